//! What a parsed virtio-blk request is: its kind, its data segments and
//! where its status byte goes, and the limits it was checked against.

use vm_memory::GuestAddress;

use crate::wire::VIRTIO_BLK_ID_BYTES;

/// A range of memory the device reads or writes (part of a descriptor).
#[derive(Clone, Copy, Debug, Eq, PartialEq)]
pub struct Segment {
    /// Start (guest physical address or IOVA).
    pub addr: GuestAddress,
    /// Length in bytes.
    pub len: u32,
}

/// One range of a discard or write-zeroes request.
#[derive(Clone, Copy, Debug, Eq, PartialEq)]
pub struct SectorRange {
    /// First sector.
    pub sector: u64,
    /// Number of sectors.
    pub count: u32,
    /// Write-zeroes only: the device may deallocate.
    pub unmap: bool,
}

/// What a request asks for.
#[derive(Clone, Debug, Eq, PartialEq)]
pub enum RequestKind {
    /// Read sectors into `data` (device-writable).
    Read {
        /// First sector.
        sector: u64,
        /// Where the data goes, in order.
        data: Vec<Segment>,
    },
    /// Write sectors from `data` (device-readable).
    Write {
        /// First sector.
        sector: u64,
        /// Where the data comes from, in order.
        data: Vec<Segment>,
    },
    /// Make every completed write durable.
    Flush,
    /// Write the device id string into `data` (up to 20 bytes).
    GetId {
        /// Device-writable buffer.
        data: Vec<Segment>,
    },
    /// Discard ranges.
    Discard(Vec<SectorRange>),
    /// Write zeroes over ranges.
    WriteZeroes(Vec<SectorRange>),
}

/// A parsed, validated request.
#[derive(Clone, Debug, Eq, PartialEq)]
pub struct Request {
    /// Head descriptor index (for the used ring).
    pub head: u16,
    /// The operation.
    pub kind: RequestKind,
    /// Where the status byte goes (checked writable).
    pub status: GuestAddress,
}

impl Request {
    /// Bytes of data the device writes on success, before the status byte.
    pub fn data_in_len(&self) -> u32 {
        match &self.kind {
            RequestKind::Read { data, .. } => data.iter().map(|s| s.len).sum(),
            RequestKind::GetId { data } => {
                let n: u32 = data.iter().map(|s| s.len).sum();
                n.min(VIRTIO_BLK_ID_BYTES as u32)
            }
            _ => 0,
        }
    }
}

/// Limits a request must respect (from the device's configuration).
#[derive(Clone, Copy, Debug, Eq, PartialEq)]
pub struct Limits {
    /// Capacity in sectors.
    pub capacity: u64,
    /// Refuse writes, discards and write-zeroes.
    pub readonly: bool,
    /// Most sectors per discard range.
    pub max_discard_sectors: u32,
    /// Most ranges per discard request.
    pub max_discard_seg: u32,
    /// Most sectors per write-zeroes range.
    pub max_write_zeroes_sectors: u32,
    /// Most ranges per write-zeroes request.
    pub max_write_zeroes_seg: u32,
}
