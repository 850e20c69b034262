//! `iopath rpmsg remote|host|ping`: rpmsg over virtio rings in shared memory.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use iopath_bench::rpmsg::RawPingPong;
use iopath_bench::Latency;
use iopath_rpmsg::ctrl::{proto, CtrlClient, CtrlEndpoint, CtrlError, EptFd, EptInfo};
use iopath_rpmsg::wire::{ADDR_ANY, MAX_PAYLOAD};

mod common;
mod ept;
mod exec;
mod host;
mod remote;
mod stop;

pub use host::HostArgs;
pub use remote::RemoteArgs;

use common::{parse_name, OPENAMP_MAX, OPENAMP_SERVICE};

/// The `iopath rpmsg` subcommands (their help is in `main.rs`).
#[derive(Debug, clap::Subcommand)]
pub enum RpmsgCmd {
    /// Be the remote (virtio device): wait for the host, announce echo
    /// services, echo every message back; then wait for the next host
    /// (--once: exit, status 1 if the host died). SIGINT/SIGTERM: clean
    /// stop, status 0.
    Remote(RemoteArgs),
    /// Be the host (virtio driver): own the buffers and the bus, serve local
    /// clients on a control socket; if the remote dies, hang its clients up
    /// and serve again once a remote is back (--once: exit, status 1).
    /// SIGINT/SIGTERM: clean stop, status 0.
    Host(HostArgs),
    /// Echo round trips through an endpoint fd from the host's endpoint
    /// service (or an inherited one): every byte checked; p50/p99/max
    /// latency and messages per second.
    Ping(PingArgs),
    /// Endpoints from the host's endpoint service: create one as an fd (and
    /// hand it to a command) or the legacy way (a node to open).
    #[command(subcommand)]
    Ept(ept::EptCmd),
    /// Run an unmodified program written for Linux's /dev/rpmsg_ctrlN and
    /// /dev/rpmsgN on the host's endpoint service (LD_PRELOAD of
    /// libiopath_rpmsg_preload.so).
    Exec(exec::ExecArgs),
}

/// Options of `iopath rpmsg ping`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  iopath rpmsg ping --ctrl /tmp/rp.ctrl --name echo --count 10000 --size 496
  iopath rpmsg ept create --ctrl /tmp/rp.ctrl --name echo -- \\
      sh -c 'iopath rpmsg ping --fd $IOPATH_RPMSG_FD --count 100'")]
pub struct PingArgs {
    /// The host's control socket: ping creates an endpoint fd there.
    #[arg(long, required_unless_present = "fd")]
    ctrl: Option<PathBuf>,
    /// Use this inherited endpoint fd instead (e.g. $IOPATH_RPMSG_FD from
    /// `iopath rpmsg ept create ... -- CMD`).
    #[arg(long, conflicts_with_all = ["ctrl", "attach"])]
    fd: Option<i32>,
    /// Use the older ATTACH request: the connection itself becomes an
    /// announced endpoint (the remote sees name-service create/destroy).
    #[arg(long)]
    attach: bool,
    /// Channel (service name the remote announced).
    #[arg(long, default_value = OPENAMP_SERVICE, value_parser = parse_name)]
    name: String,
    /// Round trips.
    #[arg(long, default_value_t = 1000)]
    count: u64,
    /// Payload size for every message (default: cycle through 1..=496).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=MAX_PAYLOAD as u64))]
    size: Option<u64>,
    /// OpenAMP demo payloads ({u64 num; u64 size; data[size] = 0xA5}, sizes
    /// 1..=480, 480 round trips); implies --attach (the demo's remote
    /// waits for the host's name-service destroy).
    #[arg(long, conflicts_with_all = ["size", "count"])]
    openamp: bool,
    /// Also measure the limit: a raw eventfd ping-pong between two processes
    /// (this one and a child), same count, and print the ratio.
    #[arg(long)]
    limit: bool,
    /// Busy-poll the endpoint fd for each echo instead of sleeping in
    /// poll(2): no wake-up on the way back, one core spinning (pair it with
    /// a host and remote on `--notify poll`).
    #[arg(long, conflicts_with_all = ["attach", "openamp"])]
    poll: bool,
    /// Seconds to wait for the channel and for each echo.
    #[arg(long, default_value_t = 10)]
    timeout: u64,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

/// Runs one `rpmsg` subcommand.
pub fn run(cmd: RpmsgCmd) -> Result<()> {
    match cmd {
        RpmsgCmd::Remote(a) => remote::run(a),
        RpmsgCmd::Host(a) => host::run(a),
        RpmsgCmd::Ping(a) => ping(a),
        RpmsgCmd::Ept(c) => ept::run(c),
        RpmsgCmd::Exec(a) => exec::exec(a),
    }
}

fn fill(buf: &mut [u8], seq: u64) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = (seq as usize).wrapping_mul(31).wrapping_add(i * 7) as u8;
    }
}

