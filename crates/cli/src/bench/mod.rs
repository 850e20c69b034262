//! `iopath bench`: the arguments of the seed experiments, mapped to the
//! configs of `iopath-bench`, which runs them; their reports printed.
//!
//! `iopath bench` with no subcommand runs every experiment on small embedded
//! defaults (the "main job", well under two minutes), or with `--full` on
//! the original sizes of the three threads.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use iopath_bench::blk::{BlkConfig, DmaMode};
use iopath_bench::heap::HeapConfig;
use iopath_bench::rpmsg::scale::ScaleConfig;
use iopath_bench::rpmsg::RpmsgConfig;
use iopath_bench::Placement;

use crate::size::parse_size;

/// Arguments of `iopath bench`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Without a subcommand, runs every experiment on small defaults (under two
minutes); a peer that is missing (fio, qemu-storage-daemon) drops its row,
with a note, and the bench measures a limit of its own in fio's place:
  iopath bench
  iopath bench --plot charts --markdown bench.md --json bench.json
  iopath bench --full --plot docs/bench      # the threads' sizes; prints an estimate first
  iopath bench heap --size 1G --runs 3

Exit status: 0 when every experiment ran (missing peers included), 1 on an
error, 2 on a usage error. SIGINT or SIGTERM stops the child processes, removes the scratch
files and exits 130 or 143.")]
pub struct BenchArgs {
    /// One experiment; without it, all of them on small defaults.
    #[command(subcommand)]
    pub cmd: Option<BenchCmd>,
    /// (Without a subcommand) the original sizes of the three threads: a
    /// 1 GiB file into 32 x 32 MiB buffers; `dd bs=8M count=1024` x 10 runs
    /// per DMA mode; 1,000 / 10,000 / 100,000 create+destroy loops.
    #[arg(long)]
    pub full: bool,
    /// (Without a subcommand) write one JSON object, one key per experiment
    /// with every row, to FILE (`-` or no FILE: stdout, instead of the
    /// tables).
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<PathBuf>,
    #[command(flatten)]
    pub out: Outputs,
}

/// Files a bench writes when asked (never otherwise).
#[derive(Debug, Clone, clap::Args)]
pub struct Outputs {
    /// Write one SVG chart per experiment into DIR (created if needed):
    /// heap.svg, blk.svg, rpmsg.svg.
    #[arg(long, value_name = "DIR")]
    pub plot: Option<PathBuf>,
    /// Write the tables as Markdown (as in BENCHMARKS.md) to FILE.
    #[arg(long, value_name = "FILE")]
    pub markdown: Option<PathBuf>,
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
    Blk(BenchBlkArgs),
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

/// The DMA ops of a `bench blk` row (`iopath_bench::blk::DmaMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DmaModeArg {
    /// Direct ops through `&dyn DmaOps`.
    Direct,
    /// Direct ops, the driver monomorphised over them.
    DirectStatic,
    /// IOMMU ops: IOVAs, IOTLB updates and invalidations.
    Iommu,
    /// Bounce ops: copies through a small shared window.
    Bounce,
}

impl From<DmaModeArg> for DmaMode {
    fn from(m: DmaModeArg) -> DmaMode {
        match m {
            DmaModeArg::Direct => DmaMode::Direct,
            DmaModeArg::DirectStatic => DmaMode::DirectStatic,
            DmaModeArg::Iommu => DmaMode::Iommu,
            DmaModeArg::Bounce => DmaMode::Bounce,
        }
    }
}

