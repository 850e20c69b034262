//! `iopath bench blk`: the 2018 "virtio uses the DMA API" experiment.
//!
//! The same dd (iopath's virtio-blk driver writing `size` bytes in `bs`
//! blocks through [`iopath_blk::workload`]) once per DMA mode against
//! iopath's own back end (`iopath blk serve`, started here), `runs` runs
//! each; a peer row with the same driver against `qemu-storage-daemon`
//! exporting the same image; and the limit: the best of a small sweep
//! of fio's `O_DIRECT` sequential write of the same image file (block
//! sizes 1 MiB, 8 MiB and `bs`, queue depths 4, 16, 64), or without fio
//! the bench's own plain O_DIRECT write (labelled so). Then the
//! small-block table (`small`). A Linux guest's dd on each back end is
//! `scripts/guest-dd-bench`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use iopath_blk::dd::DdConfig;
use iopath_blk::workload::{self, Workload};

use crate::error::invalid;
use crate::limit::Limit;
use crate::place::{on_cpu, Cpus, Placement, Spawned};
use crate::{fio, Error, Missing, ProgressBar, Report, Result};

mod libblkio;
mod report;
mod small;

/// The DMA ops of a row: the override `iopath blk dd --dma` gives.
pub use iopath_blk::dd::DmaMode;
pub use small::SmallConfig;

/// What `iopath bench blk` measures.
#[derive(Debug, Clone)]
pub struct BlkBenchConfig {
    /// Bytes written per run (the image is this large).
    pub size: usize,
    /// Runs per row.
    pub runs: usize,
    /// Block size of every transfer.
    pub bs: usize,
    /// Blocks in flight.
    pub queue_depth: usize,
    /// Directory for the image file; `None`: RAM (/dev/shm) when the image
    /// fits with room to spare, else /var/tmp.
    pub dir: Option<PathBuf>,
    /// DMA modes to measure (empty: all).
    pub modes: Vec<DmaMode>,
    /// Where the processes run.
    pub placement: Placement,
    /// The `iopath` executable whose `blk serve` is iopath's back end.
    pub iopath: PathBuf,
    /// The small-block table (4 KiB random I/O), when asked for.
    pub small: Option<SmallConfig>,
}

impl BlkBenchConfig {
    /// The embedded defaults of `iopath bench`: 256 MiB in 8 MiB blocks,
    /// 4 in flight, 3 runs, every mode, split placement.
    pub fn quick(iopath: PathBuf) -> BlkBenchConfig {
        BlkBenchConfig {
            size: 256 << 20,
            runs: 3,
            bs: 8 << 20,
            queue_depth: 4,
            dir: None,
            modes: Vec::new(),
            placement: Placement::Split,
            iopath,
            small: Some(SmallConfig::quick()),
        }
    }

    /// The full sizes: `dd bs=8M count=1024` (8 GiB) x 10 runs per DMA mode.
    pub fn full(iopath: PathBuf) -> BlkBenchConfig {
        BlkBenchConfig {
            size: 8 << 30,
            runs: 10,
            small: Some(SmallConfig::full()),
            ..BlkBenchConfig::quick(iopath)
        }
    }

    /// The DMA modes to measure: those asked for, or every one.
    fn modes(&self) -> Vec<DmaMode> {
        match self.modes.is_empty() {
            true => DmaMode::ALL.to_vec(),
            false => self.modes.clone(),
        }
    }
}

/// A row being measured: its GiB/s per run, or why it cannot run (the
/// missing peer's note, or the error).
#[derive(Debug)]
struct Series {
    name: String,
    runs: Vec<f64>,
    failed: Option<String>,
}

impl Series {
    fn new(name: impl Into<String>, failed: Option<&Error>) -> Self {
        let (name, runs, failed) = (name.into(), Vec::new(), failed.map(Error::chain));
        Series { name, runs, failed }
    }

    fn measure(&mut self, f: impl FnOnce() -> Result<f64>) {
        if self.failed.is_none() {
            match f() {
                Ok(v) => self.runs.push(v),
                Err(e) => self.failed = Some(e.chain()),
            }
        }
    }
}

const FIO_LIMIT: &str = "fio O_DIRECT write (limit)";
const OWN_LIMIT: &str = "own O_DIRECT write of the image (limit, no fio)";
const PEER: &str = "qemu-storage-daemon (peer), dma direct";

