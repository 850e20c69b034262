//! `iopath blk serve`: iopath's vhost-user-blk back end.

use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use iopath_blk::{BlkBackend, BlkOptions};
use iopath_sys::signals;
use iopath_virtio::device::{ServerOptions, VhostUserServer};

/// Arguments of `iopath blk serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Raw image file to serve (its size, rounded down to 512-byte
    /// sectors, is the device capacity).
    #[arg(long, value_name = "FILE")]
    image: PathBuf,
    /// Unix socket to listen on (created; a stale one is replaced).
    #[arg(long, value_name = "PATH")]
    socket: PathBuf,
    /// Mode of the socket, octal, whatever the umask. Whoever connects
    /// reads and writes the image: with the default 600 only this user
    /// (and root) can, and a front end of another user is refused even if
    /// the file's mode was changed; 660 lets the group in.
    #[arg(long, default_value = "600", value_name = "MODE", value_parser = crate::rpmsg::common::parse_mode)]
    socket_mode: u32,
    /// Number of request queues, each served by its own thread.
    #[arg(long, default_value_t = 1, value_name = "N")]
    queues: usize,
    /// Refuse writes (the device reports VIRTIO_BLK_F_RO).
    #[arg(long)]
    readonly: bool,
    /// Do not offer VIRTIO_F_ACCESS_PLATFORM, for front ends that accept it
    /// without running an IOMMU: Linux's virtio_uml (User-Mode Linux), where
    /// the offer fails the guest's probe. QEMU needs no flag (it drops the
    /// bit unless the guest has a vIOMMU); `iopath blk dd --platform
    /// iommu|protected` and QEMU's iommu_platform=on need the offer.
    #[arg(long)]
    no_access_platform: bool,
    /// How each queue thread waits for requests.
    #[command(flatten)]
    poll: crate::blk_poll::PollArgs,
}

/// Claims `path` (a stale socket is replaced) and listens there with
/// `mode`.
fn bind(path: &Path, mode: u32) -> Result<UnixListener> {
    let fd = iopath_sys::unix_socket::listen(path, rustix::net::SocketType::STREAM, mode, 16)
        .context("--socket")?;
    Ok(UnixListener::from(fd))
}

/// Runs `iopath blk serve` until SIGINT or SIGTERM.
///
/// # Errors
/// The image cannot be opened, the socket cannot be bound, or the listener
/// breaks.
pub fn run(args: &ServeArgs) -> Result<()> {
    let backend = BlkBackend::open(
        &args.image,
        BlkOptions {
            queues: args.queues,
            readonly: args.readonly,
            poll: args.poll.mode(),
        },
    )
    .context("cannot serve the image")?;
    let listener = bind(&args.socket, args.socket_mode)?;
    // SIGINT or SIGTERM: remove the socket and exit 0. (A signal before
    // this leaves a stale socket, which the next start replaces.)
    let socket = args.socket.clone();
    signals::on_stop("blk-serve-stop", move |sig| {
        let _ = std::fs::remove_file(&socket);
        tracing::info!("{}: socket removed, exiting", signals::signal_name(sig));
        0
    })
    .context("cannot install signal handlers")?;
    let cfg = backend.config();
    println!(
        "serving {} ({} sectors, {}{}) on {} (mode {:o}) with {} queue{} ({})",
        args.image.display(),
        cfg.capacity,
        if backend.direct_io() {
            "O_DIRECT"
        } else {
            "buffered"
        },
        if args.readonly { ", read-only" } else { "" },
        args.socket.display(),
        args.socket_mode,
        args.queues,
        if args.queues == 1 { "" } else { "s" },
        args.poll.mode(),
    );
    let server = VhostUserServer::new(listener, Arc::new(backend)).with_options(ServerOptions {
        access_platform: !args.no_access_platform,
        socket_mode: Some(args.socket_mode),
    });
    let res = server.run();
    let _ = std::fs::remove_file(&args.socket);
    res.context("vhost-user server stopped")
}
