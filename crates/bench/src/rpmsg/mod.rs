//! `iopath bench rpmsg`: the endpoint service's figures, each beside a
//! limit measured in the same run, with host and remote as child
//! processes (`children`) and the limits' bare servers too (`raw`):
//! create+destroy cycles (`cycles`), echo round trips (`echo`), with
//! `--openamp DIR` the peer rows (`peers`), then the `--scale` and bulk
//! rows.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::invalid;
use crate::place::{on_cpu, Cpus, Placement};
use crate::{ProgressBar, Report, Result};

mod bulk;
mod children;
mod cycles;
mod echo;
mod peers;
pub(crate) mod raw;
mod scale;

use children::{Servers, Setup};

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
    /// experiment starts, as it does the bench servers.
    pub iopath: PathBuf,
    /// Also the scale experiments: 1, 16 and 256 endpoints echoing at
    /// once, 10,000 endpoints created and held.
    pub scale: bool,
    /// Bytes each bulk row streams per run (0: no bulk rows).
    pub bulk_bytes: u64,
    /// Message sizes of the bulk rows.
    pub bulk_sizes: Vec<usize>,
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
            scale: false,
            bulk_bytes: 0,
            bulk_sizes: vec![496, 2048, 4096, 65520],
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

/// The create+destroy rows and the echo rows with every process where
/// `placement` puts it, into `r`; where they ran, in words.
fn measure(
    a: &RpmsgConfig,
    p: Placement,
    cpus: &Cpus,
    pb: &ProgressBar,
    r: &mut Report,
) -> Result<String> {
    let (client_cpu, server_cpu) = p.cpus(cpus);
    let servers = Servers::start(&a.iopath, &Setup::echo(server_cpu, server_cpu))?;
    let raw = raw::fd::RawFdServer::start(&a.iopath, server_cpu)?;
    let (rows, [echo, limit]) = on_cpu(client_cpu, cpus, || {
        let c = servers.connect()?;
        let echo_ep = children::bound(&c, "echo")?;
        let rows = cycles::rows(&c, &raw, &a.loops, a.runs, p, pb)?;
        pb.set_message(format!("{} echo", p.name()));
        let echo = echo::rows(a, echo_ep, server_cpu)?;
        Ok((rows, echo))
    })?;
    let place = p.describe(cpus, "client", "host, remote and the limit's server");
    let t = cycles::table(p, &place, &rows, a.runs);
    r.chart(cycles::chart(p, &t));
    r.table(t);
    let (name, turns) = (p.name(), echo::ECHO_TURNS);
    let title = format!("echo round trip, placement {name}: 16 B, {} round trips each, in {turns} alternating turns", a.count);
    let t = echo::table(title, &[("endpoint fd (eventfd notify)", &echo)], &limit);
    let title = "rpmsg echo round trip: an endpoint fd's latency beside its limit";
    let heading = format!("placement {name}");
    r.chart(echo::chart("rpmsg-echo-latency", title, heading, &t));
    r.table(t);
    Ok(place)
}

/// Runs the experiment.
///
/// # Errors
/// [`crate::Error::Invalid`] for bad settings; when the host, remote or a
/// raw server cannot be started or misbehave.
pub fn run(a: &RpmsgConfig) -> Result<Report> {
    a.check()?;
    let cpus = Cpus::get().map_err(crate::Error::sys("reading the CPU affinity"))?;
    let load_before = crate::loadavg();
    let total = a.loops.iter().sum::<u64>() * (cycles::WAYS * a.runs * a.placement.len()) as u64;
    let pb = ProgressBar::new("bench rpmsg", total);
    let mut r = Report::new("rpmsg", "");
    let mut places = Vec::new();
    for &p in &a.placement {
        let place = measure(a, p, &cpus, &pb, &mut r)?;
        places.push(serde_json::json!({"placement": p.name(), "where": place}));
    }
    if a.poll {
        pb.set_message("poll echo");
        echo::measure_poll(a, &cpus, &mut r)?;
    }
    let peer_placement = a.peer_placement.iter().filter(|_| a.openamp.is_some());
    let peers: Vec<_> = peer_placement
        .map(|&p| (peers::measure(a, p, &cpus, &pb), p))
        .collect();
    pb.finish();
    let load_after = crate::loadavg();
    if a.scale {
        scale::run(&a.iopath, &cpus, &mut r)?;
    }
    if a.bulk_bytes > 0 {
        bulk::run(a, &cpus, &mut r)?;
    }
    if a.openamp.is_none() {
        r.note(format!("note: {}", peers::NO_PEERS));
    }
    for (t, p) in peers {
        r.chart(peers::chart(p, &t));
        r.table(t);
    }
    let f = |v: Option<f64>| v.map_or_else(|| "?".into(), |v| format!("{v:.2}"));
    let (before, after) = (f(load_before), f(load_after));
    r.summary = format!(
        "rpmsg endpoints, {} runs, {} echo round trips per row; 1-minute load average {before} before, {after} after",
        a.runs, a.count
    );
    let peers = a.openamp.as_ref().map(|_| peers::context(a));
    r.context(
        serde_json::json!({"runs": a.runs, "count": a.count, "loadavg": [load_before, load_after],
        "placements": places, "peers": peers}),
    );
    Ok(r)
}
