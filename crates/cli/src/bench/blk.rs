//! `iopath bench blk`: the 2018 "virtio uses the DMA API" experiment.
//!
//! The same dd (a virtio-blk driver writing `--size` bytes in 8 MiB blocks)
//! once per DMA mode against iopath's own back end (`iopath blk serve`,
//! started here), `--runs` runs each; a peer row with the same driver
//! against `qemu-storage-daemon` exporting the same image; and the limit:
//! fio's `O_DIRECT` sequential write of the same image file, measured in the
//! same run.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use iopath_bench::place::{on_cpu, spawn_on, Cpus};
use iopath_blk::workload::{Access, Op, Pattern, Stats};
use iopath_virtio::Platform;

use super::PlacementArg;
use crate::blk_dd::{self, DdArgs, DmaMode};

/// Arguments of `iopath bench blk`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchBlkArgs {
    /// Bytes written per run (the image is this large).
    #[arg(long, default_value = "8G", value_parser = crate::size::parse_size)]
    pub size: usize,
    /// Runs per row.
    #[arg(long, default_value_t = 10)]
    pub runs: usize,
    /// Block size of every transfer.
    #[arg(long, default_value = "8M", value_parser = crate::size::parse_size)]
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
    /// oflag=direct`, as in the 2018 thread.
    #[arg(long)]
    pub guest: bool,
}

/// One row of the table.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// What was measured.
    pub name: String,
    /// Throughput of each run, GiB/s.
    pub runs_gib_per_s: Vec<f64>,
    /// Median, min, max, spread of the runs.
    pub stats: Stats,
    /// Median as a fraction of the fio limit's median.
    pub of_limit: f64,
    /// Why the row has no figures, when it has none.
    pub skipped: Option<String>,
}

/// What `bench blk --json` prints.
#[derive(Debug, Clone, Serialize)]
pub struct BenchBlkReport {
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
    /// Rows: limit first, then each DMA mode, then the peer.
    pub rows: Vec<Row>,
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
    let f =
        std::fs::File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
    Ok((log, f))
}

