//! `iopath rpmsg ping`: echo round trips through an endpoint of the host's
//! endpoint service, beside the raw eventfd ping-pong limit.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use iopath_rpmsg::ctrl::EptFd;
use iopath_rpmsg::tools::openamp::{MAX_DATA as OPENAMP_MAX, SERVICE as OPENAMP_SERVICE};
use iopath_rpmsg::tools::ping::{
    Latency, Payloads, PingEndpoint, PingOptions, RawPingPong, MAX_FIXED,
};

use super::common::parse_name;

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
    /// Round trips, at least 1.
    #[arg(long, default_value_t = 1000, value_parser = crate::usage::at_least_one::<u64>)]
    count: u64,
    /// Payload size for every message (default: cycle through 1..=496);
    /// above 496 with buffers negotiated that large (up to 65520 with
    /// 64 KiB buffers).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=MAX_FIXED as u64))]
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

/// Runs `iopath rpmsg ping`.
pub fn run(a: PingArgs) -> Result<()> {
    let timeout = Duration::from_secs(a.timeout);
    let ep = match (a.fd, a.ctrl.as_deref()) {
        (Some(fd), _) => {
            PingEndpoint::from(EptFd::inherited(fd).with_context(|| format!("--fd {fd}"))?)
        }
        (None, Some(ctrl)) if a.attach || a.openamp => {
            PingEndpoint::attach(ctrl, &a.name, timeout)?
        }
        (None, Some(ctrl)) => PingEndpoint::create(ctrl, &a.name, timeout)?,
        (None, None) => return Err(crate::usage::usage("--ctrl or --fd is needed")),
    };
    let (count, payloads) = match (a.openamp, a.size) {
        (true, _) => (OPENAMP_MAX as u64, Payloads::OpenAmp),
        (false, Some(s)) => (a.count, Payloads::Fixed(s as usize)),
        (false, None) => (a.count, Payloads::Cycle),
    };
    let bar = if a.json || count < 10_000 {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::new(count)
    };
    let opts = PingOptions {
        count,
        payloads,
        timeout,
        busy: a.poll,
    };
    let r = iopath_rpmsg::tools::ping::ping(&ep, &opts, || bar.inc(1))?;
    bar.finish_and_clear();
    let echo = Latency::from(r.round_trips_us, r.elapsed);
    // What the round trips went through: the channel name, or the fd.
    let name = a.fd.map_or(a.name.clone(), |fd| format!("fd {fd}"));
    let label = if a.fd.is_some() {
        name.clone()
    } else {
        format!("{name:?}")
    };
    let limit = a.limit.then(|| raw_pingpong(count.max(1000))).transpose()?;
    let (min_size, max_size) = (r.min_size, r.max_size);
    if a.json {
        let mut v = serde_json::json!({
            "name": name, "count": count, "sizes": [min_size, max_size],
            "bytes": r.bytes, "checked": true, "echo": echo,
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
    let (exe, dir) = (std::env::current_exe()?, std::env::temp_dir());
    let raw = RawPingPong::start(&exe, &dir, count + warm, std::process::Command::spawn)?;
    raw.round_trips(warm, &mut Vec::new())?;
    let mut lat = Vec::with_capacity(count as usize);
    let elapsed = raw.round_trips(count, &mut lat)?;
    Ok(Latency::from(lat, elapsed))
}
