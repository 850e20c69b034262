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
use serde::Serialize;

use crate::blk_dd::{self, DdArgs, DmaMode, Op, Pattern, Stats};

/// Arguments of `iopath bench blk`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchBlkArgs {
    /// Bytes written per run (the image is this large).
    #[arg(long, default_value = "8G", value_parser = blk_dd::parse_size)]
    pub size: u64,
    /// Runs per row.
    #[arg(long, default_value_t = 10)]
    pub runs: usize,
    /// Block size of every transfer.
    #[arg(long, default_value = "8M", value_parser = blk_dd::parse_size)]
    pub bs: u64,
    /// Blocks in flight.
    #[arg(long, default_value_t = 4)]
    pub queue_depth: usize,
    /// Directory for the image file (its file system is what is measured).
    #[arg(long, default_value = "/var/tmp")]
    pub dir: PathBuf,
    /// DMA modes to measure (default: all).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub modes: Vec<DmaMode>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
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

/// Waits until `path` exists (the back end listens) or the child exits.
fn wait_for_socket(child: &mut Reaped, path: &Path, what: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !path.exists() {
        if let Some(st) = child.0.try_wait()? {
            bail!("{what} exited before listening ({st})");
        }
        if Instant::now() > deadline {
            bail!("{what} did not create {} within 20 s", path.display());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// Starts `iopath blk serve` (this executable) on `image`.
pub fn start_iopath_serve(image: &Path, socket: &Path) -> Result<impl Drop> {
    let exe = std::env::current_exe().context("cannot find the iopath executable")?;
    let _ = std::fs::remove_file(socket);
    let child = Command::new(exe)
        .args(["blk", "serve", "--image"])
        .arg(image)
        .arg("--socket")
        .arg(socket)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .context("cannot start `iopath blk serve`")?;
    let mut c = Reaped(child);
    wait_for_socket(&mut c, socket, "iopath blk serve")?;
    Ok(c)
}

/// Starts `qemu-storage-daemon` exporting `image` as vhost-user-blk with
/// direct I/O.
pub fn start_qsd(image: &Path, socket: &Path) -> Result<impl Drop> {
    let _ = std::fs::remove_file(socket);
    let child = Command::new("qemu-storage-daemon")
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
        .spawn()
        .context("cannot start qemu-storage-daemon (package qemu-utils)")?;
    let mut c = Reaped(child);
    wait_for_socket(&mut c, socket, "qemu-storage-daemon")?;
    Ok(c)
}

/// fio's O_DIRECT sequential write of `image`: GiB/s of one run.
fn fio_once(image: &Path, size: u64, bs: u64, depth: usize) -> Result<f64> {
    let out = Command::new("fio")
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
        .stderr(Stdio::inherit())
        .output()
        .context("cannot run fio (package fio)")?;
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

fn dd_rows(socket: &Path, args: &BenchBlkArgs, dma: DmaMode) -> Result<Vec<f64>> {
    let dd = DdArgs {
        socket: socket.to_path_buf(),
        bs: args.bs,
        count: args.size / args.bs,
        op: Op::Write,
        pattern: Pattern::Zero,
        verify: false,
        dma,
        runs: args.runs,
        queue_depth: args.queue_depth,
        queues: 1,
        offset: 0,
        json: false,
    };
    let rep = blk_dd::dd(&dd, !args.json)?;
    Ok(rep.runs.iter().map(|r| r.gib_per_s).collect())
}

/// Runs the bench and returns the table.
///
/// # Errors
/// Bad arguments, an image that cannot be created, fio missing or failing.
/// A row whose back end cannot run is reported as skipped, not an error.
pub fn bench(args: &BenchBlkArgs) -> Result<BenchBlkReport> {
    if args.bs == 0 || args.size < args.bs || args.size % args.bs != 0 {
        bail!("--size must be a positive multiple of --bs");
    }
    if args.runs == 0 {
        bail!("--runs must be at least 1");
    }
    let work = tempfile::Builder::new()
        .prefix("iopath-bench-blk.")
        .tempdir_in(&args.dir)
        .with_context(|| format!("cannot create a directory in {}", args.dir.display()))?;
    let image = work.path().join("disk.img");
    let socket = work.path().join("blk.sock");
    make_image(&image, args.size)?;

    let mut rows = Vec::new();
    let mut fio = Vec::new();
    for _ in 0..args.runs {
        fio.push(fio_once(&image, args.size, args.bs, args.queue_depth)?);
    }
    let limit = Stats::of(&fio).median;
    rows.push(row("fio O_DIRECT write (limit)", fio, limit));

    let modes = if args.modes.is_empty() {
        DmaMode::ALL.to_vec()
    } else {
        args.modes.clone()
    };
    for mode in modes {
        let name = format!("iopath blk serve, dma {}", mode.name());
        let r = start_iopath_serve(&image, &socket)
            .and_then(|_server| dd_rows(&socket, args, mode));
        rows.push(match r {
            Ok(runs) => row(&name, runs, limit),
            Err(e) => skipped(&name, format!("{e:#}")),
        });
    }
    let name = "qemu-storage-daemon (peer), dma direct";
    let r = start_qsd(&image, &socket).and_then(|_qsd| dd_rows(&socket, args, DmaMode::Direct));
    rows.push(match r {
        Ok(runs) => row(name, runs, limit),
        Err(e) => skipped(name, format!("{e:#}")),
    });
    Ok(BenchBlkReport {
        bytes: args.size,
        bs: args.bs,
        queue_depth: args.queue_depth,
        runs: args.runs,
        image,
        rows,
    })
}

/// Prints the table (markdown).
pub fn print_table(rep: &BenchBlkReport) {
    println!(
        "bench blk: {} MiB per run in {} KiB blocks, queue depth {}, {} runs per row",
        rep.bytes >> 20,
        rep.bs >> 10,
        rep.queue_depth,
        rep.runs
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
}

/// `iopath bench blk`.
///
/// # Errors
/// As [`bench`].
pub fn run(args: &BenchBlkArgs) -> Result<()> {
    let rep = bench(args)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rep)?);
    } else {
        print_table(&rep);
    }
    Ok(())
}
