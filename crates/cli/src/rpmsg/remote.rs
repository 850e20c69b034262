//! `iopath rpmsg remote`: the virtio device side, serving one host after
//! another on the same shared memory, or one vhost-user driver after
//! another (`--vhost-user`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, ensure, Context, Result};
use iopath_rpmsg::notify::NotifyError;
use iopath_rpmsg::rsc_table::ShmLayout;
use iopath_rpmsg::tools::session::{
    serve_drivers, serve_hosts, AcceptError, Cleanup, RemoteEvent, RemoteShm, RemoteShmConfig,
    RemoteStartError, ServeDrivers, ServeDriversError, ServeHosts, ServeHostsError, Skipped,
};
use iopath_rpmsg::tools::{openamp, RemoteChannels};
use iopath_rpmsg::vring::VIRTIO_RING_F_EVENT_IDX;
use iopath_rpmsg::{shm_path, Convention, NotifySpec, Role, ShmOptions};

use super::common::{at, until_stopped, BufSizeArgs};

/// Options of `iopath rpmsg remote`.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("transport").required(true).args(["shm", "vhost_user"])))]
pub struct RemoteArgs {
    /// Shared-memory file (a bare name means /dev/shm/NAME).
    #[arg(long)]
    shm: Option<PathBuf>,
    /// Serve a virtio-rpmsg device (ID 7) on this vhost-user socket instead
    /// of a shared-memory file: a vhost-user front end (e.g. User-Mode
    /// Linux with virtio_uml.device=SOCKET:7) drives it, and Linux's
    /// virtio_rpmsg_bus is the host. Created with mode 0600.
    #[arg(
        long,
        value_name = "SOCKET",
        conflicts_with_all = ["shm", "create", "ring", "event_idx", "notify", "notify_mode", "shm_mode", "allow_writable_shm"]
    )]
    vhost_user: Option<PathBuf>,
    /// With --vhost-user: offer VIRTIO_F_ACCESS_PLATFORM, so that a front
    /// end with an IOMMU maps every ring and buffer with IOTLB messages
    /// (User-Mode Linux accepts the bit without an IOMMU and then fails:
    /// leave it off there).
    #[arg(long, conflicts_with = "shm")]
    access_platform: bool,
    /// Create the file with SIZE bytes (e.g. 0x80000, 512K, 2M) and write a
    /// fresh resource table: OpenAMP demo layout (table at 0, vrings at
    /// 0x4000 and 0x8000 aligned 0x1000, buffers from 0x10000).
    #[arg(long, value_parser = parse_create)]
    create: Option<TypedSize>,
    /// Entries per vring (with --create).
    #[arg(long, default_value_t = 256)]
    ring: u32,
    /// Offer VIRTIO_RING_F_EVENT_IDX (with --create).
    #[arg(long)]
    event_idx: bool,
    #[command(flatten)]
    buf: BufSizeArgs,
    /// How to notify: eventfd:SOCK (eventfd pair passed over SOCK), unix:SOCK
    /// (one byte per kick, OpenAMP demo), or poll. The remote listens.
    #[arg(long, default_value = openamp::NOTIFY)]
    notify: NotifySpec,
    /// Mode of the notify socket, octal, whatever the umask. Whoever holds
    /// it is the host: with the default 600 a host of another user (not
    /// root) is refused even if the file's mode was changed; 660 lets the
    /// group in.
    #[arg(long, default_value = "600", value_parser = super::common::parse_mode)]
    notify_mode: u32,
    /// Echo service to announce (repeatable).
    #[arg(long, default_value = openamp::SERVICE, value_parser = super::common::parse_name)]
    echo: Vec<String>,
    /// Sink service to announce (repeatable): messages are counted and
    /// dropped, except the 4 bytes "SYNC", answered with the count so far
    /// (u64, little-endian; the SYNC included), so a sender can tell when
    /// a stream has arrived.
    #[arg(long, value_parser = super::common::parse_name)]
    sink: Vec<String>,
    /// Behave like OpenAMP's rpmsg-echo demo: exit once the host destroys
    /// the channel (or sends the shutdown word 0xEF56A55A).
    #[arg(long)]
    openamp: bool,
    /// Exit once the host destroys the channel.
    #[arg(long)]
    exit_on_unbind: bool,
    /// After echoing N messages, destroy the echo services (name-service
    /// DESTROY) and exit.
    #[arg(long)]
    echo_limit: Option<u64>,
    /// Give up if the host has not set DRIVER_OK (over vhost-user: started
    /// the device) within SECS.
    #[arg(long)]
    ready_timeout: Option<u64>,
    /// Serve one host only: exit when it goes (status 1 if it went without
    /// a clean stop). By default the remote waits for the next host, as
    /// firmware outlives the driver.
    #[arg(long)]
    once: bool,
    /// Mode of the shared-memory file made by --create, octal. Whoever can
    /// read it reads every message on the bus; whoever can write it can
    /// forge any.
    #[arg(long, default_value = "600", value_parser = super::common::parse_mode)]
    shm_mode: u32,
    /// Attach to a shared-memory file that users other than its owner can
    /// write (refused by default).
    #[arg(long)]
    allow_writable_shm: bool,
    /// Print the final counters as JSON.
    #[arg(long)]
    json: bool,
}

