//! The virtio-blk configuration space (`struct virtio_blk_config`): the
//! feature masks, the fields a back end fills in ([`BlkConfig`], written
//! through the wire layout [`ConfigSpace`]) and the geometry and limits a
//! driver reads from it ([`DeviceConfig`]).

use std::fmt;

use virtio_bindings::virtio_blk as vb;
use vm_memory::ByteValued;

use crate::wire::{ConfigSpace, CONFIG_LEN, SECTOR_SIZE};

// virtio-blk feature bits (virtio 1.x, 5.2.3) as masks, from the bit
// numbers of `virtio-bindings` (the kernel's uAPI header); the driver, the
// back end and the tests take them from here.

/// `VIRTIO_BLK_F_SIZE_MAX`: `size_max` is valid.
pub const VIRTIO_BLK_F_SIZE_MAX: u64 = 1 << vb::VIRTIO_BLK_F_SIZE_MAX;
/// `VIRTIO_BLK_F_SEG_MAX`: `seg_max` is valid.
pub const VIRTIO_BLK_F_SEG_MAX: u64 = 1 << vb::VIRTIO_BLK_F_SEG_MAX;
/// `VIRTIO_BLK_F_RO`: the device is read-only.
pub const VIRTIO_BLK_F_RO: u64 = 1 << vb::VIRTIO_BLK_F_RO;
/// `VIRTIO_BLK_F_BLK_SIZE`: `blk_size` is valid.
pub const VIRTIO_BLK_F_BLK_SIZE: u64 = 1 << vb::VIRTIO_BLK_F_BLK_SIZE;
/// `VIRTIO_BLK_F_FLUSH`: the device has a cache to flush.
pub const VIRTIO_BLK_F_FLUSH: u64 = 1 << vb::VIRTIO_BLK_F_FLUSH;
/// `VIRTIO_BLK_F_MQ`: `num_queues` is valid.
pub const VIRTIO_BLK_F_MQ: u64 = 1 << vb::VIRTIO_BLK_F_MQ;
/// `VIRTIO_BLK_F_DISCARD`: the device supports discard.
pub const VIRTIO_BLK_F_DISCARD: u64 = 1 << vb::VIRTIO_BLK_F_DISCARD;
/// `VIRTIO_BLK_F_WRITE_ZEROES`: the device supports write-zeroes.
pub const VIRTIO_BLK_F_WRITE_ZEROES: u64 = 1 << vb::VIRTIO_BLK_F_WRITE_ZEROES;

/// The fields of `struct virtio_blk_config` a back end fills in; the rest
/// (geometry, topology, secure erase, zoned) read as zero.
#[derive(Clone, Copy, Debug, Default, Eq, PartialEq)]
pub struct BlkConfig {
    /// Capacity in 512-byte sectors.
    pub capacity: u64,
    /// Largest segment in bytes.
    pub size_max: u32,
    /// Most data segments in one request.
    pub seg_max: u32,
    /// Block size in bytes.
    pub blk_size: u32,
    /// Number of request queues.
    pub num_queues: u16,
    /// Most sectors in one discard segment.
    pub max_discard_sectors: u32,
    /// Most segments in one discard request.
    pub max_discard_seg: u32,
    /// Discard alignment, in sectors.
    pub discard_sector_alignment: u32,
    /// Most sectors in one write-zeroes segment.
    pub max_write_zeroes_sectors: u32,
    /// Most segments in one write-zeroes request.
    pub max_write_zeroes_seg: u32,
    /// Whether write-zeroes with the unmap flag may deallocate.
    pub write_zeroes_may_unmap: bool,
}

impl BlkConfig {
    /// The little-endian wire layout (virtio 1.2, 5.2.4): the first
    /// [`CONFIG_LEN`] bytes of [`ConfigSpace`].
    pub fn to_bytes(&self) -> [u8; CONFIG_LEN] {
        let space = ConfigSpace(vb::virtio_blk_config {
            capacity: self.capacity.to_le(),
            size_max: self.size_max.to_le(),
            seg_max: self.seg_max.to_le(),
            blk_size: self.blk_size.to_le(),
            num_queues: self.num_queues.to_le(),
            max_discard_sectors: self.max_discard_sectors.to_le(),
            max_discard_seg: self.max_discard_seg.to_le(),
            discard_sector_alignment: self.discard_sector_alignment.to_le(),
            max_write_zeroes_sectors: self.max_write_zeroes_sectors.to_le(),
            max_write_zeroes_seg: self.max_write_zeroes_seg.to_le(),
            write_zeroes_may_unmap: u8::from(self.write_zeroes_may_unmap),
            ..Default::default()
        });
        let mut b = [0u8; CONFIG_LEN];
        b.copy_from_slice(&space.as_slice()[..CONFIG_LEN]);
        b
    }

