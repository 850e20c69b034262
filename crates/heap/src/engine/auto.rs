//! `auto`: what the page cache holds is copied from it, the rest read with
//! io_uring or direct, whichever this load measures faster; for a buffer
//! whose mapping refuses direct I/O (a dma-heap's), bounce or buffered,
//! whichever measures faster.
//!
//! Every batch is first cut by page-cache residency ([`super::cached`]):
//! cached runs are copied on a thread of their own while the cold runs go
//! through the measured engine below, and only the cold runs are measured.
//!
//! Which of the two is faster depends on the device, the request size the
//! device likes, what else the CPUs are doing and how page allocation on the
//! allocator thread interleaves with the reads; on one VM `direct` beat
//! `uring` cold while on NVMe the opposite is the rule. So `auto` does not
//! guess: the first requests of a batch alternate between the two in
//! [`PROBE_SLICES`] slices (io_uring, direct, io_uring, direct), each about
//! [`PROBE_BYTES`] / 2 bytes, and the rest of the batch goes through the one
//! that moved bytes faster over its slices; direct must be faster by more
//! than [`super::DIRECT_MARGIN`], or io_uring stays. Alternating keeps a drift of
//! the disk's speed (a VM's disk is shared) from deciding for one engine.
//!
//! A slice is timed from its first request to its last completion: what
//! it takes the loader to move those bytes with that engine, waits for the
//! allocator included, since they are part of the engine's result (io_uring
//! keeps requests in flight while it waits for the next buffer, direct
//! leaves the device idle). Only the wait for a slice's first request is
//! left out, or the first slice would pay for the first buffer. The margin
//! is there because slices of the same engine on this VM's disk differ by
//! 10-20% from one another, and io_uring was the faster of the two in every
//! measurement without allocation in the way (`examples/engines.rs`): a
//! small lead of direct is noise more often than not. The figures are kept
//! ([`Engine::probe`]) and logged.
//!
//! The engines of one load's files (the shards of a checkpoint) can share
//! one probe ([`SharedChoice`]): the first cold batch measures, the others
//! run io_uring until it has chosen and then take its choice.

use std::cell::Cell;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use iopath_sys::lock;

use super::probe::{Probe, PROBE_BYTES, PROBE_SLICES};
use super::shared::{Claim, SharedChoice};
use super::{
    cached, pull, read_as_batch, BounceEngine, BufferedEngine, CheckedRead, DirectEngine, Engine,
    EngineOptions, Method, NextReq, Pull, ReqDone, Transfer, UringEngine,
};
use crate::file::IoFile;
use crate::range::BufRange;
use crate::Result;

/// io_uring or direct, chosen per batch by measurement (see the module
/// docs).
#[derive(Debug)]
pub struct AutoEngine {
    uring: UringEngine,
    direct: DirectEngine,
    /// Made when a buffer first refuses direct I/O (its own ring: not
    /// set up for loads that never need it).
    bounce: OnceLock<Option<BounceEngine>>,
    opts: EngineOptions,
    probe: Mutex<Probe>,
    /// The last batch: bytes read direct, bytes copied from the page cache.
    split: Mutex<(u64, u64)>,
    /// The probe shared with the other engines of the load, if any.
    shared: Option<Arc<SharedChoice>>,
}

impl AutoEngine {
    /// Sets up the io_uring side.
    ///
    /// # Errors
    /// As [`UringEngine::new`].
    pub fn new(opts: EngineOptions) -> Result<Self> {
        Ok(AutoEngine {
            uring: UringEngine::new(opts)?,
            direct: DirectEngine,
            bounce: OnceLock::new(),
            opts,
            probe: Mutex::new(Probe::default()),
            split: Mutex::new((0, 0)),
            shared: None,
        })
    }

    /// As [`AutoEngine::new`], measuring once with the other engines that
    /// share `choice` (see [`SharedChoice`]).
    ///
    /// # Errors
    /// As [`UringEngine::new`].
    pub fn sharing(opts: EngineOptions, choice: Arc<SharedChoice>) -> Result<Self> {
        Ok(AutoEngine {
            shared: Some(choice),
            ..Self::new(opts)?
        })
    }

