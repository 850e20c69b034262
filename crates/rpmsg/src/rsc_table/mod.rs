//! The remoteproc resource table (Linux `include/linux/remoteproc.h`,
//! OpenAMP `lib/include/openamp/remoteproc.h`), as far as rpmsg needs it.
//!
//! ```text
//! table:  ver u32 (=1) | num u32 | reserved[2] u32 | offset[num] u32
//! entry:  type u32 | entry data (at table + offset[i])
//! vdev:   type=3 | id u32 (7 = rpmsg) | notifyid | dfeatures | gfeatures
//!         | config_len | status u8 | num_of_vrings u8 | reserved[2] u8
//!         | vring[num_of_vrings] {da, align, num, notifyid, pa} | config[config_len]
//! ```
//!
//! All device addresses (`da`) are offsets into the shared memory, the
//! convention of OpenAMP's Linux demo. Fields are in the remote's native
//! byte order; iopath supports little-endian machines only for this table.
//!
//! [`ResourceTable::parse`] trusts nothing: each offset, length and ring is
//! checked against the bytes given and the shared-memory size, and a table
//! that lies is refused with the reason.

mod error;
mod layout;

pub use error::RscError;
pub use layout::ShmLayout;

use crate::bufsz::{BufSizeError, BufSizes};
use crate::vring::VringPlacement;

/// Resource type of a virtio device entry.
pub const RSC_VDEV: u32 = 3;
/// Virtio device id of rpmsg.
pub use virtio_bindings::virtio_ids::VIRTIO_ID_RPMSG;
/// "Any address" in a resource entry (the host would pick; refused here).
pub const FW_RSC_ADDR_ANY: u32 = 0xFFFF_FFFF;
/// Size of the table header (without the offsets).
pub const TABLE_HDR_LEN: usize = 16;
/// Size of a vdev entry without its vrings, type word included.
pub const VDEV_LEN: usize = 28;
/// Size of one vring entry.
pub const VRING_LEN: usize = 20;
/// Most entries a table may declare.
pub const MAX_ENTRIES: u32 = 64;

/// Virtio status bits (virtio 1.x §2.1), as the vdev's `status` byte holds
/// them.
pub use iopath_virtio::features::status;

/// One vring as the table describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VringRsc {
    /// Device address (offset into the shared memory).
    pub da: u32,
    /// Used-ring alignment.
    pub align: u32,
    /// Entries.
    pub num: u32,
    /// Notification id.
    pub notifyid: u32,
    /// Physical address (unused here).
    pub pa: u32,
}

impl VringRsc {
    /// Where the ring sits (`None` for a number of entries or an alignment
    /// no ring has).
    pub fn layout(&self) -> Option<VringPlacement> {
        VringPlacement::new(u64::from(self.da), self.num, u64::from(self.align))
    }
}

/// The rpmsg vdev entry, with the absolute offsets of its mutable fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VdevRsc {
    /// Offset of the entry (its type word) in the shared memory.
    pub offset: usize,
    /// Virtio device id.
    pub id: u32,
    /// Notification id of the device itself.
    pub notifyid: u32,
    /// Features the device offers.
    pub dfeatures: u32,
    /// Features the driver accepted.
    pub gfeatures: u32,
    /// Bytes of config space after the vrings.
    pub config_len: u32,
    /// Virtio status byte.
    pub status: u8,
    /// The vrings: vq0 (host rx, remote tx), vq1 (host tx, remote rx).
    pub vrings: Vec<VringRsc>,
    /// The config space (`config_len` bytes after the vrings), copied.
    pub config: Vec<u8>,
}

impl VdevRsc {
    /// Offset of `gfeatures` in the shared memory.
    pub fn gfeatures_offset(&self) -> usize {
        self.offset + 16
    }

    /// Offset of the status byte in the shared memory.
    pub fn status_offset(&self) -> usize {
        self.offset + 24
    }
}

/// A parsed, validated resource table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceTable {
    /// Offset of the table in the shared memory.
    pub table_offset: usize,
    /// Bytes from the table start to the end of its last entry.
    pub extent: usize,
    /// The rpmsg vdev.
    pub vdev: VdevRsc,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    // Little-endian: iopath's resource tables are in the native order of
    // the little-endian machines it supports (x86_64, arm64).
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

