//! `iopath`: the command-line front of the iopath stack.
//!
//! Subcommands: `load` (fill shareable buffers from a file), `bench`
//! (rerun the heap, blk and rpmsg experiments beside the limits measured
//! in the same run).

mod bench;
mod blk;
mod blk_dd;
mod blk_error;
mod blk_poll;
mod blk_serve;
mod heaps;
mod load;
mod rpmsg;
mod usage;

use anyhow::Result;
use clap::Parser;

/// Move bytes between files, processes and devices at the speed of the
/// hardware, and measure it.
#[derive(Debug, Parser)]
#[command(name = "iopath", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, clap::Subcommand)]
enum Cmd {
    /// List the heaps and say which are available on this machine.
    Heaps,
    /// Load a file into shareable buffers (memfd, udmabuf, dma-heap) with
    /// direct I/O and io_uring; report GiB/s.
    Load(load::LoadArgs),
    /// Rerun the heap, blk and rpmsg experiments beside the limits measured
    /// in the same run.
    Bench(bench::BenchArgs),
    /// rpmsg over virtio rings in shared memory: remote, host, ping.
    ///
    /// A remote (virtio device) and a host (virtio driver, owner of the
    /// buffers and the bus) share one file: a remoteproc resource table at
    /// offset 0, two vrings and 512-byte buffers; device address = offset,
    /// as in OpenAMP's Linux demo. Example, three shells:
    ///
    ///   iopath rpmsg remote --shm rp.shm --create 0x80000 --notify eventfd:/tmp/rp.ev --echo echo
    ///   iopath rpmsg host --shm rp.shm --notify eventfd:/tmp/rp.ev --ctrl /tmp/rp.ctrl
    ///   iopath rpmsg ping --ctrl /tmp/rp.ctrl --name echo --count 10000
    #[command(subcommand, verbatim_doc_comment)]
    Rpmsg(rpmsg::RpmsgCmd),
    /// virtio-blk over vhost-user: `dd` with iopath's driver.
    Blk(blk::BlkArgs),
}

fn main() {
    // A bench server started by `iopath bench` runs before any parsing.
    let r = match iopath_bench::serve_if_child() {
        Some(served) => served.map_err(anyhow::Error::from),
        None => run(),
    };
    if let Err(e) = r {
        // One line: the error and its causes, joined by ": ".
        eprintln!("iopath: error: {e:#}");
        // Usage errors found after parsing exit as clap's own do.
        std::process::exit(if usage::is_usage(&e) { 2 } else { 1 });
    }
}

fn run() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("IOPATH_LOG").unwrap_or_else(|_| {
                // Warnings, and each front end's IOTLB summary (a back end
                // behind a vIOMMU says what translating cost it).
                format!("warn,{}=info", iopath_virtio::device::IOTLB_STATS_TARGET).into()
            }),
        )
        .with_writer(std::io::stderr)
        // Colour only for a person at a terminal, never into a pipe or a log.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Rpmsg(c) => return rpmsg::run(c),
        Cmd::Heaps => heaps::run(),
        Cmd::Load(args) => load::run(&args)?,
        Cmd::Bench(args) => bench::run(&args)?,
        Cmd::Blk(args) => blk::run(&args)?,
    }
    Ok(())
}
