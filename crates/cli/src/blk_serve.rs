//! `iopath blk serve`: iopath's vhost-user-blk back end, one export or
//! many ([`iopath_blk::Exports`]).

use std::path::PathBuf;

use anyhow::{Context, Result};
use iopath_blk::export::{self, ExportSpec, Exports};
use iopath_blk::BlkOptions;
use iopath_sys::signals;

use crate::usage::usage;

/// Arguments of `iopath blk serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Raw image file to serve (its size, rounded down to 512-byte
    /// sectors, is the device capacity); with --socket, the one-export
    /// form.
    #[arg(
        long,
        value_name = "FILE",
        requires = "socket",
        required_unless_present = "export",
        conflicts_with = "export"
    )]
    image: Option<PathBuf>,
    /// Unix socket to listen on (created; a stale one is replaced).
    #[arg(
        long,
        value_name = "PATH",
        requires = "image",
        conflicts_with = "export"
    )]
    socket: Option<PathBuf>,
    /// An image on its own socket with its own settings, served beside the
    /// others by its own thread: image=PATH,socket=PATH[,readonly]
    /// [,queues=N][,poll|poll-us=US][,no-access-platform] (the options
    /// below, per export). Repeat for more images; no two on one socket,
    /// no image writable twice.
    #[arg(long, value_name = "SPEC")]
    export: Vec<ExportSpec>,
    /// Mode of the sockets, octal, whatever the umask. Whoever connects
    /// reads and writes the image: with the default 600 only this user
    /// (and root) can, and a front end of another user is refused even if
    /// the file's mode was changed; 660 lets the group in.
    #[arg(long, default_value = "600", value_name = "MODE", value_parser = crate::rpmsg::common::parse_mode)]
    socket_mode: u32,
    /// Number of request queues, each served by its own thread.
    #[arg(long, value_name = "N", conflicts_with = "export")]
    queues: Option<usize>,
    /// Refuse writes (the device reports VIRTIO_BLK_F_RO).
    #[arg(long, conflicts_with = "export")]
    readonly: bool,
    /// Do not offer VIRTIO_F_ACCESS_PLATFORM, for front ends that accept it
    /// without running an IOMMU: Linux's virtio_uml (User-Mode Linux), where
    /// the offer fails the guest's probe. QEMU needs no flag (it drops the
    /// bit unless the guest has a vIOMMU); `iopath blk dd --platform
    /// iommu|protected` and QEMU's iommu_platform=on need the offer.
    #[arg(long, conflicts_with = "export")]
    no_access_platform: bool,
    /// How each queue thread waits for requests.
    #[command(flatten)]
    poll: crate::blk_poll::PollArgs,
}

impl ServeArgs {
    /// The exports asked for: the --export specs, or the one of --image
    /// and --socket.
    fn specs(&self) -> Result<Vec<ExportSpec>> {
        let (Some(image), Some(socket)) = (&self.image, &self.socket) else {
            if self.poll.poll || self.poll.poll_us.is_some() {
                return Err(usage(
                    "--poll and --poll-us are for the one-export form; give poll or poll-us=US in each --export",
                ));
            }
            return Ok(self.export.clone());
        };
        let mut spec = ExportSpec::new(image, socket);
        spec.options = BlkOptions {
            queues: self.queues.unwrap_or(1),
            readonly: self.readonly,
            poll: self.poll.mode(),
        };
        spec.access_platform = !self.no_access_platform;
        Ok(vec![spec])
    }
}

/// Runs `iopath blk serve` until SIGINT or SIGTERM.
///
/// # Errors
/// Exports that cannot be served together (a usage error), an image that
/// cannot be opened, a socket that cannot be bound, a listener that breaks.
pub fn run(args: &ServeArgs) -> Result<()> {
    let exports = Exports::open(args.specs()?, args.socket_mode).map_err(|e| {
        if e.is_usage() {
            usage(e.to_string())
        } else {
            anyhow::Error::new(e)
        }
    })?;
    // SIGINT or SIGTERM: remove every socket and exit 0. (A signal before
    // this leaves stale sockets, which the next start replaces.)
    let sockets = exports.sockets();
    signals::on_stop("blk-serve-stop", move |sig| {
        export::remove_sockets(&sockets);
        tracing::info!("{}: sockets removed, exiting", signals::signal_name(sig));
        0
    })
    .context("cannot install signal handlers")?;
    for e in exports.iter() {
        println!("serving {e}");
    }
    exports.serve().context("vhost-user server stopped")
}