impl ResourceTable {
    /// Parses the table in `bytes` (copied from the shared memory starting at
    /// `table_offset`; pass everything up to the end of the shared memory or
    /// a sane bound) and validates its rpmsg vdev against a shared memory of
    /// `shm_len` bytes.
    ///
    /// # Errors
    /// An [`RscError`] naming the first lie found.
    pub fn parse(bytes: &[u8], table_offset: usize, shm_len: u64) -> Result<Self, RscError> {
        let len = bytes.len();
        if len < TABLE_HDR_LEN {
            return Err(RscError::TooSmall { len });
        }
        let ver = u32_at(bytes, 0);
        if ver != 1 {
            return Err(RscError::Version { ver });
        }
        let num = u32_at(bytes, 4);
        let fit = ((len - TABLE_HDR_LEN) / 4) as u32;
        if num > fit.min(MAX_ENTRIES) {
            return Err(RscError::TooManyEntries {
                num,
                max: fit.min(MAX_ENTRIES),
            });
        }
        let hdr_end = TABLE_HDR_LEN + 4 * num as usize;
        let mut extent = hdr_end;
        let mut vdev = None;
        for index in 0..num as usize {
            let offset = u32_at(bytes, TABLE_HDR_LEN + 4 * index);
            let off = offset as usize;
            if off < hdr_end || off.checked_add(4).is_none_or(|e| e > len) {
                return Err(RscError::EntryOffset { index, offset, len });
            }
            let kind = u32_at(bytes, off);
            if kind != RSC_VDEV {
                // Other resources (carveouts, traces, vendor entries) are
                // not rpmsg's business; only their header is checked.
                extent = extent.max(off + 4);
                continue;
            }
            let room = len - off;
            if room < VDEV_LEN {
                return Err(RscError::VdevTruncated {
                    offset: off,
                    need: VDEV_LEN,
                    room,
                });
            }
            let nvr = bytes[off + 25];
            let config_len = u32_at(bytes, off + 20);
            let need = VDEV_LEN as u64 + VRING_LEN as u64 * u64::from(nvr) + u64::from(config_len);
            if need > room as u64 {
                return Err(RscError::VdevTruncated {
                    offset: off,
                    need: need as usize,
                    room,
                });
            }
            extent = extent.max(off + need as usize);
            if bytes[off + 26] != 0 || bytes[off + 27] != 0 {
                return Err(RscError::VdevReserved { offset: off });
            }
            let id = u32_at(bytes, off + 4);
            if id != VIRTIO_ID_RPMSG || vdev.is_some() {
                continue;
            }
            let cfg_at = off + VDEV_LEN + VRING_LEN * usize::from(nvr);
            let config = bytes[cfg_at..cfg_at + config_len as usize].to_vec();
            let vrings = (0..usize::from(nvr))
                .map(|i| {
                    let v = off + VDEV_LEN + VRING_LEN * i;
                    VringRsc {
                        da: u32_at(bytes, v),
                        align: u32_at(bytes, v + 4),
                        num: u32_at(bytes, v + 8),
                        notifyid: u32_at(bytes, v + 12),
                        pa: u32_at(bytes, v + 16),
                    }
                })
                .collect();
            vdev = Some(VdevRsc {
                offset: table_offset + off,
                id,
                notifyid: u32_at(bytes, off + 8),
                dfeatures: u32_at(bytes, off + 12),
                gfeatures: u32_at(bytes, off + 16),
                config_len,
                status: bytes[off + 24],
                vrings,
                config,
            });
        }
        let vdev = vdev.ok_or(RscError::NoRpmsgVdev)?;
        let table = ResourceTable {
            table_offset,
            extent,
            vdev,
        };
        table.check_vrings(shm_len)?;
        Ok(table)
    }

    fn check_vrings(&self, shm_len: u64) -> Result<(), RscError> {
        let v = &self.vdev.vrings;
        if v.len() != 2 {
            return Err(RscError::VringCount {
                count: v.len() as u8,
            });
        }
        let table = (
            self.table_offset as u64,
            (self.table_offset + self.extent) as u64,
        );
        let mut spans = Vec::new();
        for (index, r) in v.iter().enumerate() {
            // A power of two that fits the ring's u16 size is at most 32768.
            if r.num == 0 || !r.num.is_power_of_two() || u16::try_from(r.num).is_err() {
                return Err(RscError::VringNum { index, num: r.num });
            }
            if r.align < 16 || !r.align.is_power_of_two() {
                return Err(RscError::VringAlign {
                    index,
                    align: r.align,
                });
            }
            if r.da == FW_RSC_ADDR_ANY || r.da % 16 != 0 {
                return Err(RscError::VringAddr { index, da: r.da });
            }
            // Linux's vring_init() aligns the used ring's absolute address;
            // the ring layout aligns its offset from the descriptor table:
            // the same place only when the table is aligned itself.
            if r.da % r.align != 0 {
                return Err(RscError::VringMisaligned {
                    index,
                    da: r.da,
                    align: r.align,
                });
            }
            let l = r.layout().ok_or(RscError::VringNum { index, num: r.num })?;
            if l.end() > shm_len {
                return Err(RscError::VringOutside {
                    index,
                    da: l.desc,
                    size: l.size,
                    shm_len,
                });
            }
            if l.desc < table.1 && table.0 < l.end() {
                return Err(RscError::VringOverlap {
                    index,
                    da: l.desc,
                    what: "the resource table",
                });
            }
            for &(a, b) in &spans {
                if l.desc < b && a < l.end() {
                    return Err(RscError::VringOverlap {
                        index,
                        da: l.desc,
                        what: "the other vring",
                    });
                }
            }
            spans.push((l.desc, l.end()));
        }
        Ok(())
    }

