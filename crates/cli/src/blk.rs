//! `iopath blk`: virtio-blk over vhost-user, both ends.

use anyhow::Result;

use crate::{blk_dd, blk_serve};

/// Arguments of `iopath blk`.
#[derive(Debug, clap::Args)]
pub struct BlkArgs {
    /// What to do.
    #[command(subcommand)]
    pub cmd: BlkCmd,
}

/// `iopath blk` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum BlkCmd {
    /// Write (or read) a vhost-user-blk device with iopath's virtio-blk
    /// driver, like `dd oflag=direct` in a guest; every buffer goes through
    /// the DMA ops the platform policy picks (or --dma forces).
    #[command(after_help = "\
Examples:
  iopath blk dd --socket /tmp/blk.sock --bs 8M --count 128 --pattern seq --verify
  iopath blk dd --socket /tmp/blk.sock --platform iommu --json
  iopath blk dd --socket /tmp/blk.sock --dma bounce --runs 10 --json
  iopath blk dd --socket /tmp/blk.sock --bs 4K --count 65536 --access rand --queue-depth 32
  iopath blk dd --socket /tmp/blk.sock --bs 4K --count 65536 --access rand --op read --poll")]
    Dd(blk_dd::DdArgs),
    /// Serve a raw image file as a vhost-user-blk device.
    ///
    /// Front ends (QEMU's vhost-user-blk-pci with a Linux guest,
    /// `iopath blk dd`, any vhost-user front end) connect to SOCKET; one is
    /// served at a time, and when it goes away the next one is. With
    /// --export, repeated, one process serves many images, each on its own
    /// socket with its own settings and its own front end. The image
    /// is accessed with O_DIRECT when its file system allows it (buffered
    /// otherwise); with VIRTIO_F_ACCESS_PLATFORM every address is an IOVA
    /// checked against the front end's IOTLB. Runs until SIGINT or SIGTERM,
    /// then removes every socket.
    ///
    /// Requests in flight are recorded in a memfd the front end keeps
    /// (vhost-user INFLIGHT_SHMFD): a back end killed under a running guest
    /// and started again on the same image and socket is handed that
    /// record by a reconnecting front end (QEMU: -chardev
    /// socket,...,reconnect-ms=N) and runs what was in flight first, so the
    /// guest sees no I/O error.
    #[command(after_help = "\
Examples:
  iopath blk serve --image disk.img --socket /tmp/blk.sock
  iopath blk serve --image disk.img --socket /tmp/blk.sock --queues 2 --readonly
  iopath blk serve --export image=a.img,socket=/tmp/a.sock --export image=b.img,socket=/tmp/b.sock,readonly,queues=2
  iopath blk serve --image disk.img --socket /tmp/blk.sock --poll-us 0   # sleep at once
  taskset -c 1 iopath blk serve --image disk.img --socket /tmp/blk.sock --poll
  iopath blk serve --image disk.img --socket /tmp/blk.sock --no-access-platform   # for User-Mode Linux
  linux.uml mem=256M virtio_uml.device=/tmp/blk.sock:2 ...")]
    Serve(blk_serve::ServeArgs),
}

/// Runs `iopath blk`.
///
/// # Errors
/// Whatever the subcommand fails with.
pub fn run(args: &BlkArgs) -> Result<()> {
    match &args.cmd {
        BlkCmd::Dd(a) => blk_dd::run(a),
        BlkCmd::Serve(a) => blk_serve::run(a),
    }
}
