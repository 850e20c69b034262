//! `iopath bench`: the experiments' arguments, mapped to the configs of
//! `iopath-bench`, which runs them and prints their reports.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::builder::{PossibleValuesParser, TypedValueParser};
use iopath_bench::blk::{BlkBenchConfig, DmaMode, SmallConfig};
use iopath_bench::heap::HeapConfig;
use iopath_bench::rpmsg::RpmsgConfig;
use iopath_bench::{Experiment, Outputs, Placement};

/// `--placement` values.
fn placement() -> impl TypedValueParser<Value = Placement> {
    PossibleValuesParser::new(Placement::NAMES)
        .map(|s| s.parse::<Placement>().expect("a listed name"))
}

/// Arguments of `iopath bench`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Without a subcommand, runs every experiment on small defaults (under two
minutes); a peer that is missing (fio, qemu-storage-daemon) drops its row,
with a note, and the bench measures a limit of its own in fio's place:
  iopath bench
  iopath bench --plot charts --markdown bench.md --json bench.json
  iopath bench --full --plot docs/bench      # 1 GiB file; 8 GiB x 10 runs; 100,000 loops; progress on stderr
  iopath bench heap --size 1G --runs 3

Exit status: 0 when every experiment ran (missing peers included), 1 on an
error, 2 on a usage error. SIGINT or SIGTERM stops the child processes,
removes the scratch files and exits 130 or 143.")]
pub struct BenchArgs {
    /// One experiment; without it, all of them on small defaults.
    #[command(subcommand)]
    cmd: Option<BenchCmd>,
    /// (Without a subcommand) the full sizes: a 1 GiB file into 32 x 32
    /// MiB buffers; 8 GiB written in 8 MiB blocks x 10 runs per DMA mode;
    /// 1,000 / 10,000 / 100,000 create+destroy loops.
    #[arg(long)]
    full: bool,
    /// Write every table, each cell with its unit and runs, as one JSON
    /// object (one key per experiment when there are several) to FILE
    /// (`-` or no FILE: stdout, instead of the tables).
    #[arg(long, global = true, value_name = "FILE", num_args = 0..=1, default_missing_value = "-")]
    json: Option<PathBuf>,
    /// Write the SVG charts into DIR (created if needed), one per message,
    /// named by what they show: heap-load-time-by-method.svg,
    /// blk-8m-throughput-by-dma-mode.svg, rpmsg-echo-latency.svg, ...
    #[arg(long, global = true, value_name = "DIR")]
    plot: Option<PathBuf>,
    /// Write the tables as Markdown (as in BENCHMARKS.md) to FILE.
    #[arg(long, global = true, value_name = "FILE")]
    markdown: Option<PathBuf>,
}

#[derive(Debug, clap::Subcommand)]
enum BenchCmd {
    /// Fill 32 x 32 MiB buffers from a cold file with every heap and
    /// method, beside fio's O_DIRECT io_uring read of the same file.
    #[command(after_help = "\
Each run drops the file's cached pages first (fsync + POSIX_FADV_DONTNEED,
checked with mincore). alloc ms = allocating and faulting in buffers on the
allocator thread (overlapped with reads); read ms = time in transfers; total
ms = wall time; GiB/s over total; cache growth = file pages left in the page
cache (worst run). Two bounds are measured in every run: fio's O_DIRECT
io_uring read of the same file (the `limit` row) and allocating and faulting
in the same buffers with no I/O (`alloc only`).")]
    Heap(HeapArgs),
    /// iopath's virtio-blk driver writes an image through each DMA mode via
    /// `iopath blk serve`, beside fio's O_DIRECT write of the same image and
    /// the same driver against qemu-storage-daemon; then 4 KiB random reads
    /// and writes at queue depths 1 and 32 (IOPS, p50/p99, CPU per request).
    #[command(after_help = "\
The limit is the best of a fio sweep of O_DIRECT writes of the same image
(block sizes 1M, 8M and --bs; queue depths 4, 16, 64), measured in the same
run; without fio, the bench's own O_DIRECT write of the image (labelled so).
Without qemu-storage-daemon its row is a note and its ratio n/a. In the 4 KiB
table iopath's driver and libblkio's on one back end run next to each other,
every other run in reverse; each ratio below the table is the median of the
run-by-run ratios, with their range.")]
    Blk(BlkArgs),
    /// rpmsg endpoints as fds: create+destroy an endpoint L times the legacy
    /// way (a node to open) and the fd way, beside a raw SOCK_SEQPACKET
    /// request/response passing an fd; echo latency beside a raw eventfd
    /// ping-pong.
    #[command(after_help = "\
