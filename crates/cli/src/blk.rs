//! `iopath blk`: virtio-blk over vhost-user, both ends.

use anyhow::Result;

use crate::blk_dd;

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
    /// the chosen DMA ops.
    #[command(after_help = "\
Examples:
  iopath blk dd --socket /tmp/blk.sock --bs 8M --count 128 --pattern seq --verify
  iopath blk dd --socket /tmp/blk.sock --dma bounce --runs 10 --json")]
    Dd(blk_dd::DdArgs),
}

/// Runs `iopath blk`.
///
/// # Errors
/// Whatever the subcommand fails with.
pub fn run(args: &BlkArgs) -> Result<()> {
    match &args.cmd {
        BlkCmd::Dd(a) => blk_dd::run(a),
    }
}
