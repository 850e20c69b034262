//! `iopath rpmsg host`: the virtio driver side, owning the buffers and the
//! bus, serving local clients on a control socket.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, ensure, Result};
use iopath_rpmsg::bufsz::{BufSizes, VIRTIO_RPMSG_F_BUFSZ};
use iopath_rpmsg::tools::openamp;
use iopath_rpmsg::tools::ping::openamp_demo;
use iopath_rpmsg::tools::session::{
    Cleanup, HostConfig, HostEvent, HostSession, HostStartError, ServeRemotesError,
};
use iopath_rpmsg::vring::VIRTIO_RING_F_EVENT_IDX;
use iopath_rpmsg::{
    shm_path, Bus, Convention, CtrlOptions, HostOptions, NotifySpec, Role, ShmError, ShmOptions,
    HOST_FEATURES,
};

use super::common::{at, until_stopped, BufSizeArgs};

/// Options of `iopath rpmsg host`.
#[derive(Debug, clap::Args)]
pub struct HostArgs {
    /// Shared-memory file written by the remote (a bare name means
    /// /dev/shm/NAME).
    #[arg(long)]
    shm: PathBuf,
    /// How to notify (see `remote --notify`); the host connects.
    #[arg(long, default_value = openamp::NOTIFY)]
    notify: NotifySpec,
    /// Serve local clients on this SOCK_SEQPACKET control socket: the
    /// endpoint service (create endpoints as fds or legacy nodes, STATS)
    /// and ATTACH. The peer's credentials are logged (IOPATH_LOG=info).
    #[arg(long)]
    ctrl: Option<PathBuf>,
    /// Mode of the control socket and of the legacy nodes, octal (e.g.
    /// 660 to let the group in).
    #[arg(long, default_value = "600", value_parser = super::common::parse_mode)]
    ctrl_mode: u32,
    /// Endpoints one control connection may hold; one more is refused with
    /// EMFILE and nobody else notices. Default 1024, the soft open-file
    /// limit a process starts with (as many as it could hold of the
    /// kernel's /dev/rpmsgN), at most the per-user bound.
    #[arg(long, value_name = "N", value_parser = crate::usage::at_least_one::<u32>)]
    max_endpoints_per_client: Option<u32>,
    /// Endpoints one user may hold over all its connections; one more is
    /// refused with ENOSPC. Default 4096, at most a quarter of the fds the
    /// service may spend on endpoints (its open-file limit less a reserve,
    /// so other clients' requests are always answered).
    #[arg(long, value_name = "N", value_parser = crate::usage::at_least_one::<u32>)]
    max_endpoints_per_uid: Option<u32>,
    /// Directory for legacy nodes (rpmsgN); default: the control socket
    /// path with ".d" appended.
    #[arg(long)]
    rundir: Option<PathBuf>,
    /// Behave like OpenAMP's rpmsg-echo-ping demo: payloads {u64 num; u64
    /// size; u8 data[size]} of sizes 1..480 filled with 0xA5, each echo
    /// checked, then a name-service destroy; exit status 1 on any error.
    #[arg(long, conflicts_with = "ctrl")]
    openamp_ping: bool,
    /// Attach to a shared-memory file that users other than its owner can
    /// write (refused by default: whoever can write it can forge any
    /// message).
    #[arg(long)]
    allow_writable_shm: bool,
    /// Serve one remote only: exit with status 1 when the link to it goes
    /// down. By default the host waits for a remote to come back on the
    /// same shared memory (its clients' endpoints hang up meanwhile, and the
    /// control socket is away) and serves new clients then.
    #[arg(long)]
    once: bool,
    /// Do not accept VIRTIO_RING_F_EVENT_IDX even if offered.
    #[arg(long)]
    no_event_idx: bool,
    #[command(flatten)]
    buf: BufSizeArgs,
    /// Decline buffer sizes the remote offers: 512 bytes each way.
    #[arg(long, conflicts_with_all = ["buf_size", "tx_buf_size", "rx_buf_size"])]
    no_buf_size: bool,
    /// Seconds to wait for the remote.
    #[arg(long, default_value_t = 30)]
    timeout: u64,
    /// Print results as JSON.
    #[arg(long)]
    json: bool,
}

/// Says why the remote's shared memory could not be opened.
fn open_shm_error(e: ShmError, path: &Path, timeout: Duration) -> anyhow::Error {
    match e {
        // Someone else's file stays someone else's: no point waiting.
        e @ ShmError::Writable { .. } => {
            at(e, "--shm: refused (--allow-writable-shm attaches anyway)")
        }
        e => at(
            e,
            format!(
                "--shm {}: no remote's shared memory there (waited {} s; \
             `iopath rpmsg remote --shm {} --create SIZE` makes one)",
                path.display(),
                timeout.as_secs(),
                path.display()
            ),
        ),
    }
}

