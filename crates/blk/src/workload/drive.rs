//! The engine: runs a [`Workload`] on a driver, every queue on its own
//! thread with its share of the blocks in flight.

use std::time::Instant;

use iopath_dma::DmaOps;
use iopath_heap::Buffer;

use super::blocks::Blocks;
use super::choices::{Op, Pattern};
use super::error::WorkloadError;
use super::order::Order;
use super::pattern::{check_pattern, fill_seq};
use super::spec::Workload;
use super::stats::Run;
use crate::driver::{BlkDriver, BlkQueue, Command};

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
    /// `n` blocks of a timed run completed.
    fn blocks_done(&self, n: u64) {
        let _ = n;
    }
    /// Timed run `run` (from 0) of `runs` completed (its writes flushed),
    /// moving `bytes`: lets a caller report it before the next starts, so
    /// a dd killed later keeps the runs it finished.
    fn run_done(&self, run: usize, runs: usize, bytes: u64, r: &Run) {
        let _ = (run, runs, bytes, r);
    }
}

impl Progress for () {}

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
        let mut latency = Vec::with_capacity(w.count.try_into().unwrap_or(0));
        timed_pass(drv, w, blocks, w.op, progress, false, &mut latency)?;
        // Timed like `dd oflag=direct` and fio's O_DIRECT write: up to the
        // last completion. The flush after makes the writes durable.
        let timed = Run::new(w.bytes(), t0.elapsed(), &mut latency);
        if w.op == Op::Write {
            drv.flush()?;
        }
        progress.run_done(run, w.runs, w.bytes(), &timed);
        runs.push(timed);
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
    timed_pass(drv, w, blocks, op, progress, check, &mut Vec::new())
}

/// [`pass`], adding each block's submission-to-completion time (ns) to
/// `latency`.
fn timed_pass<O: DmaOps + ?Sized>(
    drv: &mut BlkDriver<O>,
    w: &Workload,
    blocks: &Blocks,
    op: Op,
    progress: &dyn Progress,
    check: bool,
    latency: &mut Vec<u32>,
) -> Result<Option<u64>, WorkloadError> {
    let order = Order::new(w);
    let queues = drv.queues_mut();
    let nq = queues.len();
    // The slots for the requests with the device; a single queue also
    // builds its next request in the spare one while the device works.
    let (slots, spare) = blocks.slots.split_at(w.queue_depth);
    if nq == 1 {
        return queue_pass(
            &mut queues[0],
            (0, 1),
            w,
            &order,
            (&blocks.slots, !spare.is_empty()),
            (op, check),
            progress,
            latency,
        );
    }
    std::thread::scope(|scope| {
        let workers: Vec<_> = queues
            .iter_mut()
            .enumerate()
            .map(|(qi, q)| {
                // Slots qi, qi + nq, ...: at least one per queue.
                let mine: Vec<_> = slots.iter().skip(qi).step_by(nq).cloned().collect();
                let order = &order;
                scope.spawn(move || {
                    let mut lat = Vec::new();
                    let bad = queue_pass(
                        q,
                        (qi, nq),
                        w,
                        order,
                        (&mine, false),
                        (op, check),
                        progress,
                        &mut lat,
                    );
                    bad.map(|b| (b, lat))
                })
            })
            .collect();
        let mut bad: Option<u64> = None;
        for (qi, worker) in workers.into_iter().enumerate() {
            let (b, lat) = worker
                .join()
                .map_err(|_| WorkloadError::Panicked { queue: qi })??;
            latency.extend(lat);
            bad = match (bad, b) {
                (Some(x), Some(y)) => Some(x.min(y)),
                (x, y) => x.or(y),
            };
        }
        Ok(bad)
    })
}

/// The slot -> (block of the order, device offset, submitted at) of the
/// request using it, for one queue's pass.
type Busy = Vec<Option<(u64, u64, Instant)>>;

