//! `iopath bench`: the arguments of the seed experiments, mapped to the
//! configs of `iopath-bench`, which runs them; their reports printed.
//!
//! `iopath bench` with no subcommand runs every experiment on small embedded
//! defaults (the "main job", well under a minute).

mod blk;

use std::path::PathBuf;

use anyhow::Result;
use iopath_bench::heap::HeapConfig;
use iopath_bench::rpmsg::RpmsgConfig;
use iopath_bench::Placement;

use crate::size::parse_size;

/// Arguments of `iopath bench`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Without a subcommand, runs every experiment on small defaults (under a minute):
  iopath bench
  iopath bench heap --size 1G --runs 3")]
pub struct BenchArgs {
    /// One experiment; without it, all of them on small defaults.
    #[command(subcommand)]
    pub cmd: Option<BenchCmd>,
    /// (Without a subcommand) print one JSON object, one key per experiment.
    #[arg(long)]
    pub json: bool,
}

/// The experiments.
#[derive(Debug, clap::Subcommand)]
pub enum BenchCmd {
    /// Fill 32 x 32 MiB buffers from a cold file with every heap and
    /// method, beside fio's O_DIRECT io_uring read of the same file.
    Heap(HeapArgs),
    /// The 2018 "virtio uses the DMA API" experiment: iopath's virtio-blk
    /// driver writes an image through each DMA mode (direct, direct-static,
    /// iommu, bounce) via `iopath blk serve`, beside fio's O_DIRECT write of
    /// the same image and the same driver against qemu-storage-daemon;
    /// with --guest, a Linux guest's dd on both back ends too.
    Blk(blk::BenchBlkArgs),
    /// The 2025 RPMSG_CREATE_EPT_FD_IOCTL experiment: create+destroy an
    /// endpoint L times the legacy way (a node to open) and the fd way,
    /// beside a raw SOCK_SEQPACKET request/response passing an fd; echo
    /// latency beside a raw eventfd ping-pong.
    Rpmsg(RpmsgArgs),
}

/// Where the processes of a measurement run (`iopath_bench::Placement`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PlacementArg {
    /// Every process on one CPU: no wake-up crosses CPUs.
    One,
    /// The client on one CPU, the servers (and the limit's) on another.
    Split,
    /// No pinning: where the scheduler puts them.
    Free,
}

impl From<PlacementArg> for Placement {
    fn from(p: PlacementArg) -> Placement {
        match p {
            PlacementArg::One => Placement::One,
            PlacementArg::Split => Placement::Split,
            PlacementArg::Free => Placement::Free,
        }
    }
}

/// Arguments of `iopath bench heap`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Each run drops the file's cached pages first (fsync + POSIX_FADV_DONTNEED,
checked with mincore). Columns: alloc ms = time allocating and faulting in
buffers on the allocator thread (overlapped with reads); read ms = time in
transfers; total ms = wall time, allocation included; GiB/s over total;
cache growth = file pages left in the page cache (worst run). Two bounds are
measured in every run: fio's O_DIRECT io_uring read of the same file (the
`limit` row, 100%) and allocating and faulting in the same buffers with no
I/O (`alloc only`); a load can be no faster than the slower of the two.")]
pub struct HeapArgs {
    /// Read this file (it must hold buffers x buffer-size bytes).
    #[arg(long, conflicts_with = "size")]
    pub file: Option<PathBuf>,
    /// Make a scratch file of this size in /var/tmp (or the current
    /// directory, never a tmpfs), removed afterwards [default: 1G].
    #[arg(long, value_parser = parse_size)]
    pub size: Option<usize>,
    /// Buffers per load [default: file size / buffer size].
    #[arg(long)]
    pub buffers: Option<usize>,
    /// Bytes per buffer.
    #[arg(long, default_value = "32M", value_parser = parse_size)]
    pub buffer_size: usize,
    /// Runs per row (median and spread are reported).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Heaps to try, comma-separated [default: all; absent ones are listed
    /// as skipped].
    #[arg(long, value_delimiter = ',')]
    pub heaps: Vec<String>,
    /// Methods to try, comma-separated [default: auto,buffered,direct,sendfile,uring].
    #[arg(long, value_delimiter = ',')]
    pub methods: Vec<String>,
    /// io_uring requests in flight.
    #[arg(long, default_value_t = 16)]
    pub queue_depth: u32,
    /// Print one JSON object with `rows` and `limit`.
    #[arg(long)]
    pub json: bool,
}

