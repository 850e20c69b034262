//! The OpenAMP peer rows of `iopath bench rpmsg --openamp DIR`: strict
//! ping-pong of 16-byte messages between each driver side ([`Driver`])
//! and each remote ([`Remote`]), pinned per placement, the pairs taking
//! turns. OpenAMP's Linux demo platform fixes its shared memory and its
//! notification socket ([`OPENAMP_SHM`], [`OPENAMP_EVENT`]: one byte per
//! kick), so the pairs run there one at a time, and no other OpenAMP demo
//! may run meanwhile. `DIR` is built by `scripts/openamp-demo`.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use iopath_rpmsg::ctrl::CtrlClient;
use iopath_rpmsg::{Bus, EndpointOptions, NotifySpec, SharedMem, HOST_FEATURES};

use iopath_rpmsg::tools::openamp::{EVENT as OPENAMP_EVENT, NOTIFY, SERVICE, SHM as OPENAMP_SHM};
use iopath_rpmsg::tools::ping::{wait_announced, Latency};

use super::children::{self, bound, echo_once};
use super::RpmsgConfig;
use crate::error::{check, check_failed};
use crate::place::{on_cpu, Cpus, Placement, Spawned};
use crate::report::plot::{Chart, PEER, PRIMARY, SECONDARY};
use crate::report::{Cell, Column, Table, Unit};
use crate::{Error, ProgressBar, Result, Stats};

/// The programs `--openamp DIR` must hold.
pub(super) const OPENAMP_PROGRAMS: [&str; 2] = ["rpmsg-echo", "rpmsg-ping-timed"];
/// Unmeasured round trips before each row's measured ones.
const PEER_WARM: u64 = 100;
const SIZE: usize = 16;

/// Who drives (the virtio driver side, owning the buffers): OpenAMP's
/// timed driver `rpmsg-ping-timed`; `iopath rpmsg host --ctrl` with this
/// process as the client of an endpoint fd; this process as the host, on
/// iopath's in-process `Bus` API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Driver {
    OpenAmp,
    EptFd,
    Bus,
}

/// Who echoes (the virtio device side): OpenAMP's `rpmsg-echo`, or
/// `iopath rpmsg remote`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Remote {
    OpenAmp,
    Iopath,
}

/// Each driver's and remote's name in the tables and key in the progress
/// line.
const DRIVERS: [(&str, &str); 3] = [
    ("OpenAMP driver (rpmsg-ping-timed)", "openamp"),
    ("iopath endpoint fd (rpmsg host + client)", "ept_fd"),
    ("iopath Bus API (in-process host)", "bus"),
];
const REMOTES: [(&str, &str); 2] = [
    ("OpenAMP rpmsg-echo", "openamp"),
    ("iopath rpmsg remote", "iopath"),
];

/// Every pair, in the order of the tables.
const PAIRS: [(Driver, Remote); 6] = [
    (Driver::OpenAmp, Remote::OpenAmp),
    (Driver::OpenAmp, Remote::Iopath),
    (Driver::EptFd, Remote::Iopath),
    (Driver::EptFd, Remote::OpenAmp),
    (Driver::Bus, Remote::Iopath),
    (Driver::Bus, Remote::OpenAmp),
];

/// One pair's runs in one placement: each run that completed, and why
/// the others did not.
#[derive(Debug, Default)]
struct PeerRow {
    runs: Vec<Latency>,
    failures: Vec<String>,
}

impl PeerRow {
    fn each(&self, f: impl Fn(&Latency) -> f64) -> Vec<f64> {
        self.runs.iter().map(f).collect()
    }

    fn median(&self, f: impl Fn(&Latency) -> f64) -> f64 {
        Stats::of(&self.each(f)).median
    }
}

/// Starts the remote `kind` on `cpu` and waits until it listens.
fn start_remote(a: &RpmsgConfig, dir: &Path, kind: Remote, cpu: Option<usize>) -> Result<Spawned> {
    // Each remote binds the socket and writes the table afresh; what an
    // earlier pair left would let a driver connect to nothing.
    clear_platform();
    let (name, mut cmd) = match kind {
        Remote::OpenAmp => ("rpmsg-echo", Command::new(openamp(a).join("rpmsg-echo"))),
        Remote::Iopath => {
            let shm = Path::new(OPENAMP_SHM);
            let mut cmd = children::remote(&a.iopath, shm, NOTIFY, children::SHM_SIZE);
            cmd.args(["--echo", SERVICE, "--once"]);
            ("iopath rpmsg remote", cmd)
        }
    };
    let mut kid = logged(dir, name, cpu, &mut cmd)?;
    kid.wait_for("notification socket", Duration::from_secs(20), || {
        Path::new(OPENAMP_EVENT).exists()
    })?;
    Ok(kid)
}

