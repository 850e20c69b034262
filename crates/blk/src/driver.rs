//! The virtio-blk driver: a block-device API over any virtio transport and
//! any DMA ops.
//!
//! (Driver-side config and request layout; the queue engine follows.)

use std::fmt;

/// Sector size of virtio-blk addressing (virtio 1.x, 5.2.6), whatever the
/// device's logical block size.
pub const SECTOR: u64 = 512;

/// virtio-blk feature bits (virtio 1.x, 5.2.3).
pub mod features {
    /// Maximum size of any single segment is in `size_max`.
    pub const SIZE_MAX: u64 = 1 << 1;
    /// Maximum number of segments in a request is in `seg_max`.
    pub const SEG_MAX: u64 = 1 << 2;
    /// Device is read-only.
    pub const RO: u64 = 1 << 5;
    /// Block size of disk is in `blk_size`.
    pub const BLK_SIZE: u64 = 1 << 6;
    /// Cache flush command support.
    pub const FLUSH: u64 = 1 << 9;
    /// Device supports multiqueue.
    pub const MQ: u64 = 1 << 12;
    /// Device can support discard command.
    pub const DISCARD: u64 = 1 << 13;
    /// Device can support write zeroes command.
    pub const WRITE_ZEROES: u64 = 1 << 14;
    /// Indirect descriptors (virtio 1.x, 6).
    pub const INDIRECT_DESC: u64 = 1 << 28;
    /// Used/avail event index notification suppression.
    pub const EVENT_IDX: u64 = 1 << 29;
    /// Modern (non-legacy) device.
    pub const VERSION_1: u64 = 1 << 32;
    /// Device accesses memory through the platform's IOMMU.
    pub const ACCESS_PLATFORM: u64 = 1 << 33;
}

/// Request types (virtio 1.x, 5.2.6).
pub(crate) mod req_type {
    pub const IN: u32 = 0;
    pub const OUT: u32 = 1;
    pub const FLUSH: u32 = 4;
    pub const GET_ID: u32 = 8;
    pub const DISCARD: u32 = 11;
    pub const WRITE_ZEROES: u32 = 13;
}

/// Size of `struct virtio_blk_config` up to `write_zeroes_may_unmap` and
/// its padding (virtio 1.x, 5.2.4).
pub const CONFIG_LEN: usize = 60;
/// Size of the request header `{type u32, ioprio u32, sector u64}`.
pub const HEADER_LEN: usize = 16;
/// Size of a discard / write-zeroes segment `{sector u64, num_sectors u32,
/// flags u32}`.
pub const RANGE_LEN: usize = 16;
/// Length of the `GET_ID` answer.
pub const ID_LEN: usize = 20;

/// The device's geometry and limits, from its config space and features.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlkConfig {
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

fn le_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

impl BlkConfig {
    /// Reads the config space `raw` (the device's `virtio_blk_config`,
    /// little-endian) under the negotiated `features`. Fields of features not
    /// negotiated are ignored; zero limits mean "no limit" (some devices offer
    /// `SIZE_MAX` with `size_max` 0) and zero range limits fall back to 1.
    pub fn parse(raw: &[u8; CONFIG_LEN], features: u64) -> Self {
        let nonzero = |v: u32| (v != 0).then_some(v);
        let has = |f: u64| features & f != 0;
        let range = |at: usize, align_at: Option<usize>| RangeLimits {
            max_sectors: le_u32(raw, at).max(1),
            max_segs: le_u32(raw, at + 4).max(1),
            alignment: align_at.map_or(1, |a| le_u32(raw, a).max(1)),
        };
        let blk_size = if has(features::BLK_SIZE) {
            let b = le_u32(raw, 20);
            // A block size that is not a power of two multiple of 512 is
            // nonsense from the device; fall back to 512.
            if b >= 512 && b.is_power_of_two() {
                b
            } else {
                512
            }
        } else {
            512
        };
        BlkConfig {
            capacity: le_u64(raw, 0),
            size_max: if has(features::SIZE_MAX) {
                nonzero(le_u32(raw, 8))
            } else {
                None
            },
            seg_max: if has(features::SEG_MAX) {
                nonzero(le_u32(raw, 12))
            } else {
                None
            },
            blk_size,
            num_queues: if has(features::MQ) {
                le_u16(raw, 34).max(1)
            } else {
                1
            },
            discard: has(features::DISCARD).then(|| range(36, Some(44))),
            write_zeroes: has(features::WRITE_ZEROES).then(|| range(48, None)),
            write_zeroes_may_unmap: has(features::WRITE_ZEROES) && raw[56] != 0,
            read_only: has(features::RO),
            flush: has(features::FLUSH),
        }
    }

    /// Capacity in bytes.
    pub fn capacity_bytes(&self) -> u64 {
        self.capacity.saturating_mul(SECTOR)
    }
}

impl fmt::Display for BlkConfig {
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

/// Encodes a request header.
pub(crate) fn header(kind: u32, sector: u64) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[0..4].copy_from_slice(&kind.to_le_bytes());
    // ioprio (4..8) stays 0.
    h[8..16].copy_from_slice(&sector.to_le_bytes());
    h
}