    /// The buffer pool the host carves its 512-byte buffers from, following
    /// OpenAMP's Linux demo: from the first 64 KiB boundary after the
    /// highest vring (and [`BUF_OFFSET`] into it), `2 * num` buffers (rx
    /// for vq0, then tx for vq1). Returns where the first buffer starts
    /// and the bytes of all of them.
    ///
    /// # Errors
    /// [`RscError::NoPool`] if the shared memory is too small.
    pub fn buffer_pool(&self, shm_len: u64) -> Result<(u64, u64), RscError> {
        self.buffer_pool_for(shm_len, BufSizes::DEFAULT)
            .map_err(|_| RscError::NoPool {
                need: self.pool_need(BufSizes::DEFAULT),
                shm_len,
            })
    }

    fn pool_need(&self, sizes: BufSizes) -> u64 {
        let v = &self.vdev.vrings;
        let n = |i: usize| v.get(i).map_or(0, |r| u64::from(r.num));
        n(0) * u64::from(sizes.to_host) + n(1) * u64::from(sizes.to_remote)
    }

    /// As [`ResourceTable::buffer_pool`] for buffers of `sizes`: the first
    /// `num` of vq0 (remote → host, `sizes.to_host` each), then those of
    /// vq1 (host → remote, `sizes.to_remote` each).
    ///
    /// # Errors
    /// [`BufSizeError::NoRoom`] naming the sizes if the shared memory is
    /// too small.
    pub fn buffer_pool_for(
        &self,
        shm_len: u64,
        sizes: BufSizes,
    ) -> Result<(u64, u64), BufSizeError> {
        let end = self
            .vdev
            .vrings
            .iter()
            .filter_map(|r| r.layout())
            .map(|l| l.end())
            .max()
            .unwrap_or(0)
            .max((self.table_offset + self.extent) as u64);
        let start = end.div_ceil(POOL_ALIGN) * POOL_ALIGN + BUF_OFFSET;
        let need = self.pool_need(sizes);
        if start + need > shm_len {
            return Err(BufSizeError::NoRoom {
                to_remote: sizes.to_remote,
                to_host: sizes.to_host,
                need,
                start,
                shm_len,
            });
        }
        Ok((start, need))
    }
}

/// Alignment of the buffer pool (OpenAMP demo: 0x10000).
pub const POOL_ALIGN: u64 = 0x10000;