/// Runs `iopath rpmsg host` until a signal stops it (exit 0), serving one
/// remote after another; with `--once` until the link goes down (an error:
/// the remote went away or broke the rings).
pub fn run(a: HostArgs) -> Result<()> {
    ensure!(
        a.ctrl.is_some() || a.openamp_ping,
        "nothing to do: give --ctrl SOCK (serve clients) or --openamp-ping"
    );
    until_stopped("host", |stop| serve(&a, stop))
}

/// Starts the host (iopath_rpmsg's [`HostSession`]) and serves one remote
/// after another.
fn serve(a: &HostArgs, stop: &Cleanup) -> Result<()> {
    // Sizes are checked before anything is touched.
    let fixed = match a.buf.sizes(Role::Host)? {
        Some(_) if a.buf.buf_size_convention != Convention::Fixed => {
            return Err(crate::usage::usage(
                "--buf-size on the host needs --buf-size-convention fixed (otherwise the remote offers the sizes)",
            ))
        }
        Some(sizes) => sizes,
        None => BufSizes::DEFAULT,
    };
    let mut features = HOST_FEATURES;
    if a.no_event_idx {
        features &= !(1 << VIRTIO_RING_F_EVENT_IDX);
    }
    if a.no_buf_size {
        features &= !(1 << VIRTIO_RPMSG_F_BUFSZ);
    }
    let path = shm_path(&a.shm);
    let timeout = Duration::from_secs(a.timeout);
    let cfg = HostConfig {
        shm: path.clone(),
        shm_opts: ShmOptions {
            allow_others_write: a.allow_writable_shm,
            ..ShmOptions::default()
        },
        notify: a.notify.clone(),
        timeout,
        host: HostOptions {
            features,
            convention: a.buf.buf_size_convention,
            fixed,
        },
        ctrl: a.ctrl.clone(),
        ctrl_opts: CtrlOptions {
            mode: a.ctrl_mode,
            rundir: a.rundir.clone(),
            max_endpoints_per_client: a.max_endpoints_per_client,
            max_endpoints_per_uid: a.max_endpoints_per_uid,
        },
        once: a.once,
    };
    let ctrl = a.ctrl.as_deref().unwrap_or(Path::new(""));
    let host = HostSession::start(cfg, stop).map_err(|e| match e {
        HostStartError::CtrlInUse(e) => at(e, format!("--ctrl {}", ctrl.display())),
        HostStartError::Owner(e) => at(e, format!("--shm {}", path.display())),
        HostStartError::Connect(e) => at(e, format!("connecting to the remote on {}", a.notify)),
        HostStartError::Shm(e) => open_shm_error(e, &path, timeout),
        HostStartError::Bus(e) => at(
            e,
            format!(
                "starting the host (--buf-size-convention {})",
                a.buf.buf_size_convention
            ),
        ),
        HostStartError::Ctrl(e) => at(e, format!("control socket {}", ctrl.display())),
    })?;
    let bus = host.bus();
    eprintln!(
        "host: payloads up to {} bytes to the remote, {} from it",
        bus.max_payload(),
        bus.max_rx_payload()
    );
    let Some(server) = host.server() else {
        return openamp_ping(bus, timeout, a.json);
    };
    eprintln!(
        "host: {} via {}, control socket {} (mode {:o}), nodes in {}",
        path.display(),
        bus.notifier_kind(),
        server.path().display(),
        a.ctrl_mode,
        server.rundir().display()
    );
    let Err(e) = host.serve(stop, |ev| match ev {
        HostEvent::LinkDown { reason, stats } if a.json => println!(
            "{}",
            serde_json::json!({ "role": "host", "end": reason, "stats": stats })
        ),
        HostEvent::Waiting { .. } => {
            eprintln!("host: {ev}; waiting for a remote on {}", a.notify)
        }
        ev => eprintln!("host: {ev}"),
    });
    Err(match e {
        ServeRemotesError::LinkDown { reason } => {
            anyhow!("the link to the remote went down: {reason}")
        }
        ServeRemotesError::Reconnect(e) => at(e, format!("reconnecting to {}", a.notify)),
        ServeRemotesError::Shm(e) => open_shm_error(e, &path, timeout),
        ServeRemotesError::Bus(e) => at(e, "restarting the host"),
        ServeRemotesError::Ctrl(e) => at(e, format!("control socket {}", ctrl.display())),
    })
}

/// OpenAMP's rpmsg-echo-ping, over iopath's bus; then the device reset.
fn openamp_ping(bus: &Bus, timeout: Duration, json: bool) -> Result<()> {
    let r = openamp_demo(bus, timeout, |num, size| {
        eprintln!("openamp-ping: payload {num} (size {size}) came back wrong");
    })?;
    bus.shutdown();
    if json {
        println!("{}", serde_json::to_value(r)?);
    } else {
        println!("openamp-ping: {r}");
    }
    ensure!(r.errors == 0, "{} payloads came back wrong", r.errors);
    Ok(())
}
