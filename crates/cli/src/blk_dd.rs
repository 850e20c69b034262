//! `iopath blk dd`: the 2018 thread's `dd ... oflag=direct`, as a
//! virtio-blk driver talking vhost-user to a back end.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use std::sync::Arc;

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use iopath_blk::driver::DEVICE_ID_BLOCK;
use iopath_blk::{BlkDriver, BlkQueue, DriverOptions, Request};
use iopath_dma::{Bounce, Direct, DmaOps, Iommu};
use iopath_heap::{Buffer, Heap, HugePages, MemfdHeap};
use iopath_virtio::features::VIRTIO_F_ACCESS_PLATFORM as ACCESS_PLATFORM;
use iopath_virtio::transport::vhost_user::VhostUser;
use iopath_virtio::Transport;
use serde::Serialize;

/// Arguments of `iopath blk dd`.
#[derive(Debug, Clone, clap::Args)]
pub struct DdArgs {
    /// vhost-user-blk socket of the back end (`iopath blk serve`,
    /// `qemu-storage-daemon --export type=vhost-user-blk`, ...).
    #[arg(long)]
    pub socket: PathBuf,
    /// Block size of each transfer (suffixes K, M, G; powers of 1024).
    #[arg(long, default_value = "8M", value_parser = crate::size::parse_size)]
    pub bs: usize,
    /// Number of blocks per run.
    #[arg(long, default_value_t = 1024)]
    pub count: u64,
    /// Write the device or read it.
    #[arg(long, value_enum, default_value_t = Op::Write)]
    pub op: Op,
    /// Data written (and expected by --verify): zeros, or `seq`, where each
    /// 8-byte little-endian word holds its own byte offset on the device.
    #[arg(long, value_enum, default_value_t = Pattern::Zero)]
    pub pattern: Pattern,
    /// After the runs, read the range back and compare it with the pattern.
    #[arg(long)]
    pub verify: bool,
    /// DMA ops between driver and device: `direct` (device sees the
    /// buffers, `&dyn DmaOps`), `direct-static` (same, the driver
    /// monomorphised over the concrete ops type), `iommu` (IOVAs and IOTLB
    /// messages; the back end must offer ACCESS_PLATFORM), `bounce` (only a
    /// small window is shared; data is copied through it).
    #[arg(long, value_enum, default_value_t = DmaMode::Direct)]
    pub dma: DmaMode,
    /// Number of timed runs.
    #[arg(long, default_value_t = 1)]
    pub runs: usize,
    /// Blocks in flight at once.
    #[arg(long, default_value_t = 4)]
    pub queue_depth: usize,
    /// Virtqueues to use (at most what the device offers), each driven by
    /// its own thread with its share of the blocks in flight.
    #[arg(long, default_value_t = 1)]
    pub queues: usize,
    /// Byte offset on the device where the first block goes.
    #[arg(long, default_value = "0", value_parser = crate::size::parse_size)]
    pub offset: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Direction of the transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Op {
    /// Write blocks to the device.
    Write,
    /// Read blocks from the device.
    Read,
}

/// Data pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Pattern {
    /// All bytes zero.
    Zero,
    /// Each 8-byte little-endian word holds its byte offset on the device.
    Seq,
}

/// DMA ops choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DmaMode {
    /// Direct ops through `&dyn DmaOps`.
    Direct,
    /// Direct ops, statically dispatched.
    DirectStatic,
    /// IOMMU ops: IOVAs, IOTLB updates and invalidations.
    Iommu,
    /// Bounce ops: copies through a small shared window.
    Bounce,
}

impl DmaMode {
    /// Every mode, in table order.
    pub const ALL: [DmaMode; 4] = [
        DmaMode::Direct,
        DmaMode::DirectStatic,
        DmaMode::Iommu,
        DmaMode::Bounce,
    ];

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            DmaMode::Direct => "direct",
            DmaMode::DirectStatic => "direct-static",
            DmaMode::Iommu => "iommu",
            DmaMode::Bounce => "bounce",
        }
    }
}