/// `cmd`, called `name`, on `cpu`, its output in `dir/NAME.log`.
fn logged(dir: &Path, name: &str, cpu: Option<usize>, cmd: &mut Command) -> Result<Spawned> {
    crate::place::spawn(name, Some(dir.join(format!("{name}.log"))), cpu, cmd)
}

/// [`PEER_WARM`] unmeasured round trips, then up to `count` strict round
/// trips within `budget`, each one `rt(seq)`; their latencies.
fn timed(count: u64, budget: Duration, mut rt: impl FnMut(u64) -> Result<()>) -> Result<Latency> {
    (0..PEER_WARM).try_for_each(&mut rt)?;
    let mut lat = Vec::with_capacity(count as usize);
    let t0 = Instant::now();
    let mut seq = PEER_WARM;
    while (lat.len() as u64) < count && t0.elapsed() < budget {
        let t = Instant::now();
        rt(seq)?;
        lat.push(t.elapsed().as_secs_f64() * 1e6);
        seq += 1;
    }
    Ok(Latency::from(lat, t0.elapsed()))
}

fn message(seq: u64) -> [u8; SIZE] {
    u128::from(seq).to_le_bytes()
}

/// OpenAMP's demo programs (the config is checked before any row runs).
fn openamp(a: &RpmsgConfig) -> &Path {
    a.openamp.as_deref().expect("peer rows need --openamp")
}

/// The OpenAMP driver: runs `rpmsg-ping-timed` and reads its JSON line.
fn openamp_driver(a: &RpmsgConfig, dir: &Path, cpu: Option<usize>) -> Result<Latency> {
    let secs = a.peer_budget.as_secs().max(1);
    let name = "rpmsg-ping-timed";
    let mut cmd = Command::new(openamp(a).join(name));
    let args = format!("-n {} -w {PEER_WARM} -s {SIZE} -t {secs}", a.count);
    cmd.args(args.split(' '));
    let mut kid = logged(dir, name, cpu, &mut cmd)?;
    let st = kid.wait_until(Instant::now() + Duration::from_secs(secs + 90))?;
    let out = kid.output();
    let last = out.lines().rev().find(|l| l.starts_with('{'));
    let parsed = last.and_then(|l| serde_json::from_str::<serde_json::Value>(l).ok());
    let Some(v) = parsed.filter(|_| st.success()) else {
        return Err(Error::Peer {
            program: name.into(),
            reason: format!("{st}; {}", kid.last_words()),
        });
    };
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    check!(
        n("errors") == 0 && n("count") > 0 && n("size") == SIZE as u64,
        "rpmsg-ping-timed reported {v}"
    );
    Ok(Latency {
        count: n("count"),
        p50_us: n("p50_ns") as f64 / 1e3,
        p99_us: n("p99_ns") as f64 / 1e3,
        max_us: n("max_ns") as f64 / 1e3,
        msgs_per_s: n("count") as f64 / (n("total_ns") as f64 / 1e9).max(1e-9),
    })
}

/// The endpoint-fd driver: `iopath rpmsg host` on `cpu`, this thread (on
/// `cpu` too) its client.
fn ept_fd_driver(a: &RpmsgConfig, dir: &Path, cpu: Option<usize>, cpus: &Cpus) -> Result<Latency> {
    let ctrl = dir.join("ctrl");
    let mut cmd = children::host(&a.iopath, Path::new(OPENAMP_SHM), NOTIFY, &ctrl);
    cmd.args(["--once", "--timeout", "20"]);
    let name = "iopath rpmsg host";
    let mut host = logged(dir, name, cpu, &mut cmd)?;
    host.wait_for("control socket", Duration::from_secs(20), || ctrl.exists())?;
    on_cpu(cpu, cpus, || {
        let c = CtrlClient::connect(&ctrl).map_err(Error::layer("connecting to the host"))?;
        let ep = bound(&c, SERVICE)?;
        let mut back = [0u8; 512];
        let rt = |seq| echo_once(&ep, &message(seq), &mut back, "", seq);
        timed(a.count, a.peer_budget, rt)
    })
}

