//! `iopath bench rpmsg`: the endpoint service's create+destroy and echo
//! figures, each beside a limit measured in the same run.
//!
//! Create and destroy an endpoint L times the legacy way (create, find and
//! open the node, destroy through it, close) and the fd way (create,
//! close), beside one raw `SOCK_SEQPACKET` request/response between two
//! processes with an fd passed, per cycle ([`cycles`]). Then echo round
//! trips through the remote (host and remote are separate processes on a
//! temporary shared-memory file) beside a raw eventfd ping-pong between two
//! processes ([`echo`]). With OpenAMP's demo built (`--openamp DIR`), the
//! peer rows: OpenAMP's driver and iopath's endpoint fd and `Bus` API
//! against OpenAMP's echo and iopath's remote ([`peers`]).
//!
//! ```text
//!   RpmsgConfig  what to measure, checked
//!   children     iopath rpmsg remote + host (Servers), logged children
//!   raw          the limits' bare servers (child processes) and clients
//!   cycles       create+destroy rows    echo   echo rows (+ --poll)
//!   peers        OpenAMP peer rows      scale, bulk  --scale, bulk rows
//!   report       RpmsgReport -> Report: tables, chart, figures
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::invalid;
use crate::place::{on_cpu, Cpus, Placement};
use crate::{Latency, ProgressBar, Result};

pub mod bulk;
mod children;
mod cycles;
mod echo;
pub mod peers;
pub mod raw;
mod report;
pub mod scale;

pub use raw::RawPingPong;

use children::{Servers, Setup};
use cycles::{Row, WAYS};
use echo::PollMeasured;

/// What `iopath bench rpmsg` measures.
#[derive(Debug, Clone)]
pub struct RpmsgConfig {
    /// Create+destroy cycles per row.
    pub loops: Vec<u64>,
    /// Runs per row (median and spread are reported).
    pub runs: usize,
    /// Echo round trips (16-byte messages) for the latency rows.
    pub count: u64,
    /// Also measure echo latency with host and remote polling the rings and
    /// the client busy-polling its fd (no notifications; spins two cores).
    pub poll: bool,
    /// Where the processes run; the first one fills the main table and
    /// JSON `rows`.
    pub placement: Vec<Placement>,
    /// OpenAMP's demo, built by `scripts/openamp-demo build SRC DIR`: the
    /// peer rows run when given, else they are noted as missing.
    pub openamp: Option<PathBuf>,
    /// Where the peer rows' processes run (driver side, remote).
    pub peer_placement: Vec<Placement>,
    /// Longest a peer row's measured round trips may take per run (OpenAMP's
    /// driver spins: with its remote on the same CPU it manages a few
    /// hundred round trips a second).
    pub peer_budget: Duration,
    /// The `iopath` executable whose `rpmsg host` and `rpmsg remote` the
    /// experiment starts, as it does the bench servers ([`crate::child`]).
    pub iopath: PathBuf,
    /// Show progress on stderr.
    pub progress: bool,
}

impl RpmsgConfig {
    /// The embedded defaults of `iopath bench`: 1000 loops, 3 runs, 5000
    /// echo round trips, no polling, placements one and split.
    pub fn quick(iopath: PathBuf) -> RpmsgConfig {
        RpmsgConfig {
            loops: vec![1000],
            runs: 3,
            count: 5000,
            poll: false,
            placement: vec![Placement::One, Placement::Split],
            openamp: None,
            peer_placement: vec![Placement::Split, Placement::One],
            peer_budget: Duration::from_secs(2),
            iopath,
            progress: true,
        }
    }

    /// The full sizes: 1,000 / 10,000 / 100,000 loops, 3 runs, 10,000
    /// echo round trips, placements one and split.
    pub fn full(iopath: PathBuf) -> RpmsgConfig {
        RpmsgConfig {
            loops: vec![1000, 10_000, 100_000],
            count: 10_000,
            ..RpmsgConfig::quick(iopath)
        }
    }

    /// A rough duration, from nominal rates on a 2-vCPU VM: 260 us for a
    /// cycle of the five ways, 100 us per echo round trip and its limit's.
    pub fn estimate(&self) -> Duration {
        let cycles = self.loops.iter().sum::<u64>() as f64 * self.runs as f64;
        let per_place = cycles * 260e-6 + self.count as f64 * 100e-6 + 1.0;
        let poll = if self.poll {
            self.count as f64 * 50e-6 + 1.0
        } else {
            0.0
        };
        // Per peer row and run: start-up, warm-up, and the round trips at
        // about 15,000/s or the budget.
        let peers = if self.openamp.is_some() {
            let row = 1.0 + (self.count as f64 / 15_000.0).min(self.peer_budget.as_secs_f64());
            row * (peers::PAIRS.len() * self.runs * self.peer_placement.len()) as f64
        } else {
            0.0
        };
        Duration::from_secs_f64(per_place * self.placement.len() as f64 + poll + peers)
    }

