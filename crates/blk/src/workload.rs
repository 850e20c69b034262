//! A dd-like workload on a [`BlkDriver`]: many blocks in flight on every
//! queue, sequential or random offsets, a data pattern and its check.
//!
//! (Over 700 lines with its tests and its error enum; the engine proper,
//! `drive` / `pass` / `queue_pass`, is about 200.)
//!
//! ```text
//!  Workload ─► Blocks (one buffer slot per block in flight)
//!      └─► drive: runs × pass ─► queue_pass per queue (its own thread)
//!              block k of the order ─► device block order(k) ─► submit
//!              completion ─► next block into the freed slot
//!          verify: one more pass reading the range, checked against the pattern
//!  ◄─ Outcome { runs: per-run timings }        (callers summarise with Stats)
//! ```
//!
//! Random access visits every block of the range exactly once per pass, in
//! an order drawn from a seeded permutation (as fio's random map does), so
//! a pattern written at random offsets verifies like a sequential one and a
//! seed gives the same order again.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

use iopath_dma::DmaOps;
use iopath_heap::{page_size, Buffer, Heap, HugePages, MemfdHeap};
use serde::Serialize;

use crate::driver::{BlkDriver, BlkError, BlkQueue, Request};

/// Direction of the transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Op {
    /// Write blocks to the device.
    Write,
    /// Read blocks from the device.
    Read,
}

/// Data written, and expected by a verify pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Pattern {
    /// All bytes zero.
    Zero,
    /// Each 8-byte little-endian word holds its own byte offset on the device.
    Seq,
}

/// Order in which the blocks of the range are visited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Access {
    /// Block 0, 1, 2, ... of the range.
    Seq,
    /// Every block of the range once, in a seeded random order.
    Rand,
}

/// An enum that has command-line names.
macro_rules! names {
    ($t:ty, $what:literal, $($v:ident => $n:literal),+) => {
        impl $t {
            /// Every name, in declaration order.
            pub const NAMES: &'static [&'static str] = &[$($n),+];

            /// The name used on command lines and in reports.
            pub fn name(self) -> &'static str {
                match self { $(<$t>::$v => $n),+ }
            }
        }

        impl FromStr for $t {
            type Err = WorkloadError;

            fn from_str(s: &str) -> Result<Self, WorkloadError> {
                match s {
                    $($n => Ok(<$t>::$v),)+
                    _ => Err(WorkloadError::UnknownName {
                        what: $what,
                        got: s.to_string(),
                        accepted: Self::NAMES,
                    }),
                }
            }
        }

        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

names!(Op, "op", Write => "write", Read => "read");
names!(Pattern, "pattern", Zero => "zero", Seq => "seq");
names!(Access, "access", Seq => "seq", Rand => "rand");

/// What to run: the block size, range, depth and data of a dd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Workload {
    /// Write or read.
    pub op: Op,
    /// Data written, and expected by `verify`.
    pub pattern: Pattern,
    /// Sequential or random block order.
    pub access: Access,
    /// Seed of the random order (`Access::Rand`).
    pub seed: u64,
    /// Bytes per block (a positive multiple of 512).
    pub bs: usize,
    /// Blocks per pass.
    pub count: u64,
    /// Byte offset of block 0 on the device (a multiple of 512).
    pub offset: u64,
    /// Blocks in flight at once, over all queues (1 to 256, at least one
    /// per queue the driver uses).
    pub queue_depth: usize,
    /// Timed passes.
    pub runs: usize,
    /// After the runs, read the range back and check it against `pattern`.
    pub verify: bool,
}

impl Default for Workload {
    /// 1024 sequential writes of 8 MiB zeros, 4 in flight, one run.
    fn default() -> Self {
        Workload {
            op: Op::Write,
            pattern: Pattern::Zero,
            access: Access::Seq,
            seed: 0,
            bs: 8 << 20,
            count: 1024,
            offset: 0,
            queue_depth: 4,
            runs: 1,
            verify: false,
        }
    }
}

/// Most blocks in flight a workload may ask for.
pub const MAX_QUEUE_DEPTH: usize = 256;

impl Workload {
    /// Bytes moved by one pass.
    pub fn bytes(&self) -> u64 {
        self.bs as u64 * self.count
    }

