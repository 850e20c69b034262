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
//! against OpenAMP's echo and iopath's remote ([`peers`]). The report ends
//! with the targets, each ratio measured in this run beside its target.
//!
//! ```text
//!   config      RpmsgConfig: what to measure, checked
//!   children    iopath rpmsg remote + host (Servers), logged children
//!   raw         the limits' bare servers (child processes) and clients
//!   cycles      create+destroy rows    echo   echo rows (+ --poll)
//!   peers       OpenAMP peer rows      scale  --scale experiments
//!   report      RpmsgReport -> Report: tables, targets, chart, figures
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::place::{on_cpu, Cpus, Placement};
use crate::{Latency, Progress as ProgressBar, Result, Summary};

pub mod bulk;
mod children;
mod config;
mod cycles;
mod echo;
pub mod peers;
pub mod raw;
mod report;
pub mod scale;

pub use config::RpmsgConfig;
pub use raw::RawPingPong;

use children::{Servers, Setup};
use cycles::{way, Row, CHUNK, WAYS};
use echo::{PollMeasured, ECHO_TURNS};

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
            shm_size: crate::rpmsg::children::SHM_SIZE,
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
    /// Where each placement put the processes, in words.
    wheres: Vec<String>,
    /// Echo with polling, its limits, and where they ran.
    poll: Option<PollMeasured>,
    /// Each placement's figures, in order.
    placements: Vec<serde_json::Value>,
    /// The peer rows per placement (`None`: no `--openamp`).
    peers: Option<Vec<peers::PeerPlacement>>,
    /// What the peer rows were given: `--openamp`, round trips, budget.
    openamp: Option<PathBuf>,
    peer_budget: Duration,
    /// Where each peer placement put the processes, in words.
    peer_wheres: Vec<String>,
    /// The scale experiments' tables and figures, when added
    /// ([`RpmsgReport::add_scale`]).
    scale: Option<(Vec<crate::report::Table>, serde_json::Value)>,
    /// The scale experiments' chart panels, when added.
    scale_panels: Vec<crate::plot::Panel>,
    /// The bulk rows, when added ([`RpmsgReport::add_bulk`]).
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
    let mut all = Vec::new();
    for &p in &a.placement {
        all.push(measure(a, p, &cpus, &pb)?);
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
            .map(|&p| peers::measure(a, p, &cpus, &pb))
            .collect::<Vec<_>>()
    });
    pb.finish();
    let peer_wheres = a
        .peer_placement
        .iter()
        .map(|p| p.describe(&cpus, "driver side", "remote"))
        .collect();
    let placements = all
        .iter()
        .map(|m| report::placement_json(m, &cpus))
        .collect();
    let wheres = all
        .iter()
        .map(|m| {
            m.placement
                .describe(&cpus, "client", "host, remote and the limit's server")
        })
        .collect();
    Ok(RpmsgReport {
        runs: a.runs,
        count: a.count,
        measured: all,
        wheres,
        poll,
        placements,
        peers,
        openamp: a.openamp.clone(),
        peer_budget: a.peer_budget,
        peer_wheres,
        scale: None,
        scale_panels: Vec::new(),
        bulk: None,
        loadavg: (load_before, crate::loadavg()),
    })
}
