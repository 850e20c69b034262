//! `iopath bench rpmsg`: the `RPMSG_CREATE_EPT_FD_IOCTL` thread's
//! experiment on iopath's endpoint service. Create and destroy an endpoint
//! L times the legacy way (create, find and open the node, destroy through
//! it, close) and the fd way (create, close), beside the limit measured in
//! the same run: one raw `SOCK_SEQPACKET` request/response between two
//! processes with an fd passed, per cycle. Then echo round trips through
//! the remote (host and remote are separate processes on a temporary shared
//! memory file) beside a raw eventfd ping-pong between two processes.
//! With OpenAMP's demo built (`--openamp DIR`), the peer rows: OpenAMP's
//! driver and iopath's endpoint fd and `Bus` API against OpenAMP's echo and
//! iopath's remote ([`peers`]). The report ends with issue 16's goals, each
//! ratio measured in this run beside its target.

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use iopath_rpmsg::ctrl::proto::{Request, O_CLOEXEC, O_RDWR};
use iopath_rpmsg::ctrl::{CtrlClient, EptFd, EptInfo};
use iopath_rpmsg::notify::Wake;
use iopath_rpmsg::wire::ADDR_ANY;
use iopath_rpmsg::{Notifier, NotifySpec};
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};

use crate::error::{check, check_failed, invalid};
use crate::place::{on_cpu, spawn_on, Children, Cpus, Placement};
use crate::{Error, Latency, Progress as ProgressBar, Result, Summary};

/// Cycles per turn: the ways alternate in chunks of this many.
const CHUNK: u64 = 500;
/// legacy, fd, limit (an eventfd passed), limit (a fresh socket passed),
/// limit (a fresh socket passed and watched until its close with epoll).
const WAYS: usize = 5;
const WAY_NAMES: [&str; WAYS] = ["legacy", "fd", "limit", "limit-s", "limit-w"];
/// Each way's index in [`WAY_NAMES`], [`Row::totals`] and [`Row::chunks`].
mod way {
    pub(super) const LEGACY: usize = 0;
    pub(super) const FD: usize = 1;
    pub(super) const LIMIT: usize = 2;
    pub(super) const LIMIT_S: usize = 3;
    pub(super) const LIMIT_W: usize = 4;
}
/// What the raw fd server passes for the ways from [`way::LIMIT`] on.
const LIMIT_PASSES: [Pass; WAYS - way::LIMIT] = [Pass::Eventfd, Pass::Socket, Pass::Watched];

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
    /// The `iopath` executable whose `rpmsg host|remote|raw-fd-server|raw-echo`
    /// subcommands the experiment starts.
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
}

impl RpmsgConfig {
    /// The thread's sizes: 1,000 / 10,000 / 100,000 loops, 3 runs, 10,000
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
}

/// Runs the experiment.
///
/// # Errors
/// [`Error::Invalid`] for bad settings; when the host, remote or raw server
/// cannot be started or misbehave.
pub fn run(cfg: &RpmsgConfig) -> Result<RpmsgReport> {
    experiment(cfg)
}