    /// Parses the layout back (for drivers and tests); `bytes` shorter
    /// than the layout reads as zeros past its end.
    pub fn from_bytes(bytes: &[u8]) -> Self {
        let mut space = ConfigSpace::default();
        let n = bytes.len().min(CONFIG_LEN);
        space.as_mut_slice()[..n].copy_from_slice(&bytes[..n]);
        // Fields of the packed struct are copied out, never borrowed.
        let c = space.0;
        Self {
            capacity: u64::from_le(c.capacity),
            size_max: u32::from_le(c.size_max),
            seg_max: u32::from_le(c.seg_max),
            blk_size: u32::from_le(c.blk_size),
            num_queues: u16::from_le(c.num_queues),
            max_discard_sectors: u32::from_le(c.max_discard_sectors),
            max_discard_seg: u32::from_le(c.max_discard_seg),
            discard_sector_alignment: u32::from_le(c.discard_sector_alignment),
            max_write_zeroes_sectors: u32::from_le(c.max_write_zeroes_sectors),
            max_write_zeroes_seg: u32::from_le(c.max_write_zeroes_seg),
            write_zeroes_may_unmap: c.write_zeroes_may_unmap != 0,
        }
    }

    /// Bytes `offset..offset + len` of the configuration space, zero past
    /// the end of the layout.
    pub fn read(&self, offset: u32, len: u32) -> Vec<u8> {
        let bytes = self.to_bytes();
        let mut out = vec![0u8; len as usize];
        let start = (offset as usize).min(CONFIG_LEN);
        let end = (offset as usize)
            .saturating_add(len as usize)
            .min(CONFIG_LEN);
        if start < end {
            out[..end - start].copy_from_slice(&bytes[start..end]);
        }
        out
    }
}

/// The device's geometry and limits, from its config space and features.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceConfig {
    /// Capacity in 512-byte sectors.
    pub capacity: u64,
    /// Largest data segment in bytes (`None`: no limit given).
    pub size_max: Option<u32>,
    /// Most data segments in one request (`None`: no limit given).
    pub seg_max: Option<u32>,
    /// Logical block size in bytes (512 unless `BLK_SIZE`).
    pub blk_size: u32,
    /// Number of request queues (1 unless `MQ`).
    pub num_queues: u16,
    /// Discard limits, when `DISCARD` was offered.
    pub discard: Option<RangeLimits>,
    /// Write-zeroes limits, when `WRITE_ZEROES` was offered.
    pub write_zeroes: Option<RangeLimits>,
    /// Whether write-zeroes may deallocate (`write_zeroes_may_unmap`).
    pub write_zeroes_may_unmap: bool,
    /// Whether the device is read-only (`RO`).
    pub read_only: bool,
    /// Whether the device has a volatile cache that `FLUSH` drains.
    pub flush: bool,
}

/// Limits of the range commands (discard, write-zeroes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RangeLimits {
    /// Most sectors in one segment.
    pub max_sectors: u32,
    /// Most segments in one request.
    pub max_segs: u32,
    /// Required alignment of a discard segment, in sectors (1 for
    /// write-zeroes).
    pub alignment: u32,
}