/// Fills `out` with the `seq` pattern for device byte offset `dev_off`.
/// `dev_off` and `out.len()` are multiples of 8.
pub fn fill_seq(out: &mut [u8], dev_off: u64) {
    for (i, w) in out.chunks_exact_mut(8).enumerate() {
        w.copy_from_slice(&(dev_off + 8 * i as u64).to_le_bytes());
    }
}

/// First mismatch of `got` against `pattern` at device offset `dev_off`.
pub fn check_pattern(got: &[u8], pattern: Pattern, dev_off: u64) -> Option<u64> {
    match pattern {
        // Word-granular like `Seq`: the offset of the first 8-byte word that
        // is not zero.
        Pattern::Zero => got
            .iter()
            .position(|&b| b != 0)
            .map(|i| dev_off + (i as u64 & !7)),
        Pattern::Seq => got.chunks_exact(8).enumerate().find_map(|(i, w)| {
            let want = dev_off + 8 * i as u64;
            (w != want.to_le_bytes()).then_some(want)
        }),
    }
}

/// One timed run.
#[derive(Debug, Clone, Serialize)]
pub struct Run {
    /// Wall time of the run.
    pub seconds: f64,
    /// Throughput in GiB/s.
    pub gib_per_s: f64,
}

impl Run {
    /// A run that moved `bytes` in `elapsed`.
    pub fn new(bytes: u64, elapsed: Duration) -> Self {
        let seconds = elapsed.as_secs_f64();
        Run {
            seconds,
            gib_per_s: bytes as f64 / seconds.max(1e-9) / f64::from(1u32 << 30),
        }
    }
}

/// Median, min, max and spread of a series.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Stats {
    /// Median.
    pub median: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
    /// (max - min) / median.
    pub spread: f64,
}

impl Stats {
    /// Stats of a series (NaN when empty).
    pub fn of(values: &[f64]) -> Self {
        let s = crate::bench::Summary::of(values);
        Stats {
            median: s.median,
            min: s.min,
            max: s.max,
            spread: s.spread_pct() / 100.0,
        }
    }
}

/// What `blk dd --json` prints.
#[derive(Debug, Clone, Serialize)]
pub struct DdReport {
    /// Bytes per run.
    pub bytes: u64,
    /// Block size.
    pub bs: u64,
    /// Blocks per run.
    pub count: u64,
    /// Direction.
    pub op: Op,
    /// Pattern.
    pub pattern: Pattern,
    /// DMA mode.
    pub dma: DmaMode,
    /// Blocks in flight.
    pub queue_depth: usize,
    /// Queues used.
    pub queues: usize,
    /// Each run.
    pub runs: Vec<Run>,
    /// Median throughput.
    pub median_gib_per_s: f64,
    /// Stats over the runs (GiB/s).
    pub stats: Stats,
    /// Whether --verify read the data back and it matched (null: not asked).
    pub verified: Option<bool>,
    /// The device, as its config space describes it.
    pub device: String,
}

/// `iopath blk dd`.
///
/// # Errors
/// Bad arguments, a back end that cannot be reached or refuses, a request
/// that fails, a verification mismatch.
pub fn run(args: &DdArgs) -> Result<()> {
    let report = dd(args, true)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        for (i, r) in report.runs.iter().enumerate() {
            println!(
                "run {}: {} bytes in {:.3} s, {:.3} GiB/s",
                i + 1,
                report.bytes,
                r.seconds,
                r.gib_per_s
            );
        }
        println!(
            "{} {} x {} B, dma {}, qd {}: median {:.3} GiB/s (min {:.3}, max {:.3}, spread {:.1}%)",
            match report.op {
                Op::Write => "wrote",
                Op::Read => "read",
            },
            report.count,
            report.bs,
            report.dma.name(),
            report.queue_depth,
            report.stats.median,
            report.stats.min,
            report.stats.max,
            report.stats.spread * 100.0
        );
        if report.verified == Some(true) {
            println!(
                "verify: {} bytes match the {:?} pattern",
                report.bytes, report.pattern
            );
        }
    }
    Ok(())
}

