//! The virtio-blk wire format (virtio 1.2, 5.2), shared by the driver and
//! the back end: the request types and status bytes, and the layouts of
//! the request header, the discard / write-zeroes segment and the
//! configuration space.
//!
//! The layouts are `virtio-bindings`' structs (the kernel's uAPI header)
//! in `#[repr(transparent)]` wrappers that implement
//! [`ByteValued`], so each is read and written whole, as vm-virtio does;
//! the accessors convert from and to the little-endian wire order.
//!
//! ```text
//!  driver: OutHeader::new(type, sector).as_slice() ─► descriptor ─► back end:
//!          OutHeader::default().as_mut_slice() ◄─ read ◄─┘  .kind() / .sector()
//! ```

use std::mem::{offset_of, size_of};

use virtio_bindings::virtio_blk as vb;
use vm_memory::ByteValued;

/// Bytes in a virtio-blk sector (virtio 1.x, 5.2.6: `sector` counts
/// 512-byte units whatever the device's block size).
pub const SECTOR_SIZE: u64 = 512;

// Request types (virtio 1.x, 5.2.6), from `virtio-bindings`.
pub use vb::{
    VIRTIO_BLK_T_DISCARD, VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN,
    VIRTIO_BLK_T_OUT, VIRTIO_BLK_T_WRITE_ZEROES,
};

/// Status: success (`VIRTIO_BLK_S_OK`, as the status byte it is written as).
pub const VIRTIO_BLK_S_OK: u8 = vb::VIRTIO_BLK_S_OK as u8;
/// Status: I/O error (also every malformed request).
pub const VIRTIO_BLK_S_IOERR: u8 = vb::VIRTIO_BLK_S_IOERR as u8;
/// Status: request type or flag not supported.
pub const VIRTIO_BLK_S_UNSUPP: u8 = vb::VIRTIO_BLK_S_UNSUPP as u8;
/// Length of the `GET_ID` string.
pub const VIRTIO_BLK_ID_BYTES: usize = vb::VIRTIO_BLK_ID_BYTES as usize;
/// The one flag of a write-zeroes segment: the device may deallocate.
pub const VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP: u32 = vb::VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP;

/// The request header `struct virtio_blk_outhdr` (`type`, `ioprio`,
/// `sector`), the first device-readable bytes of every request.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[repr(transparent)]
pub struct OutHeader(vb::virtio_blk_outhdr);

// SAFETY: `virtio_blk_outhdr` is `repr(C)` of two u32 and a u64, 16 bytes
// with no padding: every byte pattern is a valid value.
unsafe impl ByteValued for OutHeader {}

/// Size of the request header.
pub const HEADER_LEN: usize = size_of::<OutHeader>();

impl OutHeader {
    /// The header of a request of type `kind` at `sector` (ioprio 0).
    pub fn new(kind: u32, sector: u64) -> Self {
        Self(vb::virtio_blk_outhdr {
            type_: kind.to_le(),
            ioprio: 0,
            sector: sector.to_le(),
        })
    }

    /// The request type (`VIRTIO_BLK_T_*`).
    pub fn kind(&self) -> u32 {
        u32::from_le(self.0.type_)
    }

    /// The first sector.
    pub fn sector(&self) -> u64 {
        u64::from_le(self.0.sector)
    }
}

/// One segment of a discard or write-zeroes request, `struct
/// virtio_blk_discard_write_zeroes` (`sector`, `num_sectors`, `flags`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[repr(transparent)]
pub struct RangeSegment(vb::virtio_blk_discard_write_zeroes);

// SAFETY: `virtio_blk_discard_write_zeroes` is `repr(C)` of a u64 and two
// u32, 16 bytes with no padding: every byte pattern is a valid value.
unsafe impl ByteValued for RangeSegment {}

/// Size of a discard / write-zeroes segment.
pub const RANGE_LEN: usize = size_of::<RangeSegment>();

impl RangeSegment {
    /// `sectors` sectors from `sector`, with the unmap flag when `unmap`.
    pub fn new(sector: u64, sectors: u32, unmap: bool) -> Self {
        let flags = if unmap {
            VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP
        } else {
            0
        };
        Self(vb::virtio_blk_discard_write_zeroes {
            sector: sector.to_le(),
            num_sectors: sectors.to_le(),
            flags: flags.to_le(),
        })
    }

    /// The first sector.
    pub fn sector(&self) -> u64 {
        u64::from_le(self.0.sector)
    }

    /// The number of sectors.
    pub fn num_sectors(&self) -> u32 {
        u32::from_le(self.0.num_sectors)
    }

    /// The flags, as sent.
    pub fn flags(&self) -> u32 {
        u32::from_le(self.0.flags)
    }
}

/// The configuration space `struct virtio_blk_config`, whole (secure-erase
/// and zoned fields included).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[repr(transparent)]
pub struct ConfigSpace(pub vb::virtio_blk_config);

// SAFETY: `virtio_blk_config` is `repr(C, packed)` of integers and of
// structs of integers, so it has no padding: every byte pattern is a valid
// value.
unsafe impl ByteValued for ConfigSpace {}

/// Bytes of the configuration space iopath's driver reads and its back end
/// fills in: up to `write_zeroes_may_unmap` and its padding (the
/// secure-erase and zoned fields after it read as zero).
pub const CONFIG_LEN: usize = offset_of!(vb::virtio_blk_config, max_secure_erase_sectors);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_are_the_specs() {
        assert_eq!(HEADER_LEN, 16);
        assert_eq!(RANGE_LEN, 16);
        assert_eq!(CONFIG_LEN, 60);
        assert_eq!(
            OutHeader::new(VIRTIO_BLK_T_OUT, 0x0102_0304_0506_0708).as_slice(),
            [1, 0, 0, 0, 0, 0, 0, 0, 8, 7, 6, 5, 4, 3, 2, 1]
        );
        assert_eq!(
            RangeSegment::new(2, 3, true).as_slice(),
            [2, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 1, 0, 0, 0]
        );
    }

    #[test]
    fn accessors_read_back_what_was_written() {
        let h = OutHeader::new(VIRTIO_BLK_T_GET_ID, 77);
        assert_eq!((h.kind(), h.sector()), (VIRTIO_BLK_T_GET_ID, 77));
        let r = RangeSegment::new(9, 4, false);
        assert_eq!((r.sector(), r.num_sectors(), r.flags()), (9, 4, 0));
    }
}