impl DeviceConfig {
    /// Reads the config space `raw` (the device's `virtio_blk_config`,
    /// little-endian; its layout is [`BlkConfig`]) under the
    /// negotiated `features`. Fields of features not negotiated are ignored;
    /// zero limits mean "no limit" (some devices offer `SIZE_MAX` with
    /// `size_max` 0) and zero range limits fall back to 1.
    pub fn parse(raw: &[u8; CONFIG_LEN], features: u64) -> Self {
        let w = BlkConfig::from_bytes(raw);
        let nonzero = |v: u32| (v != 0).then_some(v);
        let has = |f: u64| features & f != 0;
        let range = |sectors: u32, segs: u32, align: u32| RangeLimits {
            max_sectors: sectors.max(1),
            max_segs: segs.max(1),
            alignment: align.max(1),
        };
        // A block size that is not a power-of-two multiple of 512 is
        // nonsense from the device; 512 then.
        let blk_size =
            if has(VIRTIO_BLK_F_BLK_SIZE) && w.blk_size >= 512 && w.blk_size.is_power_of_two() {
                w.blk_size
            } else {
                512
            };
        DeviceConfig {
            capacity: w.capacity,
            size_max: nonzero(w.size_max).filter(|_| has(VIRTIO_BLK_F_SIZE_MAX)),
            seg_max: nonzero(w.seg_max).filter(|_| has(VIRTIO_BLK_F_SEG_MAX)),
            blk_size,
            num_queues: if has(VIRTIO_BLK_F_MQ) {
                w.num_queues.max(1)
            } else {
                1
            },
            discard: has(VIRTIO_BLK_F_DISCARD).then(|| {
                range(
                    w.max_discard_sectors,
                    w.max_discard_seg,
                    w.discard_sector_alignment,
                )
            }),
            write_zeroes: has(VIRTIO_BLK_F_WRITE_ZEROES)
                .then(|| range(w.max_write_zeroes_sectors, w.max_write_zeroes_seg, 1)),
            write_zeroes_may_unmap: has(VIRTIO_BLK_F_WRITE_ZEROES) && w.write_zeroes_may_unmap,
            read_only: has(VIRTIO_BLK_F_RO),
            flush: has(VIRTIO_BLK_F_FLUSH),
        }
    }

    /// Capacity in bytes.
    pub fn capacity_bytes(&self) -> u64 {
        self.capacity.saturating_mul(SECTOR_SIZE)
    }
}

impl fmt::Display for DeviceConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} sectors ({} MiB), block {} B, {} queue(s), seg_max {}, size_max {}",
            self.capacity,
            self.capacity_bytes() >> 20,
            self.blk_size,
            self.num_queues,
            self.seg_max.map_or("-".into(), |v| v.to_string()),
            self.size_max.map_or("-".into(), |v| v.to_string()),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_round_trips_at_spec_offsets() {
        let c = BlkConfig {
            capacity: 0x1122_3344_5566_7788,
            size_max: 1 << 22,
            seg_max: 126,
            blk_size: 512,
            num_queues: 3,
            max_discard_sectors: 1 << 20,
            max_discard_seg: 32,
            discard_sector_alignment: 8,
            max_write_zeroes_sectors: 1 << 21,
            max_write_zeroes_seg: 16,
            write_zeroes_may_unmap: true,
        };
        let b = c.to_bytes();
        assert_eq!(b[0], 0x88);
        assert_eq!(&b[12..16], &126u32.to_le_bytes());
        assert_eq!(&b[34..36], &3u16.to_le_bytes());
        assert_eq!(b[56], 1);
        assert_eq!(BlkConfig::from_bytes(&b), c);
        assert_eq!(c.read(34, 4), vec![3, 0, 0, 0]);
        assert_eq!(c.read(58, 6), vec![0; 6]);
        assert_eq!(c.read(u32::MAX, 2), vec![0; 2]);
    }

    /// qemu-storage-daemon 10.0's config space, as read from a 24 MiB export
    /// with two queues.
    const QSD_CONFIG: [u8; CONFIG_LEN] = [
        0x00, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x7e, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x01, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x80, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01,
        0x00, 0x00, 0x00, 0x00, 0x80, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];
    const QSD_FEATURES: u64 = 0x1_7500_7e46;

    #[test]
    fn parses_qemu_storage_daemon_config() {
        let c = DeviceConfig::parse(&QSD_CONFIG, QSD_FEATURES);
        assert_eq!(c.capacity, 49152);
        assert_eq!(c.capacity_bytes(), 24 << 20);
        assert_eq!(c.size_max, None, "size_max 0 means no limit");
        assert_eq!(c.seg_max, Some(126));
        assert_eq!(c.blk_size, 512);
        assert_eq!(c.num_queues, 2);
        assert_eq!(
            c.discard,
            Some(RangeLimits {
                max_sectors: 32768,
                max_segs: 1,
                alignment: 1
            })
        );
        assert_eq!(c.write_zeroes.map(|w| w.max_sectors), Some(32768));
        assert!(c.flush);
        assert!(!c.read_only);
    }

    #[test]
    fn fields_of_unnegotiated_features_are_ignored() {
        let c = DeviceConfig::parse(&QSD_CONFIG, iopath_virtio::features::VIRTIO_F_VERSION_1);
        assert_eq!(c.seg_max, None);
        assert_eq!(c.num_queues, 1);
        assert_eq!(c.discard, None);
        assert!(!c.flush);
    }
}
