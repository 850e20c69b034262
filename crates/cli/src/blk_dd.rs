//! `iopath blk dd`: `dd ... oflag=direct` as a virtio-blk driver talking
//! vhost-user to a back end. This file parses the arguments, calls
//! [`iopath_blk::dd::run`] and prints.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::builder::{PossibleValuesParser, TypedValueParser};
use indicatif::{ProgressBar, ProgressStyle};
use iopath_blk::dd::{self, DdConfig, DdReport, DmaMode};
use iopath_blk::workload::{self, Access, Op, Pattern, Workload};
use iopath_virtio::transport::vhost_user::Timeouts;
use iopath_virtio::{BounceGeometry, Platform};

/// A clap parser for one of iopath-blk's named enums (workload choices,
/// DMA modes).
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
    /// Block size of each transfer, a multiple of 512 (decimal or 0x hex,
    /// suffixes K, M, G; powers of 1024).
    #[arg(long, default_value = "8M", value_parser = iopath_sys::parse_size::<usize>)]
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
    #[arg(long, value_parser = named!(DmaMode))]
    pub dma: Option<DmaMode>,
    /// Size of the bounce window when bounce ops are used (default 64M,
    /// swiotlb's).
    #[arg(long, value_parser = iopath_sys::parse_size::<usize>)]
    pub bounce_window: Option<usize>,
    /// Size of the bounce window's slots, a power of two (default 2K,
    /// swiotlb's IO_TLB_SIZE).
    #[arg(long, value_parser = iopath_sys::parse_size::<usize>)]
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
    #[arg(long, default_value = "0", value_parser = iopath_sys::parse_size::<usize>)]
    pub offset: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Seconds to wait for the back end's answer to each vhost-user
    /// request, and for each block request to complete, before giving up
    /// (after 1 s without a vhost-user answer, dd says once that it is
    /// waiting: a back end serves one front end at a time).
    #[arg(long, default_value = "10", value_parser = parse_timeout)]
    pub timeout: Duration,
    /// How each queue waits for completions.
    #[command(flatten)]
    pub poll: crate::blk_poll::PollArgs,
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
    /// The dd these arguments describe.
    pub fn config(&self) -> DdConfig {
        let d = BounceGeometry::DEFAULT;
        DdConfig {
            socket: self.socket.clone(),
            timeouts: Timeouts {
                connect: Duration::from_secs(10),
                reply: self.timeout,
            },
            platform: self.platform,
            bounce: BounceGeometry {
                window: self.bounce_window.unwrap_or(d.window),
                slot: self.bounce_slot.unwrap_or(d.slot),
            },
            dma: self.dma,
            queues: self.queues,
            poll: self.poll.mode(),
            workload: Workload {
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
            },
        }
    }
}

/// `iopath blk dd`.
///
/// # Errors
/// Bad arguments, a back end that cannot be reached or refuses, a request
/// that fails, a verification mismatch.
pub fn run(args: &DdArgs) -> Result<()> {
    let report = dd(args)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("{report}");
    }
    Ok(())
}

/// Runs the dd and returns its report, with a progress bar on stderr
/// unless `--json`.
///
/// # Errors
/// As [`run`].
fn dd(args: &DdArgs) -> Result<DdReport> {
    let cfg = args.config();
    let w = &cfg.workload;
    let bar = if !args.json {
        ProgressBar::new(w.count.saturating_mul(w.runs as u64))
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} blocks {per_sec}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    let bar = Bar(bar, !args.json);
    let report = dd::run(&cfg, &bar);
    bar.0.finish_and_clear();
    report.map_err(crate::blk_error::explain)
}

/// A progress bar on stderr, advanced by the workload.
/// The bar and whether runs are printed (not with --json).
struct Bar(ProgressBar, bool);

impl workload::Progress for Bar {
    fn run_started(&self, run: usize, runs: usize) {
        self.0.set_message(format!("run {}/{}", run + 1, runs));
    }

    fn blocks_done(&self, n: u64) {
        self.0.inc(n);
    }

    /// Each run is printed as it completes (above the bar), so a dd killed
    /// later keeps what it measured; with --json nothing is (the bar is
    /// hidden) and the report holds every run.
    fn run_done(&self, run: usize, _runs: usize, bytes: u64, r: &workload::Run) {
        if !self.1 {
            return;
        }
        let line = format!(
            "run {}: {} bytes in {:.3} s, {:.3} GiB/s",
            run + 1,
            bytes,
            r.seconds,
            r.gib_per_s
        );
        self.0.suspend(|| {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        });
    }
}
