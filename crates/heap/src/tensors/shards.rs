//! Every shard of a checkpoint loaded into one map, or none.
//!
//! ```text
//!   resolve (index) ─► open every shard: header, plan ─► cross-check names
//!        ─► room for all buffers? ─► fill K shards at once (threads), their
//!           buffers made by allocator threads shared by all of them
//!        ─► every file unchanged? ─► one map
//! ```
//!
//! All headers are read and checked against each other (and the index)
//! before any tensor byte is, so a missing shard, a tensor in two shards or
//! a hostile header fails at once; a failure later (a read, a file changed
//! during the load) drops every buffer: nothing is returned half-loaded.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use iopath_sys::lock;

use super::index::{resolve, Checkpoint};
use super::shard::OpenShard;
use super::{Shard, Tensor, Tensors};
use crate::engine::SharedChoice;
use crate::loader::{alloc_one, Allocated};
use crate::{Buffer, Error, Heap, LoadOptions, LoadStats, Progress, Result};

/// Shards loaded at once by [`crate::load_safetensors`].
pub const DEFAULT_SHARDS_AT_ONCE: usize = 2;

/// Loads the checkpoint at `path` (a safetensors file, a directory, or an
/// `*.index.json`: see [`crate::load_safetensors`]) with up to `at_once`
/// shards loading at the same time, each on its own thread with its own
/// engine. `progress` is called on the caller's thread after every read,
/// with the whole load's bytes and the shard's own.
///
/// # Errors
/// As [`crate::load_safetensors`]; `at_once` 0 counts as 1.
pub fn load_checkpoint(
    path: &Path,
    heap: &dyn Heap,
    opts: &LoadOptions,
    at_once: usize,
    progress: &mut dyn FnMut(&Progress),
) -> Result<Tensors> {
    let start = Instant::now();
    let page = opts.checked_page()?;
    let ck = resolve(path)?;
    let n = ck.shards.len();
    check_files(n)?;
    let in_shard = |i: usize, e: Error| {
        if ck.single {
            e
        } else {
            Error::Shard {
                index: i + 1,
                count: n,
                path: ck.shards[i].clone(),
                source: Box::new(e),
            }
        }
    };
    let opened = ck
        .shards
        .iter()
        .enumerate()
        .map(|(i, p)| OpenShard::open(p, heap, opts, page).map_err(|e| in_shard(i, e)))
        .collect::<Result<Vec<_>>>()?;
    cross_check(path, &ck, &opened)?;
    check_room(heap, &opened)?;
    let filled = fill_all(heap, opts, &opened, at_once.max(1), start, progress)
        .map_err(|(i, e)| in_shard(i, e))?;
    for (i, s) in opened.iter().enumerate() {
        s.check_unchanged().map_err(|e| in_shard(i, e))?;
    }
    Ok(merge(ck, opened, filled, start.elapsed()))
}

/// Fails when a tensor is in two shards, or when the index and the shards
/// disagree on where a tensor is.
fn cross_check(path: &Path, ck: &Checkpoint, opened: &[OpenShard]) -> Result<()> {
    let bad = |reason: String| Error::Checkpoint {
        path: path.to_path_buf(),
        reason,
    };
    let file = |i: usize| {
        crate::error::escaped(
            &ck.shards[i]
                .file_name()
                .unwrap_or_default()
                .to_string_lossy(),
        )
    };
    let mut found: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, s) in opened.iter().enumerate() {
        for (name, _) in &s.header.tensors {
            if let Some(j) = found.insert(name, i) {
                return Err(bad(format!(
                    "tensor {name:?} is in two shards: {} and {}",
                    file(j),
                    file(i)
                )));
            }
            match ck.weight_map.as_ref().map(|m| m.get(name)) {
                Some(None) => {
                    return Err(bad(format!(
                        "tensor {name:?} of shard {} is not in the index",
                        file(i)
                    )))
                }
                Some(Some(&want)) if want != i => {
                    return Err(bad(format!(
                        "tensor {name:?} is in shard {} but the index names shard {}",
                        file(i),
                        file(want)
                    )))
                }
                _ => {}
            }
        }
    }
    for (name, &i) in ck.weight_map.iter().flatten() {
        if !found.contains_key(name.as_str()) {
            return Err(bad(format!(
                "the index names tensor {name:?} in shard {}, which does not hold it",
                file(i)
            )));
        }
    }
    Ok(())
}

/// Files a shard holds open while the load runs at most: its own, its
/// direct-I/O descriptor, and its first buffer.
const FILES_PER_SHARD: usize = 3;

