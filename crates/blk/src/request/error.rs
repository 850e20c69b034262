//! Why a descriptor chain is not a valid request, and the status byte it
//! is completed with.

use vm_memory::GuestAddress;

use crate::wire::{VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_UNSUPP};

/// Why a chain is not a valid request.
#[derive(Clone, Debug, thiserror::Error, Eq, PartialEq)]
pub enum ParseError {
    /// The chain has no descriptor (the head could not be read).
    #[error("Empty descriptor chain")]
    Empty,
    /// The chain loops, points past its table, or its next descriptor
    /// cannot be read.
    #[error("Descriptor chain is broken (loop, bad index or unreadable descriptor)")]
    BrokenChain,
    /// More descriptors than any request needs.
    #[error("Descriptor chain longer than {max} descriptors")]
    TooLong {
        /// The limit.
        max: usize,
    },
    /// A device-readable descriptor follows a device-writable one.
    #[error("Device-readable descriptor after a device-writable one")]
    ReadableAfterWritable,
    /// No device-writable byte for the status.
    #[error("No status byte")]
    NoStatus,
    /// Fewer than 16 device-readable bytes.
    #[error("Request header is {len} bytes")]
    ShortHeader {
        /// Readable bytes found.
        len: u64,
    },
    /// A buffer lies (partly) outside the memory the device may access, or
    /// the access it needs is not permitted there.
    #[error("Buffer {addr:#x}+{len:#x} is not accessible")]
    BadAddress {
        /// Start of the buffer.
        addr: u64,
        /// Its length.
        len: u64,
    },
    /// Data length is not a whole number of sectors.
    #[error("Data length {len} is not a multiple of 512")]
    NotSectorMultiple {
        /// The length in bytes.
        len: u64,
    },
    /// The request reaches past the end of the device.
    #[error("Sectors {sector}+{count} are past the capacity {capacity}")]
    OutOfRange {
        /// First sector.
        sector: u64,
        /// Number of sectors.
        count: u64,
        /// Capacity in sectors.
        capacity: u64,
    },
    /// Data where the request type has none, or the wrong direction.
    #[error("Unexpected data layout for request type {kind}")]
    BadLayout {
        /// The request type.
        kind: u32,
    },
    /// Too many discard or write-zeroes ranges, or too many sectors in one.
    #[error("Discard or write-zeroes request over the device limits")]
    OverLimit,
    /// A write-class request on a read-only device.
    #[error("Device is read-only")]
    ReadOnly,
    /// An unknown request type.
    #[error("Request type {kind} is not supported")]
    UnsupportedType {
        /// The request type.
        kind: u32,
    },
    /// A flag this device does not support.
    #[error("Flags {flags:#x} not supported")]
    UnsupportedFlags {
        /// The flags.
        flags: u32,
    },
}

impl ParseError {
    /// The status byte this error completes the request with.
    pub fn status(&self) -> u8 {
        match self {
            Self::UnsupportedType { .. } | Self::UnsupportedFlags { .. } => VIRTIO_BLK_S_UNSUPP,
            _ => VIRTIO_BLK_S_IOERR,
        }
    }
}

/// A chain that was not a valid request: complete it with
/// [`ParseError::status`] at `status` when there is a usable status byte.
#[derive(Clone, Debug, Eq, PartialEq)]
pub struct Rejected {
    /// Head descriptor index.
    pub head: u16,
    /// What was wrong.
    pub error: ParseError,
    /// The last device-writable byte of the chain, if it is writable memory.
    pub status: Option<GuestAddress>,
}