fn mode_row(m: DmaMode) -> String {
    format!("iopath blk serve, dma {}", m.name())
}

/// `a / b` when both were measured and `b` is positive.
fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    Some(a? / b.filter(|b| *b > 0.0)?)
}

#[derive(Debug)]
struct Measured {
    cfg: BlkBenchConfig,
    image: PathBuf,
    image_on: &'static str,
    placement: String,
    /// The limit first, then each DMA mode, the peer.
    rows: Vec<Series>,
    limit: Limit,
    small: Option<small::Measured>,
}

/// One dd run of iopath's driver through the workload API against the
/// back end on `socket`, with `mode`'s override of the platform policy:
/// GiB/s.
fn dd_once(socket: &Path, cfg: &BlkBenchConfig, mode: DmaMode) -> Result<f64> {
    let w = Workload {
        bs: cfg.bs,
        count: (cfg.size / cfg.bs) as u64,
        queue_depth: cfg.queue_depth,
        ..Workload::default()
    };
    let mut dd = DdConfig::new(socket, w);
    dd.dma = Some(mode);
    let report = iopath_blk::dd::run(&dd, &()).map_err(Error::layer("dd"))?;
    Ok(report.runs[0].gib_per_s)
}

/// Runs the experiment. Rows are interleaved run by run (the limit, each
/// DMA mode in a rotating order, the peer, then again),
/// so slow drift of the machine spreads over every row instead of biasing
/// one. A row whose back end or peer cannot run is reported as not run,
/// not an error.
///
/// # Errors
/// [`Error::Invalid`] for bad settings; an image that cannot be created;
/// the limit failing.
pub fn run(cfg: &BlkBenchConfig) -> Result<Report> {
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
    let dir = match cfg.dir.clone().or_else(|| ram_dir(cfg.size as u64)) {
        Some(d) => d,
        None => crate::scratch_dir()?,
    };
    let work = crate::cleanup::temp_dir("iopath-bench-blk.", &dir)?;
    let image = work.path().join("disk.img");
    // A new file in a new directory.
    let f = std::fs::File::create(&image).map_err(Error::io(&image))?;
    // Every block allocated up front, so that no run pays for allocation.
    rustix::fs::fallocate(&f, rustix::fs::FallocateFlags::empty(), 0, cfg.size as u64)
        .map_err(Error::io(&image))?;
    let sock = |name: &str| work.path().join(name);
    let (ours_sock, peer_sock) = (sock("iopath.sock"), sock("qsd.sock"));
    let cpus = Cpus::get().map_err(Error::sys("reading the CPU affinity"))?;
    let (client, server) = cfg.placement.cpus(&cpus);
    // `iopath blk serve` on the image with `extra` arguments.
    let serve = |socket: &Path, extra: &[&str]| {
        let mut cmd = Command::new(&cfg.iopath);
        cmd.args(["blk", "serve", "--image"]).arg(&image);
        cmd.arg("--socket").arg(socket).args(extra);
        back_end("iopath blk serve", socket, server, &mut cmd)
    };
    let ours = serve(&ours_sock, &["--queues", "2"]);
    let peer = qsd(&image, &peer_sock, server);
    let dd_run = |sock: &Path, mode| on_cpu(client, &cpus, || dd_once(sock, cfg, mode));
    let modes = cfg.modes();
    let mut rows: Vec<Series> = modes
        .iter()
        .map(|&m| Series::new(mode_row(m), ours.as_ref().err()))
        .collect();
    let mut peer_row = Series::new(PEER, peer.as_ref().err());
    let (size, bs, qd) = (cfg.size as u64, cfg.bs as u64, cfg.queue_depth as u32);
    let base = fio::Job::new(true, &image, size, bs, qd);
    let mut limit = Limit::new(&base, &[1 << 20, 8 << 20, bs]);
    let total = cfg.runs as u64 * (1 + rows.len()) as u64
        + limit.steps(cfg.runs)
        + cfg.small.as_ref().map_or(0, SmallConfig::steps);
    let bar = ProgressBar::new("bench blk", total);
    // One warm-up round, not counted: the first write of each path pays
    // one-time costs (the back end's first request after start, the image's
    // first touch), which showed up as a lone outlier in the first run.
    bar.set_message("warm-up");
    let _ = on_cpu(server, &cpus, || limit.warm_up(&base, server));
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
        for i in crate::turns(rows.len(), run) {
            let (mode, series) = (modes[i], &mut rows[i]);
            bar.set_message(format!("run {}: dma {}", run + 1, mode.name()));
            series.measure(|| dd_run(&ours_sock, mode));
            bar.inc(1);
        }
        bar.set_message(format!("run {}: qemu-storage-daemon", run + 1));
        peer_row.measure(|| dd_run(&peer_sock, DmaMode::Direct));
        bar.inc(1);
    }
    let small = cfg.small.as_ref().map(|s| {
        // Two more back ends, sleeping at once and never sleeping; the
        // default one is adaptive.
        let (sleep_sock, busy_sock) = (sock("iopath-sleep.sock"), sock("iopath-busy.sock"));
        let sleep = serve(&sleep_sock, &["--poll-us", "0"]);
        let busy = serve(&busy_sock, &["--poll"]);
        let be =
            |c: &Result<Spawned>, sock: &Path| Some((sock.to_path_buf(), c.as_ref().ok()?.id()));
        let backends = small::Backends {
            sleep: be(&sleep, &sleep_sock),
            adaptive: be(&ours, &ours_sock),
            busy: be(&busy, &busy_sock),
            qsd: be(&peer, &peer_sock),
        };
        small::run(cfg, s, &image, &backends, &cpus, (client, server), &bar)
    });
    bar.finish();
    drop((ours, peer));
    let mut lim_row = Series::new(if limit.is_fio() { FIO_LIMIT } else { OWN_LIMIT }, None);
    lim_row.runs = limit.runs().to_vec();
    let all = std::iter::once(lim_row).chain(rows).chain([peer_row]);
    let servers = "the back end, qemu-storage-daemon and fio";
    let in_ram = crate::fs_type(&image) == Some(crate::TMPFS_MAGIC);
    let m = Measured {
        cfg: cfg.clone(),
        image_on: if in_ram { "RAM (tmpfs)" } else { "disk" },
        placement: cfg.placement.describe(&cpus, "the driver", servers),
        image,
        rows: all.collect(),
        limit,
        small,
    };
    Ok(m.report())
}