fn validate(args: &DdArgs) -> Result<()> {
    if args.bs == 0 || args.bs % 512 != 0 {
        bail!(
            "--bs must be a positive multiple of 512 bytes, got {}",
            args.bs
        );
    }
    if args.offset % 512 != 0 {
        bail!(
            "--offset must be a multiple of 512 bytes, got {}",
            args.offset
        );
    }
    if args.count == 0 || args.runs == 0 || args.queue_depth == 0 || args.queues == 0 {
        bail!("--count, --runs, --queue-depth and --queues must be at least 1");
    }
    if args.queue_depth < args.queues {
        bail!(
            "--queue-depth ({}) must be at least --queues ({}): each queue needs a block in flight",
            args.queue_depth,
            args.queues
        );
    }
    if args.queue_depth > 256 {
        bail!("--queue-depth is at most 256");
    }
    (args.bs as u64)
        .checked_mul(args.count)
        .and_then(|b| b.checked_add(args.offset as u64))
        .context("--bs x --count overflows")?;
    Ok(())
}

/// Bounce window of the `bounce` mode: the kernel's default SWIOTLB size.
const BOUNCE_WINDOW: usize = 64 << 20;
/// Bounce slot: the kernel's `IO_TLB_SIZE`.
const BOUNCE_SLOT: usize = 2048;

/// Runs the dd and returns its report; `progress` shows a bar on stderr.
///
/// # Errors
/// As [`run`].
pub fn dd(args: &DdArgs, progress: bool) -> Result<DdReport> {
    validate(args)?;
    let blocks = Blocks::new(args)?;
    let bufs = &blocks.distinct;
    let transport: Arc<dyn Transport> = Arc::new(
        VhostUser::connect(&args.socket, DEVICE_ID_BLOCK, Duration::from_secs(10))
            .with_context(|| format!("cannot reach the back end at {}", args.socket.display()))?,
    );
    let offered = transport.device_features()?;
    let opts = DriverOptions {
        queues: args.queues.try_into().unwrap_or(u16::MAX),
        ..DriverOptions::default()
    };
    let ops: Arc<dyn DmaOps> = match args.dma {
        DmaMode::DirectStatic => {
            let ops = Arc::new(Direct::new());
            for b in bufs {
                ops.register(b)?;
            }
            let mut drv = BlkDriver::new(transport, ops, &opts)
                .context("cannot initialise the virtio-blk device")?;
            return drive(&mut drv, args, &blocks, progress);
        }
        DmaMode::Direct => Arc::new(Direct::new()),
        DmaMode::Iommu => {
            if offered & ACCESS_PLATFORM == 0 {
                bail!(
                    "the back end does not offer VIRTIO_F_ACCESS_PLATFORM, so it cannot \
                     enforce an IOTLB (qemu-storage-daemon cannot); use --dma direct or bounce"
                );
            }
            Arc::new(Iommu::new())
        }
        DmaMode::Bounce => Arc::new(Bounce::new(BOUNCE_WINDOW, BOUNCE_SLOT)?),
    };
    for b in bufs {
        ops.register(b)?;
    }
    let mut drv = BlkDriver::<dyn DmaOps>::new(transport, ops, &opts)
        .context("cannot initialise the virtio-blk device")?;
    drive(&mut drv, args, &blocks, progress)
}

/// The memory of the blocks in flight: one slot per request.
///
/// When the CPU never writes a block during a pass (zeros, or reads), all
/// slots are ranges of one buffer, so the device needs one memory region for
/// them (vhost-user back ends may accept as few as 8 regions, and the rings
/// take some). Writing the `seq` pattern needs a buffer per slot: a buffer
/// with any range mapped for the device refuses CPU writes.
#[derive(Debug)]
struct Blocks {
    distinct: Vec<Buffer>,
    slots: Vec<(Buffer, usize)>,
}

impl Blocks {
    fn new(args: &DdArgs) -> Result<Self> {
        let heap = MemfdHeap::new(HugePages::None);
        let per_slot = args.op == Op::Write && args.pattern == Pattern::Seq;
        let (distinct, slots) = if per_slot {
            let d = (0..args.queue_depth)
                .map(|_| heap.alloc(args.bs))
                .collect::<std::result::Result<Vec<_>, _>>()
                .context("cannot allocate the block buffers")?;
            let s = d.iter().map(|b| (b.clone(), 0)).collect();
            (d, s)
        } else {
            let len = args
                .bs
                .checked_mul(args.queue_depth)
                .context("--bs x --queue-depth overflows")?;
            let b = heap
                .alloc(len)
                .context("cannot allocate the block buffer")?;
            let s = (0..args.queue_depth)
                .map(|i| (b.clone(), i * args.bs))
                .collect();
            (vec![b], s)
        };
        Ok(Blocks { distinct, slots })
    }
}