/// A size as the user typed it, and its bytes.
#[derive(Debug, Clone)]
struct TypedSize {
    bytes: u64,
    typed: String,
}

fn parse_create(s: &str) -> Result<TypedSize, String> {
    let bytes = iopath_sys::parse_size::<u64>(s).map_err(|e| e.to_string())?;
    Ok(TypedSize {
        bytes,
        typed: s.to_owned(),
    })
}

/// `bytes` in the units of `typed` (`0x` hex, a K/M/G/T suffix, or
/// bytes), rounded up to a whole one.
fn in_units_of(typed: &str, bytes: u64) -> String {
    let t = typed.trim();
    if t.starts_with("0x") || t.starts_with("0X") {
        return format!("{bytes:#x}");
    }
    let digits = t.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let suffix = &t[digits.len()..];
    let shift = match suffix.chars().next().map(|c| c.to_ascii_uppercase()) {
        Some('K') => 10,
        Some('M') => 20,
        Some('G') => 30,
        Some('T') => 40,
        _ => return bytes.to_string(),
    };
    format!("{}{suffix}", bytes.div_ceil(1 << shift))
}

/// Runs `iopath rpmsg remote` until a session ends it or a signal stops
/// it, over shared memory or vhost-user.
pub fn run(a: RemoteArgs) -> Result<()> {
    until_stopped("remote", |stop| match (&a.vhost_user, &a.shm) {
        (Some(sock), _) => serve_vhost_user(&a, sock, stop),
        (None, Some(shm)) => serve_shm(&a, shm, stop),
        (None, None) => Err(crate::usage::usage("--shm or --vhost-user is required")),
    })
}

fn channels(a: &RemoteArgs) -> RemoteChannels {
    RemoteChannels {
        echo: a.echo.clone(),
        sink: a.sink.clone(),
        openamp: a.openamp,
        exit_on_unbind: a.exit_on_unbind,
        echo_limit: a.echo_limit,
    }
}

/// Binds the vhost-user socket and serves one driver after another.
fn serve_vhost_user(a: &RemoteArgs, sock: &Path, stop: &Cleanup) -> Result<()> {
    // Sizes are checked before the socket is bound.
    let buf_sizes = a
        .buf
        .sizes(Role::Remote)?
        .map(|s| (a.buf.buf_size_convention, s));
    let listener = iopath_rpmsg::vhost_user::bind(sock)
        .with_context(|| format!("--vhost-user {}", sock.display()))?;
    stop.add_file(sock);
    eprintln!(
        "remote: virtio-rpmsg over vhost-user on {}, waiting for a driver",
        sock.display()
    );
    let channels = channels(a);
    let cfg = ServeDrivers {
        listener,
        ready_timeout: a.ready_timeout.map(Duration::from_secs),
        channels: &channels,
        once: a.once,
        access_platform: a.access_platform,
        buf_sizes,
    };
    let socket = sock.display().to_string();
    serve_drivers(cfg, stop, events(a, format!("the next driver on {socket}"))).map_err(|e| match e
    {
        ServeDriversError::Wait(e) => at(e, "waiting for the driver"),
        ServeDriversError::Announce(e) => anyhow::Error::new(e),
        ServeDriversError::DriverGone { reason } => anyhow!("the driver went away: {reason}"),
        ServeDriversError::BufSizes(e) => crate::usage::usage(format!("--buf-size: {e}")),
        ServeDriversError::Server(e) => at(e, format!("--vhost-user {socket}")),
    })
}

