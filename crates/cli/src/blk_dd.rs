//! `iopath blk dd`: the 2018 thread's `dd ... oflag=direct`, as a
//! virtio-blk driver talking vhost-user to a back end.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;

/// Arguments of `iopath blk dd`.
#[derive(Debug, Clone, clap::Args)]
pub struct DdArgs {
    /// vhost-user-blk socket of the back end (`iopath blk serve`,
    /// `qemu-storage-daemon --export type=vhost-user-blk`, ...).
    #[arg(long)]
    pub socket: PathBuf,
    /// Block size of each transfer (suffixes K, M, G; powers of 1024).
    #[arg(long, default_value = "8M", value_parser = parse_size)]
    pub bs: u64,
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
    /// Virtqueues to use (at most what the device offers).
    #[arg(long, default_value_t = 1)]
    pub queues: usize,
    /// Byte offset on the device where the first block goes.
    #[arg(long, default_value = "0", value_parser = parse_size)]
    pub offset: u64,
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

/// Parses `8M`, `512K`, `8G`, `4096` (powers of 1024).
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m: u64 = match c.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => return Err(format!("unknown size suffix {c:?} (use K, M, G or T)")),
            };
            (&s[..i], m)
        }
        _ => (s, 1),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size like 8M or 4096"))?;
    n.checked_mul(mult)
        .ok_or_else(|| format!("size {s:?} overflows"))
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
        Pattern::Zero => got.iter().position(|&b| b != 0).map(|i| dev_off + i as u64),
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
    /// Stats of a non-empty series.
    pub fn of(values: &[f64]) -> Self {
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n == 0 {
            0.0
        } else if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        let (min, max) = (
            v.first().copied().unwrap_or(0.0),
            v.last().copied().unwrap_or(0.0),
        );
        Stats {
            median,
            min,
            max,
            spread: if median > 0.0 {
                (max - min) / median
            } else {
                0.0
            },
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
            println!("verify: {} bytes match the {:?} pattern", report.bytes, report.pattern);
        }
    }
    Ok(())
}

fn validate(args: &DdArgs) -> Result<()> {
    if args.bs == 0 || args.bs % 512 != 0 {
        bail!("--bs must be a positive multiple of 512 bytes, got {}", args.bs);
    }
    if args.offset % 512 != 0 {
        bail!("--offset must be a multiple of 512 bytes, got {}", args.offset);
    }
    if args.count == 0 || args.runs == 0 || args.queue_depth == 0 || args.queues == 0 {
        bail!("--count, --runs, --queue-depth and --queues must be at least 1");
    }
    if usize::try_from(args.bs).is_err() {
        bail!("--bs {} does not fit in memory", args.bs);
    }
    args.bs
        .checked_mul(args.count)
        .and_then(|b| b.checked_add(args.offset))
        .context("--bs x --count overflows")?;
    Ok(())
}

/// Runs the dd and returns its report; `progress` shows a bar on stderr.
///
/// # Errors
/// As [`run`].
pub fn dd(args: &DdArgs, progress: bool) -> Result<DdReport> {
    validate(args)?;
    let _ = (progress, Instant::now());
    bail!("blk dd: driver not wired yet")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("8M"), Ok(8 << 20));
        assert_eq!(parse_size("8g"), Ok(8 << 30));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("8X").unwrap_err().contains("suffix"));
        assert!(parse_size("M").is_err());
        assert!(parse_size("99999999999T").unwrap_err().contains("overflows"));
    }

    #[test]
    fn seq_pattern_round_trips_and_finds_the_first_bad_word() {
        let mut b = vec![0u8; 4096];
        fill_seq(&mut b, 1 << 20);
        assert_eq!(u64::from_le_bytes(b[8..16].try_into().unwrap()), (1 << 20) + 8);
        assert_eq!(check_pattern(&b, Pattern::Seq, 1 << 20), None);
        b[100] ^= 1;
        assert_eq!(check_pattern(&b, Pattern::Seq, 1 << 20), Some((1 << 20) + 96));
        assert_eq!(check_pattern(&b, Pattern::Zero, 0), Some(8));
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
