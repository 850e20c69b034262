//! Request planning for the driver: a [`Command`] checked against the
//! device and cut into virtio requests ([`cut`]), a transfer's chunks
//! respecting the device's `size_max`/`seg_max`, the DMA ops' largest
//! mapping and the ring ([`plan`]). Pure code, apart from the queue that
//! runs it; the wire layouts are in `wire.rs`.

use crate::command::Command;
use crate::config::DeviceConfig;
use crate::error::{BlkError, Result};
use crate::wire::{SECTOR_SIZE as SECTOR, VIRTIO_BLK_T_DISCARD, VIRTIO_BLK_T_WRITE_ZEROES};

/// One virtio request's share of a larger transfer: `len` bytes at byte
/// offset `offset` from the start of the transfer, sent as data segments
/// of `seg` bytes (the last one shorter), all contiguous in one mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Chunk {
    pub offset: u64,
    pub len: u64,
    pub seg: u64,
}

impl Chunk {
    /// The data segments' lengths, in order.
    pub fn segs(&self) -> impl Iterator<Item = u32> {
        let (len, seg) = (self.len, self.seg);
        // `seg <= u32::MAX` (see `plan`).
        (0..len.div_ceil(seg)).map(move |i| (len - i * seg).min(seg) as u32)
    }
}

/// The chunks of a transfer, in order (an iterator: planning allocates
/// nothing, on every request's path).
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    len: u64,
    per_req: u64,
    seg: u64,
    off: u64,
}

impl Iterator for Plan {
    type Item = Chunk;

    fn next(&mut self) -> Option<Chunk> {
        if self.off >= self.len {
            return None;
        }
        let n = self.per_req.min(self.len - self.off);
        let c = Chunk {
            offset: self.off,
            len: n,
            seg: self.seg,
        };
        self.off += n;
        Some(c)
    }
}

/// Cuts a transfer of `len` bytes into requests that respect the device's
/// `size_max`/`seg_max`, the DMA ops' largest mapping `max_map` and the
/// descriptors one request may use (`max_descs`, header and status
/// included). Every chunk but the last is a multiple of `align` (the block
/// size), so each request starts on a block boundary.
pub(crate) fn plan(
    len: u64,
    cfg: &DeviceConfig,
    max_map: u64,
    max_descs: u32,
    align: u64,
) -> Option<Plan> {
    let seg = u64::from(cfg.size_max.unwrap_or(u32::MAX))
        .min(u64::from(u32::MAX))
        .max(1);
    // Data descriptors left once the header and status have theirs.
    let seg_count = u64::from(
        cfg.seg_max
            .unwrap_or(u32::MAX)
            .min(max_descs.saturating_sub(2)),
    )
    .max(1);
    let mut per_req = seg.saturating_mul(seg_count).min(max_map);
    // Every request must start on a block: a device (or DMA ops) whose
    // limits cannot carry one block per request cannot be driven.
    per_req -= per_req % align.max(1);
    if per_req == 0 {
        return None;
    }
    Some(Plan {
        len,
        per_req,
        seg,
        off: 0,
    })
}

/// One virtio request to build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PieceSpec {
    Data {
        sector: u64,
        buf_offset: usize,
        chunk: Chunk,
    },
    Flush,
    Range {
        kind: u32,
        sector: u64,
        sectors: u32,
        unmap: bool,
    },
    GetId,
}

/// The virtio requests a [`Command`] is cut into: a read's or write's
/// chunks as planned (nothing allocated), or a list.
#[derive(Debug)]
pub(crate) enum Pieces {
    Data {
        plan: Plan,
        offset: u64,
        buf_offset: usize,
    },
    List(std::vec::IntoIter<PieceSpec>),
}

impl Iterator for Pieces {
    type Item = PieceSpec;

    fn next(&mut self) -> Option<PieceSpec> {
        match self {
            Pieces::Data {
                plan,
                offset,
                buf_offset,
            } => plan.next().map(|chunk| PieceSpec::Data {
                sector: (*offset + chunk.offset) / SECTOR,
                buf_offset: *buf_offset + chunk.offset as usize,
                chunk,
            }),
            Pieces::List(l) => l.next(),
        }
    }
}

