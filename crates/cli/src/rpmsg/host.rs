//! `iopath rpmsg host`: the virtio driver side, owning the buffers and the
//! bus, serving local clients on a control socket.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, ensure, Context, Result};
use iopath_rpmsg::bufsz::{BufSizes, VIRTIO_RPMSG_F_BUFSZ};
use iopath_rpmsg::ctrl::CtrlError;
use iopath_rpmsg::session::{serve_remotes, HostEvent, ServeRemotes, ServeRemotesError};
use iopath_rpmsg::vring::VIRTIO_RING_F_EVENT_IDX;
use iopath_rpmsg::{
    shm_path, Bus, Convention, CtrlOptions, CtrlServer, HostOptions, NotifySpec, SharedMem,
    ShmError, ShmOptions, ShmOwner, ShmRole, HOST_FEATURES,
};

use iopath_rpmsg::openamp;
use iopath_rpmsg::ping::openamp_demo;

use super::common::{stats_json, stats_line};
use iopath_rpmsg::session::Cleanup;

use super::stop;

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
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    max_endpoints_per_client: Option<u32>,
    /// Endpoints one user may hold over all its connections; one more is
    /// refused with ENOSPC. Default 4096, at most a quarter of the fds the
    /// service may spend on endpoints (its open-file limit less a reserve,
    /// so other clients' requests are always answered).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
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
    /// How the remote's buffer sizes are read: linux (feature bit 1 and a
    /// versioned config, Linux's proposal), nuttx (bit 2, the sizes
    /// first in the config; bit 1 is then NuttX's ACK, never taken) or
    /// fixed (nothing read, no bit taken: the sizes of --buf-size, 512
    /// without it, which the remote must be given too, as upstream
    /// OpenAMP's RPMSG_BUFFER_SIZE).
    #[arg(long, default_value = "linux", value_name = "CONVENTION")]
    buf_size_convention: Convention,
    /// With --buf-size-convention fixed: buffers of SIZE bytes both ways,
    /// header included (512 to 64K, a multiple of 4).
    #[arg(long, value_parser = iopath_sys::parse_size::<u64>, value_name = "SIZE")]
    buf_size: Option<u64>,
    /// With --buf-size-convention fixed: SIZE-byte buffers for messages
    /// from the host to the remote (overrides --buf-size that way).
    #[arg(long, value_parser = iopath_sys::parse_size::<u64>, value_name = "SIZE")]
    tx_buf_size: Option<u64>,
    /// With --buf-size-convention fixed: SIZE-byte buffers for messages
    /// from the remote to the host (overrides --buf-size that way).
    #[arg(long, value_parser = iopath_sys::parse_size::<u64>, value_name = "SIZE")]
    rx_buf_size: Option<u64>,
    /// Decline buffer sizes the remote offers: 512 bytes each way.
    #[arg(long)]
    no_buf_size: bool,
    /// Seconds to wait for the remote.
    #[arg(long, default_value_t = 30)]
    timeout: u64,
    /// Print results as JSON.
    #[arg(long)]
    json: bool,
}

/// Opens the remote's shared memory, waiting while it is being created.
fn open_shm(path: &Path, opts: &ShmOptions, timeout: Duration) -> Result<SharedMem> {
    SharedMem::open_waiting(path, opts, timeout).map_err(|e| open_shm_error(e, path, timeout))
}

