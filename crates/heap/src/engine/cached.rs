//! Cache-aware reads: what the page cache holds is copied out of it, the
//! rest is read with direct I/O, both at once.
//!
//! ```text
//!                       ┌─ cached runs ─► copier threads: copy from a ─────┐
//!   request ─cache_runs─┤                 read-only mapping, no readahead ├─► done(request)
//!                       └─ cold runs ───► direct engine (io_uring, O_DIRECT)┘
//! ```
//!
//! Each request of a batch is cut into runs by [`cache_runs`]. Cached runs
//! go, in pieces of at most [`COPY_PIECE`] bytes, to [`COPIERS`] copier
//! threads (started on the first one), which copy them out of a read-only
//! shared mapping of the file ([`FileView`]: its pages faulted in by the
//! copy, `MADV_RANDOM` so touching a page never
//! reads ahead into the cold part of the file, SIGBUS guarded; one mapping
//! shared by the copiers). Buffered `pread` would read ahead: a cached page
//! that readahead marked starts reading the pages after it, cold ones included,
//! and `POSIX_FADV_RANDOM` does not stop that. Where the file cannot be
//! mapped, `pread` it is. Cold runs become the requests of the direct
//! engine's batch, which keeps the device busy meanwhile; they never enter
//! the page cache. A request is reported done when all of its runs are.

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use iopath_sys::lock;

use super::residency::{cache_runs, CacheLookup, CacheRun};
use super::{buffered, check_read, NextReq, Pull, ReadReq, ReqDone, Transfer};
use crate::file::IoFile;
use crate::mmap::FileView;
use crate::{Error, Result};

/// Copier threads a batch starts for its cached runs (on its first one):
/// two. Each copy maps the source pages, copies and unmaps them again, so
/// one thread does not reach one-thread `memcpy` speed; two threads copied
/// a cached 1 GiB file into faulted-in memory 1.3x as fast as one here
/// (3.1-3.5 against 4.2-4.6 GiB/s, 2 CPUs, loaded machine).
pub(crate) const COPIERS: usize = 2;

/// Cached runs are copied in pieces of at most this many bytes, so the
/// copiers share a long run.
pub(crate) const COPY_PIECE: u64 = 8 << 20;

/// A request being filled through its runs.
struct Outer {
    len: usize,
    /// Runs not finished yet.
    left: usize,
    /// Fallbacks of its direct runs, bytes of its cached ones.
    t: Transfer,
}

/// State shared by the direct engine's request source and its completion
/// callback.
struct Split {
    outers: BTreeMap<usize, Outer>,
    next_outer: usize,
    /// Cold runs not handed to the direct engine yet: (request, run).
    cold: VecDeque<(usize, ReadReq)>,
    /// The request each direct request (by its index) belongs to.
    owner: Vec<usize>,
    jobs: Option<mpsc::Sender<(usize, ReadReq)>>,
    total: Transfer,
    fatal: Option<Error>,
    /// Bytes read direct.
    direct: u64,
}

impl Split {
    /// One run of request `o` finished with `t`; tells `done` when it was
    /// the last.
    fn finish(&mut self, o: usize, t: Transfer, done: &mut ReqDone<'_>) {
        let Some(out) = self.outers.get_mut(&o) else {
            return;
        };
        out.t.fallbacks += t.fallbacks;
        out.t.cached += t.cached;
        out.left -= 1;
        if out.left == 0 {
            let out = self.outers.remove(&o).expect("present");
            let t = Transfer {
                fallbacks: out.t.fallbacks.min(1),
                ..Transfer {
                    bytes: out.len as u64,
                    ..out.t
                }
            };
            self.total += t;
            done(o, t);
        }
    }
}

/// A mapping of the file as it is when the copier starts; `None` (the
/// copier then reads with `pread`) when it cannot be made.
fn view(file: &IoFile) -> Option<FileView> {
    let len = usize::try_from(file.size().ok()?).ok()?;
    FileView::new(file.fd(), len)
        .map_err(|e| tracing::debug!("cached runs copied with pread: {e}"))
        .ok()
}