/// An `iopath rpmsg remote` (echo "echo") and `iopath rpmsg host --ctrl`
/// on a temporary shared-memory file; killed when dropped.
struct Pair {
    children: Children,
    dir: tempfile::TempDir,
    ctrl: PathBuf,
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
    /// Remote and host on `remote_cpu` and `host_cpu` (`None`: anywhere).
    fn start(
        exe: &Path,
        notify_poll: bool,
        remote_cpu: Option<usize>,
        host_cpu: Option<usize>,
    ) -> Result<Pair> {
        let dir = crate::cleanup::temp_dir("iopath-bench-rpmsg-", &shm_dir())?;
        let shm = dir.path().join("shm");
        let notify = if notify_poll {
            "poll".to_owned()
        } else {
            format!("eventfd:{}", dir.path().join("ev").display())
        };
        let ctrl = dir.path().join("ctrl");
        let log = |name: &str| -> Result<Stdio> {
            let p = dir.path().join(name);
            Ok(std::fs::File::create(&p).map_err(Error::io(p))?.into())
        };
        let (rlog, hlog) = (log("remote.err")?, log("host.err")?);
        let mut pair = Pair {
            children: Children::default(),
            dir,
            ctrl,
        };
        pair.children.spawn_on(
            remote_cpu,
            Command::new(exe)
                .args(["rpmsg", "remote", "--shm"])
                .arg(&shm)
                .args(["--create", "0x80000", "--notify", &notify, "--echo", "echo"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(rlog),
        )?;
        if notify_poll {
            // With no notifier to connect through, the host must find the
            // table already written.
            let start = Instant::now();
            while std::fs::metadata(&shm).map_or(true, |m| m.len() < 0x80000) {
                check!(
                    start.elapsed() < Duration::from_secs(20),
                    "the remote wrote no shared memory within 20 s"
                );
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        pair.children.spawn_on(
            host_cpu,
            Command::new(exe)
                .args(["rpmsg", "host", "--shm"])
                .arg(&shm)
                .args(["--notify", &notify, "--ctrl"])
                .arg(&pair.ctrl)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(hlog),
        )?;
        let start = Instant::now();
        while !pair.ctrl.exists() {
            if start.elapsed() > Duration::from_secs(30) {
                let err =
                    std::fs::read_to_string(pair.dir.path().join("host.err")).unwrap_or_default();
                check_failed!("the host never opened its control socket: {}", err.trim());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(pair)
    }

    /// A control connection, once the remote has announced "echo".
    fn client(&self) -> Result<(CtrlClient, EptFd)> {
        bound_ept(&self.ctrl, "echo")
    }
}

/// A connection to the endpoint service on `ctrl` and an endpoint fd for
/// `name`, once the remote has announced it (the fd bound to its address).
fn bound_ept(ctrl: &Path, name: &str) -> Result<(CtrlClient, EptFd)> {
    let c = CtrlClient::connect(ctrl).map_err(Error::ctrl("connecting to the endpoint service"))?;
    let start = Instant::now();
    loop {
        let ep = c
            .create_ept_fd(&EptInfo::new(name), O_RDWR | O_CLOEXEC)
            .map_err(Error::ctrl(format!("CREATE_EPT_FD for {name:?}")))?;
        if ep.info().dst != ADDR_ANY {
            return Ok((c, ep));
        }
        drop(ep);
        check!(
            start.elapsed() < Duration::from_secs(30),
            "the remote never announced {name:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn legacy_cycles(c: &CtrlClient, loops: u64, bar: &ProgressBar) -> Result<Duration> {
    let info = EptInfo::new("bench");
    let t = Instant::now();
    for _ in 0..loops {
        let (_, path) = c.create_ept(&info).map_err(Error::ctrl("CREATE_EPT"))?;
        let node = EptFd::open_node(&path, O_CLOEXEC).map_err(Error::ctrl("opening the node"))?;
        node.destroy()
            .map_err(Error::ctrl("destroying through the node"))?;
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
                .map_err(Error::ctrl("CREATE_EPT_FD"))?,
        );
        bar.inc(1);
    }
    // Closing is asynchronous: count until the service has freed them all.
    let base = 1; // the echo endpoint the bench holds
    while c.stats().map_err(Error::ctrl("STATS"))?.endpoints() > base {
        std::hint::spin_loop();
    }
    Ok(t.elapsed())
}

/// The far end of a raw limit: listens on the `SOCK_SEQPACKET` socket
/// `sock` and takes its one client; with the error mapper for `sock`.
///
/// # Errors
/// [`Error::Io`] (the socket) when a socket call fails.
pub(crate) fn accept_one(
    sock: &Path,
) -> Result<(OwnedFd, impl Fn(rustix::io::Errno) -> Error + Copy + '_)> {
    let io = |e: rustix::io::Errno| Error::Io {
        path: sock.to_path_buf(),
        source: e.into(),
    };
    let l = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .map_err(io)?;
    rustix::net::bind(&l, &SocketAddrUnix::new(sock).map_err(io)?).map_err(io)?;
    rustix::net::listen(&l, 1).map_err(io)?;
    let c = rustix::net::accept_with(&l, SocketFlags::CLOEXEC).map_err(io)?;
    Ok((c, io))
}

/// A `SOCK_SEQPACKET` connection to `sock`, retrying for 10 s while its
/// server starts.
///
/// # Errors
/// [`Error::Io`] (the socket) when it still refuses after 10 s.
pub(crate) fn connect_retry(sock: &Path) -> Result<OwnedFd> {
    let io = |e: rustix::io::Errno| Error::Io {
        path: sock.to_path_buf(),
        source: e.into(),
    };
    let addr = SocketAddrUnix::new(sock).map_err(io)?;
    let start = Instant::now();
    loop {
        let fd = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )
        .map_err(Error::sys("creating a socket"))?;
        match rustix::net::connect(&fd, &addr) {
            Ok(()) => return Ok(fd),
            Err(_) if start.elapsed() < Duration::from_secs(10) => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(e) => return Err(io(e)),
        }
    }
}

/// What the raw fd server passes for a request, by the request's first
/// byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// Always the same eventfd.
    Eventfd,
    /// One end of a fresh `SOCK_SEQPACKET` socketpair, the other end
    /// closed at once (cue `S`).
    Socket,
    /// One end of a fresh socketpair with the smallest send buffer, the
    /// other end watched with epoll until the client closes its own (cue
    /// `W`).
    Watched,
}

impl Pass {
    /// The request's first byte that asks for this way (none: the request
    /// as it is, whose magic starts with no cue).
    fn cue(self) -> Option<u8> {
        match self {
            Pass::Eventfd => None,
            Pass::Socket => Some(b'S'),
            Pass::Watched => Some(b'W'),
        }
    }

    fn of(cue: u8) -> Pass {
        match cue {
            b'S' => Pass::Socket,
            b'W' => Pass::Watched,
            _ => Pass::Eventfd,
        }
    }
}

/// Watched sockets passed between two looks at their hang-ups: the
/// endpoint service looks once per drain of 16 requests too.
const WATCH_DRAIN: usize = 16;

/// The ends of the sockets passed with [`Pass::Watched`], in an epoll set
/// of their own, each closed once its client's end is (after the read
/// that finds the end of file): the kernel work the endpoint service
/// cannot skip per endpoint, without anything else the service does.
struct Watched {
    epoll: OwnedFd,
    ends: std::collections::HashMap<u64, OwnedFd>,
    next_key: u64,
    since_look: usize,
    /// Reads of an end that brought data rather than the end of file.
    messages: u64,
}

impl Watched {
    fn new() -> rustix::io::Result<Watched> {
        Ok(Watched {
            epoll: rustix::event::epoll::create(rustix::event::epoll::CreateFlags::CLOEXEC)?,
            ends: std::collections::HashMap::new(),
            next_key: 0,
            since_look: 0,
            messages: 0,
        })
    }

    /// Watches `end` (its peer was just passed) as the service watches an
    /// endpoint's socket; every [`WATCH_DRAIN`] of them, closes the ends
    /// whose peer went.
    fn add(&mut self, end: OwnedFd) -> rustix::io::Result<()> {
        use rustix::event::epoll;
        let key = self.next_key;
        self.next_key += 1;
        epoll::add(
            &self.epoll,
            &end,
            epoll::EventData::new_u64(key),
            epoll::EventFlags::IN | epoll::EventFlags::RDHUP,
        )?;
        self.ends.insert(key, end);
        self.since_look += 1;
        if self.since_look >= WATCH_DRAIN {
            self.since_look = 0;
            self.look()?;
        }
        Ok(())
    }

    /// Closes every end whose peer closed (without waiting).
    fn look(&mut self) -> rustix::io::Result<()> {
        use rustix::event::epoll;
        let mut space = [MaybeUninit::<epoll::Event>::uninit(); 64];
        let zero = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let (events, _) = epoll::wait(&self.epoll, &mut space[..], Some(&zero))?;
        let mut b = [0u8; 512];
        for ev in events.iter() {
            let key = ev.data.u64();
            let Some(end) = self.ends.get(&key) else {
                continue;
            };
            match rustix::net::recv(end, &mut b, RecvFlags::DONTWAIT | RecvFlags::TRUNC) {
                Ok((_, 0)) => {
                    self.ends.remove(&key);
                }
                Ok(_) => self.messages += 1,
                Err(rustix::io::Errno::AGAIN) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// The limit's server: answers every packet on one connection with a packet
/// of CREATE_EPT_FD answer size and an fd: always the same eventfd; for a
/// packet starting with `S`, one end of a fresh `SOCK_SEQPACKET`
/// socketpair (the other end closed at once); for one starting with `W`,
/// the same with what the endpoint service must add per endpoint: the
/// passed end's send buffer set to the smallest, the other end watched
/// with epoll until the client closes its own, then read (end of file)
/// and closed. The answer's first 8 bytes (little endian) count the kept
/// ends still open, the next 8 the reads of a kept end that brought data,
/// the rest are zero. Returns when the client hangs up.
///
/// # Errors
/// [`Error::Io`] (the socket) when a socket call fails.
pub fn raw_fd_server(sock: &Path) -> Result<()> {
    let (c, io) = accept_one(sock)?;
    let ev = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).map_err(io)?;
    let mut watched = Watched::new().map_err(io)?;
    let mut answer = [0u8; 12 + 48];
    let mut req = [0u8; 128];
    loop {
        let n = rustix::net::recv(&c, &mut req, RecvFlags::empty())
            .map_err(io)?
            .0;
        if n == 0 {
            return Ok(());
        }
        let pass = Pass::of(req[0]);
        let held = watched.ends.len() as u64;
        answer[..8].copy_from_slice(&held.to_le_bytes());
        answer[8..16].copy_from_slice(&watched.messages.to_le_bytes());
        let pair = match pass {
            Pass::Eventfd => None,
            Pass::Socket | Pass::Watched => Some(
                rustix::net::socketpair(
                    AddressFamily::UNIX,
                    SocketType::SEQPACKET,
                    SocketFlags::CLOEXEC,
                    None,
                )
                .map_err(io)?,
            ),
        };
        let fds = match &pair {
            None => [ev.as_fd()],
            Some((_, theirs)) => [theirs.as_fd()],
        };
        if let (Pass::Watched, Some((_, theirs))) = (pass, &pair) {
            rustix::net::sockopt::set_socket_send_buffer_size(theirs, 0).map_err(io)?;
        }
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut anc = SendAncillaryBuffer::new(&mut space);
        anc.push(SendAncillaryMessage::ScmRights(&fds));
        rustix::net::sendmsg(&c, &[IoSlice::new(&answer)], &mut anc, SendFlags::NOSIGNAL)
            .map_err(io)?;
        match (pass, pair) {
            (Pass::Watched, Some((ours, theirs))) => {
                drop(theirs);
                watched.add(ours).map_err(io)?;
            }
            _ => {}
        }
    }
}

/// The client side of the limit: `loops` request/response cycles, each
/// receiving an fd (as `pass` asks) and closing it.
fn limit_cycles(c: &OwnedFd, loops: u64, pass: Pass, bar: &ProgressBar) -> Result<Duration> {
    let mut req = Request::CreateEptFd(EptInfo::new("bench"), O_RDWR | O_CLOEXEC)
        .encode()
        .ok_or_else(|| Error::Check("the bench's CREATE_EPT_FD request does not encode".into()))?;
    if let Some(cue) = pass.cue() {
        req[0] = cue;
    }
    let mut b = [0u8; 128];
    let t = Instant::now();
    for _ in 0..loops {
        let (bytes, fds) = ask_raw_fd_server(c, &req, &mut b)?;
        check!(
            bytes == 60 && fds.len() == 1,
            "the raw fd server answered {bytes} bytes and {} fds, not 60 and 1",
            fds.len()
        );
        drop(fds);
        bar.inc(1);
    }
    Ok(t.elapsed())
}

/// Sends `req` to the raw fd server on `c` and takes its answer into `b`:
/// the answer's length and the fds that rode along.
///
/// # Errors
/// [`Error::Sys`] when the send or the receive fails.
fn ask_raw_fd_server(c: &OwnedFd, req: &[u8], b: &mut [u8]) -> Result<(usize, Vec<OwnedFd>)> {
    rustix::net::send(c, req, SendFlags::NOSIGNAL)
        .map_err(Error::sys("sending to the raw fd server"))?;
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut anc = RecvAncillaryBuffer::new(&mut space);
    let got = rustix::net::recvmsg(
        c,
        &mut [IoSliceMut::new(b)],
        &mut anc,
        RecvFlags::CMSG_CLOEXEC,
    )
    .map_err(Error::sys("receiving from the raw fd server"))?;
    let mut fds = Vec::new();
    for m in anc.drain() {
        if let RecvAncillaryMessage::ScmRights(r) = m {
            fds.extend(r);
        }
    }
    Ok((got.bytes, fds))
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

fn raw_server(exe: &Path, cpu: Option<usize>) -> Result<RawServer> {
    let dir = crate::cleanup::temp_dir("iopath-bench-raw-", &std::env::temp_dir())?;
    let sock = dir.path().join("sock");
    let child = spawn_on(
        cpu,
        Command::new(exe)
            .args(["rpmsg", "raw-fd-server", "--sock"])
            .arg(&sock)
            .stdin(Stdio::null()),
    )?;
    let conn = connect_retry(&sock)?;
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
fn echo(ep: &EptFd, count: u64, busy: bool, seq: &mut u64, lat: &mut Vec<f64>) -> Result<Duration> {
    let mut back = [0u8; 512];
    let t0 = Instant::now();
    for _ in 0..count {
        *seq += 1;
        let msg = u128::from(*seq).to_le_bytes();
        let t = Instant::now();
        ep.send(&msg).map_err(Error::ctrl("sending an echo"))?;
        let wait = Duration::from_secs(10);
        let n = if busy {
            ep.recv_busy(&mut back, wait)
        } else {
            ep.recv_timeout(&mut back, wait)
        }
        .map_err(Error::ctrl("receiving an echo"))?
        .ok_or_else(|| Error::Check(format!("no echo {seq} within 10 s")))?;
        lat.push(t.elapsed().as_secs_f64() * 1e6);
        check!(n == 16 && back[..16] == msg, "echo {seq} came back wrong");
    }
    Ok(t0.elapsed())
}

/// The latency limit: a child process (`iopath rpmsg raw-echo`) kicked
/// through an eventfd pair kicks back.
#[derive(Debug)]
pub struct RawPingPong {
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
    /// A partner (`iopath rpmsg raw-echo` of the executable `iopath`, on
    /// `cpu`) that echoes `kicks` kicks.
    ///
    /// # Errors
    /// When the child cannot be started or does not connect.
    pub fn start(iopath: &Path, kicks: u64, cpu: Option<usize>) -> Result<RawPingPong> {
        let dir = crate::cleanup::temp_dir("iopath-bench-rawpp-", &std::env::temp_dir())?;
        let spec = NotifySpec::Eventfd(dir.path().join("ev"));
        let listener = spec
            .bind()
            .map_err(Error::notify("binding the raw ping-pong's socket"))?;
        let child = spawn_on(
            cpu,
            Command::new(iopath)
                .args([
                    "rpmsg",
                    "raw-echo",
                    "--notify",
                    &spec.to_string(),
                    "--count",
                ])
                .arg(kicks.to_string())
                .stdin(Stdio::null()),
        )?;
        let n = listener
            .accept()
            .map_err(Error::notify("waiting for the raw echo child"))?;
        Ok(RawPingPong {
            child,
            n,
            _dir: dir,
        })
    }

    /// `count` round trips, latencies appended to `lat`; the time taken.
    ///
    /// # Errors
    /// When a kick fails or the partner is gone.
    pub fn round_trips(&self, count: u64, lat: &mut Vec<f64>) -> Result<Duration> {
        let t0 = Instant::now();
        for _ in 0..count {
            let t = Instant::now();
            self.n
                .kick()
                .map_err(Error::notify("kicking the raw echo child"))?;
            while self
                .n
                .wait(Duration::from_secs(5))
                .map_err(Error::notify("waiting for the raw echo child"))?
                != Wake::Kicked
            {}
            lat.push(t.elapsed().as_secs_f64() * 1e6);
        }
        Ok(t0.elapsed())
    }
}

/// A way of doing round trips: `n` of them, latencies appended to the
/// vector, the time taken returned.
type Way<'a> = &'a mut dyn FnMut(u64, &mut Vec<f64>) -> Result<Duration>;

/// `count` round trips of every way after [`ECHO_WARM`] each unmeasured,
/// in [`ECHO_TURNS`] turns whose order rotates, so that each sees the same
/// machine and none always runs first.
fn alternate<const N: usize>(count: u64, mut ways: [Way<'_>; N]) -> Result<[Latency; N]> {
    let mut scratch = Vec::new();
    for w in &mut ways {
        w(ECHO_WARM, &mut scratch)?;
    }
    let mut lat: [Vec<f64>; N] = std::array::from_fn(|_| Vec::new());
    let mut time = [Duration::ZERO; N];
    let mut done = 0;
    for turn in 0..ECHO_TURNS {
        let n = (count - done) / (ECHO_TURNS - turn);
        for k in 0..N {
            let i = (k + turn as usize) % N;
            time[i] += ways[i](n, &mut lat[i])?;
        }
        done += n;
    }
    Ok(std::array::from_fn(|i| {
        Latency::from(std::mem::take(&mut lat[i]), time[i])
    }))
}

/// Echo through `ep` (busy-polling its fd if `busy`) and the raw
/// ping-pong (its child on `raw_cpu`), `count` round trips each, in
/// alternating turns.
fn echo_vs_limit(
    exe: &Path,
    ep: &EptFd,
    count: u64,
    busy: bool,
    raw_cpu: Option<usize>,
) -> Result<(Latency, Latency)> {
    let raw = RawPingPong::start(exe, ECHO_WARM + count, raw_cpu)?;
    let mut seq = 0;
    let mut e = |n, lat: &mut Vec<f64>| echo(ep, n, busy, &mut seq, lat);
    let mut r = |n, lat: &mut Vec<f64>| raw.round_trips(n, lat);
    let [e, r] = alternate(count, [&mut e, &mut r])?;
    Ok((e, r))
}

/// One loop count's create+destroy figures.
#[derive(Debug)]
struct Row {
    loops: u64,
    /// Totals per run, microseconds, per way.
    totals: [Vec<f64>; WAYS],
    /// Per-cycle microseconds of every chunk of every run, per way.
    chunks: [Vec<f64>; WAYS],
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
    let pair = Pair::start(&a.iopath, false, server_cpu, server_cpu)?;
    let raw = raw_server(&a.iopath, server_cpu)?;
    on_cpu(client_cpu, cpus, || {
        let (c, echo_ep) = pair.client()?;
        let mut rows: Vec<Row> = a
            .loops
            .iter()
            .map(|&loops| Row {
                loops,
                totals: Default::default(),
                chunks: Default::default(),
            })
            .collect();
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        for run in 0..a.runs {
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
                            way::LEGACY => legacy_cycles(&c, n, pb)?,
                            way::FD => fd_cycles(&c, n, pb)?,
                            _ => limit_cycles(&raw.conn, n, LIMIT_PASSES[w - way::LIMIT], pb)?,
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
        let st = c.stats().map_err(Error::ctrl("STATS"))?;
        check!(
            st.endpoints() == 1 && st.open_nodes == 0,
            "the service still holds endpoints after the cycles: {st:?}"
        );
        pb.set_message(format!("{} echo", placement.name()));
        let (echo, echo_limit) = echo_vs_limit(&a.iopath, &echo_ep, a.count, false, server_cpu)?;
        Ok(Measured {
            placement,
            rows,
            echo,
            echo_limit,
        })
    })
}

/// What the polling echo measured, beside its two limits.
#[derive(Debug)]
struct PollMeasured {
    echo: Latency,
    /// The raw eventfd ping-pong, both on the client's CPU.
    eventfd: Latency,
    /// The same three hops with no rpmsg ([`pollfloor`]).
    floor: Latency,
    /// Where they ran, in words.
    place: String,
}

/// Echo with host and remote polling the rings and the client busy-polling
/// its fd: the host spins on the second CPU, the remote on the client's
/// (where it gives way to the client whenever the client runs). Beside it
/// the poll floor in the same places, and the raw eventfd ping-pong in its
/// fastest placement, both on the client's CPU.
fn measure_poll(a: &RpmsgConfig, cpus: &Cpus) -> Result<PollMeasured> {
    let (ca, cb) = cpus.pair();
    let pair = Pair::start(&a.iopath, true, Some(ca), Some(cb))?;
    let floor = pollfloor::RawPollPath::start(&a.iopath, ECHO_WARM + a.count, Some(cb), Some(ca))?;
    let raw = RawPingPong::start(&a.iopath, ECHO_WARM + a.count, Some(ca))?;
    let [echo, floor, eventfd] = on_cpu(Some(ca), cpus, || {
        let (_c, ep) = pair.client()?;
        let mut seq = 0;
        let mut e = |n, lat: &mut Vec<f64>| echo(&ep, n, true, &mut seq, lat);
        let mut f = |n, lat: &mut Vec<f64>| floor.round_trips(n, lat);
        let mut r = |n, lat: &mut Vec<f64>| raw.round_trips(n, lat);
        alternate(a.count, [&mut e, &mut f, &mut r])
    })?;
    Ok(PollMeasured {
        echo,
        eventfd,
        floor,
        place: format!(
            "host and the floor's forwarder on CPU {cb}; remote, the floor's echo and the \
             busy-polling client on CPU {ca}; eventfd pair on CPU {ca}"
        ),
    })
}

/// What the rpmsg experiment measured: the tables with
/// [`RpmsgReport::text`], every figure with [`RpmsgReport::json`].
#[derive(Debug)]
pub struct RpmsgReport {
    runs: usize,
    count: u64,
    measured: Vec<Measured>,
    /// Where each placement put the processes, in words.
    wheres: Vec<String>,
    /// Echo with polling, its limits, and where they ran.
    poll: Option<PollMeasured>,
    /// Each placement's table text and JSON, in order.
    placements: Vec<(String, serde_json::Value)>,
    /// The peer rows per placement (`None`: no `--openamp`).
    peers: Option<Vec<peers::PeerPlacement>>,
    /// What the peer rows were given: `--openamp`, round trips, budget.
    openamp: Option<PathBuf>,
    peer_budget: Duration,
    /// Where each peer placement put the processes, in words.
    peer_wheres: Vec<String>,
    /// The scale experiments' text, Markdown and JSON, when added
    /// ([`RpmsgReport::add_scale`]).
    scale: Option<(String, String, serde_json::Value)>,
    /// The scale experiments' chart panels, when added.
    scale_panels: Vec<crate::plot::Panel>,
    /// The 1-minute load average before and after the run.
    loadavg: (Option<f64>, Option<f64>),
}

fn experiment(a: &RpmsgConfig) -> Result<RpmsgReport> {
    if a.runs == 0 {
        invalid!("--runs", "give at least 1");
    }
    if a.loops.is_empty() || a.loops.contains(&0) {
        invalid!("--loops", "give positive counts, e.g. 1000,10000");
    }
    if a.placement.is_empty() {
        invalid!("--placement", "give at least one of one, split, free");
    }
    if let Some(dir) = &a.openamp {
        peers::check_dir(dir)?;
        if a.peer_placement.is_empty() {
            invalid!("--peer-placement", "give at least one of one, split, free");
        }
        if a.peer_budget.is_zero() {
            invalid!("--peer-seconds", "give at least 1");
        }
    }
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
        Some(measure_poll(a, &cpus)?)
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
    let placements = all.iter().map(|m| report::report(a, m, &cpus)).collect();
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
        loadavg: (load_before, crate::loadavg()),
    })
}

pub mod peers;
pub mod pollfloor;
mod report;
pub mod scale;

#[cfg(test)]
mod tests {
    use super::*;

    /// One request with cue `cue` to the raw fd server on `c`: the fd.
    fn ask(c: &OwnedFd, cue: u8) -> OwnedFd {
        let mut req = [0u8; 56];
        req[0] = cue;
        let (bytes, mut fds) = ask_raw_fd_server(c, &req, &mut [0u8; 128]).unwrap();
        assert_eq!(bytes, 60);
        assert_eq!(fds.len(), 1);
        fds.pop().unwrap()
    }

    #[test]
    fn the_raw_fd_server_passes_what_each_cue_asks_for() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("sock");
        let s2 = sock.clone();
        let server = std::thread::spawn(move || raw_fd_server(&s2));
        let c = connect_retry(&sock).expect("no raw fd server");
        let big = [5u8; 5000];
        // An eventfd: 8-byte counter writes.
        let ev = ask(&c, 0);
        assert_eq!(rustix::io::write(&ev, &1u64.to_ne_bytes()), Ok(8));
        // A fresh socket with the default send buffer: a 5000-byte packet
        // is not refused for its size (it goes, or finds the far end
        // closed already).
        let s = ask(&c, b'S');
        let sent = rustix::net::send(&s, &big, SendFlags::NOSIGNAL | SendFlags::DONTWAIT);
        assert!(
            matches!(sent, Ok(5000) | Err(rustix::io::Errno::PIPE)),
            "{sent:?}"
        );
        // A watched socket: the far end is alive and reads nothing, the
        // send buffer is at the smallest, so the kernel refuses 5000 bytes
        // and takes 16.
        let mut watched = Vec::new();
        for _ in 0..2 * WATCH_DRAIN {
            let w = ask(&c, b'W');
            assert_smallest_send_buffer(&w);
            watched.push(w);
        }
        // Closing them all and asking for more: the server closes its ends
        // of the closed ones as it goes, and keeps answering.
        drop(watched);
        for _ in 0..2 * WATCH_DRAIN {
            drop(ask(&c, b'W'));
        }
        drop(c);
        server.join().unwrap().unwrap();
    }
    /// A passed socket with the smallest send buffer whose far end is
    /// alive and reads nothing: the kernel refuses 5000 bytes, takes 16.
    fn assert_smallest_send_buffer(fd: &OwnedFd) {
        let flags = SendFlags::NOSIGNAL | SendFlags::DONTWAIT;
        assert_eq!(
            rustix::net::send(fd, &[5u8; 5000], flags),
            Err(rustix::io::Errno::MSGSIZE)
        );
        assert_eq!(rustix::net::send(fd, &[1u8; 16], flags), Ok(16));
    }
}