/// Says why the remote's shared memory could not be opened.
fn open_shm_error(e: ShmError, path: &Path, timeout: Duration) -> anyhow::Error {
    match e {
        // Someone else's file stays someone else's: no point waiting.
        e @ ShmError::Writable { .. } => {
            anyhow::Error::new(e).context("--shm: refused (--allow-writable-shm attaches anyway)")
        }
        e => anyhow::Error::new(e).context(format!(
            "--shm {}: no remote's shared memory there (waited {} s; \
             `iopath rpmsg remote --shm {} --create SIZE` makes one)",
            path.display(),
            timeout.as_secs(),
            path.display()
        )),
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
    let stop = stop::install("host")?;
    let r = serve(&a, &stop);
    stop.run();
    r
}

/// Connects to the remote, starts the bus and serves one remote after
/// another (with `--once` until the link goes down).
fn serve(a: &HostArgs, stop: &Cleanup) -> Result<()> {
    // Sizes are checked before anything is touched.
    let fixed = super::common::buf_sizes(a.buf_size, a.tx_buf_size, a.rx_buf_size)?;
    if fixed.is_some() && a.buf_size_convention != Convention::Fixed {
        return Err(crate::usage::usage(
            "--buf-size on the host needs --buf-size-convention fixed (otherwise the remote offers the sizes)",
        ));
    }
    let fixed = fixed.map_or(BufSizes::DEFAULT, |(to_remote, to_host)| BufSizes {
        to_remote,
        to_host,
    });
    // Refuse a live control socket before the device is touched: a second
    // host would reset the running one's device.
    if let Some(ctrl) = &a.ctrl {
        CtrlServer::check_free(ctrl).with_context(|| format!("--ctrl {}", ctrl.display()))?;
    }
    let path = shm_path(&a.shm);
    // A host already on this file: say so at once, before the remote's
    // notify socket is touched (a busy remote would keep this one waiting).
    ShmOwner::check(&path, ShmRole::Host).with_context(|| format!("--shm {}", path.display()))?;
    let timeout = Duration::from_secs(a.timeout);
    let notifier = a
        .notify
        .connect(timeout)
        .with_context(|| format!("connecting to the remote on {}", a.notify))?;
    let shm_opts = ShmOptions {
        allow_others_write: a.allow_writable_shm,
        ..ShmOptions::default()
    };
    let shm = open_shm(&path, &shm_opts, timeout)?;
    // The host's role for this process's life, across remotes; the session
    // lock while the link is up (see iopath_rpmsg::ShmOwner).
    let owner = ShmOwner::claim(&path, ShmRole::Host)
        .and_then(|o| o.attach().map(|()| o))
        .with_context(|| format!("--shm {}", path.display()))?;
    let mut features = HOST_FEATURES;
    if a.no_event_idx {
        features &= !(1 << VIRTIO_RING_F_EVENT_IDX);
    }
    if a.no_buf_size {
        features &= !(1 << VIRTIO_RPMSG_F_BUFSZ);
    }
    let host_opts = HostOptions {
        features,
        convention: a.buf_size_convention,
        fixed,
    };
    let bus = Bus::host_with(shm, notifier, &host_opts).with_context(|| {
        format!(
            "starting the host (--buf-size-convention {})",
            a.buf_size_convention
        )
    })?;
    eprintln!(
        "host: payloads up to {} bytes to the remote, {} from it",
        bus.max_payload(),
        bus.max_rx_payload()
    );
    stop.set_bus(Some(bus.clone()));
    if a.openamp_ping {
        return openamp_ping(&bus, timeout, a.json);
    }
    let ctrl = a.ctrl.as_deref().expect("checked above");
    let opts = CtrlOptions {
        mode: a.ctrl_mode,
        rundir: a.rundir.clone(),
        max_endpoints_per_client: a.max_endpoints_per_client,
        max_endpoints_per_uid: a.max_endpoints_per_uid,
    };
    // Registered before the socket appears: a signal that comes as soon as
    // a client could connect still finds it to remove.
    stop.add_file(ctrl);
    let rundir = a
        .rundir
        .clone()
        .unwrap_or_else(|| iopath_rpmsg::ctrl::default_run_dir(ctrl));
    stop.set_rundir(Some(&rundir));
    let server = match CtrlServer::start_with(bus.clone(), ctrl, &opts) {
        Ok(server) => server,
        Err(e) => {
            if matches!(e, CtrlError::InUse { .. } | CtrlError::NotSocket { .. }) {
                stop.forget_file(ctrl); // someone else's
                stop.set_rundir(None);
            }
            return Err(e).with_context(|| format!("control socket {}", ctrl.display()));
        }
    };
    stop.set_rundir(Some(server.rundir()));
    eprintln!(
        "host: {} via {}, control socket {} (mode {:o}), nodes in {}",
        path.display(),
        bus.notifier_kind(),
        server.path().display(),
        a.ctrl_mode,
        server.rundir().display()
    );
    let cfg = ServeRemotes {
        notify: &a.notify,
        timeout,
        shm: &path,
        shm_opts: &shm_opts,
        features,
        convention: a.buf_size_convention,
        fixed,
        ctrl,
        ctrl_opts: &opts,
        once: a.once,
        owner: Some(&owner),
    };
    let Err(e) = serve_remotes(&cfg, bus, server, stop, |ev| match ev {
        HostEvent::LinkDown { reason, stats } => {
            if a.json {
                println!(
                    "{}",
                    serde_json::json!({ "role": "host", "end": reason, "stats": stats_json(stats) })
                );
            } else {
                eprintln!("host: {reason}; {}", stats_line(stats));
            }
        }
        HostEvent::Waiting { reason } => eprintln!(
            "host: the link to the remote went down ({reason}); waiting for a remote on {}",
            a.notify
        ),
        HostEvent::RemoteBack { ctrl } => {
            eprintln!("host: remote back, serving on {} again", ctrl.display())
        }
    });
    Err(match e {
        ServeRemotesError::LinkDown { reason } => {
            anyhow!("the link to the remote went down: {reason}")
        }
        ServeRemotesError::Reconnect(e) => {
            anyhow::Error::new(e).context(format!("reconnecting to {}", a.notify))
        }
        ServeRemotesError::Shm(e) => open_shm_error(e, &path, timeout),
        ServeRemotesError::Bus(e) => anyhow::Error::new(e).context("restarting the host"),
        ServeRemotesError::Ctrl(e) => {
            anyhow::Error::new(e).context(format!("control socket {}", ctrl.display()))
        }
    })
}

/// OpenAMP's rpmsg-echo-ping, over iopath's bus; then the device reset.
fn openamp_ping(bus: &Bus, timeout: Duration, json: bool) -> Result<()> {
    let r = openamp_demo(bus, timeout, |num, size| {
        eprintln!("openamp-ping: payload {num} (size {size}) came back wrong");
    })?;
    let s = bus.stats();
    bus.shutdown();
    let (n, errors) = (r.payloads, r.errors);
    if json {
        println!(
            "{}",
            serde_json::json!({ "payloads": n, "errors": errors, "elapsed_us": r.elapsed.as_micros() as u64, "stats": stats_json(&s) })
        );
    } else {
        println!(
            "openamp-ping: {n} payloads (sizes 1..{n}) echoed, errors {errors}, {:.1} ms",
            r.elapsed.as_secs_f64() * 1e3
        );
    }
    ensure!(errors == 0, "{errors} payloads came back wrong");
    Ok(())
}