/// The dd proper, generic over the ops type: `O = Direct` is the static
/// dispatch build, `O = dyn DmaOps` the dynamic one.
fn drive<O: DmaOps + ?Sized>(
    drv: &mut BlkDriver<O>,
    args: &DdArgs,
    blocks: &Blocks,
    progress: bool,
) -> Result<DdReport> {
    let cfg = *drv.config();
    let bytes = args.bs as u64 * args.count;
    let end = args.offset as u64 + bytes;
    if end > cfg.capacity_bytes() {
        bail!(
            "--offset + --bs x --count = {end} bytes is past the device's end ({} bytes)",
            cfg.capacity_bytes()
        );
    }
    if args.op == Op::Write && cfg.read_only {
        bail!("the device is read-only");
    }
    let bar = if progress && !args.json {
        ProgressBar::new(args.count * args.runs as u64)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} blocks {per_sec}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    if args.op == Op::Write && args.pattern == Pattern::Zero {
        // Zero the blocks once, outside the timed runs.
        for b in &blocks.distinct {
            b.fill(0, b.len(), 0)?;
        }
    }
    let mut runs = Vec::with_capacity(args.runs);
    for run in 0..args.runs {
        bar.set_message(format!("run {}/{}", run + 1, args.runs));
        let t0 = Instant::now();
        pass(drv, args, &blocks.slots, args.op, &bar, None)?;
        // Timed like `dd oflag=direct` and fio's O_DIRECT write: up to the
        // last completion. The flush after makes the writes durable.
        runs.push(Run::new(bytes, t0.elapsed()));
        if args.op == Op::Write {
            drv.flush().context("flush failed")?;
        }
    }
    bar.finish_and_clear();
    let verified = if args.verify {
        let mut bad = None;
        pass(
            drv,
            args,
            &blocks.slots,
            Op::Read,
            &ProgressBar::hidden(),
            Some(&mut bad),
        )?;
        if let Some(at) = bad {
            bail!(
                "verify failed: the device's byte {at} differs from the {:?} pattern",
                args.pattern
            );
        }
        Some(true)
    } else {
        None
    };
    let g: Vec<f64> = runs.iter().map(|r| r.gib_per_s).collect();
    let stats = Stats::of(&g);
    Ok(DdReport {
        bytes,
        bs: args.bs as u64,
        count: args.count,
        op: args.op,
        pattern: args.pattern,
        dma: args.dma,
        queue_depth: args.queue_depth,
        queues: drv.num_queues(),
        runs,
        median_gib_per_s: stats.median,
        stats,
        verified,
        device: cfg.to_string(),
    })
}

/// One pass over the range: `count` blocks, block `i` on queue
/// `i % queues`, each queue driven by its own thread with its share of the
/// `queue_depth` slots in flight. With `check`, each block read is compared
/// with the pattern and the lowest bad device offset is stored there.
fn pass<O: DmaOps + ?Sized>(
    drv: &mut BlkDriver<O>,
    args: &DdArgs,
    slots: &[(Buffer, usize)],
    op: Op,
    bar: &ProgressBar,
    check: Option<&mut Option<u64>>,
) -> Result<()> {
    let queues = drv.queues_mut();
    let nq = queues.len();
    let checking = check.is_some();
    let mut bad = None;
    if nq == 1 {
        bad = queue_pass(&mut queues[0], 0, 1, args, slots, op, bar, checking)?;
    } else {
        std::thread::scope(|scope| -> Result<()> {
            let workers: Vec<_> = queues
                .iter_mut()
                .enumerate()
                .map(|(qi, q)| {
                    // Slots qi, qi + nq, ...: at least one per queue.
                    let mine: Vec<_> = slots.iter().skip(qi).step_by(nq).cloned().collect();
                    scope.spawn(move || queue_pass(q, qi, nq, args, &mine, op, bar, checking))
                })
                .collect();
            for w in workers {
                let b = w
                    .join()
                    .map_err(|_| anyhow::anyhow!("a queue thread panicked"))??;
                bad = match (bad, b) {
                    (Some(x), Some(y)) => Some(u64::min(x, y)),
                    (x, y) => x.or(y),
                };
            }
            Ok(())
        })?;
    }
    if let Some(c) = check {
        *c = bad;
    }
    Ok(())
}

