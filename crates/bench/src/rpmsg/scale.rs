//! `iopath bench rpmsg --scale`: what the endpoint service costs as the
//! work grows, beside limits measured in the same run.
//!
//! ```text
//!  client threads (one per endpoint fd) ─► host (endpoint service, one
//!  thread) ─► vrings ─► remote "echo" / "sink" (another process)
//!
//!  echo     1, 16, 256 endpoints echoing at once, one thread each, for a
//!           fixed time: aggregate round trips/s, each endpoint's p99 and
//!           round trips (fairness: no endpoint starved)
//!  stream   one endpoint sending as fast as it can to the sink (the ring
//!           kept full), then "SYNC", answered with the sink's count:
//!           messages/s and MB/s, beside the same stream over a bare
//!           SOCK_SEQPACKET socket to another process (`rpmsg raw-sink`)
//!  create   10,000 endpoint fds created on one control connection and
//!           held, then closed: time per endpoint per thousand (a curve),
//!           the host's resident memory per endpoint
//! ```
//!
//! The remote offers `EVENT_IDX`, so kicks are batched both ways.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use iopath_rpmsg::ctrl::proto::{O_CLOEXEC, O_RDWR};
use iopath_rpmsg::ctrl::{CtrlClient, EptFd, EptInfo};
use iopath_rpmsg::wire::ADDR_ANY;
use rustix::net::{RecvFlags, SendFlags};
use serde_json::json;

use crate::error::{check, check_failed, invalid};
use crate::place::{on_cpu, spawn_on, Children, Cpus, Placement};
use crate::{percentile, Error, Result, Summary};

/// The message a sink answers with its count (u64, little-endian) of
/// messages received so far, this one included.
pub const SINK_SYNC: &[u8; 4] = b"SYNC";

/// What `iopath bench rpmsg --scale` measures.
#[derive(Debug, Clone)]
pub struct ScaleConfig {
    /// Endpoints echoing at once, one row each.
    pub endpoints: Vec<usize>,
    /// How long each echo row runs per run.
    pub echo_time: Duration,
    /// Runs of each echo and stream row (median and spread reported).
    pub runs: usize,
    /// Messages per stream run.
    pub stream_msgs: u64,
    /// Payload sizes of the stream rows.
    pub stream_sizes: Vec<usize>,
    /// Endpoints created (and held) at once.
    pub create: usize,
    /// Where the processes run: the client threads where the placement
    /// puts the client, host and remote (and the raw sink) where it puts
    /// the servers.
    pub placement: Placement,
    /// The `iopath` executable (`rpmsg host|remote|raw-sink`).
    pub iopath: PathBuf,
}

impl ScaleConfig {
    /// 1, 16 and 256 endpoints for 1 s each, 3 runs, streams of 100,000
    /// messages of 16 and 496 bytes, 10,000 endpoints, every process on
    /// one CPU.
    pub fn new(iopath: PathBuf) -> ScaleConfig {
        ScaleConfig {
            endpoints: vec![1, 16, 256],
            echo_time: Duration::from_secs(1),
            runs: 3,
            stream_msgs: 100_000,
            stream_sizes: vec![16, 496],
            create: 10_000,
            placement: Placement::One,
            iopath,
        }
    }
}

/// Host and remote (echo "echo", sink "sink") on a temporary shared-memory
/// file; killed when dropped.
struct Servers {
    children: Children,
    dir: tempfile::TempDir,
    ctrl: PathBuf,
    host_pid: u32,
}