    /// Checks the fields against each other (not against a device).
    ///
    /// # Errors
    /// [`WorkloadError::Invalid`] naming the field and what it accepts;
    /// [`WorkloadError::Overflow`] when the range does not fit in 64 bits.
    pub fn validate(&self) -> Result<(), WorkloadError> {
        let bad = |field, value, accepted| {
            Err(WorkloadError::Invalid {
                field,
                value,
                accepted,
            })
        };
        if self.bs == 0 || self.bs % 512 != 0 {
            return bad("bs", self.bs as u64, "a positive multiple of 512 bytes");
        }
        if self.offset % 512 != 0 {
            return bad("offset", self.offset, "a multiple of 512 bytes");
        }
        if self.count == 0 {
            return bad("count", 0, "at least 1");
        }
        if self.runs == 0 {
            return bad("runs", 0, "at least 1");
        }
        if self.queue_depth == 0 || self.queue_depth > MAX_QUEUE_DEPTH {
            return bad("queue_depth", self.queue_depth as u64, "1 to 256");
        }
        let len = (self.bs as u64)
            .checked_mul(self.count)
            .ok_or(WorkloadError::Overflow {
                what: "bs x count",
                limit: u64::MAX,
            })?;
        len.checked_add(self.offset)
            .ok_or(WorkloadError::Overflow {
                what: "offset + bs x count",
                limit: u64::MAX,
            })?;
        Ok(())
    }

    /// Device byte offset of the `k`th block of a pass.
    fn device_offset(&self, order: &Order, k: u64) -> u64 {
        self.offset + order.block(k) * self.bs as u64
    }
}

/// Errors of a workload.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// A field out of its range.
    #[error("Workload {field} = {value} is not accepted: it must be {accepted}")]
    Invalid {
        /// The field of [`Workload`] at fault.
        field: &'static str,
        /// Its value.
        value: u64,
        /// What it accepts.
        accepted: &'static str,
    },
    /// A name that is none of an enum's.
    #[error("Unknown {what} {got:?} (accepted: {accepted:?})")]
    UnknownName {
        /// Which enum.
        what: &'static str,
        /// The name given.
        got: String,
        /// The names accepted.
        accepted: &'static [&'static str],
    },
    /// A product or sum of fields does not fit.
    #[error("{what} overflows (at most {limit})")]
    Overflow {
        /// The expression, in field names.
        what: &'static str,
        /// Its largest value.
        limit: u64,
    },
    /// Fewer blocks in flight than queues: a queue would idle.
    #[error("Queue depth {queue_depth} is less than the {queues} queues: each queue needs a block in flight")]
    DepthBelowQueues {
        /// Blocks in flight.
        queue_depth: usize,
        /// Queues the driver uses.
        queues: usize,
    },
    /// The range ends past the device.
    #[error("Range end {end} is past the device's end ({capacity} bytes)")]
    PastEnd {
        /// offset + bs x count.
        end: u64,
        /// Device capacity.
        capacity: u64,
    },
    /// A write workload on a read-only device.
    #[error("The device is read-only")]
    ReadOnly,
    /// The block buffers cannot be allocated.
    #[error("Cannot allocate {len} bytes of block buffers")]
    Alloc {
        /// Bytes asked for.
        len: usize,
        /// The heap's error.
        #[source]
        source: iopath_heap::Error,
    },
    /// A block buffer access failed.
    #[error(transparent)]
    Heap(#[from] iopath_heap::Error),
    /// A block could not be submitted.
    #[error("Cannot submit block {block} (device byte {offset})")]
    Submit {
        /// Index of the block in the range.
        block: u64,
        /// Its device byte offset.
        offset: u64,
        /// The driver's error.
        #[source]
        source: BlkError,
    },
    /// The device failed a block.
    #[error("Block {block} (device byte {offset}) failed")]
    Block {
        /// Index of the block in the range.
        block: u64,
        /// Its device byte offset.
        offset: u64,
        /// The driver's error.
        #[source]
        source: BlkError,
    },
    /// Waiting for a completion (or a flush) failed.
    #[error(transparent)]
    Driver(#[from] BlkError),
    /// A completion whose tag is no slot in flight.
    #[error("Completion for tag {tag}, which no block in flight has")]
    UnknownTag {
        /// The tag.
        tag: u64,
    },
    /// The verify pass read data that is not the pattern.
    #[error("Verify failed: the device's byte {offset} differs from the {pattern} pattern")]
    Mismatch {
        /// Lowest device byte offset of a bad 8-byte word.
        offset: u64,
        /// The pattern expected.
        pattern: Pattern,
    },
    /// A queue's thread panicked.
    #[error("The thread of queue {queue} panicked")]
    Panicked {
        /// The queue.
        queue: usize,
    },
}

/// Fills `out` with the `seq` pattern for device byte offset `dev_off`.
/// `dev_off` and `out.len()` are multiples of 8.
pub fn fill_seq(out: &mut [u8], dev_off: u64) {
    for (i, w) in out.chunks_exact_mut(8).enumerate() {
        w.copy_from_slice(&(dev_off + 8 * i as u64).to_le_bytes());
    }
}

/// First mismatch of `got` against `pattern` at device offset `dev_off`.
pub fn check_pattern(got: &[u8], pattern: Pattern, dev_off: u64) -> Option<u64> {
    match pattern {
        // Word-granular like `Seq`: the offset of the first 8-byte word that
        // is not zero.
        Pattern::Zero => got
            .iter()
            .position(|&b| b != 0)
            .map(|i| dev_off + (i as u64 & !7)),
        Pattern::Seq => got.chunks_exact(8).enumerate().find_map(|(i, w)| {
            let want = dev_off + 8 * i as u64;
            (w != want.to_le_bytes()).then_some(want)
        }),
    }
}

/// One timed run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Run {
    /// Wall time of the run.
    pub seconds: f64,
    /// Throughput in GiB/s.
    pub gib_per_s: f64,
}