/// The blocks of queue `qi` of `nq` (blocks `qi`, `qi + nq`, ...), with
/// `slots.len()` in flight. Returns the lowest device offset that did not
/// match the pattern, when `check`.
#[allow(clippy::too_many_arguments)]
fn queue_pass<O: DmaOps + ?Sized>(
    q: &mut BlkQueue<O>,
    qi: usize,
    nq: usize,
    args: &DdArgs,
    slots: &[(Buffer, usize)],
    op: Op,
    bar: &ProgressBar,
    check: bool,
) -> Result<Option<u64>> {
    let bs = args.bs;
    let dev_off = |block: u64| args.offset as u64 + block * bs as u64;
    let mut blocks = (qi as u64..args.count).step_by(nq);
    let mut scratch = Vec::new();
    let mut bad: Option<u64> = None;
    // slot -> block of the request using it.
    let mut busy: Vec<Option<u64>> = vec![None; slots.len()];
    loop {
        for (slot, b) in busy.iter_mut().enumerate() {
            if b.is_some() {
                continue;
            }
            let Some(block) = blocks.next() else { break };
            let (buf, at) = &slots[slot];
            if op == Op::Write && args.pattern == Pattern::Seq {
                scratch.resize(bs, 0);
                fill_seq(&mut scratch, dev_off(block));
                buf.write_at(*at, &scratch)?;
            }
            let (offset, buf_offset, len) = (dev_off(block), *at, bs);
            let req = match op {
                Op::Write => Request::Write {
                    offset,
                    buf,
                    buf_offset,
                    len,
                },
                Op::Read => Request::Read {
                    offset,
                    buf,
                    buf_offset,
                    len,
                },
            };
            q.submit(req, slot as u64)
                .with_context(|| format!("cannot submit block {block}"))?;
            *b = Some(block);
        }
        if busy.iter().all(Option::is_none) {
            return Ok(bad);
        }
        let d = q.complete()?;
        let slot = usize::try_from(d.tag).ok().filter(|&s| s < slots.len());
        let slot = slot.context("completion for an unknown tag")?;
        let block = busy[slot].take().context("completion for an idle slot")?;
        d.result
            .with_context(|| format!("block {block} (device byte {}) failed", dev_off(block)))?;
        if check {
            scratch.resize(bs, 0);
            slots[slot].0.read_at(slots[slot].1, &mut scratch)?;
            if let Some(at) = check_pattern(&scratch, args.pattern, dev_off(block)) {
                // Keep the lowest bad offset whatever order blocks finish in.
                bad = Some(bad.map_or(at, |b| b.min(at)));
            }
        }
        bar.inc(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seq_pattern_round_trips_and_finds_the_first_bad_word() {
        let mut b = vec![0u8; 4096];
        fill_seq(&mut b, 1 << 20);
        assert_eq!(
            u64::from_le_bytes(b[8..16].try_into().unwrap()),
            (1 << 20) + 8
        );
        assert_eq!(check_pattern(&b, Pattern::Seq, 1 << 20), None);
        b[100] ^= 1;
        assert_eq!(
            check_pattern(&b, Pattern::Seq, 1 << 20),
            Some((1 << 20) + 96)
        );
        // Word 0 holds 1 MiB, not zero.
        assert_eq!(check_pattern(&b, Pattern::Zero, 0), Some(0));
        assert_eq!(check_pattern(&b[..16], Pattern::Zero, 64), Some(64));
    }

    #[test]
    fn stats_of_runs() {
        let s = Stats::of(&[3.0, 1.0, 2.0, 4.0]);
        assert_eq!(s.median, 2.5);
        assert_eq!(s.min, 1.0);
        assert_eq!(s.max, 4.0);
        assert!((s.spread - 1.2).abs() < 1e-12);
    }
}