impl Servers {
    fn start(exe: &Path, cpu: Option<usize>) -> Result<Servers> {
        let dir = crate::cleanup::temp_dir("iopath-bench-scale-", &std::env::temp_dir())?;
        let shm = dir.path().join("shm");
        let notify = format!("eventfd:{}", dir.path().join("ev").display());
        let ctrl = dir.path().join("ctrl");
        let log = |name: &str| -> Result<Stdio> {
            let p = dir.path().join(name);
            Ok(std::fs::File::create(&p).map_err(Error::io(p))?.into())
        };
        let (rlog, hlog) = (log("remote.err")?, log("host.err")?);
        let mut s = Servers {
            children: Children::default(),
            dir,
            ctrl,
            host_pid: 0,
        };
        s.children.spawn_on(
            cpu,
            Command::new(exe)
                .args(["rpmsg", "remote", "--shm"])
                .arg(&shm)
                .args(["--create", "0x80000", "--event-idx", "--notify", &notify])
                .args(["--echo", "echo", "--sink", "sink"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(rlog),
        )?;
        s.host_pid = s.children.spawn_on(
            cpu,
            Command::new(exe)
                .args(["rpmsg", "host", "--shm"])
                .arg(&shm)
                .args(["--notify", &notify, "--ctrl"])
                .arg(&s.ctrl)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(hlog),
        )?;
        let start = Instant::now();
        while !s.ctrl.exists() {
            if start.elapsed() > Duration::from_secs(30) {
                let err =
                    std::fs::read_to_string(s.dir.path().join("host.err")).unwrap_or_default();
                check_failed!("the host never opened its control socket: {}", err.trim());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(s)
    }

    fn connect(&self) -> Result<CtrlClient> {
        CtrlClient::connect(&self.ctrl).map_err(Error::ctrl("connecting to the endpoint service"))
    }

    /// The host's resident memory, KiB.
    fn host_rss_kib(&self) -> Result<u64> {
        let p = format!("/proc/{}/status", self.host_pid);
        let s = std::fs::read_to_string(&p).map_err(Error::io(&p))?;
        s.lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .ok_or_else(|| Error::Check(format!("no VmRSS in {p}")))
    }
}

/// An endpoint bound to the remote's `name`, once the remote announced it.
fn bound(c: &CtrlClient, name: &str) -> Result<EptFd> {
    let start = Instant::now();
    loop {
        let ep = c
            .create_ept_fd(&EptInfo::new(name), O_RDWR | O_CLOEXEC)
            .map_err(Error::ctrl(format!("CREATE_EPT_FD for {name:?}")))?;
        if ep.info().dst != ADDR_ANY {
            return Ok(ep);
        }
        drop(ep);
        check!(
            start.elapsed() < Duration::from_secs(30),
            "the remote never announced {name:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// One endpoint's share of an echo run.
#[derive(Debug, Clone, Copy)]
struct PerEpt {
    round_trips: u64,
    p99_us: f64,
}

/// `n` endpoints echoing at once from `n` threads for `time`.
fn echo_run(c: &CtrlClient, n: usize, time: Duration) -> Result<(f64, Vec<PerEpt>)> {
    let eps = (0..n)
        .map(|_| bound(c, "echo"))
        .collect::<Result<Vec<_>>>()?;
    let go = Barrier::new(n + 1);
    let deadline = AtomicU64::new(0);
    let t0 = Instant::now();
    let per = std::thread::scope(|s| -> Result<Vec<PerEpt>> {
        let mut handles = Vec::with_capacity(n);
        for (i, ep) in eps.iter().enumerate() {
            let (go, deadline) = (&go, &deadline);
            let h = std::thread::Builder::new()
                .stack_size(256 << 10)
                .spawn_scoped(s, move || -> Result<PerEpt> {
                    let mut lat = Vec::with_capacity(1 << 14);
                    let mut back = [0u8; 512];
                    go.wait();
                    let end = t0 + Duration::from_nanos(deadline.load(Ordering::SeqCst));
                    let mut seq = 0u64;
                    loop {
                        let t = Instant::now();
                        if t >= end {
                            break;
                        }
                        seq += 1;
                        let mut msg = [0u8; 16];
                        msg[..8].copy_from_slice(&(i as u64).to_le_bytes());
                        msg[8..].copy_from_slice(&seq.to_le_bytes());
                        ep.send(&msg).map_err(Error::ctrl("sending an echo"))?;
                        let got = ep
                            .recv_timeout(&mut back, Duration::from_secs(10))
                            .map_err(Error::ctrl("receiving an echo"))?
                            .ok_or_else(|| {
                                Error::Check(format!("endpoint {i}: no echo {seq} within 10 s"))
                            })?;
                        check!(
                            got == 16 && back[..16] == msg,
                            "endpoint {i}: echo {seq} came back wrong"
                        );
                        lat.push(t.elapsed().as_secs_f64() * 1e6);
                    }
                    lat.sort_by(f64::total_cmp);
                    Ok(PerEpt {
                        round_trips: lat.len() as u64,
                        p99_us: percentile(&lat, 0.99),
                    })
                })
                .map_err(Error::sys("spawning an echo thread"))?;
            handles.push(h);
        }
        // Every thread made and parked before the clock starts.
        deadline.store(
            (t0.elapsed() + Duration::from_millis(20) + time).as_nanos() as u64,
            Ordering::SeqCst,
        );
        go.wait();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::Check("an echo thread panicked".into())))
            })
            .collect()
    })?;
    let total: u64 = per.iter().map(|p| p.round_trips).sum();
    Ok((total as f64 / time.as_secs_f64(), per))
}

/// One echo row over every run.
#[derive(Debug)]
struct EchoRow {
    endpoints: usize,
    /// Aggregate round trips/s per run.
    aggregate: Vec<f64>,
    /// Per run: the median endpoint's p99, the worst endpoint's p99, the
    /// fewest round trips of an endpoint over the median endpoint's.
    p99_median: Vec<f64>,
    p99_max: Vec<f64>,
    fewest_share: Vec<f64>,
}

/// Sends `msgs` payloads of `size` bytes on `send`, then [`SINK_SYNC`], and
/// waits for the count with `recv`; returns the time taken and the count.
fn stream(
    msgs: u64,
    size: usize,
    mut send: impl FnMut(&[u8]) -> Result<()>,
    mut recv: impl FnMut(&mut [u8]) -> Result<usize>,
) -> Result<(Duration, u64)> {
    let payload = vec![0x5Au8; size];
    let mut answer = [0u8; 64];
    let t0 = Instant::now();
    for _ in 0..msgs {
        send(&payload)?;
    }
    send(SINK_SYNC)?;
    let n = recv(&mut answer)?;
    let took = t0.elapsed();
    check!(n == 8, "the sink answered {n} bytes, not 8");
    let mut c = [0u8; 8];
    c.copy_from_slice(&answer[..8]);
    Ok((took, u64::from_le_bytes(c)))
}

/// One stream row: messages/s per run, through the endpoint and raw.
#[derive(Debug)]
struct StreamRow {
    size: usize,
    ept: Vec<f64>,
    raw: Vec<f64>,
}

/// The stream limit's far end: counts and drops the packets of one
/// connection on the `SOCK_SEQPACKET` socket `sock`, answering
/// [`SINK_SYNC`] with the count so far (u64, little-endian). Returns when
/// the client hangs up.
///
/// # Errors
/// [`Error::Io`] (the socket) when a socket call fails.
pub fn raw_sink(sock: &Path) -> Result<()> {
    let (c, io) = super::accept_one(sock)?;
    let mut buf = [0u8; 512];
    let mut count = 0u64;
    loop {
        let (n, _) = rustix::net::recv(&c, &mut buf, RecvFlags::empty()).map_err(io)?;
        if n == 0 {
            return Ok(());
        }
        count += 1;
        if buf[..n] == SINK_SYNC[..] {
            rustix::net::send(&c, &count.to_le_bytes(), SendFlags::NOSIGNAL).map_err(io)?;
        }
    }
}

/// A connection to an `iopath rpmsg raw-sink` child.
struct RawSink {
    child: Child,
    conn: rustix::fd::OwnedFd,
    _dir: tempfile::TempDir,
}

impl Drop for RawSink {
    fn drop(&mut self) {
        let _ = rustix::net::shutdown(&self.conn, rustix::net::Shutdown::Both);
        let _ = self.child.wait();
    }
}

impl RawSink {
    fn start(exe: &Path, cpu: Option<usize>) -> Result<RawSink> {
        let dir = crate::cleanup::temp_dir("iopath-bench-sink-", &std::env::temp_dir())?;
        let sock = dir.path().join("sock");
        let child = spawn_on(
            cpu,
            Command::new(exe)
                .args(["rpmsg", "raw-sink", "--sock"])
                .arg(&sock)
                .stdin(Stdio::null()),
        )?;
        let conn = super::connect_retry(&sock)?;
        Ok(RawSink {
            child,
            conn,
            _dir: dir,
        })
    }
}

/// Creating many endpoints at once.
#[derive(Debug)]
struct CreateRow {
    endpoints: usize,
    /// Microseconds per endpoint, per thousand created (the curve).
    per_thousand_us: Vec<f64>,
    create_s: f64,
    destroy_s: f64,
    /// The host's resident memory before, with every endpoint held, after.
    rss_kib: [u64; 3],
}

/// Raises this process's soft open-file limit to at least `want` (or the
/// hard limit); returns the limit now.
fn raise_nofile(want: u64) -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut r = getrlimit(Resource::Nofile);
    let cur = r.current.unwrap_or(u64::MAX);
    if cur >= want {
        return cur;
    }
    r.current = Some(r.maximum.map_or(want, |m| m.min(want)));
    let _ = setrlimit(Resource::Nofile, r);
    getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX)
}

fn create_many(srv: &Servers, c: &CtrlClient, n: usize) -> Result<CreateRow> {
    let limit = raise_nofile(n as u64 + 256);
    if limit < n as u64 + 64 {
        invalid!(
            "--scale",
            "{n} endpoints need {} open files; the limit here is {limit}",
            n + 64
        );
    }
    let base = c.stats().map_err(Error::ctrl("STATS"))?.endpoints();
    let before = srv.host_rss_kib()?;
    let info = EptInfo::new("bench");
    let mut held = Vec::with_capacity(n);
    let mut per_thousand_us = Vec::new();
    let t0 = Instant::now();
    let mut tk = Instant::now();
    for i in 0..n {
        held.push(
            c.create_ept_fd(&info, O_RDWR | O_CLOEXEC)
                .map_err(Error::ctrl(format!("CREATE_EPT_FD number {}", i + 1)))?,
        );
        if (i + 1) % 1000 == 0 {
            per_thousand_us.push(tk.elapsed().as_secs_f64() * 1e6 / 1000.0);
            tk = Instant::now();
        }
    }
    let create_s = t0.elapsed().as_secs_f64();
    let st = c.stats().map_err(Error::ctrl("STATS"))?;
    check!(
        u64::from(st.endpoints()) == u64::from(base) + n as u64,
        "the service holds {} endpoints, not {}",
        st.endpoints(),
        u64::from(base) + n as u64
    );
    let full = srv.host_rss_kib()?;
    let t1 = Instant::now();
    drop(held);
    while c.stats().map_err(Error::ctrl("STATS"))?.endpoints() > base {
        check!(
            t1.elapsed() < Duration::from_secs(60),
            "the service did not free {n} closed endpoints within 60 s"
        );
        std::thread::sleep(Duration::from_micros(200));
    }
    let destroy_s = t1.elapsed().as_secs_f64();
    Ok(CreateRow {
        endpoints: n,
        per_thousand_us,
        create_s,
        destroy_s,
        rss_kib: [before, full, srv.host_rss_kib()?],
    })
}

/// What the scale experiments measured: [`ScaleReport::text`],
/// [`ScaleReport::json`], [`ScaleReport::markdown`].
#[derive(Debug)]
pub struct ScaleReport {
    runs: usize,
    echo_time: Duration,
    stream_msgs: u64,
    wheres: String,
    echo: Vec<EchoRow>,
    stream: Vec<StreamRow>,
    create: CreateRow,
}

impl ScaleReport {
    /// The chart's panels: aggregate round trips/s and the per-endpoint
    /// p99 as endpoints grow (the curves of the echo rows), and the
    /// one-way stream beside its raw limit; medians with min-max whiskers.
    pub(crate) fn panels(&self) -> Vec<crate::plot::Panel> {
        use crate::plot::{Bar, Line, Panel, LIMIT, PRIMARY, SECONDARY};
        let bar = |label: String, v: &[f64], color| {
            let s = Summary::of(v);
            Bar {
                label,
                segments: vec![(0.0, s.median, color)],
                whisker: Some((s.min, s.max)),
            }
        };
        let one = self
            .echo
            .first()
            .map_or(0.0, |r| Summary::of(&r.aggregate).median);
        let n = self.echo.len();
        let echo = Panel {
            title: "endpoints echoing at once, one CPU: aggregate round trips/s".into(),
            y_desc: "round trips/s".into(),
            log: false,
            bars: self
                .echo
                .iter()
                .map(|r| bar(format!("{} endpoints", r.endpoints), &r.aggregate, PRIMARY))
                .collect(),
            lines: vec![Line::across(
                "one endpoint's rate (the 256-endpoint goal: at least 0.9x)".into(),
                n,
                one,
            )],
            legend: vec![("aggregate".into(), PRIMARY)],
        };
        let p99 = Panel {
            title: "per-endpoint p99: median endpoint and worst endpoint".into(),
            y_desc: "us (log)".into(),
            log: true,
            bars: self
                .echo
                .iter()
                .flat_map(|r| {
                    [
                        bar(format!("{} median", r.endpoints), &r.p99_median, PRIMARY),
                        bar(format!("{} worst", r.endpoints), &r.p99_max, SECONDARY),
                    ]
                })
                .collect(),
            lines: Vec::new(),
            legend: vec![
                ("median endpoint's p99".into(), PRIMARY),
                ("worst endpoint's p99".into(), SECONDARY),
            ],
        };
        let stream = Panel {
            title: "one-way stream: messages/s".into(),
            y_desc: "messages/s".into(),
            log: false,
            bars: self
                .stream
                .iter()
                .flat_map(|r| {
                    [
                        bar(format!("{} B endpoint", r.size), &r.ept, PRIMARY),
                        bar(format!("{} B raw", r.size), &r.raw, LIMIT),
                    ]
                })
                .collect(),
            lines: Vec::new(),
            legend: vec![
                ("endpoint fd".into(), PRIMARY),
                ("limit: raw SOCK_SEQPACKET".into(), LIMIT),
            ],
        };
        let create = Panel {
            title: format!(
                "creating {} endpoint fds: us per endpoint, each thousand in turn",
                self.create.endpoints
            ),
            y_desc: "us per endpoint".into(),
            log: false,
            bars: self
                .create
                .per_thousand_us
                .iter()
                .enumerate()
                .map(|(k, &us)| bar(format!("{}k", k + 1), &[us], PRIMARY))
                .collect(),
            lines: Vec::new(),
            legend: vec![("endpoint fd create".into(), PRIMARY)],
        };
        vec![echo, p99, stream, create]
    }
}

/// Runs the scale experiments.
///
/// # Errors
/// [`Error::Invalid`] for bad settings; when the host, remote or raw sink
/// cannot be started or misbehave (an echo wrong, a message lost).
pub fn run(cfg: &ScaleConfig) -> Result<ScaleReport> {
    if cfg.runs == 0 {
        invalid!("--runs", "give at least 1");
    }
    if cfg.endpoints.is_empty() || cfg.endpoints.contains(&0) {
        invalid!("--scale", "give positive endpoint counts");
    }
    let cpus = Cpus::get()?;
    let (client_cpu, server_cpu) = cfg.placement.cpus(&cpus);
    let srv = Servers::start(&cfg.iopath, server_cpu)?;
    let raw = RawSink::start(&cfg.iopath, server_cpu)?;
    let wheres = cfg
        .placement
        .describe(&cpus, "client threads", "host, remote and the raw sink");
    on_cpu(client_cpu, &cpus, || {
        let c = srv.connect()?;
        let mut echo: Vec<EchoRow> = cfg
            .endpoints
            .iter()
            .map(|&endpoints| EchoRow {
                endpoints,
                aggregate: Vec::new(),
                p99_median: Vec::new(),
                p99_max: Vec::new(),
                fewest_share: Vec::new(),
            })
            .collect();
        let mut streams: Vec<StreamRow> = cfg
            .stream_sizes
            .iter()
            .map(|&size| StreamRow {
                size,
                ept: Vec::new(),
                raw: Vec::new(),
            })
            .collect();
        let sink = bound(&c, "sink")?;
        let mut expect = 0u64; // the remote sink's count so far
        let mut raw_count = 0u64;
        for run in 0..cfg.runs {
            // Rows take turns, the order rotating per run.
            for k in 0..echo.len() {
                let row = &mut echo[(k + run) % cfg.endpoints.len()];
                let (agg, per) = echo_run(&c, row.endpoints, cfg.echo_time)?;
                let mut p99: Vec<f64> = per.iter().map(|p| p.p99_us).collect();
                p99.sort_by(f64::total_cmp);
                let mut rts: Vec<f64> = per.iter().map(|p| p.round_trips as f64).collect();
                rts.sort_by(f64::total_cmp);
                row.aggregate.push(agg);
                row.p99_median.push(percentile(&p99, 0.5));
                row.p99_max.push(p99.last().copied().unwrap_or(0.0));
                row.fewest_share
                    .push(rts[0] / percentile(&rts, 0.5).max(1.0));
            }
            for k in 0..streams.len() {
                let row = &mut streams[(k + run) % cfg.stream_sizes.len()];
                let mut ways = [0, 1];
                if run % 2 == 1 {
                    ways.reverse();
                }
                for way in ways {
                    let (took, count) = if way == 0 {
                        stream(
                            cfg.stream_msgs,
                            row.size,
                            |m| sink.send(m).map_err(Error::ctrl("streaming to the sink")),
                            |b| {
                                sink.recv_timeout(b, Duration::from_secs(60))
                                    .map_err(Error::ctrl("waiting for the sink's count"))?
                                    .ok_or_else(|| {
                                        Error::Check("no answer from the sink within 60 s".into())
                                    })
                            },
                        )?
                    } else {
                        stream(
                            cfg.stream_msgs,
                            row.size,
                            |m| {
                                rustix::net::send(&raw.conn, m, SendFlags::NOSIGNAL)
                                    .map(drop)
                                    .map_err(Error::sys("streaming to the raw sink"))
                            },
                            |b| {
                                rustix::net::recv(&raw.conn, b, RecvFlags::empty())
                                    .map(|(n, _)| n)
                                    .map_err(Error::sys("waiting for the raw sink's count"))
                            },
                        )?
                    };
                    let seen = if way == 0 {
                        &mut expect
                    } else {
                        &mut raw_count
                    };
                    *seen += cfg.stream_msgs + 1;
                    check!(
                        count == *seen,
                        "the {} sink counted {count} messages, not {}: messages were lost",
                        if way == 0 { "remote" } else { "raw" },
                        *seen
                    );
                    let rate = cfg.stream_msgs as f64 / took.as_secs_f64();
                    if way == 0 {
                        row.ept.push(rate);
                    } else {
                        row.raw.push(rate);
                    }
                }
            }
        }
        drop(sink);
        let create = create_many(&srv, &c, cfg.create)?;
        Ok(ScaleReport {
            runs: cfg.runs,
            echo_time: cfg.echo_time,
            stream_msgs: cfg.stream_msgs,
            wheres,
            echo,
            stream: streams,
            create,
        })
    })
}

fn mrange(v: &[f64], prec: usize) -> String {
    let s = Summary::of(v);
    format!("{:.p$} ({:.p$}-{:.p$})", s.median, s.min, s.max, p = prec)
}

impl ScaleReport {
    fn base_aggregate(&self) -> f64 {
        self.echo
            .iter()
            .find(|r| r.endpoints == 1)
            .map_or(f64::NAN, |r| Summary::of(&r.aggregate).median)
    }