    /// Refuses settings the experiment cannot run with.
    ///
    /// # Errors
    /// [`crate::Error::Invalid`] naming the option.
    fn check(&self) -> Result<()> {
        if self.runs == 0 {
            invalid!("--runs", "give at least 1");
        }
        if self.loops.is_empty() || self.loops.contains(&0) {
            invalid!("--loops", "give positive counts, e.g. 1000,10000");
        }
        if self.placement.is_empty() {
            invalid!("--placement", "give at least one of one, split, free");
        }
        if let Some(dir) = &self.openamp {
            let missing: Vec<&str> = peers::OPENAMP_PROGRAMS
                .into_iter()
                .filter(|p| !dir.join(p).is_file())
                .collect();
            if !missing.is_empty() {
                invalid!(
                    "--openamp",
                    "{} has no {} (build them with `scripts/openamp-demo build SRC {}`)",
                    dir.display(),
                    missing.join(", "),
                    dir.display()
                );
            }
            if self.peer_placement.is_empty() {
                invalid!("--peer-placement", "give at least one of one, split, free");
            }
            if self.peer_budget.is_zero() {
                invalid!("--peer-seconds", "give at least 1");
            }
        }
        Ok(())
    }
}

/// Where the shared memory goes: `/dev/shm`, else the temporary directory.
fn shm_dir() -> PathBuf {
    let d = Path::new("/dev/shm");
    if d.is_dir() {
        d.to_owned()
    } else {
        std::env::temp_dir()
    }
}

/// What one placement measured.
#[derive(Debug)]
struct Measured {
    placement: Placement,
    /// Where the placement put the processes, in words.
    place: String,
    rows: Vec<Row>,
    echo: Latency,
    echo_limit: Latency,
}

/// The create+destroy rows and the echo rows with every process where
/// `placement` puts it.
fn measure(
    a: &RpmsgConfig,
    placement: Placement,
    cpus: &Cpus,
    pb: &ProgressBar,
) -> Result<Measured> {
    let (client_cpu, server_cpu) = placement.cpus(cpus);
    let servers = Servers::start(
        &a.iopath,
        &Setup {
            parent: &shm_dir(),
            prefix: "iopath-bench-rpmsg-",
            poll: false,
            remote_args: &["--echo", "echo"],
            shm_size: children::SHM_SIZE,
            remote_cpu: server_cpu,
            host_cpu: server_cpu,
        },
    )?;
    let raw = raw::fd::RawFdServer::start(&a.iopath, server_cpu)?;
    on_cpu(client_cpu, cpus, || {
        let (c, echo_ep) = servers.client("echo")?;
        let rows = cycles::rows(&c, &raw, &a.loops, a.runs, placement, pb)?;
        pb.set_message(format!("{} echo", placement.name()));
        let (echo, echo_limit) = echo::echo_vs_limit(&a.iopath, &echo_ep, a.count, server_cpu)?;
        Ok(Measured {
            placement,
            place: placement.describe(cpus, "client", "host, remote and the limit's server"),
            rows,
            echo,
            echo_limit,
        })
    })
}

/// What the rpmsg experiment measured; [`RpmsgReport::report`] makes its
/// tables, chart and figures.
#[derive(Debug)]
pub struct RpmsgReport {
    runs: usize,
    count: u64,
    measured: Vec<Measured>,
    /// Echo with polling, its limits, and where they ran.
    poll: Option<PollMeasured>,
    /// The peer rows per placement (`None`: no `--openamp`), where each
    /// placement put the processes, and what they were given.
    peers: Option<Vec<(peers::PeerPlacement, String)>>,
    openamp: Option<PathBuf>,
    peer_budget: Duration,
    /// The scale experiments and the bulk rows, when added.
    scale: Option<scale::ScaleReport>,
    bulk: Option<bulk::BulkReport>,
    /// The 1-minute load average before and after the run.
    loadavg: (Option<f64>, Option<f64>),
}

/// Runs the experiment.
///
/// # Errors
/// [`crate::Error::Invalid`] for bad settings; when the host, remote or a
/// raw server cannot be started or misbehave.
pub fn run(a: &RpmsgConfig) -> Result<RpmsgReport> {
    a.check()?;
    let cpus = Cpus::get()?;
    let load_before = crate::loadavg();
    let total: u64 =
        a.loops.iter().sum::<u64>() * WAYS as u64 * a.runs as u64 * a.placement.len() as u64;
    let pb = ProgressBar::new(a.progress, "bench rpmsg", total);
    let mut measured = Vec::new();
    for &p in &a.placement {
        measured.push(measure(a, p, &cpus, &pb)?);
    }
    let poll = if a.poll {
        pb.set_message("poll echo");
        Some(echo::measure_poll(a, &cpus)?)
    } else {
        None
    };
    let peers = a.openamp.as_ref().map(|_| {
        a.peer_placement
            .iter()
            .map(|&p| {
                let place = p.describe(&cpus, "driver side", "remote");
                (peers::measure(a, p, &cpus, &pb), place)
            })
            .collect()
    });
    pb.finish();
    Ok(RpmsgReport {
        runs: a.runs,
        count: a.count,
        measured,
        poll,
        peers,
        openamp: a.openamp.clone(),
        peer_budget: a.peer_budget,
        scale: None,
        bulk: None,
        loadavg: (load_before, crate::loadavg()),
    })
}

impl RpmsgReport {
    /// Adds the scale experiments: their tables after the polling echo,
    /// their figures (JSON `scale`) and chart panels.
    pub fn add_scale(&mut self, s: scale::ScaleReport) {
        self.scale = Some(s);
    }

    /// Adds the bulk rows: their table after the scale tables, their
    /// figures (JSON `bulk`) and chart panel.
    pub fn add_bulk(&mut self, b: bulk::BulkReport) {
        self.bulk = Some(b);
    }
}