/// The `Bus` driver: this thread (on `cpu`) the host.
fn bus_driver(a: &RpmsgConfig, cpu: Option<usize>, cpus: &Cpus) -> Result<Latency> {
    on_cpu(cpu, cpus, || {
        let wait = Duration::from_secs(20);
        let notifier = NotifySpec::Unix(OPENAMP_EVENT.into())
            .connect(wait)
            .map_err(Error::layer(format!(
                "connecting to the remote on {NOTIFY}"
            )))?;
        let shm = SharedMem::open(Path::new(OPENAMP_SHM))
            .map_err(Error::layer(format!("opening {OPENAMP_SHM}")))?;
        let bus = Bus::host(shm, notifier, HOST_FEATURES)
            .map_err(Error::layer("starting the in-process host"))?;
        let ep = bus
            .create(EndpointOptions::new(SERVICE))
            .map_err(Error::layer(format!("creating the endpoint {SERVICE:?}")));
        let r = ep.and_then(|ep| {
            wait_announced(&bus, &ep, SERVICE, wait)
                .map_err(Error::layer("waiting for the remote"))?;
            timed(a.count, a.peer_budget, |seq| {
                let msg = message(seq);
                ep.send(&msg).map_err(Error::layer("sending an echo"))?;
                let m = ep
                    .recv(Some(Duration::from_secs(10)))
                    .map_err(Error::layer("receiving an echo"))?;
                check!(m.data == msg, "echo {seq} came back wrong");
                Ok(())
            })
        });
        // Down before the endpoint goes: a name-service DESTROY would end
        // OpenAMP's echo, and the bus would log the link going down.
        bus.shutdown();
        r
    })
}

fn one(
    a: &RpmsgConfig,
    (driver, remote): (Driver, Remote),
    (driver_cpu, remote_cpu): (Option<usize>, Option<usize>),
    cpus: &Cpus,
) -> Result<Latency> {
    let dir = crate::cleanup::temp_dir("iopath-bench-peer-", &std::env::temp_dir())?;
    let mut remote_kid = start_remote(a, dir.path(), remote, remote_cpu)?;
    let r = match driver {
        Driver::OpenAmp => openamp_driver(a, dir.path(), driver_cpu),
        Driver::EptFd => ept_fd_driver(a, dir.path(), driver_cpu, cpus),
        Driver::Bus => bus_driver(a, driver_cpu, cpus),
    };
    let r = r.map_err(|e| match remote_kid.exited() {
        Some(st) => Error::Check(format!(
            "{e} (the remote exited: {st}; {})",
            remote_kid.last_words()
        )),
        _ => e,
    });
    drop(remote_kid);
    clear_platform();
    r
}

/// Removes the demo platform's files.
fn clear_platform() {
    let _ = std::fs::remove_file(OPENAMP_EVENT);
    let _ = std::fs::remove_file(OPENAMP_SHM);
}

/// Every pair in placement `p`, `a.runs` times, the pairs taking turns
/// (the first pair rotating from run to run): its table.
/// A run that fails is noted in its row; the others go on.
pub(super) fn measure(a: &RpmsgConfig, p: Placement, cpus: &Cpus, pb: &ProgressBar) -> Table {
    let place = p.cpus(cpus);
    // The demo platform's fixed files go too if a signal ends the run.
    crate::cleanup::path(Path::new(OPENAMP_SHM));
    crate::cleanup::path(Path::new(OPENAMP_EVENT));
    let mut rows: Vec<PeerRow> = PAIRS.map(|_| PeerRow::default()).into();
    for run in 0..a.runs {
        for i in crate::turns(PAIRS.len(), run) {
            let (d, r) = (DRIVERS[PAIRS[i].0 as usize], REMOTES[PAIRS[i].1 as usize]);
            pb.set_message(format!("peers {}: {} <-> {}", p.name(), d.1, r.1));
            match one(a, PAIRS[i], place, cpus) {
                Ok(l) => rows[i].runs.push(l),
                Err(e) => rows[i].failures.push(e.chain()),
            }
        }
    }
    let place = p.describe(cpus, "driver side", "remote");
    table(a, p, &place, &rows)
}