/// Arguments of `iopath bench blk`.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = "\
The limit is the best of a fio sweep of O_DIRECT writes of the same image
(block sizes 1M, 8M and --bs; queue depths 4, 16, 64), measured in the same
run; without fio, the bench's own O_DIRECT write of the image (labelled so).
Without qemu-storage-daemon its row is a note and its ratio n/a.")]
pub struct BenchBlkArgs {
    /// Bytes written per run (the image is this large).
    #[arg(long, default_value = "8G", value_parser = parse_size)]
    pub size: usize,
    /// Runs per row.
    #[arg(long, default_value_t = 10)]
    pub runs: usize,
    /// Block size of every transfer.
    #[arg(long, default_value = "8M", value_parser = parse_size)]
    pub bs: usize,
    /// Blocks in flight.
    #[arg(long, default_value_t = 4)]
    pub queue_depth: usize,
    /// Directory for the image file. Default: RAM (/dev/shm, a tmpfs that
    /// takes O_DIRECT) when the image fits with room to spare, so that the
    /// path's own cost shows instead of the disk's noise; else /var/tmp.
    /// Give a directory on a disk (e.g. /var/tmp) to measure the disk.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// DMA modes to measure (default: all).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub modes: Vec<DmaModeArg>,
    /// Where the processes run: split (the driver, this process, on one
    /// CPU; the back end, qemu-storage-daemon and fio on another), one
    /// (all on one CPU), free (no pinning; on this kind of VM a wake-up
    /// across CPUs costs tens of microseconds and migrations make runs
    /// scatter).
    #[arg(long, value_enum, default_value = "split")]
    pub placement: PlacementArg,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Also a Linux guest's dd (QEMU with TCG, booted by scripts/guest-dd)
    /// on each back end: `dd if=/dev/zero of=/dev/vda bs=BS count=SIZE/BS
    /// oflag=direct`, as in the 2018 thread.
    #[arg(long)]
    pub guest: bool,
    #[command(flatten)]
    pub out: Outputs,
}