impl Run {
    /// A run that moved `bytes` in `elapsed`.
    pub fn new(bytes: u64, elapsed: Duration) -> Self {
        let seconds = elapsed.as_secs_f64();
        Run {
            seconds,
            gib_per_s: bytes as f64 / seconds.max(1e-9) / f64::from(1u32 << 30),
        }
    }
}

/// Median, min, max and spread of a series.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Stats {
    /// Median.
    pub median: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
    /// (max - min) / median (0 when the median is 0).
    pub spread: f64,
}

impl Stats {
    /// Stats of a series (NaN when empty).
    pub fn of(values: &[f64]) -> Self {
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = match n {
            0 => f64::NAN,
            _ if n % 2 == 1 => v[n / 2],
            _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        };
        let min = v.first().copied().unwrap_or(f64::NAN);
        let max = v.last().copied().unwrap_or(f64::NAN);
        Stats {
            median,
            min,
            max,
            spread: if median == 0.0 {
                0.0
            } else {
                (max - min) / median
            },
        }
    }
}

/// What a workload measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// Each timed run, in order.
    pub runs: Vec<Run>,
    /// Whether a verify pass read the range back and it matched the
    /// pattern (`false`: none was asked for; a mismatch is an error).
    pub verified: bool,
}

/// Called as a workload advances (from the queues' threads, hence `Sync`);
/// `()` ignores everything.
pub trait Progress: Sync {
    /// Timed run `run` (from 0) of `runs` starts.
    fn run_started(&self, run: usize, runs: usize) {
        let _ = (run, runs);
    }
    /// A block of a timed run completed.
    fn block_done(&self) {}
}

impl Progress for () {}

/// The memory of the blocks in flight: one slot per request.
///
/// When the CPU never writes a block during a pass (zeros, or reads), all
/// slots are ranges of one buffer, so the device needs one memory region for
/// them (vhost-user back ends may accept as few as 8 regions, and the rings
/// take some). Writing the `seq` pattern needs a buffer per slot: a buffer
/// with any range mapped for the device refuses CPU writes.
#[derive(Debug)]
pub struct Blocks {
    distinct: Vec<Buffer>,
    slots: Vec<(Buffer, usize)>,
}

impl Blocks {
    /// Allocates the slots `w` needs from a memfd heap (each buffer rounded
    /// up to whole pages).
    ///
    /// # Errors
    /// [`WorkloadError::Overflow`], [`WorkloadError::Alloc`].
    pub fn new(w: &Workload) -> Result<Self, WorkloadError> {
        let heap = MemfdHeap::new(HugePages::None);
        let alloc = |len: usize| {
            let page = page_size();
            let rounded = len
                .checked_next_multiple_of(page)
                .ok_or(WorkloadError::Overflow {
                    what: "bs x queue_depth",
                    limit: usize::MAX as u64,
                })?;
            heap.alloc(rounded).map_err(|source| WorkloadError::Alloc {
                len: rounded,
                source,
            })
        };
        let per_slot = w.op == Op::Write && w.pattern == Pattern::Seq;
        if per_slot {
            let distinct = (0..w.queue_depth)
                .map(|_| alloc(w.bs))
                .collect::<Result<Vec<_>, _>>()?;
            let slots = distinct.iter().map(|b| (b.clone(), 0)).collect();
            Ok(Blocks { distinct, slots })
        } else {
            let len =
                w.bs.checked_mul(w.queue_depth)
                    .ok_or(WorkloadError::Overflow {
                        what: "bs x queue_depth",
                        limit: usize::MAX as u64,
                    })?;
            let b = alloc(len)?;
            let slots = (0..w.queue_depth).map(|i| (b.clone(), i * w.bs)).collect();
            Ok(Blocks {
                distinct: vec![b],
                slots,
            })
        }
    }

