//! `iopath bench blk`: its arguments, mapped to [`BlkBenchConfig`].

use std::path::PathBuf;

use anyhow::Result;
use clap::builder::{PossibleValuesParser, TypedValueParser};
use iopath_bench::blk::{BlkBenchConfig, DmaMode, SmallConfig};
use iopath_bench::Report;

use super::{Outputs, PlacementArg};

/// Arguments of `iopath bench blk`.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = "\
The limit is the best of a fio sweep of O_DIRECT writes of the same image
(block sizes 1M, 8M and --bs; queue depths 4, 16, 64), measured in the same
run; without fio, the bench's own O_DIRECT write of the image (labelled so).
Without qemu-storage-daemon its row is a note and its ratio n/a.")]
pub struct BenchBlkArgs {
    /// Bytes written per run (the image is this large).
    #[arg(long, default_value = "8G", value_parser = iopath_sys::parse_size::<usize>)]
    pub size: usize,
    /// Runs per row.
    #[arg(long, default_value_t = 10)]
    pub runs: usize,
    /// Block size of every transfer.
    #[arg(long, default_value = "8M", value_parser = iopath_sys::parse_size::<usize>)]
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
    #[arg(long, value_delimiter = ',', value_parser = PossibleValuesParser::new(DmaMode::NAMES).map(|s| s.parse::<DmaMode>().expect("a listed name")))]
    pub modes: Vec<DmaMode>,
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
    /// oflag=direct`; on iopath's back end twice: with virtio's direct
    /// addresses, and through the guest's DMA API with swiotlb=force behind
    /// the vIOMMU (Linux bounces every block, the back end translates every
    /// address through the IOTLB), the two alternating run by run. The
    /// guest's QEMU runs on the driver's CPU.
    #[arg(long)]
    pub guest: bool,
    /// 4 KiB random requests per run of each row of the small-block
    /// table (random reads and writes at queue depths 1 and 32: fio
    /// io_uring O_DIRECT, iopath blk serve sleeping, adaptive and --poll,
    /// qemu-storage-daemon, two queues); 0 leaves the table out.
    #[arg(long, default_value_t = 65536)]
    pub small_count: u64,
    /// Runs per row of the small-block table.
    #[arg(long, default_value_t = 5)]
    pub small_runs: usize,
    #[command(flatten)]
    pub out: Outputs,
}

impl BenchBlkArgs {
    fn config(&self) -> Result<BlkBenchConfig> {
        Ok(BlkBenchConfig {
            size: self.size,
            runs: self.runs,
            bs: self.bs,
            queue_depth: self.queue_depth,
            dir: self.dir.clone(),
            modes: self.modes.clone(),
            placement: self.placement.into(),
            guest: self.guest,
            iopath: iopath_bench::current_exe()?,
            progress: !self.json,
            small: (self.small_count > 0).then(|| SmallConfig {
                count: self.small_count,
                runs: self.small_runs.max(1),
                ..SmallConfig::full()
            }),
        })
    }

    /// Runs the experiment.
    pub(super) fn report(&self) -> Result<Report> {
        Ok(iopath_bench::blk::run(&self.config()?)?.report())
    }
}