/// Checks `req` against the device (`config`) and cuts it into virtio
/// requests of at most `max_descs` descriptors, each one mapping of at
/// most `max_map` bytes.
pub(crate) fn cut(
    req: &Command<'_>,
    config: &DeviceConfig,
    max_map: u64,
    max_descs: u32,
) -> Result<Pieces> {
    let cap = config.capacity_bytes();
    let check = |offset: u64, len: u64| -> Result<()> {
        if len == 0 {
            return Err(BlkError::Empty);
        }
        if offset % SECTOR != 0 || len % SECTOR != 0 {
            return Err(BlkError::Unaligned { offset, len });
        }
        match offset.checked_add(len) {
            Some(end) if end <= cap => Ok(()),
            _ => Err(BlkError::OutOfRange {
                offset,
                len,
                capacity: cap,
            }),
        }
    };
    Ok(match *req {
        Command::Read {
            offset,
            buf,
            buf_offset,
            len,
        }
        | Command::Write {
            offset,
            buf,
            buf_offset,
            len,
        } => {
            check(offset, len as u64)?;
            buf.check_range(buf_offset, len)?;
            if matches!(req, Command::Write { .. }) && config.read_only {
                return Err(BlkError::ReadOnly);
            }
            let plan = plan(
                len as u64,
                config,
                max_map,
                max_descs,
                u64::from(config.blk_size),
            )
            .ok_or(BlkError::Limits {
                size_max: config.size_max,
                seg_max: config.seg_max,
                max_map,
            })?;
            Pieces::Data {
                plan,
                offset,
                buf_offset,
            }
        }
        Command::Flush => {
            if !config.flush {
                return Err(BlkError::NotSupported { what: "flush" });
            }
            Pieces::List(vec![PieceSpec::Flush].into_iter())
        }
        Command::Discard { offset, len } | Command::WriteZeroes { offset, len, .. } => {
            let (limits, kind, unmap, what) = match *req {
                Command::Discard { .. } => (config.discard, VIRTIO_BLK_T_DISCARD, false, "discard"),
                Command::WriteZeroes { unmap, .. } => (
                    config.write_zeroes,
                    VIRTIO_BLK_T_WRITE_ZEROES,
                    unmap && config.write_zeroes_may_unmap,
                    "write-zeroes",
                ),
                _ => unreachable!("matched above"),
            };
            let limits = limits.ok_or(BlkError::NotSupported { what })?;
            if config.read_only {
                return Err(BlkError::ReadOnly);
            }
            check(offset, len)?;
            let mut out = Vec::new();
            let mut sector = offset / SECTOR;
            let mut left = len / SECTOR;
            while left > 0 {
                let n = left.min(u64::from(limits.max_sectors));
                out.push(PieceSpec::Range {
                    kind,
                    sector,
                    // `n <= max_sectors`, a u32.
                    sectors: n as u32,
                    unmap,
                });
                sector += n;
                left -= n;
            }
            Pieces::List(out.into_iter())
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The config of a device with two queues and the given limits.
    fn cfg(size_max: Option<u32>, seg_max: Option<u32>) -> DeviceConfig {
        DeviceConfig {
            capacity: 49152,
            size_max,
            seg_max,
            blk_size: 512,
            num_queues: 2,
            discard: None,
            write_zeroes: None,
            write_zeroes_may_unmap: false,
            read_only: false,
            flush: true,
        }
    }

    #[test]
    fn plan_splits_by_size_and_segment_limits() {
        // 8 MiB, 64 KiB segments, 4 segments per request: 32 requests of
        // 256 KiB each, four segments apiece.
        let p: Vec<_> = plan(8 << 20, &cfg(Some(64 << 10), Some(4)), u64::MAX, 256, 512)
            .unwrap()
            .collect();
        assert_eq!(p.len(), 32);
        assert!(p
            .iter()
            .all(|c| c.len == 256 << 10 && c.segs().eq([64 << 10; 4])));
        assert_eq!(p[31].offset, 31 * (256 << 10));
        // No limits: one request, one segment.
        let p: Vec<_> = plan(8 << 20, &cfg(None, None), u64::MAX, 256, 512)
            .unwrap()
            .collect();
        assert_eq!(p.len(), 1);
        assert_eq!((p[0].offset, p[0].len), (0, 8 << 20));
        assert!(p[0].segs().eq([8 << 20]));
        // The DMA ops' largest mapping (a 1 MiB bounce window) bounds it too.
        let p = plan(3 << 20, &cfg(None, Some(126)), 1 << 20, 256, 512).unwrap();
        assert_eq!(p.count(), 3);
        // Limits that cannot carry one 512-byte block: refused, not split
        // at an unaligned offset.
        assert!(plan(4096, &cfg(Some(100), Some(2)), u64::MAX, 256, 512).is_none());
        assert!(plan(4096, &cfg(None, None), 256, 256, 512).is_none());
        // A 4 KiB block device with 3 KiB x 2 segments: 4 KiB requests.
        let mut p = plan(16384, &cfg(Some(3072), Some(2)), u64::MAX, 256, 4096).unwrap();
        assert!(p.all(|c| c.len == 4096 && c.segs().eq([3072, 1024])));
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
            let p: Vec<_> = plan(len, &c, max_map, max_descs, 512).unwrap().collect();
            let mut next = 0;
            for (i, ch) in p.iter().enumerate() {
                prop_assert_eq!(ch.offset, next);
                prop_assert!(ch.len <= max_map);
                let segs: Vec<u32> = ch.segs().collect();
                prop_assert_eq!(segs.iter().map(|&s| u64::from(s)).sum::<u64>(), ch.len);
                prop_assert!(segs.len() as u32 <= max_descs - 2);
                if let Some(sm) = seg_max { prop_assert!(segs.len() as u32 <= sm); }
                if let Some(sz) = size_max { prop_assert!(segs.iter().all(|&s| s <= sz)); }
                if i + 1 < p.len() { prop_assert_eq!(ch.len % 512, 0); }
                next += ch.len;
            }
            prop_assert_eq!(next, len);
        }
    }
}