    /// The distinct buffers (register these with the DMA ops before the
    /// driver shares memory with the device).
    pub fn buffers(&self) -> &[Buffer] {
        &self.distinct
    }
}

/// The order of a pass: block `k` of the pass is device block `block(k)`
/// of the range.
///
/// `Rand` is a bijection on `0..count` without a table: a 4-round Feistel
/// network on the smallest even number of bits covering `count`, walked
/// again from its output while that falls past `count` (cycle walking).
#[derive(Debug, Clone, Copy)]
struct Order {
    count: u64,
    /// Half the Feistel width in bits; 0 for sequential.
    half: u32,
    keys: [u64; 4],
}

impl Order {
    fn new(w: &Workload) -> Self {
        let mut half = 0;
        let mut keys = [0; 4];
        if w.access == Access::Rand && w.count > 1 {
            let bits = 64 - (w.count - 1).leading_zeros();
            half = bits.div_ceil(2).max(1);
            let mut s = w.seed;
            for k in &mut keys {
                *k = splitmix64(&mut s);
            }
        }
        Order {
            count: w.count,
            half,
            keys,
        }
    }

    fn block(&self, k: u64) -> u64 {
        if self.half == 0 {
            return k;
        }
        let mut x = self.feistel(k);
        while x >= self.count {
            x = self.feistel(x);
        }
        x
    }

    fn feistel(&self, x: u64) -> u64 {
        let mask = (1u64 << self.half) - 1;
        let (mut l, mut r) = (x >> self.half, x & mask);
        for key in self.keys {
            let mut s = r ^ key;
            let f = splitmix64(&mut s) & mask;
            (l, r) = (r, l ^ f);
        }
        (l << self.half) | r
    }
}

/// One step of splitmix64 (Steele, Lea, Flood 2014): advances `state`
/// and returns a well-mixed 64-bit value.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Runs `w` on `drv` with the slots of `blocks` (made by [`Blocks::new`]
/// for the same workload, and registered with the driver's ops): `runs`
/// timed passes (each write pass followed by a flush, outside its timing),
/// then the verify pass when asked for. Generic over the ops type: `O =
/// Direct` is the static dispatch build, `O = dyn DmaOps` the dynamic one.
///
/// # Errors
/// [`Workload::validate`]'s; [`WorkloadError::DepthBelowQueues`],
/// [`WorkloadError::PastEnd`], [`WorkloadError::ReadOnly`] before any I/O;
/// a failed block, flush or completion; [`WorkloadError::Mismatch`].
pub fn drive<O: DmaOps + ?Sized>(
    drv: &mut BlkDriver<O>,
    w: &Workload,
    blocks: &Blocks,
    progress: &dyn Progress,
) -> Result<Outcome, WorkloadError> {
    w.validate()?;
    let cfg = *drv.config();
    let queues = drv.num_queues();
    if w.queue_depth < queues {
        return Err(WorkloadError::DepthBelowQueues {
            queue_depth: w.queue_depth,
            queues,
        });
    }
    let end = w.offset + w.bytes();
    if end > cfg.capacity_bytes() {
        return Err(WorkloadError::PastEnd {
            end,
            capacity: cfg.capacity_bytes(),
        });
    }
    if w.op == Op::Write && cfg.read_only {
        return Err(WorkloadError::ReadOnly);
    }
    if w.op == Op::Write && w.pattern == Pattern::Zero {
        // Zero the blocks once, outside the timed runs.
        for b in &blocks.distinct {
            b.fill(0, b.len(), 0)?;
        }
    }
    let mut runs = Vec::with_capacity(w.runs);
    for run in 0..w.runs {
        progress.run_started(run, w.runs);
        let t0 = Instant::now();
        pass(drv, w, blocks, w.op, progress, false)?;
        // Timed like `dd oflag=direct` and fio's O_DIRECT write: up to the
        // last completion. The flush after makes the writes durable.
        runs.push(Run::new(w.bytes(), t0.elapsed()));
        if w.op == Op::Write {
            drv.flush()?;
        }
    }
    if w.verify {
        if let Some(offset) = pass(drv, w, blocks, Op::Read, &(), true)? {
            return Err(WorkloadError::Mismatch {
                offset,
                pattern: w.pattern,
            });
        }
    }
    Ok(Outcome {
        runs,
        verified: w.verify,
    })
}