/// One placement's table: round trips/s per pair, p50, p99, and each pair
/// over OpenAMP's own (by round trips/s and by p50).
fn table(a: &RpmsgConfig, placement: Placement, place: &str, rows: &[PeerRow]) -> Table {
    let mut t = Table::new(
        format!(
            "rpmsg peers, placement {} ({place}): {} runs, up to {} strict {SIZE}-byte round trips per row \
             (at most {} s) after {PEER_WARM} unmeasured, the pairs taking turns; OpenAMP's demo platform \
             ({OPENAMP_SHM}, a byte per kick on {NOTIFY}); OpenAMP from {}",
            placement.name(),
            a.runs,
            a.count,
            a.peer_budget.as_secs(),
            a.openamp.as_deref().map_or_else(|| "-".into(), |d| d.display().to_string())
        ),
        vec![
            Column::left("driver side"),
            Column::left("remote"),
            Column::right("round trips/s, median (min-max)"),
            Column::right("p50 us"),
            Column::right("p99 us"),
            Column::right("/ OpenAMP pair"),
            Column::right("by p50"),
        ],
    );
    // Every ratio is over OpenAMP's own pair, the first row.
    let pair = &rows[0];
    for (r, (driver, remote)) in rows.iter().zip(PAIRS) {
        let (d, m) = (DRIVERS[driver as usize].0, REMOTES[remote as usize].0);
        for f in &r.failures {
            t.note(format!("note: a run of {d} <-> {m} failed: {f}"));
        }
        if r.runs.is_empty() {
            let why = r.failures.join("; ");
            t.not_run(format!("{d} <-> {m}"), "every run failed", &why);
            continue;
        }
        let rates = r.each(|l| l.msgs_per_s);
        // The ratio of the medians, and the range of the per-run ratios
        // (run i of one against run i of the other: they ran side by side).
        let side_by_side = r.runs.iter().zip(&pair.runs);
        let per: Vec<f64> = side_by_side
            .map(|(x, y)| x.msgs_per_s / y.msgs_per_s)
            .collect();
        let by_rate = Cell::times(Stats::of(&rates).median / pair.median(|l| l.msgs_per_s));
        let s = Stats::of(&per);
        // By the median round trip, unlike round trips/s, the rare long
        // stall a spinning peer takes when it loses its CPU does not count.
        // Without the pair's runs both are NaN: n/a.
        let by_p50 = pair.median(|l| l.p50_us) / r.median(|l| l.p50_us);
        t.row(vec![
            Cell::text(d),
            Cell::text(m),
            Cell::runs(&rates, Unit::Grouped, 0)
                .with_samples(r.runs.iter().map(|l| l.count).collect()),
            Cell::median(&r.each(|l| l.p50_us), Unit::Plain, 1),
            Cell::median(&r.each(|l| l.p99_us), Unit::Plain, 1),
            by_rate.with_range(s.min, s.max),
            Cell::times(by_p50),
        ]);
    }
    t
}

/// The chart of `t` (the peers' table at `placement`): round trips/s per
/// pair, coloured by driver, in a group of the placement.
pub(super) fn chart(placement: Placement, t: &Table) -> Chart {
    let title = "rpmsg peers: round trips/s of each driver with each remote";
    let mut c = Chart::new("rpmsg-peers-round-trips", title, "round trips/s")
        .about(format!("strict {SIZE}-byte round trips over OpenAMP's demo platform, median (min-max) over runs"), "round trips/s, higher is faster")
        .legend(&[
            ("OpenAMP driver", PEER),
            ("iopath endpoint fd", PRIMARY),
            ("iopath Bus API", SECONDARY),
        ]);
    c.group(format!("placement {}", placement.name()));
    let v = t.col("round trips/s, median (min-max)");
    for row in &t.rows {
        let (d, m) = (row[0].to_string(), row[1].to_string());
        let color = match d.split_whitespace().nth(1) {
            Some("driver") => PEER,
            Some("endpoint") => PRIMARY,
            _ => SECONDARY,
        };
        let short = |s: &str| s.split(" (").next().unwrap_or_default().to_string();
        c.bar(format!("{} <-> {}", short(&d), short(&m)), &row[v], color);
    }
    c
}

/// The note in place of the peer rows without `--openamp`.
pub(super) const NO_PEERS: &str = "the OpenAMP peer rows (OpenAMP's driver and iopath's endpoint \
fd and Bus API, each against OpenAMP's rpmsg-echo and iopath's remote) are missing: no --openamp \
DIR (build DIR with `scripts/openamp-demo build SRC DIR`)";

/// The peer rows' settings, for a report's context.
pub(super) fn context(a: &RpmsgConfig) -> serde_json::Value {
    serde_json::json!({
        "openamp": a.openamp,
        "size": SIZE,
        "warm": PEER_WARM,
        "count": a.count,
        "budget_s": a.peer_budget.as_secs(),
        "notify": NOTIFY,
        "shm": OPENAMP_SHM,
    })
}