/// Encodes one discard / write-zeroes segment.
pub(crate) fn range(sector: u64, sectors: u32, unmap: bool) -> [u8; RANGE_LEN] {
    let mut r = [0u8; RANGE_LEN];
    r[0..8].copy_from_slice(&sector.to_le_bytes());
    r[8..12].copy_from_slice(&sectors.to_le_bytes());
    r[12..16].copy_from_slice(&u32::from(unmap).to_le_bytes());
    r
}

/// One virtio request's share of a larger transfer: `len` bytes at byte
/// offset `offset` from the start of the transfer, sent as data segments of
/// the given lengths (all contiguous in one mapping).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Chunk {
    pub offset: u64,
    pub len: u64,
    pub segs: Vec<u32>,
}

/// Cuts a transfer of `len` bytes into requests that respect the device's
/// `size_max`/`seg_max`, the DMA ops' largest mapping `max_map` and the
/// descriptors one request may use (`max_descs`, header and status
/// included). Every chunk but the last is a multiple of `align` (the block
/// size), so each request starts on a block boundary.
pub(crate) fn plan(len: u64, cfg: &BlkConfig, max_map: u64, max_descs: u32, align: u64) -> Vec<Chunk> {
    let seg_size = u64::from(cfg.size_max.unwrap_or(u32::MAX))
        .min(u64::from(u32::MAX))
        .max(1);
    // Data descriptors left once the header and status have theirs.
    let seg_count = u64::from(cfg.seg_max.unwrap_or(u32::MAX).min(max_descs.saturating_sub(2)))
        .max(1);
    let mut per_req = seg_size.saturating_mul(seg_count).min(max_map).max(1);
    if per_req > align {
        per_req -= per_req % align;
    }
    let mut out = Vec::new();
    let mut off = 0;
    while off < len {
        let n = per_req.min(len - off);
        let mut segs = Vec::new();
        let mut left = n;
        while left > 0 {
            let s = left.min(seg_size);
            // `s <= seg_size <= u32::MAX`.
            segs.push(s as u32);
            left -= s;
        }
        out.push(Chunk {
            offset: off,
            len: n,
            segs,
        });
        off += n;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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
        let c = BlkConfig::parse(&QSD_CONFIG, QSD_FEATURES);
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
        let c = BlkConfig::parse(&QSD_CONFIG, features::VERSION_1);
        assert_eq!(c.seg_max, None);
        assert_eq!(c.num_queues, 1);
        assert_eq!(c.discard, None);
        assert!(!c.flush);
    }

    #[test]
    fn header_layout() {
        assert_eq!(
            header(req_type::OUT, 0x0102_0304_0506_0708),
            [1, 0, 0, 0, 0, 0, 0, 0, 8, 7, 6, 5, 4, 3, 2, 1]
        );
        assert_eq!(
            range(2, 3, true),
            [2, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 1, 0, 0, 0]
        );
    }

    fn cfg(size_max: Option<u32>, seg_max: Option<u32>) -> BlkConfig {
        let mut c = BlkConfig::parse(&QSD_CONFIG, QSD_FEATURES);
        c.size_max = size_max;
        c.seg_max = seg_max;
        c
    }

    #[test]
    fn plan_splits_by_size_and_segment_limits() {
        // 8 MiB, 64 KiB segments, 4 segments per request: 32 requests of
        // 256 KiB each, four segments apiece.
        let p = plan(8 << 20, &cfg(Some(64 << 10), Some(4)), u64::MAX, 256, 512);
        assert_eq!(p.len(), 32);
        assert!(p.iter().all(|c| c.len == 256 << 10 && c.segs == vec![64 << 10; 4]));
        assert_eq!(p[31].offset, 31 * (256 << 10));
        // No limits: one request, one segment.
        let p = plan(8 << 20, &cfg(None, None), u64::MAX, 256, 512);
        assert_eq!(p, vec![Chunk { offset: 0, len: 8 << 20, segs: vec![8 << 20] }]);
        // The DMA ops' largest mapping (a 1 MiB bounce window) bounds it too.
        let p = plan(3 << 20, &cfg(None, Some(126)), 1 << 20, 256, 512);
        assert_eq!(p.len(), 3);
    }

    proptest! {
        #[test]
        fn plan_covers_the_transfer_within_limits(
            len in 1u64..(64 << 20),
            size_max in proptest::option::of(512u32..(4 << 20)),
            seg_max in proptest::option::of(1u32..300),
            max_map in 4096u64..(16 << 20),
            max_descs in 3u32..1024,
        ) {
            let c = cfg(size_max, seg_max);
            let p = plan(len, &c, max_map, max_descs, 512);
            let mut next = 0;
            for (i, ch) in p.iter().enumerate() {
                prop_assert_eq!(ch.offset, next);
                prop_assert!(ch.len <= max_map);
                prop_assert_eq!(ch.segs.iter().map(|&s| u64::from(s)).sum::<u64>(), ch.len);
                prop_assert!(ch.segs.len() as u32 <= max_descs - 2);
                if let Some(sm) = seg_max { prop_assert!(ch.segs.len() as u32 <= sm); }
                if let Some(sz) = size_max { prop_assert!(ch.segs.iter().all(|&s| s <= sz)); }
                if i + 1 < p.len() { prop_assert_eq!(ch.len % 512, 0); }
                next += ch.len;
            }
            prop_assert_eq!(next, len);
        }
    }
}