/// `/dev/shm` if it is a tmpfs with room for `size` bytes and the machine
/// has that much memory available with 2 GiB to spare.
#[allow(clippy::unnecessary_cast)] // statfs field types differ by target
fn ram_dir(size: u64) -> Option<PathBuf> {
    let dir = PathBuf::from("/dev/shm");
    let st = rustix::fs::statfs(&dir).ok()?;
    let free = st.f_bavail as u64 * st.f_bsize as u64;
    let avail = iopath_sys::limits::meminfo("MemAvailable")?;
    let need = size + (2 << 30);
    let tmpfs = st.f_type as i64 == crate::TMPFS_MAGIC;
    (tmpfs && free >= need && avail >= need).then_some(dir)
}

/// Starts `cmd` (`name` in messages) on `cpu`, its log beside `socket`,
/// stopped with SIGTERM first when dropped, and waits (20 s at most) until
/// it listens there.
fn back_end(
    name: &'static str,
    socket: &Path,
    cpu: Option<usize>,
    cmd: &mut Command,
) -> Result<Spawned> {
    let _ = std::fs::remove_file(socket);
    let mut c =
        crate::place::spawn(name, Some(socket.with_extension("log")), cpu, cmd)?.term_first();
    c.wait_for("its socket", Duration::from_secs(20), || socket.exists())?;
    Ok(c)
}

/// `qemu-storage-daemon` exporting `image` as vhost-user-blk with direct
/// I/O.
fn qsd(image: &Path, socket: &Path, cpu: Option<usize>) -> Result<Spawned> {
    if let Some(m) = Missing::QSD.check() {
        return Err(Error::MissingPeer(m));
    }
    let mut cmd = Command::new(Missing::QSD.program);
    let file = "driver=file,node-name=disk,filename";
    let export = "type=vhost-user-blk,id=exp,node-name=disk,addr.type=unix,addr.path";
    let (img, sock) = (image.display(), socket.display());
    cmd.arg("--blockdev")
        .arg(format!("{file}={img},cache.direct=on,aio=io_uring"));
    cmd.arg("--export")
        .arg(format!("{export}={sock},writable=on"));
    back_end(Missing::QSD.program, socket, cpu, &mut cmd)
}