impl HeapArgs {
    fn config(&self) -> HeapConfig {
        HeapConfig {
            file: self.file.clone(),
            size: self.size,
            buffers: self.buffers,
            buffer_size: self.buffer_size,
            runs: self.runs,
            heaps: self.heaps.clone(),
            methods: self.methods.clone(),
            queue_depth: self.queue_depth,
            progress: !self.json,
        }
    }
}

/// Arguments of `iopath bench rpmsg`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
A cycle: legacy = CREATE_EPT, open the node (connect + greeting), destroy
through it (shutdown + the service's hang-up), close; fd = CREATE_EPT_FD
(the endpoint comes back over SCM_RIGHTS), close (the service notices and
frees it; the row's time includes waiting until it has freed them all).
limit = the same request size answered with an fd by a bare server process
(an eventfd; limit-s: a fresh SOCK_SEQPACKET socket, as an endpoint is).
The ways take turns in chunks of 500 cycles (rotating which goes first), so
that load from elsewhere hits them alike; medians with (min-max) over --runs.

Placement matters more than code on a small VM: a wake-up that crosses to
an idle CPU costs tens of microseconds there, on the same CPU a few. Each
placement pins every process, the limit's included, the same way:
  one    every process on the first CPU
  split  client on the first CPU; host, remote, raw server on the second
  free   no pinning
Example: iopath bench rpmsg --loops 1000,10000,100000 --poll")]
pub struct RpmsgArgs {
    /// Create+destroy cycles per row, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000,100000")]
    pub loops: Vec<u64>,
    /// Runs per row (median and spread are reported).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Echo round trips (16-byte messages) for the latency rows.
    #[arg(long, default_value_t = 10_000)]
    pub count: u64,
    /// Also measure echo latency with host and remote polling the rings and
    /// the client busy-polling its fd (no notifications; spins two cores).
    #[arg(long)]
    pub poll: bool,
    /// Where the processes run, comma-separated; the first one fills the
    /// main table and JSON `rows`: one (all on one CPU), split (client on
    /// one CPU, servers on another), free (no pinning).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "one,split,free"
    )]
    pub placement: Vec<PlacementArg>,
    /// Print one JSON object: `rows`, `limit` and `echo` of the first
    /// placement, every placement under `placements`.
    #[arg(long)]
    pub json: bool,
}

impl RpmsgArgs {
    fn config(&self) -> Result<RpmsgConfig> {
        Ok(RpmsgConfig {
            loops: self.loops.clone(),
            runs: self.runs,
            count: self.count,
            poll: self.poll,
            placement: self.placement.iter().map(|&p| p.into()).collect(),
            iopath: iopath_bench::current_exe()?,
            progress: !self.json,
        })
    }
}

/// Runs `iopath bench`.
///
/// # Errors
/// Whatever the experiment fails with.
pub fn run(args: &BenchArgs) -> Result<()> {
    match &args.cmd {
        Some(BenchCmd::Heap(a)) => {
            let rep = iopath_bench::heap::run(&a.config())?;
            if a.json {
                println!("{}", rep.json());
            } else {
                print!("{}", rep.text());
            }
            Ok(())
        }
        Some(BenchCmd::Blk(a)) => blk::run(a),
        Some(BenchCmd::Rpmsg(a)) => {
            let rep = iopath_bench::rpmsg::run(&a.config()?)?;
            if a.json {
                println!("{}", rep.json());
            } else {
                print!("{}", rep.text());
            }
            Ok(())
        }
        None => run_default(args.json),
    }
}

/// Every experiment on embedded defaults.
fn run_default(json: bool) -> Result<()> {
    let mut all = serde_json::Map::new();
    let head = |name: &str| {
        if !json {
            println!("== {name}");
        }
    };
    let tail = |text: String| {
        if !json {
            print!("{text}");
            println!();
        }
    };
    head("heap");
    let heap = iopath_bench::heap::run(&HeapConfig {
        progress: !json,
        ..HeapConfig::quick()
    })?;
    all.insert("heap".into(), heap.json());
    tail(heap.text());
    head("blk");
    all.insert("blk".into(), blk::run_default(json)?);
    if !json {
        println!();
    }
    head("rpmsg");
    let rpmsg = iopath_bench::rpmsg::run(&RpmsgConfig {
        progress: !json,
        ..RpmsgConfig::quick(iopath_bench::current_exe()?)
    })?;
    all.insert("rpmsg".into(), rpmsg.json());
    tail(rpmsg.text());
    if json {
        println!("{}", serde_json::Value::Object(all));
    }
    Ok(())
}