/// Waits until `path` exists (the back end listens) or the child exits.
fn wait_for_socket(child: &mut Reaped, path: &Path, what: &str, log: &Path) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !path.exists() {
        if let Some(st) = child.0.try_wait()? {
            bail!("{what} exited before listening ({st}): {}", last_line(log));
        }
        if Instant::now() > deadline {
            bail!("{what} did not create {} within 20 s", path.display());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// Starts `iopath blk serve` (this executable) on `image`, pinned to `cpu`.
fn start_iopath_serve_on(image: &Path, socket: &Path, cpu: Option<usize>) -> Result<impl Drop> {
    let exe = std::env::current_exe().context("cannot find the iopath executable")?;
    let _ = std::fs::remove_file(socket);
    let (log, err) = log_for(socket)?;
    let child = spawn_on(
        cpu,
        Command::new(exe)
            .args(["blk", "serve", "--image"])
            .arg(image)
            .arg("--socket")
            .arg(socket)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err),
    )
    .context("cannot start `iopath blk serve`")?;
    let mut c = Reaped(child);
    wait_for_socket(&mut c, socket, "iopath blk serve", &log)?;
    Ok(c)
}

/// Starts `qemu-storage-daemon` exporting `image` as vhost-user-blk with
/// direct I/O, pinned to `cpu`.
fn start_qsd_on(image: &Path, socket: &Path, cpu: Option<usize>) -> Result<impl Drop> {
    let _ = std::fs::remove_file(socket);
    let (log, err) = log_for(socket)?;
    let child = spawn_on(
        cpu,
        Command::new("qemu-storage-daemon")
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
    )
    .context("cannot start qemu-storage-daemon (package qemu-utils)")?;
    let mut c = Reaped(child);
    wait_for_socket(&mut c, socket, "qemu-storage-daemon", &log)?;
    Ok(c)
}

/// fio's O_DIRECT sequential write of `image`: GiB/s of one run.
fn fio_once(image: &Path, size: u64, bs: u64, depth: usize, cpu: Option<usize>) -> Result<f64> {
    let child = spawn_on(
        cpu,
        Command::new("fio")
            .args([
                "--name=limit",
                "--rw=write",
                "--direct=1",
                "--ioengine=io_uring",
                "--output-format=json",
                "--end_fsync=0",
            ])
            .arg(format!("--filename={}", image.display()))
            .arg(format!("--bs={bs}"))
            .arg(format!("--size={size}"))
            .arg(format!("--iodepth={depth}"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit()),
    )
    .context("cannot run fio (package fio)")?;
    let out = child.wait_with_output().context("waiting for fio")?;
    if !out.status.success() {
        bail!("fio failed ({})", out.status);
    }
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).context("fio printed no JSON")?;
    let bw = v["jobs"][0]["write"]["bw_bytes"]
        .as_f64()
        .context("fio JSON lacks jobs[0].write.bw_bytes")?;
    Ok(bw / f64::from(1u32 << 30))
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
    rustix::fs::statfs(path).is_ok_and(|st| st.f_type as i64 == iopath_bench::TMPFS_MAGIC)
}

/// Creates (or reuses) a fully allocated image of `size` bytes.
fn make_image(path: &Path, size: u64) -> Result<()> {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    // Allocate every block up front so no run pays for allocation.
    rustix::fs::fallocate(&f, rustix::fs::FallocateFlags::empty(), 0, size)
        .with_context(|| format!("cannot allocate {size} bytes for {}", path.display()))?;
    Ok(())
}

fn row(name: &str, runs: Vec<f64>, limit: f64) -> Row {
    let stats = Stats::of(&runs);
    Row {
        name: name.to_string(),
        runs_gib_per_s: runs,
        of_limit: if limit > 0.0 {
            stats.median / limit
        } else {
            0.0
        },
        stats,
        skipped: None,
    }
}

fn skipped(name: &str, why: String) -> Row {
    Row {
        name: name.to_string(),
        runs_gib_per_s: Vec::new(),
        stats: Stats::of(&[]),
        of_limit: 0.0,
        skipped: Some(why),
    }
}

fn dd_once(socket: &Path, args: &BenchBlkArgs, dma: DmaMode) -> Result<f64> {
    let dd = DdArgs {
        socket: socket.to_path_buf(),
        bs: args.bs,
        count: (args.size / args.bs) as u64,
        op: Op::Write,
        pattern: Pattern::Zero,
        access: Access::Seq,
        seed: 0,
        verify: false,
        platform: Platform::Direct,
        dma: Some(dma),
        bounce_window: None,
        bounce_slot: None,
        runs: 1,
        queue_depth: args.queue_depth,
        queues: 1,
        offset: 0,
        json: false,
    };
    let rep = blk_dd::dd(&dd, false)?;
    Ok(rep.runs[0].gib_per_s)
}

/// A row being measured: its runs so far, or why it cannot run.
struct Series {
    name: String,
    runs: Vec<f64>,
    failed: Option<String>,
}

impl Series {
    fn new(name: String, failed: Option<String>) -> Self {
        Series {
            name,
            runs: Vec::new(),
            failed,
        }
    }

    fn measure(&mut self, f: impl FnOnce() -> Result<f64>) {
        if self.failed.is_none() {
            match f() {
                Ok(v) => self.runs.push(v),
                Err(e) => self.failed = Some(format!("{e:#}")),
            }
        }
    }

    fn row(self, limit: f64) -> Row {
        match self.failed {
            Some(why) => skipped(&self.name, why),
            None => row(&self.name, self.runs, limit),
        }
    }
}

/// Runs the bench and returns the table. Rows are interleaved run by run
/// (fio, each DMA mode in a rotating order, the peer, then again), so slow
/// drift of the machine spreads over every row instead of biasing one.
///
/// # Errors
/// Bad arguments, an image that cannot be created, fio missing or failing.
/// A row whose back end cannot run is reported as skipped, not an error.
pub fn bench(args: &BenchBlkArgs) -> Result<BenchBlkReport> {
    if args.bs == 0 || args.bs % 512 != 0 || args.size < args.bs || args.size % args.bs != 0 {
        bail!("--size must be a positive multiple of --bs, itself a multiple of 512");
    }
    if args.runs == 0 {
        bail!("--runs must be at least 1");
    }
    if !iopath_bench::fio::available() {
        bail!("fio is not installed (package fio): it measures the limit row");
    }
    let dir = match &args.dir {
        Some(d) => d.clone(),
        None => match ram_dir(args.size as u64) {
            Some(d) => d,
            None => iopath_bench::scratch_dir()?,
        },
    };
    let work = tempfile::Builder::new()
        .prefix("iopath-bench-blk.")
        .tempdir_in(&dir)
        .with_context(|| format!("cannot create a directory in {}", dir.display()))?;
    let image = work.path().join("disk.img");
    make_image(&image, args.size as u64)?;
    let ours_sock = work.path().join("iopath.sock");
    let peer_sock = work.path().join("qsd.sock");
    let cpus = Cpus::get()?;
    let (client, server) = iopath_bench::Placement::from(args.placement).cpus(&cpus);
    let ours = start_iopath_serve_on(&image, &ours_sock, server);
    let peer = start_qsd_on(&image, &peer_sock, server);
    let fio_run = || {
        fio_once(
            &image,
            args.size as u64,
            args.bs as u64,
            args.queue_depth,
            server,
        )
    };
    let dd_run = |sock: &Path, mode| -> Result<f64> {
        on_cpu(client, &cpus, || Ok(dd_once(sock, args, mode)))?
    };

    let modes = if args.modes.is_empty() {
        DmaMode::ALL.to_vec()
    } else {
        args.modes.clone()
    };
    let mut fio = Series::new("fio O_DIRECT write (limit)".into(), None);
    let mut rows: Vec<(DmaMode, Series)> = modes
        .iter()
        .map(|&m| {
            let failed = ours.as_ref().err().map(|e| format!("{e:#}"));
            (
                m,
                Series::new(format!("iopath blk serve, dma {}", m.name()), failed),
            )
        })
        .collect();
    let mut peer_row = Series::new(
        "qemu-storage-daemon (peer), dma direct".into(),
        peer.as_ref().err().map(|e| format!("{e:#}")),
    );
    // --guest: a Linux guest's dd on each back end's socket.
    let script = args.guest.then(iopath_bench::guest::prepare);
    let mut guest_rows: Vec<(&Path, Series)> = Vec::new();
    if let Some(script) = &script {
        for (sock, name, backend) in [
            (&ours_sock, GUEST_OURS, ours.as_ref().err()),
            (&peer_sock, GUEST_PEER, peer.as_ref().err()),
        ] {
            let failed = match (&script, backend) {
                (Err(e), _) => Some(format!("{e:#}")),
                (_, Some(e)) => Some(format!("{e:#}")),
                _ => None,
            };
            guest_rows.push((sock, Series::new(name.into(), failed)));
        }
    }
    let total = args.runs * (2 + rows.len() + guest_rows.len());
    let bar = if args.json {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(total as u64)
    };
    bar.set_style(
        ProgressStyle::with_template("bench blk [{bar:30}] {pos}/{len} {msg}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    // One warm-up round, not counted: the first write of each path pays
    // one-time costs (the back end's first request after start, the image's
    // first touch), which showed up as a lone outlier in the first run.
    bar.set_message("warm-up");
    let _ = fio_run();
    if ours.is_ok() {
        for &mode in &modes {
            let _ = dd_run(&ours_sock, mode);
        }
    }
    if peer.is_ok() {
        let _ = dd_run(&peer_sock, DmaMode::Direct);
    }
    for run in 0..args.runs {
        bar.set_message(format!("run {}: fio", run + 1));
        fio.measure(fio_run);
        bar.inc(1);
        // Rotate the modes' order from run to run, so none always runs
        // right after fio or right before the peer.
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
        for (sock, series) in &mut guest_rows {
            bar.set_message(format!("run {}: {}", run + 1, series.name));
            series.measure(|| match &script {
                Some(Ok(script)) => Ok(iopath_bench::guest::dd_once(
                    script,
                    sock,
                    args.bs as u64,
                    (args.size / args.bs) as u64,
                )?),
                _ => bail!("the guest is not prepared"),
            });
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    drop((ours, peer));
    if let Some(why) = fio.failed.take() {
        bail!("fio failed: {why}");
    }
    let limit = Stats::of(&fio.runs).median;
    let mut out = vec![fio.row(limit)];
    out.extend(rows.into_iter().map(|(_, s)| s.row(limit)));
    out.push(peer_row.row(limit));
    out.extend(guest_rows.into_iter().map(|(_, s)| s.row(limit)));
    Ok(BenchBlkReport {
        bytes: args.size as u64,
        bs: args.bs as u64,
        queue_depth: args.queue_depth,
        runs: args.runs,
        image_on: if ram_backed(&image) {
            "RAM (tmpfs)".into()
        } else {
            "disk".into()
        },
        placement: iopath_bench::Placement::from(args.placement).describe(
            &cpus,
            "the driver",
            "the back end, qemu-storage-daemon and fio",
        ),
        image,
        rows: out,
    })
}

/// `iopath bench` without a subcommand: a short run (256 MiB, 3 runs).
///
/// # Errors
/// As [`bench`].
pub fn run_default(json: bool) -> Result<serde_json::Value> {
    let args = BenchBlkArgs {
        size: 256 << 20,
        runs: 3,
        bs: 8 << 20,
        queue_depth: 4,
        dir: None,
        modes: Vec::new(),
        placement: PlacementArg::Split,
        json,
        guest: false,
    };
    let rep = bench(&args)?;
    if !json {
        print_table(&rep);
    }
    report_json(&rep)
}

/// Prints the table (markdown).
pub fn print_table(rep: &BenchBlkReport) {
    println!(
        "bench blk: {} MiB per run in {} KiB blocks, queue depth {}, {} runs per row; image in {} ({}); {}",
        rep.bytes >> 20,
        rep.bs >> 10,
        rep.queue_depth,
        rep.runs,
        rep.image.parent().unwrap_or(&rep.image).display(),
        rep.image_on,
        rep.placement
    );
    println!("| row | median GiB/s | min | max | spread | of limit |");
    println!("|---|---:|---:|---:|---:|---:|");
    for r in &rep.rows {
        match &r.skipped {
            Some(why) => println!("| {} | skipped: {} | | | | |", r.name, why),
            None => println!(
                "| {} | {:.3} | {:.3} | {:.3} | {:.1}% | {:.1}% |",
                r.name,
                r.stats.median,
                r.stats.min,
                r.stats.max,
                r.stats.spread * 100.0,
                r.of_limit * 100.0
            ),
        }
    }
    for (what, v) in ratios(rep) {
        match v {
            Some(v) => println!("{what}: {:.1}%", v * 100.0),
            None => println!("{what}: n/a"),
        }
    }
}

/// Row names of `--guest`.
const GUEST_OURS: &str = "guest dd (Linux, TCG) on iopath blk serve";
const GUEST_PEER: &str = "guest dd (Linux, TCG) on qemu-storage-daemon";

/// The ratios the experiment is about, from the medians: direct / limit,
/// direct-static / direct, iommu / direct, bounce / direct, iopath's back
/// end / qemu-storage-daemon (both with direct ops); with `--guest`, the
/// guest's dd on iopath's back end / on qemu-storage-daemon.
pub fn ratios(rep: &BenchBlkReport) -> Vec<(&'static str, Option<f64>)> {
    let median = |prefix: &str| {
        rep.rows
            .iter()
            .find(|r| r.name == prefix && r.skipped.is_none())
            .map(|r| r.stats.median)
    };
    let direct = median("iopath blk serve, dma direct");
    let div = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    };
    let mut v = vec![
        (
            "direct / fio limit",
            div(direct, median("fio O_DIRECT write (limit)")),
        ),
        (
            "direct-static / direct",
            div(median("iopath blk serve, dma direct-static"), direct),
        ),
        (
            "iommu / direct",
            div(median("iopath blk serve, dma iommu"), direct),
        ),
        (
            "bounce / direct",
            div(median("iopath blk serve, dma bounce"), direct),
        ),
        (
            "iopath blk serve / qemu-storage-daemon (dma direct)",
            div(direct, median("qemu-storage-daemon (peer), dma direct")),
        ),
    ];
    if rep.rows.iter().any(|r| r.name == GUEST_OURS) {
        v.push((
            "guest dd: iopath blk serve / qemu-storage-daemon",
            div(median(GUEST_OURS), median(GUEST_PEER)),
        ));
    }
    v
}

/// The report as JSON, with the ratios under `ratios`.
fn report_json(rep: &BenchBlkReport) -> Result<serde_json::Value> {
    let mut v = serde_json::to_value(rep)?;
    let r: serde_json::Map<String, serde_json::Value> = ratios(rep)
        .into_iter()
        .map(|(k, v)| (k.to_string(), serde_json::json!(v)))
        .collect();
    v["ratios"] = serde_json::Value::Object(r);
    Ok(v)
}

/// `iopath bench blk`.
///
/// # Errors
/// As [`bench`].
pub fn run(args: &BenchBlkArgs) -> Result<()> {
    let rep = bench(args)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report_json(&rep)?)?);
    } else {
        print_table(&rep);
    }
    Ok(())
}