A cycle: legacy = CREATE_EPT, open the node, destroy through it, close; fd =
CREATE_EPT_FD (the endpoint comes back over SCM_RIGHTS), close (the row's
time includes waiting until the service has freed them all). limit = the same
request answered with an fd by a bare server process (an eventfd; limit-s: a
fresh SOCK_SEQPACKET socket; limit-w: that socket with the kernel work the
service cannot skip per endpoint). The ways take turns in chunks of 500
cycles; medians with (min-max) over --runs. Placements: one (every process on
the first CPU), split (client on the first CPU; host, remote, raw server on
the second), free (no pinning).

With --openamp DIR (built by `scripts/openamp-demo build SRC DIR`), the peer
rows: strict 16-byte ping-pong between each driver side (OpenAMP's driver;
`iopath rpmsg host` + an endpoint fd; the in-process Bus API) and each remote
(OpenAMP's rpmsg-echo; `iopath rpmsg remote`) on OpenAMP's demo platform
(/dev/shm/openamp.shm, unix:/tmp/openamp.event.0: run no other OpenAMP demo
meanwhile). Without it those rows are a note.")]
    Rpmsg(RpmsgArgs),
}

/// Arguments of `iopath bench heap`.
#[derive(Debug, clap::Args)]
struct HeapArgs {
    /// Read this file (it must hold buffers x buffer-size bytes).
    #[arg(long, conflicts_with = "size")]
    file: Option<PathBuf>,
    /// Make a scratch file of this size in /var/tmp (or the current
    /// directory, never a tmpfs), removed afterwards [default: 1G].
    #[arg(long, value_parser = iopath_sys::parse_size::<usize>)]
    size: Option<usize>,
    /// Buffers per load [default: file size / buffer size].
    #[arg(long)]
    buffers: Option<usize>,
    /// Bytes per buffer.
    #[arg(long, default_value = "32M", value_parser = iopath_sys::parse_size::<usize>)]
    buffer_size: usize,
    /// Runs per row (median and spread are reported).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Heaps to try, comma-separated [default: all; absent ones are listed
    /// as not run].
    #[arg(long, value_delimiter = ',')]
    heaps: Vec<String>,
    /// Methods to try, comma-separated [default: auto,buffered,direct,sendfile,uring].
    #[arg(long, value_delimiter = ',')]
    methods: Vec<String>,
    /// io_uring requests in flight.
    #[arg(long, default_value_t = 16)]
    queue_depth: u32,
    /// Only the dma-buf table: the six rows of the DMA_BUF_IOCTL_RW_FILE
    /// proposal, iopath's routes beside them and a pool's first and second
    /// load; no heap x method sweep and no fio limit.
    #[arg(long)]
    dma_buf_table: bool,
}

/// Arguments of `iopath bench blk`.
#[derive(Debug, clap::Args)]
struct BlkArgs {
    /// Bytes written per run (the image is this large).
    #[arg(long, default_value = "8G", value_parser = iopath_sys::parse_size::<usize>)]
    size: usize,
    /// Runs per row.
    #[arg(long, default_value_t = 10)]
    runs: usize,
    /// Block size of every transfer.
    #[arg(long, default_value = "8M", value_parser = iopath_sys::parse_size::<usize>)]
    bs: usize,
    /// Blocks in flight.
    #[arg(long, default_value_t = 4)]
    queue_depth: usize,
    /// Directory for the image file. Default: RAM (/dev/shm) when the image
    /// fits with room to spare, else /var/tmp.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// DMA modes to measure (default: all).
    #[arg(long, value_delimiter = ',', value_parser = PossibleValuesParser::new(DmaMode::NAMES).map(|s| s.parse::<DmaMode>().expect("a listed name")))]
    modes: Vec<DmaMode>,
    /// Where the processes run: split (the driver on one CPU; the back end,
    /// qemu-storage-daemon and fio on another), one (all on one CPU), free.
    #[arg(long, default_value = "split", value_parser = placement())]
    placement: Placement,
    /// 4 KiB random requests per run of each row of the small-block table;
    /// 0 leaves the table out.
    #[arg(long, default_value_t = 65536)]
    small_count: u64,
    /// Runs per row of the small-block table.
    #[arg(long, default_value_t = 5)]
    small_runs: usize,
}