    fn last(&self) -> Probe {
        *lock(&self.probe)
    }

    fn bounce(&self) -> Option<&BounceEngine> {
        self.bounce
            .get_or_init(|| BounceEngine::new(self.opts).ok())
            .as_ref()
    }

    fn chosen(&self) -> &dyn Engine {
        match self.last().chosen {
            Some(Method::Direct) => &self.direct,
            Some(Method::Bounce) => match self.bounce() {
                Some(b) => b,
                None => &self.uring,
            },
            Some(Method::Buffered) => &BufferedEngine,
            _ => &self.uring,
        }
    }
}

impl Engine for AutoEngine {
    /// What moved the bytes: the chosen engine, io_uring before any batch
    /// chose; buffered when the last batch was all copied from the page
    /// cache.
    fn method(&self) -> Method {
        let (direct, cached) = *lock(&self.split);
        if direct == 0 && cached > 0 {
            return Method::Buffered;
        }
        self.last().chosen.unwrap_or(Method::Uring)
    }

    fn probe(&self) -> Option<Probe> {
        Some(self.last())
    }

    fn read_checked(&self, r: CheckedRead<'_>) -> Result<Transfer> {
        read_as_batch(self, r)
    }

    fn read_batch(
        &self,
        file: &IoFile,
        next: &mut NextReq<'_>,
        done: &mut ReqDone<'_>,
    ) -> Result<Transfer> {
        let (t, direct) = cached::read_split(file, next, done, &mut |next, done| {
            self.read_cold(file, next, done)
        })?;
        *lock(&self.split) = (direct, t.cached);
        Ok(t)
    }

    fn write_range(&self, src: BufRange<'_>, file: &IoFile, file_off: u64) -> Result<Transfer> {
        self.chosen().write_range(src, file, file_off)
    }
}

impl AutoEngine {
    /// The cold runs of a batch: the probe, then the engine it chose.
    fn read_cold(
        &self,
        file: &IoFile,
        next: &mut NextReq<'_>,
        done: &mut ReqDone<'_>,
    ) -> Result<Transfer> {
        // The first request says which pair to measure: a buffer whose
        // mapping refuses direct I/O gets bounce against buffered.
        let Some(first) = pull(next)? else {
            return Ok(Transfer::default());
        };
        let direct_ok = first.buf.takes_direct_io();
        let pair: [(Method, &dyn Engine); 2] = match direct_ok {
            true => [(Method::Uring, &self.uring), (Method::Direct, &self.direct)],
            false => match self.bounce() {
                Some(b) => [(Method::Bounce, b), (Method::Buffered, &BufferedEngine)],
                None => [(Method::Buffered, &BufferedEngine); 2],
            },
        };
        let mut first = Some(first);
        let mut next = |wait: bool| match first.take() {
            Some(r) => Ok(Pull::Req(r)),
            None => next(wait),
        };
        match self.shared.as_ref().map(|s| (s, s.claim(direct_ok))) {
            None | Some((_, Claim::Measure)) => {}
            Some((shared, Claim::Wait)) => {
                return self.follow(shared, direct_ok, pair, file, &mut next, done)
            }
            Some((_, Claim::Take(p))) => return self.take(p, file, &mut next, done, 0),
        }
        let r = self.measure(file, pair, &mut next, done);
        if let (Err(_), Some(s)) = (&r, &self.shared) {
            s.abandon();
        }
        r
    }

    /// While another engine measures for `shared`: the first engine of
    /// `pair` until the measuring batch has chosen the other one, then that
    /// one (a choice for the other pair is not this batch's).
    fn follow(
        &self,
        shared: &SharedChoice,
        direct_ok: bool,
        pair: [(Method, &dyn Engine); 2],
        file: &IoFile,
        next: &mut NextReq<'_>,
        done: &mut ReqDone<'_>,
    ) -> Result<Transfer> {
        let ours = || {
            shared
                .chosen()
                .filter(|p| p.mapping_refused_direct() != direct_ok)
        };
        let mut ended = false;
        let mut pulled = 0usize;
        let mut until = |wait: bool| -> Result<Pull> {
            if ours().is_some_and(|p| p.chosen != Some(pair[0].0)) {
                return Ok(Pull::End);
            }
            let p = next(wait)?;
            match &p {
                Pull::Req(_) => pulled += 1,
                Pull::End => ended = true,
                Pull::Later => {}
            }
            Ok(p)
        };
        let mut total = pair[0].1.read_batch(file, &mut until, done)?;
        match ours() {
            Some(p) if !ended => total += self.take(p, file, next, done, pulled)?,
            Some(p) => self.set_probe(p),
            None => self.set_probe(Probe {
                chosen: Some(pair[0].0),
                ..Probe::default()
            }),
        }
        Ok(total)
    }

