//! `iopath blk dd`: the 2018 thread's `dd ... oflag=direct`, as a
//! virtio-blk driver talking vhost-user to a back end. This file parses the
//! arguments, connects, calls [`iopath_blk::workload`] and prints.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::builder::{PossibleValuesParser, TypedValueParser};
use indicatif::{ProgressBar, ProgressStyle};
use iopath_blk::driver::DEVICE_ID_BLOCK;
use iopath_blk::workload::{
    self, Access, Blocks, Op, Pattern, Run, Stats, Workload, WorkloadError,
};
use iopath_blk::{BlkDriver, DriverOptions};
use iopath_dma::{Direct, DmaOps};
use iopath_virtio::transport::vhost_user::{Timeouts, VhostUser, VhostUserError};
use iopath_virtio::Transport;
use iopath_virtio::{BounceGeometry, Choice, Platform, Policy};
use serde::Serialize;

/// A clap parser for one of the workload's named enums.
macro_rules! named {
    ($t:ty) => {
        PossibleValuesParser::new(<$t>::NAMES).map(|s| s.parse::<$t>().expect("a listed name"))
    };
}

/// Arguments of `iopath blk dd`.
#[derive(Debug, Clone, clap::Args)]
pub struct DdArgs {
    /// vhost-user-blk socket of the back end (`iopath blk serve`,
    /// `qemu-storage-daemon --export type=vhost-user-blk`, ...).
    #[arg(long)]
    pub socket: PathBuf,
    /// Block size of each transfer, a multiple of 512 (suffixes K, M, G;
    /// powers of 1024).
    #[arg(long, default_value = "8M", value_parser = crate::size::parse_size)]
    pub bs: usize,
    /// Number of blocks per run.
    #[arg(long, default_value_t = 1024)]
    pub count: u64,
    /// Write the device or read it.
    #[arg(long, default_value = "write", value_parser = named!(Op))]
    pub op: Op,
    /// Data written (and expected by --verify): zeros, or `seq`, where each
    /// 8-byte little-endian word holds its own byte offset on the device.
    #[arg(long, default_value = "zero", value_parser = named!(Pattern))]
    pub pattern: Pattern,
    /// Block order: `seq` (block 0, 1, 2, ... of the range) or `rand`
    /// (every block of the range once per run, in a random order drawn
    /// from --seed; `--bs 4K --access rand` is the usual random I/O test).
    #[arg(long, default_value = "seq", value_parser = named!(Access))]
    pub access: Access,
    /// Seed of the random order of `--access rand` (the same seed gives
    /// the same order).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// After the runs, read the range back and compare it with the pattern.
    #[arg(long)]
    pub verify: bool,
    /// The platform whose policy picks the DMA ops once features are
    /// negotiated: `direct` (devices see driver memory: direct ops),
    /// `iommu` (IOMMU ops when the device offers ACCESS_PLATFORM, else
    /// direct ops and a warning), `protected` (a confidential guest: bounce
    /// ops, and a device without ACCESS_PLATFORM is refused).
    #[arg(long, default_value = "direct", value_parser = PossibleValuesParser::new(Platform::ALL.map(Platform::name)).map(|s| s.parse::<Platform>().expect("a listed name")))]
    pub platform: Platform,
    /// The experiment's override of the policy's choice: `direct` (device
    /// sees the buffers, `&dyn DmaOps`), `direct-static` (same, the driver
    /// monomorphised over the concrete ops type), `iommu` (IOVAs and IOTLB
    /// messages; the back end must offer ACCESS_PLATFORM), `bounce` (only a
    /// small window is shared; data is copied through it).
    #[arg(long, value_enum)]
    pub dma: Option<DmaMode>,
    /// Size of the bounce window when bounce ops are used (default 64M,
    /// swiotlb's).
    #[arg(long, value_parser = crate::size::parse_size)]
    pub bounce_window: Option<usize>,
    /// Size of the bounce window's slots, a power of two (default 2K,
    /// swiotlb's IO_TLB_SIZE).
    #[arg(long, value_parser = crate::size::parse_size)]
    pub bounce_slot: Option<usize>,
    /// Number of timed runs.
    #[arg(long, default_value_t = 1)]
    pub runs: usize,
    /// Blocks in flight at once (1 to 256, at least --queues).
    #[arg(long, default_value_t = 4)]
    pub queue_depth: usize,
    /// Virtqueues to use (at most what the device offers), each driven by
    /// its own thread with its share of the blocks in flight.
    #[arg(long, default_value_t = 1)]
    pub queues: usize,
    /// Byte offset on the device where the range starts, a multiple of 512.
    #[arg(long, default_value = "0", value_parser = crate::size::parse_size)]
    pub offset: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Seconds to wait for the back end's answer to each vhost-user
    /// request before giving up (after 1 s without one, dd says once that
    /// it is waiting: a back end serves one front end at a time).
    #[arg(long, default_value = "10", value_parser = parse_timeout)]
    pub timeout: Duration,
}

