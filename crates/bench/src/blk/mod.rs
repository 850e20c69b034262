//! `iopath bench blk`: the 2018 "virtio uses the DMA API" experiment.
//!
//! The same dd (iopath's virtio-blk driver writing `size` bytes in `bs`
//! blocks through [`iopath_blk::workload`]) once per DMA mode against
//! iopath's own back end (`iopath blk serve`, started here), `runs` runs
//! each; a peer row with the same driver against `qemu-storage-daemon`
//! exporting the same image; and the limit: the best of a small sweep of
//! fio's `O_DIRECT` sequential write of the same image file (block sizes
//! 1 MiB, 8 MiB and `bs`, queue depths 4, 16, 64), measured in the same run.
//! Without fio, the limit is the bench's own plain O_DIRECT write of the
//! image file (labelled so); without qemu-storage-daemon its row is a note.

use std::path::{Path, PathBuf};

use iopath_blk::dd::DdConfig;
use iopath_blk::workload::{self, Access, Op, Pattern, Stats, Workload};
use serde::Serialize;

use crate::direct::DirectJob;
use crate::error::{check_failed, invalid};
use crate::limit::Limit;
use crate::place::{on_cpu, Cpus, Placement};
use crate::{fio, Error, ProgressBar, Result};

/// The DMA ops of a row: the override `iopath blk dd --dma` gives.
pub use iopath_blk::dd::DmaMode;

/// What `iopath bench blk` measured.
#[derive(Debug, Clone, Serialize)]
pub struct BlkReport {
    /// Bytes per run.
    pub bytes: u64,
    /// Block size.
    pub bs: u64,
    /// Blocks in flight.
    pub queue_depth: usize,
    /// Runs per row.
    pub runs: usize,
    /// Image file.
    pub image: PathBuf,
    /// What holds the image: "RAM (tmpfs)" or "disk".
    pub image_on: String,
    /// Where the processes ran.
    pub placement: String,
    /// Rows: limit first, then each DMA mode, then the peer (and guests).
    pub rows: Vec<Row>,
    /// The limit row's source and sweep.
    #[serde(skip)]
    pub limit: Option<Limit>,
    /// The small-block table, when it was run.
    pub small_block: Option<SmallReport>,
}

/// One dd run of iopath's driver through the workload API against the
/// back end on `socket`, with `mode`'s override of the platform policy
/// (direct platform, swiotlb's default bounce geometry): GiB/s.
fn dd_once(socket: &Path, cfg: &BlkBenchConfig, mode: DmaMode) -> Result<f64> {
    let w = Workload {
        op: Op::Write,
        pattern: Pattern::Zero,
        access: Access::Seq,
        seed: 0,
        bs: cfg.bs,
        count: (cfg.size / cfg.bs) as u64,
        offset: 0,
        queue_depth: cfg.queue_depth,
        runs: 1,
        verify: false,
    };
    let mut dd = DdConfig::new(socket, w);
    dd.dma = Some(mode);
    let report = iopath_blk::dd::run(&dd, &()).map_err(Error::layer("dd"))?;
    Ok(report.runs[0].gib_per_s)
}

/// Row names.
const FIO_LIMIT: &str = "fio O_DIRECT write (limit)";
const OWN_LIMIT: &str = "own O_DIRECT write of the image (limit, no fio)";
const PEER: &str = "qemu-storage-daemon (peer), dma direct";

fn mode_row(m: DmaMode) -> String {
    format!("iopath blk serve, dma {}", m.name())
}

