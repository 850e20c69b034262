//! `iopath bench rpmsg`: the `RPMSG_CREATE_EPT_FD_IOCTL` thread's
//! experiment on iopath's endpoint service. Create and destroy an endpoint
//! L times the legacy way (create, find and open the node, destroy through
//! it, close) and the fd way (create, close), beside the limit measured in
//! the same run: one raw `SOCK_SEQPACKET` request/response between two
//! processes with an fd passed, per cycle. Then echo round trips through
//! the remote (host and remote are separate processes on a temporary shared
//! memory file) beside a raw eventfd ping-pong between two processes.

use std::io::{IoSlice, IoSliceMut, IsTerminal};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use iopath_rpmsg::ctrl::proto::{Request, O_CLOEXEC, O_RDWR};
use iopath_rpmsg::ctrl::{CtrlClient, EptFd, EptInfo};
use iopath_rpmsg::notify::Wake;
use iopath_rpmsg::wire::ADDR_ANY;
use iopath_rpmsg::{Notifier, NotifySpec};
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};

use super::Summary;
use crate::rpmsg::Latency;

/// Cycles per turn: the ways alternate in chunks of this many.
const CHUNK: u64 = 500;
/// legacy, fd, limit (an eventfd passed), limit (a fresh socket passed).
const WAYS: usize = 4;
const WAY_NAMES: [&str; WAYS] = ["legacy", "fd", "limit", "limit-s"];