    fn set_probe(&self, p: Probe) {
        *lock(&self.probe) = p;
    }

    /// Runs the batch through the engine a shared probe `p` chose,
    /// request numbers from `base`.
    fn take(
        &self,
        p: Probe,
        file: &IoFile,
        next: &mut NextReq<'_>,
        done: &mut ReqDone<'_>,
        base: usize,
    ) -> Result<Transfer> {
        self.set_probe(p);
        let mut rest_done = |j: usize, t: Transfer| done(base + j, t);
        self.chosen().read_batch(file, next, &mut rest_done)
    }

    /// The probe over the first requests, then the engine it chose.
    /// Publishes the choice to the shared probe, if any.
    fn measure(
        &self,
        file: &IoFile,
        pair: [(Method, &dyn Engine); 2],
        next: &mut NextReq<'_>,
        done: &mut ReqDone<'_>,
    ) -> Result<Transfer> {
        let mut probe = Probe::default();
        let mut total = Transfer::default();
        let mut base = 0;
        let mut ended = false;
        let slice = PROBE_BYTES / (PROBE_SLICES as u64 / 2);
        for k in 0..PROBE_SLICES {
            if ended {
                break;
            }
            let (method, engine) = pair[k % 2];
            let mut asked = 0u64;
            // Requests handed to the engine.
            let pulled = Cell::new(0usize);
            // The wait for the slice's first request is not the engine's
            // time (the first slice would pay for the first buffer); every
            // later wait is part of what the engine achieved.
            let mut idle = Duration::ZERO;
            let mut limited = |wait: bool| -> Result<Pull> {
                if asked >= slice {
                    return Ok(Pull::End);
                }
                let t = Instant::now();
                let p = next(wait)?;
                if pulled.get() == 0 {
                    idle += t.elapsed();
                }
                match &p {
                    Pull::Req(r) => {
                        asked += r.len as u64;
                        pulled.set(pulled.get() + 1);
                    }
                    Pull::End => ended = true,
                    Pull::Later => {}
                }
                Ok(p)
            };
            let mut slice_done = |j: usize, t: Transfer| done(base + j, t);
            let t = Instant::now();
            let tr = engine.read_batch(file, &mut limited, &mut slice_done)?;
            let took = t.elapsed().saturating_sub(idle);
            let slot = probe.slot(method);
            slot.0 += tr.bytes;
            slot.1 += took;
            total += tr;
            base += pulled.get();
        }
        let chosen = probe.choose();
        if chosen == Method::Bounce || chosen == Method::Buffered {
            tracing::info!(
                "auto: the buffer's mapping refuses direct I/O; bounce {:.2} GiB/s over {} bytes, buffered {:.2} GiB/s over {} bytes: {chosen}",
                probe.bounce_gib_per_s(),
                probe.bounce.0,
                probe.buffered_gib_per_s(),
                probe.buffered.0,
            );
        } else {
            tracing::info!(
                "auto: uring {:.2} GiB/s over {} bytes, direct {:.2} GiB/s over {} bytes: {chosen}",
                probe.uring_gib_per_s(),
                probe.uring.0,
                probe.direct_gib_per_s(),
                probe.direct.0,
            );
        }
        self.set_probe(probe);
        if let Some(s) = &self.shared {
            s.publish(&probe);
        }
        if ended {
            return Ok(total);
        }
        let mut rest_done = |j: usize, t: Transfer| done(base + j, t);
        total += self.chosen().read_batch(file, next, &mut rest_done)?;
        Ok(total)
    }
}