/// Before any shard is opened: raises the open-file limit (to the hard
/// one) when `shards` would not fit under it, and refuses a checkpoint
/// whose shards cannot all be open with a buffer each even then.
fn check_files(shards: usize) -> Result<()> {
    if shards < 2 {
        return Ok(());
    }
    let room = crate::limits::buffer_room(shards.saturating_mul(FILES_PER_SHARD));
    let needed = 2 * shards as u64;
    if needed > room.buffers {
        return Err(Error::TooManyShards {
            shards: shards as u64,
            needed,
            room: room.buffers,
            what: room.what,
            fix: room.fix,
        });
    }
    Ok(())
}

/// The smallest buffer size, a multiple of `granule`, at which shards of
/// `needs` bytes each (those with anything to read) take at most `room`
/// buffers, a shard's bytes in buffers of its own; `None` when no size
/// can do (more such shards than `room`).
fn min_buffer_size(needs: &[u64], room: u64, granule: u64) -> Option<u64> {
    if needs.len() as u64 > room {
        return None;
    }
    let buffers = |bs: u64| -> u64 { needs.iter().map(|n| n.div_ceil(bs)).sum() };
    let granule = granule.max(1);
    let (mut lo, mut hi) = (1u64, needs.iter().max()?.div_ceil(granule).max(1));
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if buffers(mid * granule) <= room {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    Some(lo * granule)
}

/// Refuses, before anything is allocated, a load whose buffers cannot fit
/// in the memory the heap can give now or in the buffers the process may
/// have.
fn check_room(heap: &dyn Heap, opened: &[OpenShard]) -> Result<()> {
    let needed: u64 = opened.iter().map(OpenShard::needed).sum();
    if let Some((available, what)) = heap.available() {
        if needed > available {
            return Err(Error::OutOfMemory {
                needed,
                available,
                what,
            });
        }
    }
    // A shard with mapped tensors holds its file's buffer too.
    let buffers: usize = opened
        .iter()
        .map(|s| s.plan.sizes.len() + usize::from(s.file_buffer().is_some()))
        .sum();
    let room = crate::limits::buffer_room(buffers);
    if buffers as u64 > room.buffers {
        let granule = heap.granule().max(crate::page_size()) as u64;
        // Each shard's bytes are in buffers of its own: a larger size
        // helps only down to one buffer per shard.
        let needs: Vec<u64> = opened
            .iter()
            .map(OpenShard::needed)
            .filter(|&n| n > 0)
            .collect();
        return Err(match min_buffer_size(&needs, room.buffers, granule) {
            Some(min_buffer_size) => Error::TooManyBuffers {
                buffers: buffers as u64,
                buffer_size: opened.first().map_or(0, |s| s.cap),
                room: room.buffers,
                what: room.what,
                min_buffer_size,
            },
            None => Error::TooManyShards {
                shards: opened.len() as u64,
                needed: needs.len() as u64,
                room: room.buffers,
                what: room.what,
                fix: room.fix,
            },
        });
    }
    Ok(())
}

/// What the shard threads tell the caller's thread.
enum Msg {
    Progress(usize, Progress),
    Done(usize, Result<OneFilled>),
}

/// One shard's buffers and what filling them took.
type OneFilled = (Vec<Buffer>, LoadStats);
type Filled = Vec<OneFilled>;

/// The order the checkpoint's allocator threads make every shard's
/// buffers in, as `(shard, buffer)`: the shards in groups of `at_once`, as
/// the shard threads take them, and each group's buffers taken in turn
/// from its shards, so each of the shards being read gets its next
/// buffer soon.
fn alloc_order(buffers: &[usize], at_once: usize) -> Vec<(usize, usize)> {
    let shards: Vec<usize> = (0..buffers.len()).collect();
    let mut order = Vec::with_capacity(buffers.iter().sum());
    for group in shards.chunks(at_once.max(1)) {
        let most = group.iter().map(|&i| buffers[i]).max().unwrap_or(0);
        for b in 0..most {
            order.extend(group.iter().filter(|&&i| b < buffers[i]).map(|&i| (i, b)));
        }
    }
    order
}

/// Fills every shard, `at_once` at a time; the first failure (with its
/// shard's index) stops shards not yet started.
///
/// One set of allocator threads makes every shard's buffers, in
/// [`alloc_order`], so they allocate ahead into the next shards while
/// the current ones read (an allocator of each shard's own started with
/// the shard, its first read waiting for its first buffer):
/// `opts.alloc_threads` for each shard loading at once, as many as
/// before. One thread for all was measured too: no faster cold, and
/// 0.9x main warm and half-warm, where allocation is the whole cost.
fn fill_all(
    heap: &dyn Heap,
    opts: &LoadOptions,
    opened: &[OpenShard],
    at_once: usize,
    start: Instant,
    progress: &mut dyn FnMut(&Progress),
) -> std::result::Result<Filled, (usize, Error)> {
    let n = opened.len();
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    // The shard that failed first: later failures may be its echo (an
    // allocator stopped by it).
    let first_failure: Mutex<Option<usize>> = Mutex::new(None);
    let total: u64 = opened
        .iter()
        .flat_map(|s| &s.plan.reads)
        .map(|r| r.len as u64)
        .sum();
    let reads_total: usize = opened.iter().map(|s| s.plan.reads.len()).sum();
    let mut results: Vec<Option<Result<OneFilled>>> = (0..n).map(|_| None).collect();
    // One probe for the whole checkpoint, not one per shard: a shard is
    // often smaller than what a probe measures.
    let choice = Arc::new(SharedChoice::new());
    let counts: Vec<usize> = opened.iter().map(|s| s.plan.sizes.len()).collect();
    let order = alloc_order(&counts, at_once);
    let claimed = AtomicUsize::new(0);
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..n)
        .map(|_| {
            let (tx, rx) = mpsc::channel::<Allocated>();
            (tx, Mutex::new(Some(rx)))
        })
        .unzip();
    std::thread::scope(|s| {
        for _ in 0..opts.alloc_threads.max(1) * at_once.clamp(1, n.max(1)) {
            let senders = senders.clone();
            let (order, claimed, failed) = (&order, &claimed, &failed);
            s.spawn(move || loop {
                if failed.load(Ordering::Acquire) {
                    break;
                }
                let k = claimed.fetch_add(1, Ordering::Relaxed);
                let Some(&(i, b)) = order.get(k) else { break };
                let r = alloc_one(heap, opened[i].plan.sizes[b], opts.prefault);
                let stop = r.is_err();
                // A shard that stopped reading dropped its receiver.
                let _ = senders[i].send((b, r));
                if stop {
                    break;
                }
            });
        }
        drop(senders);
        let (tx, rx) = mpsc::channel::<Msg>();
        for _ in 0..at_once.min(n) {
            let tx = tx.clone();
            let (next, failed, choice) = (&next, &failed, &choice);
            let (receivers, first_failure) = (&receivers, &first_failure);
            s.spawn(move || loop {
                if failed.load(Ordering::Acquire) {
                    break;
                }
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(shard) = opened.get(i) else { break };
                let buffers = lock(&receivers[i]).take();
                let r = match buffers {
                    Some(rx) => shard.fill_from(opts, choice, &rx, &mut |p| {
                        let _ = tx.send(Msg::Progress(i, *p));
                    }),
                    None => Err(Error::Loader("a shard was claimed twice".into())),
                };
                let r = r.map(|(b, mut stats)| {
                    stats.elapsed = start.elapsed();
                    (b, stats)
                });
                if r.is_err() {
                    lock(first_failure).get_or_insert(i);
                    failed.store(true, Ordering::Release);
                }
                let _ = tx.send(Msg::Done(i, r));
            });
        }
        drop(tx);
        let mut shard_bytes = vec![0u64; n];
        let (mut bytes, mut reads) = (0u64, 0usize);
        for msg in rx {
            match msg {
                Msg::Progress(i, p) => {
                    bytes += p.bytes - shard_bytes[i];
                    shard_bytes[i] = p.bytes;
                    reads += 1;
                    progress(&Progress {
                        bytes,
                        total,
                        buffers: reads,
                        buffers_total: reads_total,
                        shard: i,
                        shards: n,
                        shard_bytes: p.bytes,
                        shard_total: p.total,
                    });
                }
                Msg::Done(i, r) => results[i] = Some(r),
            }
        }
    });
    let first = *lock(&first_failure);
    if let Some(i) = first {
        if let Some(Some(Err(e))) = results.get_mut(i).map(Option::take) {
            return Err((i, e));
        }
    }
    let mut out = Vec::with_capacity(n);
    for (i, r) in results.into_iter().enumerate() {
        match r {
            Some(Ok(f)) => out.push(f),
            Some(Err(e)) => return Err((i, e)),
            // Shards are claimed in order, so one never started comes
            // after the failed one returned above.
            None => {}
        }
    }
    if out.len() < n {
        return Err((0, Error::Loader("a shard was never loaded".into())));
    }
    Ok(out)
}