/// Copies one cached run: out of the mapping where it covers the run, else
/// with buffered `pread`.
fn copy_run(file: &IoFile, view: Option<&FileView>, r: &ReadReq) -> Result<u64> {
    let dst = r.buf.range(r.buf_off, r.len)?;
    let off = usize::try_from(r.file_off).ok();
    match (view, off) {
        (Some(v), Some(off)) if off.checked_add(r.len).is_some_and(|end| end <= v.len()) => {
            v.copy_out(off, &dst)?;
            if v.truncated() {
                return Err(file.short(file.size()?, r.file_off, r.len));
            }
        }
        _ => buffered::read_into(file, r.file_off, dst)?,
    }
    Ok(r.len as u64)
}

/// `runs` with every cached one cut into pieces of at most [`COPY_PIECE`]
/// bytes.
fn pieces(runs: &[CacheRun]) -> Vec<CacheRun> {
    let mut out = Vec::with_capacity(runs.len());
    for run in runs {
        if !run.cached {
            out.push(*run);
            continue;
        }
        let mut off = run.off;
        let end = run.off + run.len;
        while off < end {
            let len = COPY_PIECE.min(end - off);
            out.push(CacheRun {
                off,
                len,
                cached: true,
            });
            off += len;
        }
    }
    out
}