/// `--timeout`: seconds, more than 0 and at most a day.
fn parse_timeout(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds (e.g. 10 or 0.5)"))?;
    if !(secs > 0.0 && secs <= 86_400.0) {
        return Err(format!(
            "{s} s is out of range (more than 0, at most 86400)"
        ));
    }
    Ok(Duration::from_secs_f64(secs))
}

impl DdArgs {
    /// The platform policy these arguments describe (`--dma` as its
    /// override).
    pub fn policy(&self) -> Policy {
        let d = BounceGeometry::DEFAULT;
        Policy::new(self.platform)
            .with_bounce(BounceGeometry {
                window: self.bounce_window.unwrap_or(d.window),
                slot: self.bounce_slot.unwrap_or(d.slot),
            })
            .with_override(self.dma.map(DmaMode::choice))
    }

    /// The workload these arguments describe.
    pub fn workload(&self) -> Workload {
        Workload {
            op: self.op,
            pattern: self.pattern,
            access: self.access,
            seed: self.seed,
            bs: self.bs,
            count: self.count,
            offset: self.offset as u64,
            queue_depth: self.queue_depth,
            runs: self.runs,
            verify: self.verify,
        }
    }
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
    /// The ops the mode forces.
    pub fn choice(self) -> Choice {
        match self {
            DmaMode::Direct | DmaMode::DirectStatic => Choice::Direct,
            DmaMode::Iommu => Choice::Iommu,
            DmaMode::Bounce => Choice::Bounce,
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
    /// Block order.
    pub access: Access,
    /// Seed of the random order.
    pub seed: u64,
    /// The platform setting of the policy.
    pub platform: String,
    /// The `--dma` override (null: the policy chose).
    pub dma: Option<DmaMode>,
    /// The DMA ops the driver used.
    pub ops: String,
    /// How the driver calls them: "dyn" (`&dyn DmaOps`) or "static"
    /// (monomorphised).
    pub dispatch: String,
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
            "{} {} x {} B ({}), {} ops ({}), qd {}: median {:.3} GiB/s (min {:.3}, max {:.3}, spread {:.1}%)",
            match report.op {
                Op::Write => "wrote",
                Op::Read => "read",
            },
            report.count,
            report.bs,
            match report.access {
                Access::Seq => "sequential",
                Access::Rand => "random",
            },
            report.ops,
            report.dispatch,
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

/// The workload's error in the command line's terms: the option at fault.
fn explain(e: WorkloadError) -> anyhow::Error {
    match e {
        WorkloadError::Invalid {
            field,
            value,
            accepted,
        } => anyhow!(
            "--{} {value} is not accepted: it must be {accepted}",
            field.replace('_', "-")
        ),
        WorkloadError::Overflow { what, limit } => {
            // "offset + bs x count" -> "--offset + --bs x --count".
            let options: Vec<String> = what
                .split(' ')
                .map(|t| match t {
                    "x" | "+" => t.to_string(),
                    field => format!("--{}", field.replace('_', "-")),
                })
                .collect();
            anyhow!(
                "{} overflows: it must be at most {limit}",
                options.join(" ")
            )
        }
        WorkloadError::DepthBelowQueues {
            queue_depth,
            queues,
        } => anyhow!(
            "--queue-depth ({queue_depth}) must be at least --queues ({queues}): each queue needs a block in flight"
        ),
        WorkloadError::PastEnd { end, capacity } => anyhow!(
            "--offset + --bs x --count = {end} bytes is past the device's end ({capacity} bytes)"
        ),
        WorkloadError::Mismatch { offset, pattern } => anyhow!(
            "verify failed: the device's byte {offset} differs from the {pattern:?} pattern"
        ),
        other => anyhow::Error::new(other),
    }
}

fn validate(args: &DdArgs) -> Result<Workload> {
    if args.queues == 0 {
        bail!("--queues 0 is not accepted: it must be at least 1");
    }
    let w = args.workload();
    w.validate().map_err(explain)?;
    if w.queue_depth < args.queues {
        return Err(explain(WorkloadError::DepthBelowQueues {
            queue_depth: w.queue_depth,
            queues: args.queues,
        }));
    }
    Ok(w)
}

/// Runs the dd and returns its report; `progress` shows a bar on stderr.
///
/// # Errors
/// As [`run`].
pub fn dd(args: &DdArgs, progress: bool) -> Result<DdReport> {
    let w = validate(args)?;
    let blocks = Blocks::new(&w).map_err(explain)?;
    let transport: Arc<dyn Transport> = Arc::new(
        VhostUser::connect_with(
            &args.socket,
            DEVICE_ID_BLOCK,
            Timeouts {
                connect: Duration::from_secs(10),
                reply: args.timeout,
            },
        )
        .map_err(|e| {
            let hint = if matches!(e, VhostUserError::Timeout { .. }) {
                " (is it serving another front end? --timeout sets the wait)"
            } else {
                ""
            };
            anyhow::Error::new(e).context(format!(
                "cannot reach the back end at {}{hint}",
                args.socket.display()
            ))
        })?,
    );
    let opts = DriverOptions {
        queues: args.queues.try_into().unwrap_or(u16::MAX),
        ..DriverOptions::default()
    };
    let policy = args.policy();
    const INIT: &str = "cannot initialise the virtio-blk device";
    if args.dma == Some(DmaMode::DirectStatic) {
        let mut drv =
            BlkDriver::<Direct>::new(transport, &policy, &opts, blocks.buffers()).context(INIT)?;
        return report(&mut drv, args, &w, &blocks, progress);
    }
    let mut drv =
        BlkDriver::<dyn DmaOps>::new(transport, &policy, &opts, blocks.buffers()).context(INIT)?;
    report(&mut drv, args, &w, &blocks, progress)
}

/// A progress bar on stderr, advanced by the workload.
struct Bar(ProgressBar);

impl workload::Progress for Bar {
    fn run_started(&self, run: usize, runs: usize) {
        self.0.set_message(format!("run {}/{}", run + 1, runs));
    }

    fn block_done(&self) {
        self.0.inc(1);
    }
}

/// Drives the workload on `drv` and builds the report; generic over the
/// ops type like [`workload::drive`].
fn report<O: DmaOps + ?Sized>(
    drv: &mut BlkDriver<O>,
    args: &DdArgs,
    w: &Workload,
    blocks: &Blocks,
    progress: bool,
) -> Result<DdReport> {
    let bar = if progress && !args.json {
        ProgressBar::new(w.count * w.runs as u64)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} blocks {per_sec}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    let bar = Bar(bar);
    let out = workload::drive(drv, w, blocks, &bar).map_err(explain);
    bar.0.finish_and_clear();
    let out = out?;
    let g: Vec<f64> = out.runs.iter().map(|r| r.gib_per_s).collect();
    let stats = Stats::of(&g);
    Ok(DdReport {
        bytes: w.bytes(),
        bs: w.bs as u64,
        count: w.count,
        op: w.op,
        pattern: w.pattern,
        access: w.access,
        seed: w.seed,
        platform: args.platform.to_string(),
        dma: args.dma,
        ops: drv.ops().name().to_string(),
        dispatch: if args.dma == Some(DmaMode::DirectStatic) {
            "static"
        } else {
            "dyn"
        }
        .to_string(),
        queue_depth: w.queue_depth,
        queues: drv.num_queues(),
        runs: out.runs,
        median_gib_per_s: stats.median,
        stats,
        verified: out.verified.then_some(true),
        device: drv.config().to_string(),
    })
}