/// Arguments of `iopath bench rpmsg`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
A cycle: legacy = CREATE_EPT, open the node (connect + greeting), destroy
through it (shutdown + the service's hang-up), close; fd = CREATE_EPT_FD
(the endpoint comes back over SCM_RIGHTS), close (the service notices and
frees it; the row's time includes waiting until it has freed them all).
limit = the same request size answered with an fd by a bare server process.
The three ways take turns in chunks of 500 cycles (rotating which goes
first), so that load from elsewhere hits them alike; medians with (min-max)
over --runs.")]
pub struct RpmsgArgs {
    /// Create+destroy cycles per row, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000,100000")]
    pub loops: Vec<u64>,
    /// Runs per row (median and spread are reported).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Echo round trips (16-byte messages) for the latency rows.
    #[arg(long, default_value_t = 10_000)]
    pub count: u64,
    /// Also measure echo latency with host and remote polling the rings
    /// (no notifications; spins a core each).
    #[arg(long)]
    pub poll: bool,
    /// Print one JSON object with `rows`, `limit`, `echo`.
    #[arg(long)]
    pub json: bool,
}

/// Runs `iopath bench rpmsg`.
///
/// # Errors
/// When the host, remote or raw server cannot be started or misbehave.
pub fn run(args: &RpmsgArgs) -> Result<()> {
    let v = experiment(args)?;
    if args.json {
        println!("{v}");
    }
    Ok(())
}

/// The experiment on small defaults for `iopath bench`: 1000 loops, 3 runs,
/// 5000 echo round trips, no polling.
///
/// # Errors
/// As [`run`].
pub fn run_default(json: bool) -> Result<serde_json::Value> {
    experiment(&RpmsgArgs {
        loops: vec![1000],
        runs: 3,
        count: 5000,
        poll: false,
        json,
    })
}

/// An `iopath rpmsg remote` (echo "echo") and `iopath rpmsg host --ctrl`
/// on a temporary shared-memory file; killed when dropped.
struct Pair {
    dir: tempfile::TempDir,
    children: Vec<Child>,
    ctrl: PathBuf,
}

impl Drop for Pair {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn shm_dir() -> PathBuf {
    let d = Path::new("/dev/shm");
    if d.is_dir() {
        d.to_owned()
    } else {
        std::env::temp_dir()
    }
}

impl Pair {
    fn start(notify_poll: bool) -> Result<Pair> {
        let dir = tempfile::Builder::new()
            .prefix("iopath-bench-rpmsg-")
            .tempdir_in(shm_dir())?;
        let exe = std::env::current_exe()?;
        let shm = dir.path().join("shm");
        let notify = if notify_poll {
            "poll".to_owned()
        } else {
            format!("eventfd:{}", dir.path().join("ev").display())
        };
        let ctrl = dir.path().join("ctrl");
        let log = |name: &str| -> Result<Stdio> {
            Ok(std::fs::File::create(dir.path().join(name))?.into())
        };
        let (rlog, hlog) = (log("remote.err")?, log("host.err")?);
        let mut pair = Pair {
            children: Vec::new(),
            ctrl,
            dir,
        };
        let remote = Command::new(&exe)
            .args(["rpmsg", "remote", "--shm"])
            .arg(&shm)
            .args(["--create", "0x80000", "--notify", &notify, "--echo", "echo"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(rlog)
            .spawn()
            .context("starting iopath rpmsg remote")?;
        pair.children.push(remote);
        if notify_poll {
            // With no notifier to connect through, the host must find the
            // table already written.
            let start = Instant::now();
            while std::fs::metadata(&shm).map_or(true, |m| m.len() < 0x80000) {
                ensure!(
                    start.elapsed() < Duration::from_secs(20),
                    "no shared memory"
                );
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let host = Command::new(&exe)
            .args(["rpmsg", "host", "--shm"])
            .arg(&shm)
            .args(["--notify", &notify, "--ctrl"])
            .arg(&pair.ctrl)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(hlog)
            .spawn()
            .context("starting iopath rpmsg host")?;
        pair.children.push(host);
        let start = Instant::now();
        while !pair.ctrl.exists() {
            if start.elapsed() > Duration::from_secs(30) {
                let err =
                    std::fs::read_to_string(pair.dir.path().join("host.err")).unwrap_or_default();
                bail!("the host never opened its control socket: {}", err.trim());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(pair)
    }

    /// A control connection, once the remote has announced "echo".
    fn client(&self) -> Result<(CtrlClient, EptFd)> {
        let c = CtrlClient::connect(&self.ctrl).context("connecting to the endpoint service")?;
        let start = Instant::now();
        loop {
            let ep = c.create_ept_fd(&EptInfo::new("echo"), O_RDWR | O_CLOEXEC)?;
            if ep.info().dst != ADDR_ANY {
                return Ok((c, ep));
            }
            drop(ep);
            ensure!(
                start.elapsed() < Duration::from_secs(30),
                "the remote never announced \"echo\""
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

fn legacy_cycles(c: &CtrlClient, loops: u64, bar: &ProgressBar) -> Result<Duration> {
    let info = EptInfo::new("bench");
    let t = Instant::now();
    for _ in 0..loops {
        let (_, path) = c.create_ept(&info).context("CREATE_EPT")?;
        let node = EptFd::open_node(&path, O_CLOEXEC).context("opening the node")?;
        node.destroy().context("destroying through the node")?;
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
                .context("CREATE_EPT_FD")?,
        );
        bar.inc(1);
    }
    // Closing is asynchronous: count until the service has freed them all.
    let base = 1; // the echo endpoint the bench holds
    while c.stats()?.endpoints() > base {
        std::hint::spin_loop();
    }
    Ok(t.elapsed())
}

/// The limit's server: answers every packet on one connection with a packet
/// of CREATE_EPT_FD answer size and an fd: always the same eventfd, or, for
/// a packet starting with `S`, one end of a fresh `SOCK_SEQPACKET`
/// socketpair (the other end closed at once).
pub fn raw_fd_server(sock: &Path) -> Result<()> {
    let l = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?;
    rustix::net::bind(&l, &SocketAddrUnix::new(sock)?)?;
    rustix::net::listen(&l, 1)?;
    let c = rustix::net::accept_with(&l, SocketFlags::CLOEXEC)?;
    let ev = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC)?;
    let answer = [0u8; 12 + 48];
    let mut req = [0u8; 128];
    loop {
        let (n, _) = rustix::net::recv(&c, &mut req, RecvFlags::empty())?;
        if n == 0 {
            return Ok(());
        }
        let pair;
        let fds = if req[0] == b'S' {
            pair = rustix::net::socketpair(
                AddressFamily::UNIX,
                SocketType::SEQPACKET,
                SocketFlags::CLOEXEC,
                None,
            )?;
            [pair.1.as_fd()]
        } else {
            [ev.as_fd()]
        };
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut anc = SendAncillaryBuffer::new(&mut space);
        anc.push(SendAncillaryMessage::ScmRights(&fds));
        rustix::net::sendmsg(&c, &[IoSlice::new(&answer)], &mut anc, SendFlags::NOSIGNAL)?;
    }
}

/// The client side of the limit: `loops` request/response cycles, each
/// receiving an fd (a fresh socket if `socket`) and closing it.
fn limit_cycles(c: &OwnedFd, loops: u64, socket: bool, bar: &ProgressBar) -> Result<Duration> {
    let mut req = Request::CreateEptFd(EptInfo::new("bench"), O_RDWR | O_CLOEXEC)
        .encode()
        .context("request")?;
    if socket {
        req[0] = b'S'; // the raw server's cue: pass a fresh socket
    }
    let mut b = [0u8; 128];
    let t = Instant::now();
    for _ in 0..loops {
        rustix::net::send(c, &req, SendFlags::NOSIGNAL)?;
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut anc = RecvAncillaryBuffer::new(&mut space);
        let got = rustix::net::recvmsg(
            c,
            &mut [IoSliceMut::new(&mut b)],
            &mut anc,
            RecvFlags::CMSG_CLOEXEC,
        )?;
        let mut fds: Vec<OwnedFd> = Vec::new();
        for m in anc.drain() {
            if let RecvAncillaryMessage::ScmRights(r) = m {
                fds.extend(r);
            }
        }
        ensure!(
            got.bytes == 60 && fds.len() == 1,
            "raw server answered oddly"
        );
        drop(fds);
        bar.inc(1);
    }
    Ok(t.elapsed())
}

struct RawServer {
    child: Child,
    conn: OwnedFd,
    _dir: tempfile::TempDir,
}

impl Drop for RawServer {
    fn drop(&mut self) {
        let _ = rustix::net::shutdown(&self.conn, rustix::net::Shutdown::Both);
        let _ = self.child.wait();
    }
}

fn raw_server() -> Result<RawServer> {
    let dir = tempfile::Builder::new()
        .prefix("iopath-bench-raw-")
        .tempdir()?;
    let sock = dir.path().join("sock");
    let child = Command::new(std::env::current_exe()?)
        .args(["rpmsg", "raw-fd-server", "--sock"])
        .arg(&sock)
        .stdin(Stdio::null())
        .spawn()
        .context("starting the raw fd server")?;
    let start = Instant::now();
    let conn = loop {
        let fd = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )?;
        match rustix::net::connect(&fd, &SocketAddrUnix::new(&sock)?) {
            Ok(()) => break fd,
            Err(_) if start.elapsed() < Duration::from_secs(10) => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(e) => return Err(e).context("connecting to the raw fd server"),
        }
    };
    Ok(RawServer {
        child,
        conn,
        _dir: dir,
    })
}

/// Echo round trips measured in this many turns, alternating with the raw
/// ping-pong, so that both see the same machine.
const ECHO_TURNS: u64 = 4;
/// Round trips of each kind before measuring.
const ECHO_WARM: u64 = 200;

/// `count` echo round trips of 16-byte messages through `ep`, each
/// checked; latencies appended to `lat`; returns the time taken.
fn echo(ep: &EptFd, count: u64, seq: &mut u64, lat: &mut Vec<f64>) -> Result<Duration> {
    let mut back = [0u8; 512];
    let t0 = Instant::now();
    for _ in 0..count {
        *seq += 1;
        let msg = u128::from(*seq).to_le_bytes();
        let t = Instant::now();
        ep.send(&msg)?;
        let n = ep
            .recv_timeout(&mut back, Duration::from_secs(10))?
            .context("no echo within 10 s")?;
        lat.push(t.elapsed().as_secs_f64() * 1e6);
        ensure!(n == 16 && back[..16] == msg, "echo {seq} came back wrong");
    }
    Ok(t0.elapsed())
}

/// The latency limit: a child process (`iopath rpmsg raw-echo`) kicked
/// through an eventfd pair kicks back.
struct RawPingPong {
    child: Child,
    n: Box<dyn Notifier>,
    _dir: tempfile::TempDir,
}

impl Drop for RawPingPong {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl RawPingPong {
    /// A partner that echoes `kicks` kicks.
    fn start(kicks: u64) -> Result<RawPingPong> {
        let dir = tempfile::Builder::new()
            .prefix("iopath-bench-rawpp-")
            .tempdir()?;
        let spec = NotifySpec::Eventfd(dir.path().join("ev"));
        let listener = spec.bind()?;
        let child = Command::new(std::env::current_exe()?)
            .args([
                "rpmsg",
                "raw-echo",
                "--notify",
                &spec.to_string(),
                "--count",
            ])
            .arg(kicks.to_string())
            .stdin(Stdio::null())
            .spawn()
            .context("starting the raw echo child")?;
        let n = listener.accept()?;
        Ok(RawPingPong {
            child,
            n,
            _dir: dir,
        })
    }

    fn round_trips(&self, count: u64, lat: &mut Vec<f64>) -> Result<Duration> {
        let t0 = Instant::now();
        for _ in 0..count {
            let t = Instant::now();
            self.n.kick()?;
            while self.n.wait(Duration::from_secs(5))? != Wake::Kicked {}
            lat.push(t.elapsed().as_secs_f64() * 1e6);
        }
        Ok(t0.elapsed())
    }
}

/// Echo through `ep` and the raw ping-pong, `count` round trips each, in
/// alternating turns.
fn echo_vs_limit(ep: &EptFd, count: u64) -> Result<(Latency, Latency)> {
    let raw = RawPingPong::start(ECHO_WARM + count)?;
    let mut seq = 0;
    let mut scratch = Vec::new();
    echo(ep, ECHO_WARM, &mut seq, &mut scratch)?;
    raw.round_trips(ECHO_WARM, &mut scratch)?;
    let (mut e_lat, mut r_lat) = (Vec::new(), Vec::new());
    let (mut e_time, mut r_time) = (Duration::ZERO, Duration::ZERO);
    let mut done = 0;
    for turn in 0..ECHO_TURNS {
        let n = (count - done) / (ECHO_TURNS - turn);
        if turn % 2 == 0 {
            e_time += echo(ep, n, &mut seq, &mut e_lat)?;
            r_time += raw.round_trips(n, &mut r_lat)?;
        } else {
            r_time += raw.round_trips(n, &mut r_lat)?;
            e_time += echo(ep, n, &mut seq, &mut e_lat)?;
        }
        done += n;
    }
    Ok((Latency::from(e_lat, e_time), Latency::from(r_lat, r_time)))
}

fn bar(total: u64, json: bool) -> ProgressBar {
    if json || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let b = ProgressBar::new(total);
    b.set_style(
        ProgressStyle::with_template("{msg:>8} [{bar:30}] {pos}/{len} cycles {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    b
}

struct Row {
    loops: u64,
    /// Totals per run, microseconds.
    legacy: Vec<f64>,
    fd: Vec<f64>,
    limit: Vec<f64>,
    limit_socket: Vec<f64>,
    /// Per-cycle microseconds of every chunk of every run, per way.
    chunks: [Vec<f64>; WAYS],
}

fn experiment(a: &RpmsgArgs) -> Result<serde_json::Value> {
    ensure!(a.runs >= 1, "--runs must be at least 1");
    ensure!(
        !a.loops.is_empty() && a.loops.iter().all(|&l| l > 0),
        "--loops: give positive counts, e.g. 1000,10000"
    );
    let pair = Pair::start(false)?;
    let (c, echo_ep) = pair.client()?;
    let raw = raw_server()?;
    let total: u64 = a.loops.iter().sum::<u64>() * WAYS as u64 * a.runs as u64;
    let pb = bar(total, a.json);
    let mut rows: Vec<Row> = a
        .loops
        .iter()
        .map(|&loops| Row {
            loops,
            legacy: Vec::new(),
            fd: Vec::new(),
            limit: Vec::new(),
            limit_socket: Vec::new(),
            chunks: Default::default(),
        })
        .collect();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    for run in 0..a.runs {
        for row in &mut rows {
            // The three ways take turns in chunks, so that each sees the
            // same machine (others' load comes and goes); the order rotates
            // per chunk so that none always runs warm.
            let mut tot = [0.0f64; WAYS];
            let mut done = 0;
            let mut turn = run;
            while done < row.loops {
                let n = CHUNK.min(row.loops - done);
                for k in 0..WAYS {
                    let way = (k + turn) % WAYS;
                    pb.set_message(WAY_NAMES[way]);
                    let t = us(match way {
                        0 => legacy_cycles(&c, n, &pb)?,
                        1 => fd_cycles(&c, n, &pb)?,
                        2 => limit_cycles(&raw.conn, n, false, &pb)?,
                        _ => limit_cycles(&raw.conn, n, true, &pb)?,
                    });
                    tot[way] += t;
                    row.chunks[way].push(t / n as f64);
                }
                done += n;
                turn += 1;
            }
            row.legacy.push(tot[0]);
            row.fd.push(tot[1]);
            row.limit.push(tot[2]);
            row.limit_socket.push(tot[3]);
        }
    }
    pb.finish_and_clear();
    drop(raw);
    let st = c.stats()?;
    ensure!(
        st.endpoints() == 1 && st.open_nodes == 0,
        "the service still holds endpoints after the cycles: {st:?}"
    );
    let (echo_lat, limit_echo) = echo_vs_limit(&echo_ep, a.count)?;
    drop(echo_ep);
    drop(c);
    drop(pair);
    // Polling host and remote spin while traffic is recent and back off to
    // 1 ms sleeps when idle, so the raw turns between echo turns run beside
    // mostly sleeping pollers.
    let echo_poll = if a.poll {
        let pair = Pair::start(true)?;
        let (c, ep) = pair.client()?;
        let l = echo_vs_limit(&ep, a.count)?;
        drop(ep);
        drop(c);
        Some(l)
    } else {
        None
    };

    let sum = |v: &[f64]| Summary::of(v);
    let mut jrows = Vec::new();
    if !a.json {
        println!(
            "rpmsg endpoint create+destroy ({} runs; totals: median (min-max); per cycle: median over {CHUNK}-cycle chunks)",
            a.runs
        );
        println!(
            "{:>7} | {:>25} | {:>23} | {:>9} | {:>23} | {:>33}",
            "loops",
            "legacy total us",
            "fd total us",
            "legacy/fd",
            "limit total us",
            "per cycle us: fd / limit / limit-s"
        );
    }
    for r in &rows {
        let (l, f, m) = (sum(&r.legacy), sum(&r.fd), sum(&r.limit));
        let pc: Vec<Summary> = r.chunks.iter().map(|c| sum(c)).collect();
        let fmt = |s: &Summary| format!("{:.0} ({:.0}-{:.0})", s.median, s.min, s.max);
        if !a.json {
            println!(
                "{:>7} | {:>25} | {:>23} | {:>8.2}x | {:>23} | {:>9.1} / {:>5.1} / {:>7.1}",
                r.loops,
                fmt(&l),
                fmt(&f),
                l.median / f.median,
                fmt(&m),
                pc[1].median,
                pc[2].median,
                pc[3].median,
            );
        }
        jrows.push(serde_json::json!({
            "loops": r.loops,
            "legacy_us": l.median, "fd_us": f.median, "limit_us": m.median,
            "limit_socket_us": sum(&r.limit_socket).median,
            "legacy_us_spread": l.json(), "fd_us_spread": f.json(), "limit_us_spread": m.json(),
            "legacy_over_fd": l.median / f.median,
            "per_cycle_us": {
                "legacy": pc[0].json(), "fd": pc[1].json(),
                "limit": pc[2].json(), "limit_socket": pc[3].json(),
            },
        }));
    }
    // Per cycle over every chunk of every row.
    let all = |w: usize| {
        let v: Vec<f64> = rows
            .iter()
            .flat_map(|r| r.chunks[w].iter().copied())
            .collect();
        sum(&v)
    };
    let (legacy_pc, fd_pc, rtt, rtt_s) = (all(0), all(1), all(2), all(3));
    let mut echo_json = serde_json::json!({
        "size": 16, "fd": &echo_lat, "limit_eventfd_pingpong": &limit_echo,
        "fd_over_limit_p50": echo_lat.p50_us / limit_echo.p50_us,
    });
    let spread = |s: &Summary| format!("{:.1} us per cycle ({:.1}-{:.1})", s.median, s.min, s.max);
    if !a.json {
        println!(
            "limit: raw SOCK_SEQPACKET request/response, two processes, an eventfd passed: {}",
            spread(&rtt)
        );
        println!(
            "limit-s: the same, a fresh SOCK_SEQPACKET socket passed (created, closed): {}",
            spread(&rtt_s)
        );
        println!("legacy create+open+destroy: {}", spread(&legacy_pc));
        println!(
            "fd create+close: {} = {:.2}x limit, {:.2}x limit-s",
            spread(&fd_pc),
            fd_pc.median / rtt.median,
            fd_pc.median / rtt_s.median
        );
        println!(
            "echo round trip, 16 B, {} round trips each, in {ECHO_TURNS} alternating turns with the limit:",
            a.count
        );
        println!("  endpoint fd (eventfd notify): {}", echo_lat.line());
        println!(
            "  limit (raw eventfd ping-pong, two processes): {}",
            limit_echo.line()
        );
        println!(
            "  fd/limit p50: {:.2}x",
            echo_lat.p50_us / limit_echo.p50_us
        );
    }
    if let Some((p, pl)) = &echo_poll {
        echo_json["fd_poll"] = serde_json::json!(p);
        echo_json["limit_eventfd_pingpong_poll_phase"] = serde_json::json!(pl);
        echo_json["fd_poll_over_limit_p50"] = serde_json::json!(p.p50_us / pl.p50_us);
        if !a.json {
            println!("  endpoint fd (--poll, rings polled): {}", p.line());
            println!("  limit, measured in turns with it: {}", pl.line());
            println!("  poll/limit p50: {:.2}x", p.p50_us / pl.p50_us);
        }
    }
    Ok(serde_json::json!({
        "runs": a.runs,
        "rows": jrows,
        "limit": {
            "what": "raw SOCK_SEQPACKET request/response with an fd (an eventfd) passed, two processes",
            "rtt_us": rtt.median, "rtt_us_spread": rtt.json(),
            "socket_rtt_us": rtt_s.median, "socket_rtt_us_spread": rtt_s.json(),
        },
        "per_cycle_us": { "legacy": legacy_pc.json(), "fd": fd_pc.json() },
        "fd_over_limit": fd_pc.median / rtt.median,
        "fd_over_limit_socket": fd_pc.median / rtt_s.median,
        "echo": echo_json,
    }))
}
