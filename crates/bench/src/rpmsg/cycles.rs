//! The create+destroy rows: an endpoint created and destroyed the legacy
//! way (create, find and open the node, destroy through it, close) and the
//! fd way (create, close), beside the raw fd server's hand-offs, the ways
//! taking turns in chunks of [`CHUNK`] cycles.

use std::time::{Duration, Instant};

use iopath_rpmsg::ctrl::proto::{O_CLOEXEC, O_RDWR};
use iopath_rpmsg::ctrl::{CtrlClient, EptFd, EptInfo};

use super::raw::fd::{Pass, RawFdServer};
use crate::error::{check, check_failed};
use crate::{Error, Placement, ProgressBar, Result};

/// Cycles per turn: the ways alternate in chunks of this many.
pub(super) const CHUNK: u64 = 500;
/// legacy, fd, limit (an eventfd passed), limit (a fresh socket passed),
/// limit (a fresh socket passed and watched until its close with epoll).
pub(super) const WAYS: usize = 5;
pub(super) const WAY_NAMES: [&str; WAYS] = ["legacy", "fd", "limit", "limit-s", "limit-w"];
/// Each way's index in [`WAY_NAMES`], [`Row::totals`] and [`Row::chunks`].
pub(super) mod way {
    pub(crate) const LEGACY: usize = 0;
    pub(crate) const FD: usize = 1;
    pub(crate) const LIMIT: usize = 2;
}
/// What the raw fd server passes for the ways from [`way::LIMIT`] on.
const LIMIT_PASSES: [Pass; WAYS - way::LIMIT] = [Pass::Eventfd, Pass::Socket, Pass::Watched];

/// One loop count's create+destroy figures.
#[derive(Debug)]
pub(super) struct Row {
    pub(super) loops: u64,
    /// Totals per run, microseconds, per way.
    pub(super) totals: [Vec<f64>; WAYS],
    /// Per-cycle microseconds of every chunk of every run, per way.
    pub(super) chunks: [Vec<f64>; WAYS],
}

fn legacy_cycles(c: &CtrlClient, loops: u64, bar: &ProgressBar) -> Result<Duration> {
    let info = EptInfo::new("bench");
    let t = Instant::now();
    for _ in 0..loops {
        let (_, path) = c.create_ept(&info).map_err(Error::layer("CREATE_EPT"))?;
        let node = EptFd::open_node(&path, O_CLOEXEC).map_err(Error::layer("opening the node"))?;
        node.destroy()
            .map_err(Error::layer("destroying through the node"))?;
        bar.inc(1);
    }
    Ok(t.elapsed())
}

fn fd_cycles(c: &CtrlClient, loops: u64, bar: &ProgressBar) -> Result<Duration> {
    let info = EptInfo::new("bench");
    let t = Instant::now();
    for _ in 0..loops {
        drop(
            c.create_ept_fd(&info, O_RDWR | O_CLOEXEC)
                .map_err(Error::layer("CREATE_EPT_FD"))?,
        );
        bar.inc(1);
    }
    // Closing is asynchronous: count until the service has freed them all.
    let base = 1; // the echo endpoint the bench holds
    while c.stats().map_err(Error::layer("STATS"))?.endpoints() > base {
        std::hint::spin_loop();
    }
    Ok(t.elapsed())
}

/// A row per loop count in `loops`, `runs` times each: every way through
/// the endpoint service on `c` (holding one endpoint, the echo's) and
/// through the raw fd server `raw`; `placement` names the progress.
///
/// # Errors
/// When a cycle fails, or the service still holds endpoints after them.
pub(super) fn rows(
    c: &CtrlClient,
    raw: &RawFdServer,
    loops: &[u64],
    runs: usize,
    placement: Placement,
    pb: &ProgressBar,
) -> Result<Vec<Row>> {
    let mut rows: Vec<Row> = loops
        .iter()
        .map(|&loops| Row {
            loops,
            totals: Default::default(),
            chunks: Default::default(),
        })
        .collect();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    for run in 0..runs {
        for row in &mut rows {
            // The ways take turns in chunks, so that each sees the same
            // machine (others' load comes and goes); the order rotates
            // per chunk so that none always runs warm.
            let mut tot = [0.0f64; WAYS];
            let mut done = 0;
            let mut turn = run;
            while done < row.loops {
                let n = CHUNK.min(row.loops - done);
                for k in 0..WAYS {
                    let w = (k + turn) % WAYS;
                    pb.set_message(format!("{} {}", placement.name(), WAY_NAMES[w]));
                    let t = us(match w {
                        way::LEGACY => legacy_cycles(c, n, pb)?,
                        way::FD => fd_cycles(c, n, pb)?,
                        _ => raw.cycles(n, LIMIT_PASSES[w - way::LIMIT], pb)?,
                    });
                    tot[w] += t;
                    row.chunks[w].push(t / n as f64);
                }
                done += n;
                turn += 1;
            }
            for (totals, t) in row.totals.iter_mut().zip(tot) {
                totals.push(t);
            }
        }
    }
    let st = c.stats().map_err(Error::layer("STATS"))?;
    check!(
        st.endpoints() == 1 && st.open_nodes == 0,
        "the service still holds endpoints after the cycles: {st:?}"
    );
    Ok(rows)
}