/// Runs a batch cache-aware: cached runs copied on a thread of their own,
/// cold runs through `direct` (a batch of an engine that bypasses the page
/// cache). Returns the batch's transfer and the bytes read direct.
///
/// # Errors
/// The first error of a request, a run or `next`; the direct engine
/// completes what it has in flight first and the copier stops.
pub(crate) fn read_split(
    file: &IoFile,
    next: &mut NextReq<'_>,
    done: &mut ReqDone<'_>,
    direct: &mut dyn FnMut(&mut NextReq<'_>, &mut ReqDone<'_>) -> Result<Transfer>,
) -> Result<(Transfer, u64)> {
    let stop = AtomicBool::new(false);
    let (rep_tx, reports) = mpsc::channel::<(usize, Result<u64>)>();
    std::thread::scope(|s| {
        let mut rep_tx = Some(rep_tx);
        let done = RefCell::new(done);
        let state = RefCell::new(Split {
            outers: BTreeMap::new(),
            next_outer: 0,
            cold: VecDeque::new(),
            owner: Vec::new(),
            jobs: None,
            total: Transfer::default(),
            fatal: None,
            direct: 0,
        });
        // Files the copier's reports that have arrived.
        let drain = |wait: bool| {
            let mut st = state.borrow_mut();
            loop {
                let got = if wait {
                    reports.recv().ok()
                } else {
                    reports.try_recv().ok()
                };
                let Some((o, r)) = got else {
                    break;
                };
                match r {
                    Ok(n) => {
                        let t = Transfer {
                            cached: n,
                            ..Transfer::default()
                        };
                        st.finish(o, t, &mut **done.borrow_mut());
                    }
                    Err(e) => {
                        st.fatal.get_or_insert(e);
                        stop.store(true, Ordering::Relaxed);
                    }
                }
            }
        };
        // Cuts request `r` into runs: cached ones to the copier, cold ones
        // queued for the direct engine.
        let mut take = |r: ReadReq| -> Result<()> {
            check_read(file, r.file_off, &r.buf, r.buf_off, r.len)?;
            let runs = match cache_runs(file, r.file_off, r.len as u64, CacheLookup::Auto) {
                Ok(runs) => runs,
                Err(e) => {
                    tracing::debug!("page-cache residency unknown ({e}); all read direct");
                    Vec::new()
                }
            };
            let mut st = state.borrow_mut();
            let o = st.next_outer;
            st.next_outer += 1;
            if runs.iter().all(|run| !run.cached) {
                // Cold (or unknown): one direct request, as asked.
                st.outers.insert(
                    o,
                    Outer {
                        len: r.len,
                        left: 1,
                        t: Transfer::default(),
                    },
                );
                st.cold.push_back((o, r));
                return Ok(());
            }
            let runs = pieces(&runs);
            st.outers.insert(
                o,
                Outer {
                    len: r.len,
                    left: runs.len(),
                    t: Transfer::default(),
                },
            );
            for run in runs {
                let rel = (run.off - r.file_off) as usize;
                let part = ReadReq {
                    buf: r.buf.clone(),
                    buf_off: r.buf_off + rel,
                    file_off: run.off,
                    len: run.len as usize,
                };
                if !run.cached {
                    st.cold.push_back((o, part));
                    continue;
                }
                if st.jobs.is_none() {
                    let (tx, jobs) = mpsc::channel::<(usize, ReadReq)>();
                    let jobs = Arc::new(Mutex::new(jobs));
                    let rep = rep_tx.take().expect("copiers start once");
                    // One mapping for both copiers (its SIGBUS guard
                    // watches the range, whichever thread faults).
                    let view = Arc::new(view(file));
                    for _ in 0..COPIERS {
                        let (rep, jobs, stop) = (rep.clone(), jobs.clone(), &stop);
                        let view = view.clone();
                        s.spawn(move || {
                            loop {
                                // The lock is held while waiting: the
                                // other copier is copying meanwhile.
                                let job = lock(&jobs).recv();
                                let Ok((o, r)) = job else { break };
                                if stop.load(Ordering::Relaxed) {
                                    break;
                                }
                                if rep.send((o, copy_run(file, (*view).as_ref(), &r))).is_err() {
                                    break;
                                }
                            }
                        });
                    }
                    st.jobs = Some(tx);
                }
                if let Some(jobs) = &st.jobs {
                    // The copier only stops early after `stop`, when the
                    // batch fails anyway.
                    let _ = jobs.send((o, part));
                }
            }
            Ok(())
        };
        let mut inner_next = |wait: bool| -> Result<Pull> {
            loop {
                drain(false);
                {
                    let mut st = state.borrow_mut();
                    if st.fatal.is_some() {
                        return Ok(Pull::End);
                    }
                    if let Some((o, r)) = st.cold.pop_front() {
                        st.owner.push(o);
                        return Ok(Pull::Req(r));
                    }
                }
                match next(wait)? {
                    Pull::Req(r) => {
                        if r.len == 0 {
                            check_read(file, r.file_off, &r.buf, r.buf_off, 0)?;
                            let mut st = state.borrow_mut();
                            let o = st.next_outer;
                            st.next_outer += 1;
                            (done.borrow_mut())(o, Transfer::default());
                            continue;
                        }
                        take(r)?;
                    }
                    Pull::Later => return Ok(Pull::Later),
                    Pull::End => return Ok(Pull::End),
                }
            }
        };
        let mut inner_done = |j: usize, t: Transfer| {
            let mut st = state.borrow_mut();
            st.direct += t.bytes;
            if let Some(&o) = st.owner.get(j) {
                st.finish(o, t, &mut **done.borrow_mut());
            }
        };
        let r = direct(&mut inner_next, &mut inner_done);
        if r.is_err() {
            stop.store(true, Ordering::Relaxed);
        }
        // No more runs: the copier ends when its queue is empty.
        state.borrow_mut().jobs = None;
        drop(rep_tx);
        drain(true);
        let st = state.into_inner();
        r?;
        if let Some(e) = st.fatal {
            return Err(e);
        }
        Ok((st.total, st.direct))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_runs_are_cut_into_pieces_and_cold_ones_kept_whole() {
        let run = |off: u64, len: u64, cached: bool| CacheRun { off, len, cached };
        let p = COPY_PIECE;
        let got = pieces(&[
            run(100, 2 * p + 5, true),
            run(100 + 2 * p + 5, 3 * p, false),
            run(100 + 5 * p + 5, p, true),
        ]);
        assert_eq!(
            got,
            [
                run(100, p, true),
                run(100 + p, p, true),
                run(100 + 2 * p, 5, true),
                run(100 + 2 * p + 5, 3 * p, false),
                run(100 + 5 * p + 5, p, true),
            ]
        );
    }
}