/// Where the first buffer starts in the pool: 48 bytes in, so that every
/// payload (16 bytes, a header, after its buffer's start) begins on a
/// 64-byte line when the buffer sizes are multiples of 64 (all of 512,
/// 2K, 4K, 64K). The kernel copies a message from a socket into a ring
/// buffer, or out of one, at about half the cost then: on this machine's
/// AMD EPYC (FSRM) a 4 KiB `recv(2)` whose destination sits 8 to 24 bytes
/// past a line costs 3.2 us, one on the line 1.9 us. Devices find buffers
/// by their descriptors, so nothing else depends on it.
pub const BUF_OFFSET: u64 = 48;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn demo() -> Vec<u8> {
        ShmLayout::openamp_demo().table()
    }

    #[test]
    fn demo_table_parses() {
        let b = demo();
        assert_eq!(b.len(), 88);
        let t = ResourceTable::parse(&b, 0, 0x80000).unwrap();
        assert_eq!(t.extent, 88);
        assert_eq!(t.vdev.offset, 20);
        assert_eq!(t.vdev.dfeatures, 1);
        assert_eq!(t.vdev.status_offset(), 44);
        assert_eq!(t.vdev.vrings[0].da, 0x4000);
        assert_eq!(t.vdev.vrings[1].da, 0x8000);
        assert_eq!(t.vdev.vrings[1].notifyid, 2);
        assert_eq!(t.buffer_pool(0x80000).unwrap(), (0x10030, 0x40000));
        assert_eq!(
            ShmLayout::for_size(0x80000, 256).unwrap(),
            ShmLayout::openamp_demo()
        );
    }

    #[test]
    fn lying_tables_are_refused() {
        let b = demo();
        let mut v = b.clone();
        v[0] = 2;
        assert_eq!(
            ResourceTable::parse(&v, 0, 0x80000),
            Err(RscError::Version { ver: 2 })
        );
        let mut v = b.clone();
        v[4..8].copy_from_slice(&1000u32.to_le_bytes());
        assert!(matches!(
            ResourceTable::parse(&v, 0, 0x80000),
            Err(RscError::TooManyEntries { num: 1000, .. })
        ));
        let mut v = b.clone();
        v[16..20].copy_from_slice(&0x1000u32.to_le_bytes());
        assert!(matches!(
            ResourceTable::parse(&v, 0, 0x80000),
            Err(RscError::EntryOffset { offset: 0x1000, .. })
        ));
        // config_len past the table.
        let mut v = b.clone();
        v[40..44].copy_from_slice(&100u32.to_le_bytes());
        assert!(matches!(
            ResourceTable::parse(&v, 0, 0x80000),
            Err(RscError::VdevTruncated { .. })
        ));
        // Ring past the shared memory.
        assert!(matches!(
            ResourceTable::parse(&b, 0, 0x9000),
            Err(RscError::VringOutside { index: 1, .. })
        ));
        // Ring count.
        let mut v = b.clone();
        v[45] = 3;
        assert!(matches!(
            ResourceTable::parse(&v, 0, 0x80000),
            Err(RscError::VdevTruncated { .. })
        ));
        let mut v = b.clone();
        v[45] = 1;
        assert_eq!(
            ResourceTable::parse(&v, 0, 0x80000),
            Err(RscError::VringCount { count: 1 })
        );
        // Non-power-of-two ring size.
        let mut v = b.clone();
        v[56..60].copy_from_slice(&255u32.to_le_bytes());
        assert_eq!(
            ResourceTable::parse(&v, 0, 0x80000),
            Err(RscError::VringNum { index: 0, num: 255 })
        );
        // Overlapping rings.
        let mut v = b.clone();
        v[68..72].copy_from_slice(&0x5000u32.to_le_bytes());
        assert!(matches!(
            ResourceTable::parse(&v, 0, 0x80000),
            Err(RscError::VringOverlap { index: 1, .. })
        ));
        // Ring over the table.
        let mut v = b.clone();
        v[48..52].copy_from_slice(&0u32.to_le_bytes());
        assert!(matches!(
            ResourceTable::parse(&v, 0, 0x80000),
            Err(RscError::VringOverlap { index: 0, .. })
        ));
        // Aligned to 16 but not to its 0x1000 alignment.
        let mut v = b.clone();
        v[48..52].copy_from_slice(&0x4010u32.to_le_bytes());
        assert!(matches!(
            ResourceTable::parse(&v, 0, 0x80000),
            Err(RscError::VringMisaligned {
                index: 0,
                da: 0x4010,
                align: 0x1000
            })
        ));
        // Unset address.
        let mut v = b.clone();
        v[48..52].copy_from_slice(&FW_RSC_ADDR_ANY.to_le_bytes());
        assert!(matches!(
            ResourceTable::parse(&v, 0, 0x80000),
            Err(RscError::VringAddr { index: 0, .. })
        ));
        // Not rpmsg.
        let mut v = b.clone();
        v[24] = 1;
        assert_eq!(
            ResourceTable::parse(&v, 0, 0x80000),
            Err(RscError::NoRpmsgVdev)
        );
        let mut v = b.clone();
        v[46] = 1;
        assert!(matches!(
            ResourceTable::parse(&v, 0, 0x80000),
            Err(RscError::VdevReserved { .. })
        ));
        assert_eq!(
            ResourceTable::parse(&b[..10], 0, 0x80000),
            Err(RscError::TooSmall { len: 10 })
        );
        // No pool room.
        let t = ResourceTable::parse(&b, 0, 0x20000).unwrap();
        assert!(matches!(
            t.buffer_pool(0x20000),
            Err(RscError::NoPool { .. })
        ));
    }

    proptest! {
        #[test]
        fn parse_never_panics(mut bytes in proptest::collection::vec(any::<u8>(), 0..200), shm_len in 0u64..0x100000, keep_header: bool) {
            if keep_header && bytes.len() >= 8 {
                bytes[0..8].copy_from_slice(&[1, 0, 0, 0, 1, 0, 0, 0]);
            }
            if let Ok(t) = ResourceTable::parse(&bytes, 0, shm_len) {
                for r in &t.vdev.vrings {
                    prop_assert!(r.layout().unwrap().end() <= shm_len);
                }
            }
        }

        #[test]
        fn mutated_demo_table_never_panics(at in 0usize..88, byte: u8) {
            let mut b = demo();
            b[at] = byte;
            if let Ok(t) = ResourceTable::parse(&b, 0, 0x80000) {
                for r in &t.vdev.vrings {
                    prop_assert!(r.layout().unwrap().end() <= 0x80000);
                }
            }
        }
    }
}
