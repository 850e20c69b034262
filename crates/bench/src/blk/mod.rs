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
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use iopath_blk::dd::DdConfig;
use iopath_blk::workload::{self, Access, Op, Pattern, Stats, Workload};
use iopath_heap::error_chain;
use serde::Serialize;

use crate::direct::DirectJob;
use crate::error::{check_failed, invalid};
use crate::limit::Limit;
use crate::place::{on_cpu, spawn_on, Cpus, Placement};
use crate::{fio, Error, Missing, Progress, Result};

/// The DMA ops of a row: the override `iopath blk dd --dma` gives.
pub use iopath_blk::dd::DmaMode;

/// What `iopath bench blk` measures.
#[derive(Debug, Clone)]
pub struct BlkConfig {
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
    /// Also a Linux guest's dd (scripts/guest-dd) on each back end.
    pub guest: bool,
    /// The `iopath` executable whose `blk serve` is iopath's back end.
    pub iopath: PathBuf,
    /// Show progress on stderr.
    pub progress: bool,
    /// The small-block table (4 KiB random I/O), when asked for.
    pub small: Option<SmallConfig>,
}

impl BlkConfig {
    /// The embedded defaults of `iopath bench`: 256 MiB in 8 MiB blocks,
    /// 4 in flight, 3 runs, every mode, split placement.
    pub fn quick(iopath: PathBuf) -> BlkConfig {
        BlkConfig {
            size: 256 << 20,
            runs: 3,
            bs: 8 << 20,
            queue_depth: 4,
            dir: None,
            modes: Vec::new(),
            placement: Placement::Split,
            guest: false,
            iopath,
            progress: true,
            small: Some(SmallConfig::quick()),
        }
    }

    /// The full sizes: `dd bs=8M count=1024` (8 GiB) x 10 runs
    /// per DMA mode.
    pub fn full(iopath: PathBuf) -> BlkConfig {
        BlkConfig {
            size: 8 << 30,
            runs: 10,
            small: Some(SmallConfig::full()),
            ..BlkConfig::quick(iopath)
        }
    }

    /// A rough duration, from nominal rates on a 2-vCPU VM (2 GiB/s per
    /// dd or fio pass and for the image's first touch).
    pub fn estimate(&self) -> Duration {
        let gib = self.size as f64 / f64::from(1u32 << 30);
        let modes = if self.modes.is_empty() {
            4
        } else {
            self.modes.len()
        };
        // Every run: the modes, the peer, the limit; a warm-up round; the sweep.
        // Every run: the modes and the peer; the limit's sweep (6 fio passes
        // at the default bs) in the first runs, its best alone after; a
        // warm-up round.
        let swept = self.runs.min(crate::limit::SWEEP_RUNS);
        let passes = (self.runs + 1) * (modes + 1) + swept * 6 + (self.runs - swept) + 1;
        // A guest run: about 20 s of boot and checks under TCG, its dd at
        // some 50 MB/s direct, 15 MB/s bounced behind the vIOMMU.
        let guest = if self.guest {
            self.runs as f64 * (3.0 * 20.0 + gib * (2.0 / 0.05 + 1.0 / 0.015))
        } else {
            0.0
        };
        // The small-block table: some 10k requests per second at worst.
        let small = self.small.as_ref().map_or(0.0, |s| {
            small::steps(s) as f64 * (s.count as f64 / 10_000.0 + 0.1)
        });
        Duration::from_secs_f64(passes as f64 * gib / 2.0 + guest + gib / 2.0 + 3.0 + small)
    }
}

/// One row of the table.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// What was measured.
    pub name: String,
    /// Throughput of each run, GiB/s.
    pub runs_gib_per_s: Vec<f64>,
    /// Median, min, max, spread of the runs (null when skipped).
    pub stats: Stats,
    /// Median as a fraction of the limit's median (null when skipped).
    pub of_limit: Option<f64>,
    /// Why the row has no figures, when it has none.
    pub skipped: Option<String>,
    /// The peer this machine lacks, when that is why.
    pub missing: Option<Missing>,
}

impl Row {
    fn measured(&self) -> bool {
        self.skipped.is_none()
    }
}

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

/// A child process killed (and reaped) on drop.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        // SIGTERM first so `iopath blk serve` removes its socket.
        let pid = rustix::process::Pid::from_child(&self.0);
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The first error line of a log file (else its last line), for messages.
fn last_line(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    lines
        .iter()
        .find(|l| l.contains("error"))
        .or(lines.last())
        .copied()
        .unwrap_or("")
        .to_string()
}

/// A log file beside the socket for a child's stderr.
fn log_for(socket: &Path) -> Result<(PathBuf, std::fs::File)> {
    let log = socket.with_extension("log");
    let f = std::fs::File::create(&log).map_err(Error::io(&log))?;
    Ok((log, f))
}