/// The blocks of queue `qi` of `nq` (blocks `qi`, `qi + nq`, ... of the
/// order), with `slots.len()` in flight, or with a `spare` last slot one
/// fewer with the device and the next one held, built, in the spare
/// ([`BlkQueue::limit_in_flight`]: each completion seen hands it over at
/// once), each block's latency (from its hand-over) added to `latency`. Returns the lowest device offset that did not match the
/// pattern, when `check`.
///
/// The queue is kept full: every slot is filled and the device notified
/// once; then each completion's slot is refilled as soon as it is taken,
/// the first refill notifying a device that went to sleep (the last, when
/// the device runs on this thread's one CPU), and a sleeping wait wakes
/// to about three quarters of the slots done ([`BlkQueue::coalesce`]), so
/// that the device works on the rest while the driver refills.
#[allow(clippy::too_many_arguments)]
fn queue_pass<O: DmaOps + ?Sized>(
    q: &mut BlkQueue<O>,
    (qi, nq): (usize, usize),
    w: &Workload,
    order: &Order,
    (slots, spare): (&[(Buffer, usize)], bool),
    (op, check): (Op, bool),
    progress: &dyn Progress,
    latency: &mut Vec<u32>,
) -> Result<Option<u64>, WorkloadError> {
    let bs = w.bs;
    // On the device's own CPU a notification hands it that CPU: refill the
    // whole batch first. Nothing is gained there by holding a request
    // back either (the two never run at once): the spare stays unused.
    let batch = q.shares_cpu_with_device();
    let slots = match (spare, batch) {
        (true, false) => {
            q.limit_in_flight(Some(slots.len() - 1))?;
            slots
        }
        (true, true) => &slots[..slots.len() - 1],
        (false, _) => slots,
    };
    let mut next = (qi as u64..w.count).step_by(nq);
    let mut scratch = Vec::new();
    let mut bad: Option<u64> = None;
    let mut busy: Busy = vec![None; slots.len()];
    let mut in_flight = 0;
    q.coalesce(true);
    q.plug();
    // One clock read stamps each batch of submissions (the first before
    // any of them, so no latency is understated).
    let at = Instant::now();
    for slot in 0..slots.len() {
        let Some(k) = next.next() else { break };
        submit_block(
            q,
            (w, order, slots, op),
            (slot, k, at),
            &mut busy,
            &mut scratch,
        )?;
        in_flight += 1;
    }
    q.unplug()?;
    while in_flight > 0 {
        // Wait for one completion, then take every other one already there;
        // they completed by `now`.
        let mut next_done = Some(q.complete()?);
        let now = Instant::now();
        if batch {
            q.plug();
        }
        let mut stamp = None;
        let mut done = 0;
        while let Some(d) = next_done {
            let slot =
                usize::try_from(d.tag).map_err(|_| WorkloadError::UnknownTag { tag: d.tag })?;
            let (block, offset, at) = busy
                .get_mut(slot)
                .and_then(Option::take)
                .ok_or(WorkloadError::UnknownTag { tag: d.tag })?;
            in_flight -= 1;
            // A request held back counts from its hand-over to the device
            // to its completion seen, before the next hand-over's
            // notification.
            let (from, to) = d.timing.map_or((at, now), |(s, e)| (s.max(at), e));
            let took = to.saturating_duration_since(from);
            latency.push(took.as_nanos().try_into().unwrap_or(u32::MAX));
            d.result.map_err(|source| WorkloadError::Block {
                block,
                offset,
                source,
            })?;
            if check {
                let (buf, at) = &slots[slot];
                scratch.resize(bs, 0);
                buf.read_at(*at, &mut scratch)?;
                if let Some(at) = check_pattern(&scratch, w.pattern, offset) {
                    // Keep the lowest bad offset whatever order blocks finish in.
                    bad = Some(bad.map_or(at, |b| b.min(at)));
                }
            } else {
                done += 1;
            }
            if let Some(k) = next.next() {
                let at = *stamp.get_or_insert_with(Instant::now);
                submit_block(
                    q,
                    (w, order, slots, op),
                    (slot, k, at),
                    &mut busy,
                    &mut scratch,
                )?;
                in_flight += 1;
            }
            next_done = q.try_complete()?;
        }
        if batch {
            q.unplug()?;
        }
        progress.blocks_done(done);
    }
    q.coalesce(false);
    q.limit_in_flight(None)?;
    Ok(bad)
}

/// Submits block `k` of the order in `slot` (writing its pattern in first
/// for a sequential-pattern write) and marks the slot busy since `at`.
fn submit_block<O: DmaOps + ?Sized>(
    q: &mut BlkQueue<O>,
    (w, order, slots, op): (&Workload, &Order, &[(Buffer, usize)], Op),
    (slot, k, at): (usize, u64, Instant),
    busy: &mut Busy,
    scratch: &mut Vec<u8>,
) -> Result<(), WorkloadError> {
    let bs = w.bs;
    let offset = w.offset + order.block(k) * bs as u64;
    let block = (offset - w.offset) / bs as u64;
    let (buf, buf_offset) = (&slots[slot].0, slots[slot].1);
    if op == Op::Write && w.pattern == Pattern::Seq {
        scratch.resize(bs, 0);
        fill_seq(scratch, offset);
        buf.write_at(buf_offset, scratch)?;
    }
    let req = match op {
        Op::Write => Command::Write {
            offset,
            buf,
            buf_offset,
            len: bs,
        },
        Op::Read => Command::Read {
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
    busy[slot] = Some((block, offset, at));
    Ok(())
}