/// Runs the experiment. Rows are interleaved run by run (the limit, each
/// DMA mode in a rotating order, the peer, then again), so slow drift of
/// the machine spreads over every row instead of biasing one.
///
/// # Errors
/// [`Error::Invalid`] for bad settings; an image that cannot be created;
/// the limit failing. A row whose back end or peer cannot run is reported
/// as skipped (with its missing peer, if that is why), not an error.
pub fn run(cfg: &BlkBenchConfig) -> Result<BlkReport> {
    if cfg.bs == 0 || cfg.bs % 512 != 0 || cfg.size < cfg.bs || cfg.size % cfg.bs != 0 {
        invalid!(
            "--size",
            "give a positive multiple of --bs, itself a multiple of 512 (got {} and {})",
            cfg.size,
            cfg.bs
        );
    }
    if cfg.runs == 0 {
        invalid!("--runs", "give at least 1");
    }
    if cfg.queue_depth == 0 || cfg.queue_depth > workload::MAX_QUEUE_DEPTH {
        invalid!(
            "--queue-depth",
            "give 1 to {}, got {}",
            workload::MAX_QUEUE_DEPTH,
            cfg.queue_depth
        );
    }
    let dir = match &cfg.dir {
        Some(d) => d.clone(),
        None => match ram_dir(cfg.size as u64) {
            Some(d) => d,
            None => crate::scratch_dir()?,
        },
    };
    let work = crate::cleanup::temp_dir("iopath-bench-blk.", &dir)?;
    let image = work.path().join("disk.img");
    make_image(&image, cfg.size as u64)?;
    let ours_sock = work.path().join("iopath.sock");
    let peer_sock = work.path().join("qsd.sock");
    let cpus = Cpus::get()?;
    let (client, server) = cfg.placement.cpus(&cpus);
    let ours = start_iopath_serve_on(&cfg.iopath, &image, &ours_sock, server, &["--queues", "2"]);
    let peer = start_qsd_on(&image, &peer_sock, server);
    let dd_run = |sock: &Path, mode| on_cpu(client, &cpus, || dd_once(sock, cfg, mode));

    let modes = if cfg.modes.is_empty() {
        DmaMode::ALL.to_vec()
    } else {
        cfg.modes.clone()
    };
    let mut rows: Vec<(DmaMode, Series)> = modes
        .iter()
        .map(|&m| (m, Series::new(mode_row(m), ours.as_ref().err())))
        .collect();
    let mut peer_row = Series::new(PEER.into(), peer.as_ref().err());
    // --guest: a Linux guest's dd on each back end's socket.
    let mut guest_rows = GuestRows::new(
        cfg,
        (&ours_sock, ours.as_ref().err()),
        (&peer_sock, peer.as_ref().err()),
    );
    let sweep_bs = [1 << 20, 8 << 20, cfg.bs as u64];
    let base = fio::Job {
        dir: fio::Dir::Write,
        path: image.clone(),
        bytes: cfg.size as u64,
        bs: cfg.bs as u64,
        iodepth: cfg.queue_depth as u32,
    };
    let own = DirectJob {
        write: true,
        path: image.clone(),
        bytes: cfg.size as u64,
        bs: cfg.bs as u64,
        depth: cfg.queue_depth as u32,
    };
    let mut limit = Limit::new(&base, &sweep_bs, own.clone());
    let total = cfg.runs as u64 * (1 + rows.len() + guest_rows.len()) as u64
        + limit.steps(cfg.runs)
        + cfg.small.as_ref().map_or(0, small::steps);
    let bar = ProgressBar::new(cfg.progress, "bench blk", total);
    // One warm-up round, not counted: the first write of each path pays
    // one-time costs (the back end's first request after start, the image's
    // first touch), which showed up as a lone outlier in the first run.
    bar.set_message("warm-up");
    if limit.is_fio() {
        let _ = base.run(server);
    } else {
        let _ = on_cpu(server, &cpus, || own.run());
    }
    if ours.is_ok() {
        for &mode in &modes {
            let _ = dd_run(&ours_sock, mode);
        }
    }
    if peer.is_ok() {
        let _ = dd_run(&peer_sock, DmaMode::Direct);
    }
    for run in 0..cfg.runs {
        on_cpu(server, &cpus, || {
            limit.measure(server, &mut || Ok(()), &bar)
        })?;
        // Rotate the modes' order from run to run, so none always runs
        // right after the limit or right before the peer.
        let n = rows.len();
        for k in 0..n {
            let (mode, series) = &mut rows[(k + run) % n];
            bar.set_message(format!("run {}: dma {}", run + 1, mode.name()));
            series.measure(|| dd_run(&ours_sock, *mode));
            bar.inc(1);
        }
        bar.set_message(format!("run {}: qemu-storage-daemon", run + 1));
        peer_row.measure(|| dd_run(&peer_sock, DmaMode::Direct));
        bar.inc(1);
        guest_rows.measure(run, cfg, client, &cpus, &bar);
    }
    let small_block = cfg.small.as_ref().map(|s| {
        // Two more back ends, sleeping at once and never sleeping; the
        // default one is adaptive.
        let sleep_sock = work.path().join("iopath-sleep.sock");
        let busy_sock = work.path().join("iopath-busy.sock");
        let sleep = start_iopath_serve_on(
            &cfg.iopath,
            &image,
            &sleep_sock,
            server,
            &["--poll-us", "0"],
        );
        let busy = start_iopath_serve_on(&cfg.iopath, &image, &busy_sock, server, &["--poll"]);
        let pid = |c: &Result<crate::place::Logged>| c.as_ref().ok().map(|c| c.id());
        let backends = small::Backends {
            sleep: pid(&sleep).map(|p| (sleep_sock.as_path(), p)),
            adaptive: pid(&ours).map(|p| (ours_sock.as_path(), p)),
            busy: pid(&busy).map(|p| (busy_sock.as_path(), p)),
            qsd: pid(&peer).map(|p| (peer_sock.as_path(), p)),
        };
        small::run(cfg, s, &image, &backends, &cpus, (client, server), &bar)
    });
    bar.finish();
    drop((ours, peer));
    let lim = limit.summary().median;
    let name = if limit.is_fio() { FIO_LIMIT } else { OWN_LIMIT };
    let mut lim_row = Series::new(name.into(), None);
    lim_row.runs = limit.runs();
    let mut out = vec![lim_row.row(lim)];
    out.extend(rows.into_iter().map(|(_, s)| s.row(lim)));
    out.push(peer_row.row(lim));
    out.extend(guest_rows.into_rows(lim));
    Ok(BlkReport {
        bytes: cfg.size as u64,
        bs: cfg.bs as u64,
        queue_depth: cfg.queue_depth,
        runs: cfg.runs,
        image_on: if ram_backed(&image) {
            "RAM (tmpfs)".into()
        } else {
            "disk".into()
        },
        placement: cfg.placement.describe(
            &cpus,
            if cfg.guest {
                "the driver and the guest's QEMU"
            } else {
                "the driver"
            },
            "the back end, qemu-storage-daemon and fio",
        ),
        image,
        rows: out,
        limit: Some(limit),
        small_block,
    })
}

mod backend;
mod config;
mod guest_rows;
mod image;
mod report;
mod series;
mod small;
mod small_report;

pub use config::BlkBenchConfig;
pub use series::Row;
pub use small::{SmallConfig, SmallReport, SmallRow, SmallRun};

use backend::{start_iopath_serve_on, start_qsd_on};
use image::{make_image, ram_backed, ram_dir};
use series::Series;

use guest_rows::{GuestRows, GUEST_OURS, GUEST_PEER, GUEST_SWIOTLB};