/// What the remote prints of each step; `next` names who comes after a
/// host went.
fn events(a: &RemoteArgs, next: String) -> impl Fn(RemoteEvent<'_>) + Send + Sync + 'static {
    let (echo, json) = (a.echo.clone(), a.json);
    move |ev| match ev {
        RemoteEvent::Skipped(Skipped::NotAHost(e @ NotifyError::PeerRefused { .. })) => {
            eprintln!("remote: {e} (--notify-mode widens it); waiting again")
        }
        RemoteEvent::Skipped(_) => eprintln!("remote: {ev}; waiting again"),
        RemoteEvent::HostReady { .. } => eprintln!("remote: {ev}, announcing {echo:?}"),
        RemoteEvent::Stats { echoed, stats } if json => println!(
            "{}",
            serde_json::json!({ "role": "remote", "echoed": echoed, "stats": stats })
        ),
        RemoteEvent::HostGone { .. } => eprintln!("remote: {ev}; waiting for {next}"),
        ev => eprintln!("remote: {ev}"),
    }
}

/// The layout `--create SIZE` writes: OpenAMP's demo layout for 0x80000
/// with rings of 256, with `--event-idx` and the offered buffer sizes.
fn layout(a: &RemoteArgs, create: &TypedSize) -> Result<ShmLayout> {
    let size = create.bytes;
    let mut layout = ShmLayout::for_size(size, a.ring).with_context(|| {
        format!(
            "--create {} with --ring {}: no layout fits",
            create.typed, a.ring
        )
    })?;
    if a.event_idx {
        layout.dfeatures |= 1 << VIRTIO_RING_F_EVENT_IDX;
    }
    if let Some(sizes) = a.buf.sizes(Role::Remote)? {
        layout = layout
            .with_buf_sizes(a.buf.buf_size_convention, sizes)
            .map_err(|e| match ShmLayout::size_for(a.ring, sizes) {
                // Too small: say which size is enough, in the user's units.
                Some(enough) if enough > size => {
                    let f = iopath_sys::format_size;
                    crate::usage::usage(format!(
                        "--create {} is too small for {} buffers of {} (remote → host) and {} of {} \
                         (host → remote) after the rings: --create {} is enough (or fewer \
                         --ring entries, or smaller buffers)",
                        create.typed,
                        a.ring,
                        f(sizes.to_host.into()),
                        a.ring,
                        f(sizes.to_remote.into()),
                        in_units_of(&create.typed, enough)
                    ))
                }
                _ => at(e, format!("--create {}", create.typed)),
            })?;
    }
    Ok(layout)
}

/// Makes or opens the shared memory, binds the notify socket
/// (iopath_rpmsg's [`RemoteShm`]) and serves one host after another.
fn serve_shm(a: &RemoteArgs, shm: &Path, stop: &Cleanup) -> Result<()> {
    let path = shm_path(shm);
    let create = match &a.create {
        Some(size) => Some(layout(a, size)?),
        None => {
            ensure!(
                !a.event_idx,
                "--event-idx needs --create (the table is written then)"
            );
            if a.buf.given() {
                return Err(crate::usage::usage(
                    "--buf-size (and --tx-buf-size/--rx-buf-size) with --shm needs --create: \
                     the table that offers the sizes is written then",
                ));
            }
            None
        }
    };
    let cfg = RemoteShmConfig {
        shm: path.clone(),
        shm_opts: ShmOptions {
            mode: a.shm_mode,
            allow_others_write: a.allow_writable_shm,
        },
        create,
        notify: a.notify.clone(),
        notify_mode: a.notify_mode,
    };
    let remote = RemoteShm::start(&cfg, stop).map_err(|e| {
        let p = path.display();
        match e {
            RemoteStartError::Create(e) => at(e, format!("creating {p}")),
            RemoteStartError::Open(e) => at(
                e,
                format!("opening {p} (--allow-writable-shm attaches to a file others can write)"),
            ),
            RemoteStartError::Table(e) => at(e, format!("resource table in {p}")),
            RemoteStartError::Owner(e) => at(e, format!("--shm {p}")),
            RemoteStartError::Bind(e) => at(e, format!("notify socket {}", a.notify)),
        }
    })?;
    let (shm, listener) = (&remote.shm, &remote.listener);
    eprintln!(
        "remote: {} ({} bytes), waiting for the host on {}",
        path.display(),
        shm.len(),
        a.notify
    );
    let channels = channels(a);
    let fixed = match a.buf.buf_size_convention {
        Convention::Fixed => a.buf.sizes(Role::Remote)?,
        _ => None,
    };
    let cfg = ServeHosts {
        listener,
        shm,
        ready_timeout: a.ready_timeout.map(Duration::from_secs),
        channels: &channels,
        once: a.once,
        fixed,
    };
    serve_hosts(
        &cfg,
        stop,
        events(a, format!("the next host on {}", a.notify)),
    )
    .map_err(|e| match e {
        ServeHostsError::Accept(AcceptError::Accept(e)) => at(e, "waiting for the host"),
        ServeHostsError::Accept(AcceptError::Ready(e)) => at(e, "waiting for DRIVER_OK"),
        ServeHostsError::Announce(e) => anyhow::Error::new(e),
        ServeHostsError::HostGone { reason } => anyhow!("the host went away: {reason}"),
        ServeHostsError::Reset(e) => at(e, "resetting the device"),
    })
}