/// One pass over the range: `count` blocks, block `k` of the order on
/// queue `k % queues`, each queue driven by its own thread with its share
/// of the `queue_depth` slots in flight. With `check`, each block read is
/// compared with the pattern and the lowest bad device offset returned.
///
/// # Errors
/// A block that cannot be submitted or fails, a completion wait that
/// fails, a panicked queue thread.
pub fn pass<O: DmaOps + ?Sized>(
    drv: &mut BlkDriver<O>,
    w: &Workload,
    blocks: &Blocks,
    op: Op,
    progress: &dyn Progress,
    check: bool,
) -> Result<Option<u64>, WorkloadError> {
    let order = Order::new(w);
    let queues = drv.queues_mut();
    let nq = queues.len();
    if nq == 1 {
        return queue_pass(
            &mut queues[0],
            0,
            1,
            w,
            &order,
            &blocks.slots,
            op,
            progress,
            check,
        );
    }
    std::thread::scope(|scope| {
        let workers: Vec<_> = queues
            .iter_mut()
            .enumerate()
            .map(|(qi, q)| {
                // Slots qi, qi + nq, ...: at least one per queue.
                let mine: Vec<_> = blocks.slots.iter().skip(qi).step_by(nq).cloned().collect();
                let order = &order;
                scope.spawn(move || queue_pass(q, qi, nq, w, order, &mine, op, progress, check))
            })
            .collect();
        let mut bad: Option<u64> = None;
        for (qi, worker) in workers.into_iter().enumerate() {
            let b = worker
                .join()
                .map_err(|_| WorkloadError::Panicked { queue: qi })??;
            bad = match (bad, b) {
                (Some(x), Some(y)) => Some(x.min(y)),
                (x, y) => x.or(y),
            };
        }
        Ok(bad)
    })
}