/// The endpoint `ping` talks through.
enum PingEp {
    Attach(CtrlEndpoint),
    Fd(EptFd),
}

fn is_pipe(e: &CtrlError) -> bool {
    matches!(e, CtrlError::Io { source, .. } if source.raw_os_error() == Some(libc_epipe()))
}

fn libc_epipe() -> i32 {
    rustix::io::Errno::PIPE.raw_os_error()
}

impl PingEp {
    fn open(a: &PingArgs, timeout: Duration) -> Result<PingEp> {
        if let Some(fd) = a.fd {
            return Ok(PingEp::Fd(ept::inherited(fd)?));
        }
        let ctrl = a.ctrl.as_deref().context("--ctrl or --fd is needed")?;
        if a.attach || a.openamp {
            let ep = CtrlEndpoint::attach(ctrl, &a.name, timeout)
                .with_context(|| format!("attaching to {:?} through {}", a.name, ctrl.display()))?;
            return Ok(PingEp::Attach(ep));
        }
        let c = CtrlClient::connect(ctrl)
            .with_context(|| format!("endpoint service {}", ctrl.display()))?;
        // An endpoint created before the remote announced the name stays
        // unbound (as rpmsg_char's do): retry until it binds.
        let start = Instant::now();
        loop {
            let ep = c
                .create_ept_fd(&EptInfo::new(&a.name), proto::O_RDWR | proto::O_CLOEXEC)
                .with_context(|| format!("creating an endpoint {:?}", a.name))?;
            if ep.info().dst != ADDR_ANY {
                return Ok(PingEp::Fd(ep));
            }
            drop(ep);
            ensure!(
                start.elapsed() < timeout,
                "{:?} not announced by the remote within {} s (no channel to bind the endpoint to)",
                a.name,
                timeout.as_secs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn send(&self, data: &[u8]) -> Result<(), CtrlError> {
        match self {
            PingEp::Attach(e) => e.send(data),
            PingEp::Fd(e) => e.send(data),
        }
    }

    /// `Ok(Some(0))`: the channel is closed. `busy`: busy-poll.
    fn recv(
        &self,
        buf: &mut [u8],
        timeout: Duration,
        busy: bool,
    ) -> Result<Option<usize>, CtrlError> {
        match self {
            PingEp::Attach(e) => e.recv(buf, timeout),
            PingEp::Fd(e) if busy => match e.recv_busy(buf, timeout) {
                Err(e) if is_pipe(&e) => Ok(Some(0)),
                r => r,
            },
            PingEp::Fd(e) => match e.recv_timeout(buf, timeout) {
                Err(e) if is_pipe(&e) => Ok(Some(0)),
                r => r,
            },
        }
    }
}

fn ping(a: PingArgs) -> Result<()> {
    let timeout = Duration::from_secs(a.timeout);
    let ep = PingEp::open(&a, timeout)?;
    let count = if a.openamp {
        OPENAMP_MAX as u64
    } else {
        a.count
    };
    let bar = if a.json || count < 10_000 {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::new(count)
    };
    let mut lat = Vec::with_capacity(count as usize);
    let mut out = vec![0u8; MAX_PAYLOAD];
    let mut back = vec![0u8; MAX_PAYLOAD + 64];
    let (mut min_size, mut max_size, mut bytes) = (usize::MAX, 0usize, 0u64);
    let t0 = Instant::now();
    for i in 0..count {
        let size = if a.openamp {
            16 + 1 + i as usize
        } else {
            a.size
                .map_or(1 + (i as usize % MAX_PAYLOAD), |s| s as usize)
        };
        let msg = &mut out[..size];
        if a.openamp {
            msg[..8].copy_from_slice(&i.to_le_bytes());
            msg[8..16].copy_from_slice(&(size as u64 - 16).to_le_bytes());
            msg[16..].fill(0xA5);
        } else {
            fill(msg, i);
        }
        let t = Instant::now();
        match ep.send(msg) {
            Err(e) if is_pipe(&e) => bail!("the channel was closed after {i} round trips"),
            r => r.with_context(|| format!("sending message {i}"))?,
        }
        let n = ep
            .recv(&mut back, timeout, a.poll)
            .with_context(|| format!("waiting for echo {i}"))?
            .with_context(|| format!("no echo of message {i} within {} s", a.timeout))?;
        lat.push(t.elapsed().as_secs_f64() * 1e6);
        ensure!(n != 0, "the channel was closed after {i} round trips");
        ensure!(n == size, "echo {i}: {n} bytes back for {size} sent");
        if let Some(at) = back[..n].iter().zip(msg.iter()).position(|(x, y)| x != y) {
            bail!("echo {i} (size {size}): byte {at} differs");
        }
        min_size = min_size.min(size);
        max_size = max_size.max(size);
        bytes += size as u64;
        bar.inc(1);
    }
    let elapsed = t0.elapsed();
    bar.finish_and_clear();
    let echo = Latency::from(lat, elapsed);
    // What the round trips went through: the channel name, or the fd.
    let (label, name) = match a.fd {
        Some(fd) => (format!("fd {fd}"), format!("fd {fd}")),
        None => (format!("{:?}", a.name), a.name.clone()),
    };
    let limit = if a.limit {
        Some(raw_pingpong(count.max(1000))?)
    } else {
        None
    };
    if a.json {
        let mut v = serde_json::json!({
            "name": name, "count": count, "sizes": [min_size, max_size],
            "bytes": bytes, "checked": true, "echo": echo,
        });
        if let Some(l) = &limit {
            v["limit"] = serde_json::json!({ "what": "raw eventfd ping-pong between two processes", "latency": l });
            v["ratio_p50"] = serde_json::json!(echo.p50_us / l.p50_us.max(1e-9));
        }
        println!("{v}");
    } else {
        println!(
            "ping {label}: {count} round trips, sizes {min_size}..{max_size}, every byte checked: {}",
            echo.line()
        );
        if let Some(l) = limit {
            println!("limit (raw eventfd ping-pong, two processes): {}", l.line());
            println!("echo/limit p50: {:.2}x", echo.p50_us / l.p50_us.max(1e-9));
        }
    }
    Ok(())
}

/// The limit: kick a child process through an eventfd pair and wait for its
/// kick back, `count` times (after a warm-up).
fn raw_pingpong(count: u64) -> Result<Latency> {
    let warm = 100;
    let raw = RawPingPong::start(&iopath_bench::current_exe()?, count + warm, None)?;
    raw.round_trips(warm, &mut Vec::new())?;
    let mut lat = Vec::with_capacity(count as usize);
    let elapsed = raw.round_trips(count, &mut lat)?;
    Ok(Latency::from(lat, elapsed))
}
