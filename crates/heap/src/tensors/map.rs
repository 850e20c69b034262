//! Tensors that are views of their file: with
//! [`crate::LoadOptions::map_cached`], a tensor whose bytes are all in the
//! page cache when the load starts is not copied but mapped, in one
//! private mapping of the whole file ([`Buffer::map_file`]), its pages made
//! resident inside the load; the other tensors are planned and read as
//! usual.
//!
//! ```text
//!   file:   [hdr][t0 cached][t1 cold][t2 cached][t3 partly cached]
//!   cache_runs ─► mapped: t0, t2  ─► Buffer::map_file (refused: read them)
//!                                     + populate_read(t0), (t2)
//!                 planned: t1, t3 ─► heap buffers, engines (auto: direct I/O)
//! ```
//!
//! The header decides nothing here: every span is inside the file (the
//! header check makes the data end exactly at the file's end), and the
//! mapping is the file's own length, so a view can never reach past it.

use std::os::fd::AsFd;

use crate::engine::{cache_runs, CacheLookup, CacheRun};
use crate::file::IoFile;
use crate::{Buffer, Error, Result};

/// Which of `spans` (file order; `(file offset, len, align)`) to map: a
/// non-empty tensor aligned for its dtype in the file (so its view is
/// too) whose every page is in the page cache now.
///
/// # Errors
/// As [`cache_runs`].
pub(super) fn cached_spans(file: &IoFile, spans: &[(u64, usize, usize)]) -> Result<Vec<bool>> {
    let (Some(first), Some(last)) = (spans.first(), spans.last()) else {
        return Ok(Vec::new());
    };
    let (lo, hi) = (first.0, last.0 + last.1 as u64);
    let runs = cache_runs(file, lo, hi.saturating_sub(lo), CacheLookup::Auto)?;
    Ok(mark(&runs, spans))
}

/// For each span, whether the cached runs among `runs` (file order,
/// disjoint) cover it whole.
fn mark(runs: &[CacheRun], spans: &[(u64, usize, usize)]) -> Vec<bool> {
    let cached: Vec<(u64, u64)> = runs
        .iter()
        .filter(|r| r.cached)
        .map(|r| (r.off, r.off + r.len))
        .collect();
    spans
        .iter()
        .map(|&(f, len, align)| {
            if len == 0 || f % align as u64 != 0 {
                return false;
            }
            let end = f + len as u64;
            // The last cached run starting at or before `f` must reach
            // `end` (neighbouring cached runs are merged, so one run
            // covers a cached span).
            let i = cached.partition_point(|&(s, _)| s <= f);
            i > 0 && cached[i - 1].1 >= end
        })
        .collect()
}

/// The whole file (`size` bytes) mapped private: the buffer mapped
/// tensors are views of.
///
/// # Errors
/// As [`Buffer::map_file`]; [`Error::Sys`] if the file's fd cannot be
/// duplicated.
pub(super) fn map_file(file: &IoFile, size: u64) -> Result<Buffer> {
    let fd = file
        .fd()
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| Error::sys("dup", e))?;
    let len = usize::try_from(size).map_err(|_| Error::BadMessage("file too large to map"))?;
    Buffer::map_file(fd, len)
}

/// Makes the pages of every span marked in `mapped` resident in `buf`,
/// the file's buffer (neighbouring spans in one call).
///
/// # Errors
/// As [`Buffer::populate_read`].
pub(super) fn populate_spans(
    buf: &Buffer,
    spans: &[(u64, usize, usize)],
    mapped: &[bool],
) -> Result<()> {
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    for (&(f, n, _), _) in spans.iter().zip(mapped).filter(|(_, &m)| m) {
        let end = f + n as u64;
        match ranges.last_mut() {
            // Contiguous or a gap inside one page apart: one range.
            Some((_, e)) if f <= *e + crate::page_size() as u64 => *e = (*e).max(end),
            _ => ranges.push((f, end)),
        }
    }
    populate(buf, &ranges)
}

/// Bytes per [`Buffer::populate_read`] call: pieces the threads share.
const PIECE: u64 = 32 << 20;

/// Threads making a shard's mapped tensors resident. Two measured faster
/// than one on 2 CPUs (1 GiB warm, fresh processes, alternating, load
/// average 5-7: medians 4.5 against 1.5-1.7 GiB/s, one file and 8 shards;
/// noisy).
const POPULATE_THREADS: usize = 2;

/// Makes `ranges` of `buf` resident, in pieces of [`PIECE`] shared by up
/// to two threads (the page-table work of mapping a page is CPU work; a
/// second CPU halves it).
fn populate(buf: &Buffer, ranges: &[(u64, u64)]) -> Result<()> {
    let pieces: Vec<(u64, u64)> = ranges
        .iter()
        .flat_map(|&(s, e)| {
            (s..e)
                .step_by(PIECE as usize)
                .map(move |o| (o, (o + PIECE).min(e)))
        })
        .collect();
    let threads = POPULATE_THREADS.min(pieces.len()).max(1);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let work = || -> Result<()> {
        loop {
            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let Some(&(s, e)) = pieces.get(i) else {
                return Ok(());
            };
            buf.populate_read(s as usize, (e - s) as usize)?;
        }
    };
    std::thread::scope(|sc| {
        let others: Vec<_> = (1..threads).map(|_| sc.spawn(work)).collect();
        let mine = work();
        others
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::Loader("a populate thread panicked".into())))
            })
            .fold(mine, Result::and)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(off: u64, len: u64, cached: bool) -> CacheRun {
        CacheRun { off, len, cached }
    }

    #[test]
    fn only_whole_aligned_cached_spans_are_mapped() {
        let runs = [run(0, 100, true), run(100, 50, false), run(150, 100, true)];
        let spans = [
            (8, 40, 4),   // inside the first run
            (48, 60, 4),  // crosses into the cold run
            (154, 8, 8),  // cached but misaligned for 8
            (160, 90, 2), // cached to the end
            (160, 91, 1), // one byte past the cached run
            (200, 0, 1),  // empty
        ];
        assert_eq!(
            mark(&runs, &spans),
            vec![true, false, false, true, false, false]
        );
        assert_eq!(mark(&[], &spans[..1]), vec![false]);
    }
}