    /// The tables, as text (the same as [`ScaleReport::markdown`]).
    pub fn text(&self) -> String {
        self.markdown()
    }

    /// The tables in Markdown.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        outln!(
            s,
            "Scale: {}; medians (min-max) over {} runs; the remote offers EVENT_IDX.",
            self.wheres,
            self.runs
        );
        outln!(s);
        outln!(
            s,
            "| endpoints echoing at once ({:.1} s, 16 B) | round trips/s (aggregate) | vs 1 endpoint | per-endpoint p99 us, median endpoint | worst endpoint's p99 / median's | fewest round trips / median's |",
            self.echo_time.as_secs_f64()
        );
        outln!(s, "|---|---|---|---|---|---|");
        let base = self.base_aggregate();
        for r in &self.echo {
            let ratio: Vec<f64> = r
                .p99_max
                .iter()
                .zip(&r.p99_median)
                .map(|(m, d)| m / d.max(1e-9))
                .collect();
            outln!(
                s,
                "| {} | {} | {:.2}x | {} | {} | {} |",
                r.endpoints,
                mrange(&r.aggregate, 0),
                Summary::of(&r.aggregate).median / base,
                mrange(&r.p99_median, 1),
                mrange(&ratio, 2),
                mrange(&r.fewest_share, 2)
            );
        }
        outln!(s);
        outln!(
            s,
            "| one-way stream ({} messages, then SYNC) | endpoint fd msgs/s | MB/s | raw SOCK_SEQPACKET msgs/s (limit) | MB/s | endpoint / limit |",
            self.stream_msgs
        );
        outln!(s, "|---|---|---|---|---|---|");
        for r in &self.stream {
            let mb =
                |v: &[f64]| -> Vec<f64> { v.iter().map(|x| x * r.size as f64 / 1e6).collect() };
            outln!(
                s,
                "| {} B payloads | {} | {} | {} | {} | {:.2}x |",
                r.size,
                mrange(&r.ept, 0),
                mrange(&mb(&r.ept), 1),
                mrange(&r.raw, 0),
                mrange(&mb(&r.raw), 1),
                Summary::of(&r.ept).median / Summary::of(&r.raw).median
            );
        }
        outln!(s);
        let c = &self.create;
        outln!(
            s,
            "| creating {} endpoint fds (held, one control connection) | |",
            c.endpoints
        );
        outln!(s, "|---|---|");
        outln!(
            s,
            "| created in | {:.2} s ({:.1} us each) |",
            c.create_s,
            c.create_s * 1e6 / c.endpoints as f64
        );
        let curve: Vec<String> = c
            .per_thousand_us
            .iter()
            .map(|v| format!("{v:.1}"))
            .collect();
        outln!(
            s,
            "| us per endpoint, each thousand in turn | {} |",
            curve.join(", ")
        );
        outln!(
            s,
            "| closed and freed in | {:.2} s ({:.1} us each) |",
            c.destroy_s,
            c.destroy_s * 1e6 / c.endpoints as f64
        );
        outln!(
            s,
            "| host resident memory: before, all held, after | {} / {} / {} KiB ({:.2} KiB per endpoint) |",
            c.rss_kib[0],
            c.rss_kib[1],
            c.rss_kib[2],
            c.rss_kib[1].saturating_sub(c.rss_kib[0]) as f64 / c.endpoints as f64
        );
        s
    }

    /// Every figure as JSON.
    pub fn json(&self) -> serde_json::Value {
        let base = self.base_aggregate();
        json!({
            "where": self.wheres,
            "runs": self.runs,
            "echo_time_s": self.echo_time.as_secs_f64(),
            "echo": self.echo.iter().map(|r| json!({
                "endpoints": r.endpoints,
                "aggregate_per_s": r.aggregate,
                "vs_one": Summary::of(&r.aggregate).median / base,
                "p99_us_median_endpoint": r.p99_median,
                "p99_us_worst_endpoint": r.p99_max,
                "fewest_round_trips_share": r.fewest_share,
            })).collect::<Vec<_>>(),
            "stream": self.stream.iter().map(|r| json!({
                "size": r.size,
                "messages": self.stream_msgs,
                "endpoint_msgs_per_s": r.ept,
                "raw_msgs_per_s": r.raw,
            })).collect::<Vec<_>>(),
            "create": {
                "endpoints": self.create.endpoints,
                "create_s": self.create.create_s,
                "destroy_s": self.create.destroy_s,
                "per_thousand_us": self.create.per_thousand_us,
                "host_rss_kib": self.create.rss_kib,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chart_has_a_curve_per_experiment_from_the_rows() {
        let r = ScaleReport {
            runs: 3,
            echo_time: Duration::from_secs(1),
            stream_msgs: 100,
            wheres: String::new(),
            echo: [(1, 40_000.0), (16, 60_000.0), (256, 38_000.0)]
                .into_iter()
                .map(|(endpoints, rate)| EchoRow {
                    endpoints,
                    aggregate: vec![rate - 1000.0, rate, rate + 5000.0],
                    p99_median: vec![10.0, 11.0, 12.0],
                    p99_max: vec![20.0, 21.0, 22.0],
                    fewest_share: vec![1.0; 3],
                })
                .collect(),
            stream: vec![StreamRow {
                size: 16,
                ept: vec![1.0, 2.0, 3.0],
                raw: vec![4.0, 5.0, 6.0],
            }],
            create: CreateRow {
                endpoints: 2000,
                per_thousand_us: vec![30.0, 31.0],
                create_s: 0.06,
                destroy_s: 0.02,
                rss_kib: [1, 2, 2],
            },
        };
        let p = r.panels();
        assert_eq!(p.len(), 4);
        // The echo curve: one bar per endpoint count at its median, the
        // runs' spread as the whisker, one endpoint's rate as the line.
        let medians: Vec<f64> = p[0].bars.iter().map(|b| b.segments[0].1).collect();
        assert_eq!(medians, [40_000.0, 60_000.0, 38_000.0]);
        assert_eq!(p[0].bars[1].whisker, Some((59_000.0, 65_000.0)));
        assert_eq!(p[0].lines.len(), 1);
        assert!(p[0].lines[0].points.iter().all(|&(_, y)| y == 40_000.0));
        // Median and worst endpoint's p99 per count; endpoint and raw per
        // size; one bar per thousand created.
        assert_eq!(p[1].bars.len(), 6);
        assert_eq!(p[1].bars[1].segments[0].1, 21.0);
        let stream: Vec<f64> = p[2].bars.iter().map(|b| b.segments[0].1).collect();
        assert_eq!(stream, [2.0, 5.0]);
        let create: Vec<f64> = p[3].bars.iter().map(|b| b.segments[0].1).collect();
        assert_eq!(create, [30.0, 31.0]);
    }
}