/// Arguments of `iopath bench rpmsg`.
#[derive(Debug, clap::Args)]
struct RpmsgArgs {
    /// Create+destroy cycles per row, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000,100000")]
    loops: Vec<u64>,
    /// Runs per row (median and spread are reported).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Echo round trips (16-byte messages) for the latency rows.
    #[arg(long, default_value_t = 10_000)]
    count: u64,
    /// Also echo latency with host and remote polling the rings and the
    /// client busy-polling its fd, beside its floor: the same hops with no
    /// rpmsg.
    #[arg(long)]
    poll: bool,
    /// Also cost as work grows, every process on one CPU: 1, 16 and 256
    /// endpoints echoing at once, 10,000 endpoints created and held.
    #[arg(long)]
    scale: bool,
    /// MiB each bulk row streams per run (0: no bulk rows): one-way streams
    /// over 64 KiB buffers through an endpoint fd and the Bus API, beside a
    /// raw SOCK_SEQPACKET stream and a memcpy of the same bytes.
    #[arg(long, default_value_t = 32, value_name = "MIB")]
    bulk_mib: u64,
    /// Message sizes of the bulk rows, comma-separated (at most 65520).
    #[arg(long, value_delimiter = ',', default_value = "496,2048,4096,65520")]
    bulk_sizes: Vec<usize>,
    /// Where the processes run, comma-separated: one, split, free.
    #[arg(long, value_delimiter = ',', default_value = "one,split,free", value_parser = placement())]
    placement: Vec<Placement>,
    /// OpenAMP's demo binaries (rpmsg-echo, rpmsg-ping-timed): adds the
    /// peer rows.
    #[arg(long, value_name = "DIR")]
    openamp: Option<PathBuf>,
    /// Where the peer rows' processes run, comma-separated: split (driver
    /// side on one CPU, the remote on another), one, free.
    #[arg(long, value_delimiter = ',', default_value = "split,one", value_parser = placement())]
    peer_placement: Vec<Placement>,
    /// Longest a peer row's round trips may take per run, seconds.
    #[arg(long, default_value_t = 2)]
    peer_seconds: u64,
}

/// Runs `iopath bench`.
///
/// # Errors
/// Whatever the experiments fail with.
pub fn run(a: &BenchArgs) -> Result<()> {
    let iopath = iopath_bench::current_exe()?;
    let experiment = match &a.cmd {
        None => None,
        Some(BenchCmd::Heap(h)) => Some(Experiment::Heap(HeapConfig {
            file: h.file.clone(),
            size: h.size,
            buffers: h.buffers,
            buffer_size: h.buffer_size,
            runs: h.runs,
            heaps: h.heaps.clone(),
            methods: h.methods.clone(),
            queue_depth: h.queue_depth,
            dma_buf_only: h.dma_buf_table,
        })),
        Some(BenchCmd::Blk(b)) => Some(Experiment::Blk(BlkBenchConfig {
            size: b.size,
            runs: b.runs,
            bs: b.bs,
            queue_depth: b.queue_depth,
            dir: b.dir.clone(),
            modes: b.modes.clone(),
            placement: b.placement,
            iopath,
            small: (b.small_count > 0).then(|| SmallConfig {
                count: b.small_count,
                runs: b.small_runs.max(1),
                ..SmallConfig::full()
            }),
        })),
        Some(BenchCmd::Rpmsg(r)) => Some(Experiment::Rpmsg(RpmsgConfig {
            loops: r.loops.clone(),
            runs: r.runs,
            count: r.count,
            poll: r.poll,
            placement: r.placement.clone(),
            openamp: r.openamp.clone(),
            peer_placement: r.peer_placement.clone(),
            peer_budget: Duration::from_secs(r.peer_seconds),
            iopath,
            scale: r.scale,
            bulk_bytes: r.bulk_mib << 20,
            bulk_sizes: r.bulk_sizes.clone(),
        })),
    };
    let out = Outputs {
        json: a.json.clone(),
        plot: a.plot.clone(),
        markdown: a.markdown.clone(),
    };
    let experiments = match experiment {
        Some(e) => vec![e],
        None => Experiment::all(a.full, iopath_bench::current_exe()?),
    };
    Ok(iopath_bench::run(&experiments, &out)?)
}