/// One map of every shard's tensors, buffer indices counted across shards.
fn merge(ck: Checkpoint, opened: Vec<OpenShard>, filled: Filled, elapsed: Duration) -> Tensors {
    let mut tensors = BTreeMap::new();
    let mut buffers = Vec::new();
    let mut metadata = ck.metadata;
    let mut shards = Vec::with_capacity(opened.len());
    let mut stats: Option<LoadStats> = None;
    for (i, (s, (bufs, st))) in opened.into_iter().zip(filled).enumerate() {
        let base = buffers.len();
        let file_buf = s.file_buffer();
        let mut places = s.plan.places.iter();
        for (((name, info), &(f, len, _)), &mapped) in
            s.header.tensors.into_iter().zip(&s.spans).zip(&s.mapped)
        {
            // A mapped tensor is at its file offset in the file's buffer;
            // the others where the plan put them (in file order).
            let (b, off) = match (mapped, file_buf) {
                (true, Some(fb)) => (fb, f as usize),
                _ => *places.next().expect("a place per planned tensor"),
            };
            let t = Tensor {
                buffer: bufs[b].clone(),
                buffer_index: base + b,
                offset: off,
                len,
                dtype: info.dtype,
                shape: info.shape,
                shard: i,
                file_offset: f,
            };
            tensors.insert(name, t);
        }
        for (k, v) in s.header.metadata {
            metadata.entry(k).or_insert(v);
        }
        buffers.extend(bufs);
        shards.push(Shard {
            path: s.path,
            tensors: s.spans.len(),
            stats: st,
        });
        stats = Some(match stats {
            None => st,
            Some(a) => LoadStats {
                bytes: a.bytes + st.bytes,
                buffers: a.buffers + st.buffers,
                buffer_size: a.buffer_size.max(st.buffer_size),
                alloc_time: a.alloc_time + st.alloc_time,
                read_time: a.read_time + st.read_time,
                fallbacks: a.fallbacks + st.fallbacks,
                from_cache: a.from_cache + st.from_cache,
                mapped: a.mapped + st.mapped,
                populate: a.populate.or(st.populate),
                ..a
            },
        });
    }
    let mut stats = stats.expect("a checkpoint has at least one shard");
    stats.elapsed = elapsed;
    Tensors {
        tensors,
        buffers,
        metadata,
        shards,
        stats,
    }
}

