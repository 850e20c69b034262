//! Why a resource table was refused: each lie it can tell, named.

use thiserror::Error;

/// Why a resource table was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RscError {
    /// Fewer bytes than a table header.
    #[error("Resource table of {len} bytes is shorter than its header")]
    TooSmall {
        /// Bytes available.
        len: usize,
    },
    /// A version other than 1.
    #[error("Resource table version {ver}, expected 1")]
    Version {
        /// The version found.
        ver: u32,
    },
    /// More entries than fit (or than iopath accepts).
    #[error("Resource table declares {num} entries; at most {max} fit")]
    TooManyEntries {
        /// Declared entries.
        num: u32,
        /// What fits.
        max: u32,
    },
    /// An entry offset that points outside the table or into its header.
    #[error("Entry {index} at offset {offset:#x} lies outside the {len}-byte table")]
    EntryOffset {
        /// Entry index.
        index: usize,
        /// The offset found.
        offset: u32,
        /// Table bytes.
        len: usize,
    },
    /// A vdev entry whose vrings or config run past the table.
    #[error("Vdev entry at {offset:#x} needs {need} bytes, {room} left in the table")]
    VdevTruncated {
        /// Entry offset.
        offset: usize,
        /// Bytes the entry claims.
        need: usize,
        /// Bytes left.
        room: usize,
    },
    /// Non-zero reserved bytes in a vdev entry.
    #[error("Vdev entry at {offset:#x} has non-zero reserved bytes")]
    VdevReserved {
        /// Entry offset.
        offset: usize,
    },
    /// No rpmsg vdev in the table.
    #[error("No rpmsg vdev (type 3, id 7) in the resource table")]
    NoRpmsgVdev,
    /// An rpmsg vdev without exactly two vrings.
    #[error("rpmsg vdev has {count} vrings, expected 2")]
    VringCount {
        /// Vrings declared.
        count: u8,
    },
    /// A vring size that is zero, not a power of two or too large.
    #[error("Vring {index} has {num} entries (must be a power of two, 1..=32768)")]
    VringNum {
        /// Vring index.
        index: usize,
        /// Entries declared.
        num: u32,
    },
    /// A vring alignment that is not a power of two of at least 16.
    #[error("Vring {index} alignment {align:#x} is not a power of two >= 16")]
    VringAlign {
        /// Vring index.
        index: usize,
        /// Alignment declared.
        align: u32,
    },
    /// A vring whose address is "any" or misaligned.
    #[error("Vring {index} address {da:#x} is unset or not 16-byte aligned")]
    VringAddr {
        /// Vring index.
        index: usize,
        /// Address declared.
        da: u32,
    },
    /// A vring whose address is not a multiple of its alignment: its used
    /// ring would not be where both sides compute it.
    #[error("Vring {index} address {da:#x} is not a multiple of its alignment {align:#x}")]
    VringMisaligned {
        /// Vring index.
        index: usize,
        /// Address declared.
        da: u32,
        /// Alignment declared.
        align: u32,
    },
    /// A vring that does not fit in the shared memory.
    #[error("Vring {index} at {da:#x} ({size} bytes) runs past the {shm_len}-byte shared memory")]
    VringOutside {
        /// Vring index.
        index: usize,
        /// Address.
        da: u64,
        /// Ring bytes.
        size: u64,
        /// Shared-memory size.
        shm_len: u64,
    },
    /// A vring that overlaps the table or the other vring.
    #[error("Vring {index} at {da:#x} overlaps {what}")]
    VringOverlap {
        /// Vring index.
        index: usize,
        /// Address.
        da: u64,
        /// What it overlaps.
        what: &'static str,
    },
    /// No room left for the buffer pool.
    #[error("No room for a {need}-byte buffer pool in the {shm_len}-byte shared memory")]
    NoPool {
        /// Bytes needed.
        need: u64,
        /// Shared-memory size.
        shm_len: u64,
    },
}