/// Waits until `path` exists (the back end listens) or the child exits.
fn wait_for_socket(child: &mut Reaped, path: &Path, what: &str, log: &Path) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !path.exists() {
        if let Some(st) = child
            .0
            .try_wait()
            .map_err(Error::sys("waiting for a child"))?
        {
            return Err(Error::Peer {
                program: what.into(),
                reason: format!("exited before listening ({st}): {}", last_line(log)),
            });
        }
        if Instant::now() > deadline {
            check_failed!("{what} did not create {} within 20 s", path.display());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// Starts `iopath blk serve` on `image` with `extra` arguments, pinned
/// to `cpu`.
fn start_iopath_serve_on(
    exe: &Path,
    image: &Path,
    socket: &Path,
    cpu: Option<usize>,
    extra: &[&str],
) -> Result<Reaped> {
    let _ = std::fs::remove_file(socket);
    let (log, err) = log_for(socket)?;
    let child = spawn_on(
        cpu,
        Command::new(exe)
            .args(["blk", "serve", "--image"])
            .arg(image)
            .arg("--socket")
            .arg(socket)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err),
    )?;
    let mut c = Reaped(child);
    wait_for_socket(&mut c, socket, "iopath blk serve", &log)?;
    Ok(c)
}

/// Starts `qemu-storage-daemon` exporting `image` as vhost-user-blk with
/// direct I/O, pinned to `cpu`.
fn start_qsd_on(image: &Path, socket: &Path, cpu: Option<usize>) -> Result<Reaped> {
    if let Some(m) = Missing::QSD.check() {
        return Err(Error::MissingPeer {
            program: m.program,
            package: m.package,
        });
    }
    let _ = std::fs::remove_file(socket);
    let (log, err) = log_for(socket)?;
    let child = spawn_on(
        cpu,
        Command::new(Missing::QSD.program)
            .arg("--blockdev")
            .arg(format!(
                "driver=file,node-name=disk,filename={},cache.direct=on,aio=io_uring",
                image.display()
            ))
            .arg("--export")
            .arg(format!(
                "type=vhost-user-blk,id=exp,node-name=disk,addr.type=unix,addr.path={},writable=on",
                socket.display()
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err),
    )?;
    let mut c = Reaped(child);
    wait_for_socket(&mut c, socket, Missing::QSD.program, &log)?;
    Ok(c)
}

/// `/dev/shm` if it is a tmpfs with room for `size` bytes and the machine
/// has that much memory available with 2 GiB to spare.
#[allow(clippy::unnecessary_cast)] // statfs field types differ by target
fn ram_dir(size: u64) -> Option<PathBuf> {
    let dir = PathBuf::from("/dev/shm");
    let st = rustix::fs::statfs(&dir).ok()?;
    let free = st.f_bavail as u64 * st.f_bsize as u64;
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let avail_kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    let spare = 2u64 << 30;
    (ram_backed(&dir) && free >= size + spare && avail_kib * 1024 >= size + spare).then_some(dir)
}

/// Whether `path` lies on a tmpfs.
#[allow(clippy::unnecessary_cast)] // statfs field types differ by target
fn ram_backed(path: &Path) -> bool {
    rustix::fs::statfs(path).is_ok_and(|st| st.f_type as i64 == crate::TMPFS_MAGIC)
}

/// Creates (or reuses) a fully allocated image of `size` bytes.
fn make_image(path: &Path, size: u64) -> Result<()> {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(Error::io(path))?;
    // Allocate every block up front so no run pays for allocation.
    rustix::fs::fallocate(&f, rustix::fs::FallocateFlags::empty(), 0, size).map_err(|e| {
        Error::Io {
            path: path.to_path_buf(),
            source: e.into(),
        }
    })?;
    Ok(())
}

/// The error of a lower layer (driver, transport, DMA ops, workload).
fn driver_err<E: std::error::Error + Send + Sync + 'static>(
    context: &str,
) -> impl FnOnce(E) -> Error + '_ {
    move |e| Error::Driver {
        context: context.to_string(),
        source: Box::new(e),
    }
}

/// One dd run of iopath's driver through the workload API against the
/// back end on `socket`, with `mode`'s override of the platform policy
/// (direct platform, swiotlb's default bounce geometry): GiB/s.
fn dd_once(socket: &Path, cfg: &BlkConfig, mode: DmaMode) -> Result<f64> {
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
    let report = iopath_blk::dd::run(&dd, &()).map_err(driver_err("dd"))?;
    Ok(report.runs[0].gib_per_s)
}

/// A row being measured: its runs so far, or why it cannot run.
struct Series {
    name: String,
    runs: Vec<f64>,
    failed: Option<String>,
    missing: Option<Missing>,
}

impl Series {
    fn new(name: String, failed: Option<&Error>) -> Self {
        let missing = match failed {
            Some(Error::MissingPeer { program, package }) => Some(Missing { program, package }),
            _ => None,
        };
        Series {
            name,
            runs: Vec::new(),
            failed: failed.map(|e| match &missing {
                Some(m) => m.note(),
                None => error_chain(e),
            }),
            missing,
        }
    }

    fn measure(&mut self, f: impl FnOnce() -> Result<f64>) {
        if self.failed.is_none() {
            match f() {
                Ok(v) => self.runs.push(v),
                Err(e) => self.failed = Some(error_chain(&e)),
            }
        }
    }

    fn row(self, limit: f64) -> Row {
        match self.failed {
            Some(why) => Row {
                name: self.name,
                runs_gib_per_s: Vec::new(),
                stats: Stats::of(&[]),
                of_limit: None,
                skipped: Some(why),
                missing: self.missing,
            },
            None => {
                let stats = Stats::of(&self.runs);
                Row {
                    name: self.name,
                    runs_gib_per_s: self.runs,
                    of_limit: (limit > 0.0).then(|| stats.median / limit),
                    stats,
                    skipped: None,
                    missing: None,
                }
            }
        }
    }
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
pub fn run(cfg: &BlkConfig) -> Result<BlkReport> {
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
    let bar = Progress::new(cfg.progress, "bench blk", total);
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
        let pid = |c: &Result<Reaped>| c.as_ref().ok().map(|c| c.0.id());
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

mod guest_rows;
mod report;
mod small;
mod small_report;

pub use small::{SmallConfig, SmallReport, SmallRow, SmallRun};

use guest_rows::{GuestRows, GUEST_OURS, GUEST_PEER, GUEST_SWIOTLB};