#[cfg(test)]
mod tests {
    use super::{alloc_order, min_buffer_size};

    #[test]
    fn the_advised_buffer_size_counts_a_buffer_per_shard() {
        const M: u64 = 1 << 20;
        // 3 shards of 10, 1 and 1 MiB in 6 buffers: 2.5 MiB (4 + 1 + 1);
        // the whole's 12 MiB / 6 would say 2 MiB, which makes 7.
        assert_eq!(min_buffer_size(&[10 * M, M, M], 6, 4096), Some(5 * M / 2));
        assert_eq!(min_buffer_size(&[10 * M, M, M], 3, 4096), Some(10 * M));
        // More shards than buffers: no size can do.
        assert_eq!(min_buffer_size(&[4096; 10], 9, 4096), None);
        assert_eq!(min_buffer_size(&[4096; 10], 10, 4096), Some(4096));
    }

    #[test]
    fn one_allocator_takes_each_group_of_shards_in_turn() {
        // Shards of 2, 3, 1 and 2 buffers, two at once.
        assert_eq!(
            alloc_order(&[2, 3, 1, 2], 2),
            [
                (0, 0),
                (1, 0),
                (0, 1),
                (1, 1),
                (1, 2),
                (2, 0),
                (3, 0),
                (3, 1)
            ]
        );
        // One at once: shard after shard; more at once than shards: all
        // of them in turn.
        assert_eq!(alloc_order(&[2, 1], 1), [(0, 0), (0, 1), (1, 0)]);
        assert_eq!(alloc_order(&[1, 2], 8), [(0, 0), (1, 0), (1, 1)]);
        assert_eq!(alloc_order(&[], 2), []);
        // Every buffer exactly once.
        let mut all = alloc_order(&[3, 0, 5, 1, 4], 3);
        all.sort_unstable();
        let want: Vec<_> = [3, 0, 5, 1, 4]
            .iter()
            .enumerate()
            .flat_map(|(i, &n)| (0..n).map(move |b| (i, b)))
            .collect();
        assert_eq!(all, want);
    }
}