impl BenchBlkArgs {
    fn config(&self) -> Result<BlkConfig> {
        Ok(BlkConfig {
            size: self.size,
            runs: self.runs,
            bs: self.bs,
            queue_depth: self.queue_depth,
            dir: self.dir.clone(),
            modes: self.modes.iter().map(|&m| m.into()).collect(),
            placement: self.placement.into(),
            guest: self.guest,
            iopath: iopath_bench::current_exe()?,
            progress: !self.json,
        })
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
    #[command(flatten)]
    pub out: Outputs,
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
(an eventfd; limit-s: a fresh SOCK_SEQPACKET socket, as an endpoint is;
limit-w: that socket with the kernel work the service cannot skip per
endpoint: the passed end's send buffer at the smallest, the kept end
watched by epoll until the client's close, then read and closed).
The ways take turns in chunks of 500 cycles (rotating which goes first), so
that load from elsewhere hits them alike; medians with (min-max) over --runs.

Placement matters more than code on a small VM: a wake-up that crosses to
an idle CPU costs tens of microseconds there, on the same CPU a few. Each
placement pins every process, the limit's included, the same way:
  one    every process on the first CPU
  split  client on the first CPU; host, remote, raw server on the second
  free   no pinning

With --openamp DIR (OpenAMP's rpmsg-echo and iopath's rpmsg-ping-timed on
OpenAMP's API, built by `scripts/openamp-demo build SRC DIR`), the peer
rows: strict 16-byte ping-pong between each driver side (OpenAMP's driver;
`iopath rpmsg host` + a client's endpoint fd; the in-process Bus API) and
each remote (OpenAMP's rpmsg-echo; `iopath rpmsg remote`), all on OpenAMP's
demo platform (/dev/shm/openamp.shm, unix:/tmp/openamp.event.0: run no other
OpenAMP demo meanwhile), per --peer-placement, the pairs taking turns, --runs
times. Without it those rows are a note. The report ends with issue 16's
goals: each ratio from this run beside its target.
Example: iopath bench rpmsg --loops 1000,10000,100000 --poll --openamp DIR")]
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
    /// the client busy-polling its fd (no notifications; spins two cores),
    /// beside its floor: the same hops in the same places with no rpmsg
    /// (a forwarder process and a flag word in a shared page).
    #[arg(long)]
    pub poll: bool,
    /// Also measure cost as work grows (about half a minute), every process
    /// on one CPU: 1, 16 and 256 endpoints echoing at once (aggregate round
    /// trips/s, per-endpoint p99), a one-way stream beside a raw
    /// SOCK_SEQPACKET stream, 10,000 endpoints created and held (JSON
    /// `scale`).
    #[arg(long)]
    pub scale: bool,
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
    /// OpenAMP's demo binaries (rpmsg-echo, rpmsg-ping-timed), built by
    /// `scripts/openamp-demo build SRC DIR`: adds the peer rows.
    #[arg(long, value_name = "DIR")]
    pub openamp: Option<PathBuf>,
    /// Where the peer rows' processes run, comma-separated: split (driver
    /// side on one CPU, the remote on another, as a co-processor), one
    /// (all on one CPU), free (no pinning).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "split,one")]
    pub peer_placement: Vec<PlacementArg>,
    /// Longest a peer row's measured round trips may take per run, seconds
    /// (OpenAMP's driver spins: sharing a CPU with its remote it manages a
    /// few hundred round trips a second).
    #[arg(long, default_value_t = 2)]
    pub peer_seconds: u64,
    /// Print one JSON object: `rows`, `limit` and `echo` of the first
    /// placement, every placement under `placements`, the peer rows under
    /// `peers`, issue 16's goals under `goals`.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub out: Outputs,
}

impl RpmsgArgs {
    fn config(&self) -> Result<RpmsgConfig> {
        Ok(RpmsgConfig {
            loops: self.loops.clone(),
            runs: self.runs,
            count: self.count,
            poll: self.poll,
            placement: self.placement.iter().map(|&p| p.into()).collect(),
            openamp: self.openamp.clone(),
            peer_placement: self.peer_placement.iter().map(|&p| p.into()).collect(),
            peer_budget: Duration::from_secs(self.peer_seconds),
            iopath: iopath_bench::current_exe()?,
            progress: !self.json,
        })
    }
}

/// One experiment's report, as the CLI prints and writes it.
struct Done {
    name: &'static str,
    text: String,
    json: serde_json::Value,
    markdown: String,
    chart: Option<PathBuf>,
}

/// Draws `plot(path)` into `DIR/NAME.svg` when `--plot DIR` was given.
fn chart(
    out: &Outputs,
    name: &str,
    plot: impl FnOnce(&Path) -> iopath_bench::Result<()>,
) -> Result<Option<PathBuf>> {
    let Some(dir) = &out.plot else {
        return Ok(None);
    };
    std::fs::create_dir_all(dir)
        .with_context(|| format!("--plot: cannot create {}", dir.display()))?;
    let path = dir.join(format!("{name}.svg"));
    plot(&path)?;
    Ok(Some(path))
}

fn heap(cfg: &HeapConfig, out: &Outputs) -> Result<Done> {
    let rep = iopath_bench::heap::run(cfg)?;
    Ok(Done {
        name: "heap",
        text: rep.text(),
        json: rep.json(),
        markdown: rep.markdown(),
        chart: chart(out, "heap", |p| rep.plot(p))?,
    })
}

fn blk(cfg: &BlkConfig, out: &Outputs) -> Result<Done> {
    let rep = iopath_bench::blk::run(cfg)?;
    Ok(Done {
        name: "blk",
        text: rep.text(),
        json: rep.json(),
        markdown: rep.markdown(),
        chart: chart(out, "blk", |p| rep.plot(p))?,
    })
}

fn rpmsg(cfg: &RpmsgConfig, scale: bool, out: &Outputs) -> Result<Done> {
    let mut rep = iopath_bench::rpmsg::run(cfg)?;
    if scale {
        let sc = iopath_bench::rpmsg::scale::run(&ScaleConfig::new(cfg.iopath.clone()))?;
        rep.add_scale(&sc);
    }
    Ok(Done {
        name: "rpmsg",
        text: rep.text(),
        json: rep.json(),
        markdown: rep.markdown(),
        chart: chart(out, "rpmsg", |p| rep.plot(p))?,
    })
}

/// The command line, for the Markdown file.
fn command_line() -> String {
    let mut args: Vec<String> = std::env::args().collect();
    if let Some(first) = args.first_mut() {
        *first = "iopath".into();
    }
    args.join(" ")
}

/// Writes `--markdown`: one section per experiment, its chart linked.
fn write_markdown(out: &Outputs, done: &[Done]) -> Result<()> {
    let Some(file) = &out.markdown else {
        return Ok(());
    };
    let mut md = format!("Command: `{}`\n\n", command_line());
    let base = file.parent().map(Path::to_path_buf).unwrap_or_default();
    for d in done {
        if done.len() > 1 {
            md.push_str(&format!("### {}\n\n", d.name));
        }
        md.push_str(&d.markdown);
        if let Some(c) = &d.chart {
            let rel = relative(c, &base);
            md.push_str(&format!("![{} chart]({})\n\n", d.name, rel.display()));
        }
    }
    std::fs::write(file, md).with_context(|| format!("--markdown: cannot write {}", file.display()))
}

/// `path` relative to `base` when it lies under it (else as given).
fn relative(path: &Path, base: &Path) -> PathBuf {
    let abs = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let (p, b) = (abs(path), abs(base));
    p.strip_prefix(&b).map(Path::to_path_buf).unwrap_or(p)
}

/// Writes what was asked (JSON to stdout with `-`) and, unless `quiet`,
/// says where.
fn finish(done: Vec<Done>, out: &Outputs, json: Option<&Path>, quiet: bool) -> Result<()> {
    let json_value = if done.len() == 1 {
        done[0].json.clone()
    } else {
        serde_json::Value::Object(
            done.iter()
                .map(|d| (d.name.to_string(), d.json.clone()))
                .collect(),
        )
    };
    write_markdown(out, &done)?;
    match json {
        Some(p) if p == Path::new("-") => println!("{json_value}"),
        Some(p) => std::fs::write(p, format!("{json_value}\n"))
            .with_context(|| format!("--json: cannot write {}", p.display()))?,
        None => {}
    }
    if !quiet {
        for d in &done {
            if let Some(c) = &d.chart {
                println!("chart: {}", c.display());
            }
        }
        if let Some(m) = &out.markdown {
            println!("markdown: {}", m.display());
        }
        if let Some(p) = json.filter(|p| *p != Path::new("-")) {
            println!("json: {}", p.display());
        }
    }
    Ok(())
}

/// Runs `iopath bench`.
///
/// # Errors
/// Whatever the experiment fails with.
pub fn run(args: &BenchArgs) -> Result<()> {
    // SIGINT/SIGTERM: stop the children, remove the scratch files, exit
    // 130/143.
    iopath_bench::cleanup::on_signals()?;
    let one = |d: Done, json: bool, out: &Outputs| {
        if !json {
            print!("{}", d.text);
        }
        finish(vec![d], out, json.then_some(Path::new("-")), json)
    };
    let r = match &args.cmd {
        Some(BenchCmd::Heap(a)) => heap(&a.config(), &a.out).and_then(|d| one(d, a.json, &a.out)),
        Some(BenchCmd::Blk(a)) => a
            .config()
            .and_then(|c| blk(&c, &a.out))
            .and_then(|d| one(d, a.json, &a.out)),
        Some(BenchCmd::Rpmsg(a)) => a
            .config()
            .and_then(|c| rpmsg(&c, a.scale, &a.out))
            .and_then(|d| one(d, a.json, &a.out)),
        None => run_all(args),
    };
    if r.is_err() {
        // Interrupted: the signal thread exits 130/143 once it has cleaned
        // up; an error its stopping caused must not exit 1 before it.
        iopath_bench::cleanup::wait_if_interrupted();
    }
    r
}

fn minutes(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 60 {
        format!("{} min {:02} s", s / 60, s % 60)
    } else {
        format!("{s} s")
    }
}

/// Every experiment, on embedded defaults or (`--full`) the threads' sizes.
fn run_all(args: &BenchArgs) -> Result<()> {
    let exe = iopath_bench::current_exe()?;
    let to_stdout = args.json.as_deref() == Some(Path::new("-"));
    let (h, b, r) = if args.full {
        (
            HeapConfig::full(),
            BlkConfig::full(exe.clone()),
            RpmsgConfig::full(exe),
        )
    } else {
        (
            HeapConfig::quick(),
            BlkConfig::quick(exe.clone()),
            RpmsgConfig::quick(exe),
        )
    };
    if args.full {
        let (eh, eb, er) = (h.estimate(), b.estimate(), r.estimate());
        let line = format!(
            "bench --full: the threads' sizes; estimated duration {} (heap {}, blk {}, rpmsg {}; nominal rates of a 2-vCPU VM, a loaded machine takes longer)",
            minutes(eh + eb + er),
            minutes(eh),
            minutes(eb),
            minutes(er)
        );
        if to_stdout {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    }
    let mut done = Vec::new();
    for name in ["heap", "blk", "rpmsg"] {
        if !to_stdout {
            println!("== {name}");
        }
        let d = match name {
            "heap" => heap(&h, &args.out)?,
            "blk" => blk(&b, &args.out)?,
            _ => rpmsg(&r, false, &args.out)?,
        };
        if !to_stdout {
            print!("{}", d.text);
            println!();
        }
        done.push(d);
    }
    finish(done, &args.out, args.json.as_deref(), to_stdout)
}