/// The blocks of queue `qi` of `nq` (blocks `qi`, `qi + nq`, ... of the
/// order), with `slots.len()` in flight. Returns the lowest device offset
/// that did not match the pattern, when `check`.
#[allow(clippy::too_many_arguments)]
fn queue_pass<O: DmaOps + ?Sized>(
    q: &mut BlkQueue<O>,
    qi: usize,
    nq: usize,
    w: &Workload,
    order: &Order,
    slots: &[(Buffer, usize)],
    op: Op,
    progress: &dyn Progress,
    check: bool,
) -> Result<Option<u64>, WorkloadError> {
    let bs = w.bs;
    let mut next = (qi as u64..w.count).step_by(nq);
    let mut scratch = Vec::new();
    let mut bad: Option<u64> = None;
    // slot -> (block of the order, device offset) of the request using it.
    let mut busy: Vec<Option<(u64, u64)>> = vec![None; slots.len()];
    loop {
        for (slot, b) in busy.iter_mut().enumerate() {
            if b.is_some() {
                continue;
            }
            let Some(k) = next.next() else { break };
            let offset = w.device_offset(order, k);
            let block = (offset - w.offset) / bs as u64;
            let (buf, buf_offset) = (&slots[slot].0, slots[slot].1);
            if op == Op::Write && w.pattern == Pattern::Seq {
                scratch.resize(bs, 0);
                fill_seq(&mut scratch, offset);
                buf.write_at(buf_offset, &scratch)?;
            }
            let req = match op {
                Op::Write => Request::Write {
                    offset,
                    buf,
                    buf_offset,
                    len: bs,
                },
                Op::Read => Request::Read {
                    offset,
                    buf,
                    buf_offset,
                    len: bs,
                },
            };
            q.submit(req, slot as u64)
                .map_err(|source| WorkloadError::Submit {
                    block,
                    offset,
                    source,
                })?;
            *b = Some((block, offset));
        }
        if busy.iter().all(Option::is_none) {
            return Ok(bad);
        }
        let d = q.complete()?;
        let (block, offset) = usize::try_from(d.tag)
            .ok()
            .and_then(|s| busy.get_mut(s))
            .and_then(Option::take)
            .ok_or(WorkloadError::UnknownTag { tag: d.tag })?;
        d.result.map_err(|source| WorkloadError::Block {
            block,
            offset,
            source,
        })?;
        if check {
            let (buf, at) = &slots[d.tag as usize];
            scratch.resize(bs, 0);
            buf.read_at(*at, &mut scratch)?;
            if let Some(at) = check_pattern(&scratch, w.pattern, offset) {
                // Keep the lowest bad offset whatever order blocks finish in.
                bad = Some(bad.map_or(at, |b| b.min(at)));
            }
        } else {
            progress.block_done();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn seq_pattern_round_trips_and_finds_the_first_bad_word() {
        let mut b = vec![0u8; 4096];
        fill_seq(&mut b, 1 << 20);
        assert_eq!(
            u64::from_le_bytes(b[8..16].try_into().unwrap()),
            (1 << 20) + 8
        );
        assert_eq!(check_pattern(&b, Pattern::Seq, 1 << 20), None);
        b[100] ^= 1;
        assert_eq!(
            check_pattern(&b, Pattern::Seq, 1 << 20),
            Some((1 << 20) + 96)
        );
        // Word 0 holds 1 MiB, not zero.
        assert_eq!(check_pattern(&b, Pattern::Zero, 0), Some(0));
        assert_eq!(check_pattern(&b[..16], Pattern::Zero, 64), Some(64));
    }

    #[test]
    fn stats_of_runs() {
        let s = Stats::of(&[3.0, 1.0, 2.0, 4.0]);
        assert_eq!(s.median, 2.5);
        assert_eq!(s.min, 1.0);
        assert_eq!(s.max, 4.0);
        assert!((s.spread - 1.2).abs() < 1e-12);
        assert_eq!(Stats::of(&[3.0, 1.0, 2.0]).median, 2.0);
        assert!(Stats::of(&[]).median.is_nan());
    }

    #[test]
    fn validate_names_the_field_at_fault() {
        let w = |f: fn(&mut Workload)| {
            let mut w = Workload::default();
            f(&mut w);
            w.validate()
        };
        assert!(w(|_| ()).is_ok());
        let field = |r: Result<(), WorkloadError>| match r {
            Err(WorkloadError::Invalid { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(field(w(|w| w.bs = 1000)), "bs");
        assert_eq!(field(w(|w| w.bs = 0)), "bs");
        assert_eq!(field(w(|w| w.offset = 100)), "offset");
        assert_eq!(field(w(|w| w.count = 0)), "count");
        assert_eq!(field(w(|w| w.runs = 0)), "runs");
        assert_eq!(field(w(|w| w.queue_depth = 257)), "queue_depth");
        assert!(matches!(
            w(|w| w.offset = u64::MAX - 511),
            Err(WorkloadError::Overflow {
                what: "offset + bs x count",
                ..
            })
        ));
        assert!(matches!(
            w(|w| w.count = u64::MAX),
            Err(WorkloadError::Overflow {
                what: "bs x count",
                ..
            })
        ));
    }

    #[test]
    fn names_parse_and_print() {
        for n in Access::NAMES {
            assert_eq!(n.parse::<Access>().unwrap().name(), *n);
        }
        assert_eq!("read".parse::<Op>().unwrap(), Op::Read);
        assert_eq!(Pattern::Seq.to_string(), "seq");
        let e = "sideways".parse::<Access>().unwrap_err().to_string();
        assert!(e.contains("sideways") && e.contains("rand"), "{e}");
    }

    #[test]
    fn sequential_order_is_the_identity() {
        let o = Order::new(&Workload {
            count: 10,
            ..Workload::default()
        });
        assert!((0..10).all(|k| o.block(k) == k));
    }

    #[test]
    fn random_order_depends_on_the_seed_and_repeats_with_it() {
        let w = |seed| Workload {
            access: Access::Rand,
            count: 1000,
            seed,
            ..Workload::default()
        };
        let list = |seed| {
            let o = Order::new(&w(seed));
            (0..1000).map(|k| o.block(k)).collect::<Vec<_>>()
        };
        assert_eq!(list(7), list(7));
        assert_ne!(list(7), list(8));
        assert_ne!(list(7), (0..1000).collect::<Vec<_>>());
    }

    proptest! {
        #[test]
        fn random_order_visits_every_block_once(count in 1u64..5000, seed: u64) {
            let o = Order::new(&Workload {
                access: Access::Rand,
                count,
                seed,
                ..Workload::default()
            });
            let mut seen = vec![false; count as usize];
            for k in 0..count {
                let b = o.block(k);
                prop_assert!(b < count);
                prop_assert!(!seen[b as usize], "block {} twice", b);
                seen[b as usize] = true;
            }
        }
    }
}
