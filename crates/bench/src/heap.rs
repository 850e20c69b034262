//! `iopath bench heap`: the `DMA_BUF_IOCTL_RW_FILE` thread's experiment on
//! this machine. N buffers of one size are filled from a cold file with every
//! heap and method that works here; the best of a small sweep of fio's
//! O_DIRECT io_uring sequential read of the same file (block sizes 1 MiB and
//! 8 MiB, queue depths 4, 16, 64), run beside them, is the limit. Without
//! fio the limit is the bench's own plain O_DIRECT read of the file at the
//! same queue depth, labelled so.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use iopath_heap::{load, open_heap, EngineOptions, Heap, IoFile, LoadOptions, Method};

use crate::direct::DirectJob;
use crate::error::{check_failed, invalid};
use crate::limit::Limit;
use crate::{fio, human, scratch_dir, Error, Progress, Result, Summary};

const HEAPS: [&str; 5] = ["memfd", "memfd:thp", "memfd:hugetlb", "udmabuf", "dma-heap"];

/// What `iopath bench heap` measures.
#[derive(Debug, Clone)]
pub struct HeapConfig {
    /// Read this file (it must hold buffers x buffer-size bytes).
    pub file: Option<PathBuf>,
    /// Without `file`: make a scratch file of this size in /var/tmp (or the
    /// current directory, never a tmpfs), removed afterwards [default 1 GiB].
    pub size: Option<usize>,
    /// Buffers per load [default: file size / buffer size].
    pub buffers: Option<usize>,
    /// Bytes per buffer.
    pub buffer_size: usize,
    /// Runs per row (median and spread are reported).
    pub runs: usize,
    /// Heaps to try [empty: all; absent ones are listed as skipped].
    pub heaps: Vec<String>,
    /// Methods to try, by name [empty: all].
    pub methods: Vec<String>,
    /// io_uring requests in flight.
    pub queue_depth: u32,
    /// Show progress on stderr.
    pub progress: bool,
}

impl HeapConfig {
    /// The embedded defaults of `iopath bench`: a 256 MiB scratch file,
    /// 8 x 32 MiB buffers, 3 runs.
    pub fn quick() -> HeapConfig {
        HeapConfig {
            file: None,
            size: Some(256 << 20),
            buffers: Some(8),
            buffer_size: 32 << 20,
            runs: 3,
            heaps: Vec::new(),
            methods: Vec::new(),
            queue_depth: 16,
            progress: true,
        }
    }
}

impl HeapConfig {
    /// The thread's sizes: a 1 GiB file into 32 x 32 MiB buffers, 3 runs.
    pub fn full() -> HeapConfig {
        HeapConfig {
            size: Some(1 << 30),
            buffers: Some(32),
            ..HeapConfig::quick()
        }
    }

    /// A rough duration, from nominal rates on a 2-vCPU VM: 0.7 GiB/s per
    /// load, 10 heap x method rows, the limit's sweep (6 fio passes a run)
    /// and the scratch file.
    pub fn estimate(&self) -> Duration {
        let bytes = self.buffers.unwrap_or(8) as f64 * self.buffer_size as f64;
        let gib = bytes / f64::from(1u32 << 30);
        let rows = if self.methods.is_empty() {
            10
        } else {
            2 * self.methods.len()
        };
        let swept = self.runs.min(crate::limit::SWEEP_RUNS);
        let passes = self.runs * (rows + 1) + swept * 6 + (self.runs - swept);
        Duration::from_secs_f64(passes as f64 * gib / 0.7 + gib / 0.5 + 1.0)
    }
}

/// Runs the experiment.
///
/// # Errors
/// [`Error::Invalid`] for bad settings or a file too short; I/O and heap
/// failures. A missing fio drops the limit row, not the run.
pub fn run(cfg: &HeapConfig) -> Result<HeapReport> {
    experiment(cfg)
}

/// One heap x method row.
#[derive(Debug)]
struct Row {
    heap: String,
    method: Method,
    used: Method,
    alloc_ms: Vec<f64>,
    read_ms: Vec<f64>,
    total_ms: Vec<f64>,
    gib_per_s: Vec<f64>,
    cache_growth: u64,
    fallbacks: u64,
}

/// What the heap experiment measured: print it with [`HeapReport::text`],
/// hand it to scripts with [`HeapReport::json`].
#[derive(Debug)]
pub struct HeapReport {
    /// Seconds to allocate and fault in the buffers, no I/O, per run.
    alloc_limit: Vec<f64>,
    alloc_heap: String,
    /// 1-minute load average before and after.
    loadavg: (Option<f64>, Option<f64>),
    file: PathBuf,
    fs: &'static str,
    bytes: u64,
    buffers: usize,
    buffer_size: usize,
    runs: usize,
    rows: Vec<Row>,
    limit: Limit,
    skipped: Vec<(String, String)>,
    warm_warnings: u64,
}

fn experiment(args: &HeapConfig) -> Result<HeapReport> {
    if args.runs == 0 {
        invalid!("--runs", "give at least 1");
    }
    let page = iopath_heap::page_size();
    if args.buffer_size == 0 || args.buffer_size % page != 0 {
        invalid!(
            "--buffer-size",
            "{} is not a non-zero multiple of the page size ({page})",
            args.buffer_size
        );
    }
    let methods: Vec<Method> = if args.methods.is_empty() {
        Method::ALL.to_vec()
    } else {
        args.methods
            .iter()
            .map(|m| m.parse())
            .collect::<Result<_, _>>()
            .map_err(|e: iopath_heap::Error| Error::Invalid {
                option: "--methods",
                reason: e.to_string(),
            })?
    };
    let heap_names: Vec<String> = if args.heaps.is_empty() {
        HEAPS.iter().map(|s| s.to_string()).collect()
    } else {
        args.heaps.clone()
    };
    // The file: given, or a scratch file removed when `_scratch` drops.
    let (_scratch, path) = match &args.file {
        Some(f) => (None, f.clone()),
        None => {
            let size = args.size.unwrap_or(1 << 30);
            let t = make_scratch(size as u64, args.progress)?;
            let p = t.path().to_path_buf();
            (Some(t), p)
        }
    };
    let file = IoFile::open(&path).map_err(Error::heap("opening the file to read"))?;
    let size = file
        .size()
        .map_err(Error::heap("reading the file's size"))?;
    let buffers = args
        .buffers
        .unwrap_or((size / args.buffer_size as u64) as usize)
        .max(1);
    let bytes = buffers as u64 * args.buffer_size as u64;
    if bytes > size {
        invalid!(
            "--file",
            "{} is {} bytes too short for {buffers} x {} buffers ({} bytes)",
            path.display(),
            bytes - size,
            args.buffer_size,
            bytes
        );
    }

    let mut heaps: Vec<Box<dyn Heap>> = Vec::new();
    let mut skipped = Vec::new();
    for name in &heap_names {
        match open_heap(name).and_then(|h| h.alloc(args.buffer_size).map(|_| h)) {
            Ok(h) => heaps.push(h),
            Err(e) => skipped.push((name.clone(), error_chain(&e))),
        }
    }
    if heaps.is_empty() {
        check_failed!("no heap works here: {skipped:?}");
    }
    let mut rows: Vec<Row> = heaps
        .iter()
        .flat_map(|h| {
            methods.iter().map(move |&m| Row {
                heap: h.name(),
                method: m,
                used: m,
                alloc_ms: Vec::new(),
                read_ms: Vec::new(),
                total_ms: Vec::new(),
                gib_per_s: Vec::new(),
                cache_growth: 0,
                fallbacks: 0,
            })
        })
        .collect();
    let sweep_bs = [1 << 20, 8 << 20];
    let base = fio::Job {
        dir: fio::Dir::Read,
        path: path.clone(),
        bytes,
        bs: 1 << 20,
        iodepth: args.queue_depth,
    };
    let own = DirectJob {
        write: false,
        path: path.clone(),
        bytes,
        bs: 1 << 20,
        depth: args.queue_depth,
    };
    let drop_cache = || {
        file.drop_cache()
            .map_err(Error::heap("dropping the file's cache"))
    };
    let mut limit = Limit::new(&base, &sweep_bs, own);
    let steps = args.runs as u64 * rows.len() as u64 + limit.steps(args.runs);
    let bar = Progress::new(args.progress, "bench heap", steps);
    let mut alloc_limit = Vec::new();
    let mut warm_warnings = 0;
    let load_before = loadavg();
    for run in 0..args.runs {
        limit.measure(None, &mut || drop_cache(), &bar)?;
        // The other bound: allocating and faulting in the same buffers with
        // no I/O at all (first heap).
        {
            let t = std::time::Instant::now();
            let mut held = Vec::with_capacity(buffers);
            for _ in 0..buffers {
                let b = heaps[0]
                    .alloc(args.buffer_size)
                    .map_err(Error::heap("allocating a buffer"))?;
                b.populate().map_err(Error::heap("faulting in a buffer"))?;
                held.push(b);
            }
            alloc_limit.push(t.elapsed().as_secs_f64());
            drop(held);
        }
        // Rotate the order from run to run, so that no row always runs first
        // (right after fio) or last: memory the previous row freed is cheaper
        // to allocate again on a VM than memory returned to the host.
        let nrows = rows.len();
        let shift = run * nrows / args.runs;
        for k in 0..nrows {
            let row = &mut rows[(k + shift) % nrows];
            bar.set_message(format!(
                "run {}/{}: {} {}",
                run + 1,
                args.runs,
                row.heap,
                row.method
            ));
            let heap = heaps
                .iter()
                .find(|h| h.name() == row.heap)
                .ok_or_else(|| Error::Check(format!("heap {} vanished", row.heap)))?;
            file.drop_cache()
                .map_err(Error::heap("dropping the file's cache"))?;
            let cold = file
                .cached_bytes()
                .map_err(Error::heap("counting the file's cached pages"))?;
            if cold > bytes / 100 {
                warm_warnings += 1;
                tracing::warn!(
                    "{} still has {cold} bytes cached after dropping",
                    path.display()
                );
            }
            let opts = LoadOptions {
                buffer_size: args.buffer_size,
                buffers: Some(buffers),
                method: row.method,
                engine: EngineOptions {
                    queue_depth: args.queue_depth,
                    ..EngineOptions::default()
                },
                ..LoadOptions::default()
            };
            let loaded = load(&path, heap.as_ref(), &opts, &mut |_| {})
                .map_err(Error::heap(format!("{} {}", row.heap, row.method)))?;
            let growth = file
                .cached_bytes()
                .map_err(Error::heap("counting the file's cached pages"))?
                .saturating_sub(cold);
            drop(loaded.buffers);
            let s = loaded.stats;
            row.used = s.method;
            row.alloc_ms.push(s.alloc_time.as_secs_f64() * 1e3);
            row.read_ms.push(s.read_time.as_secs_f64() * 1e3);
            row.total_ms.push(s.elapsed.as_secs_f64() * 1e3);
            row.gib_per_s.push(s.gib_per_s());
            row.cache_growth = row.cache_growth.max(growth);
            row.fallbacks += s.fallbacks;
            bar.inc(1);
        }
    }
    bar.finish();
    Ok(HeapReport {
        alloc_limit,
        alloc_heap: heaps[0].name(),
        loadavg: (load_before, loadavg()),
        fs: fs_name(&path),
        file: path,
        bytes,
        buffers,
        buffer_size: args.buffer_size,
        runs: args.runs,
        rows,
        limit,
        skipped,
        warm_warnings,
    })
}

/// An error and its sources on one line.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

/// Writes `size` pseudo-random bytes to a new file on a disk file system.
fn make_scratch(size: u64, talk: bool) -> Result<tempfile::NamedTempFile> {
    let dir = scratch_dir()?;
    let mut t = tempfile::Builder::new()
        .prefix("iopath-bench-")
        .suffix(".bin")
        .tempfile_in(&dir)
        .map_err(Error::io(&dir))?;
    if talk && std::io::stderr().is_terminal() {
        eprintln!(
            "writing {} scratch file {}",
            human(size),
            t.path().display()
        );
    }
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut chunk = vec![0u8; 8 << 20];
    let mut left = size;
    while left > 0 {
        for w in chunk.chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            w.copy_from_slice(&x.to_le_bytes());
        }
        let n = left.min(chunk.len() as u64) as usize;
        t.write_all(&chunk[..n]).map_err(Error::io(t.path()))?;
        left -= n as u64;
    }
    t.as_file().sync_all().map_err(Error::io(t.path()))?;
    Ok(t)
}

#[allow(clippy::unnecessary_cast)] // `f_type` is i64 on x86_64, other types elsewhere
fn fs_name(path: &Path) -> &'static str {
    match rustix::fs::statfs(path).map(|s| s.f_type as i64) {
        Ok(0xEF53) => "ext4",
        Ok(0x0102_1994) => "tmpfs",
        Ok(0x5846_5342) => "xfs",
        Ok(0x9123_683E) => "btrfs",
        _ => "other fs",
    }
}

/// The 1-minute load average.
fn loadavg() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

impl HeapReport {
    fn alloc_summary(&self) -> Summary {
        let gib = self.bytes as f64 / (1u64 << 30) as f64;
        Summary::of(&self.alloc_limit.iter().map(|s| gib / s).collect::<Vec<_>>())
    }

    fn limit_summary(&self) -> Option<Summary> {
        Some(self.limit.summary()).filter(|s| s.median > 0.0)
    }

    /// The table and its notes, as `iopath bench heap` prints them.
    pub fn text(&self) -> String {
        let mut out = String::new();
        outln!(
            out,
            "{} x {} buffers from {} ({}, {}), {} run(s), each from a cold page cache",
            self.buffers,
            human(self.buffer_size as u64),
            self.file.display(),
            human(self.bytes),
            self.fs,
            self.runs
        );
        let limit = self.limit_summary();
        outln!(
            out,
            "{:<14} {:<16} {:>9} {:>9} {:>9} {:>7} {:>7} {:>9} {:>13}",
            "heap",
            "method",
            "alloc ms",
            "read ms",
            "total ms",
            "GiB/s",
            "spread",
            "vs limit",
            "cache growth"
        );
        for r in &self.rows {
            let g = Summary::of(&r.gib_per_s);
            let method = if r.method == r.used {
                r.method.to_string()
            } else {
                format!("{} ({})", r.method, r.used)
            };
            outln!(
                out,
                "{:<14} {:<16} {:>9.1} {:>9.1} {:>9.1} {:>7.3} {:>6.1}% {:>9} {:>13}",
                r.heap,
                method,
                Summary::of(&r.alloc_ms).median,
                Summary::of(&r.read_ms).median,
                Summary::of(&r.total_ms).median,
                g.median,
                g.spread_pct(),
                limit.map_or("-".to_string(), |l| format!(
                    "{:.0}%",
                    g.median / l.median * 100.0
                )),
                human(r.cache_growth),
            );
            if r.fallbacks > 0 {
                outln!(
                    out,
                    "{:<31} ({} request(s) fell back to buffered)",
                    "",
                    r.fallbacks
                );
            }
        }
        if let Some(s) = limit {
            outln!(
                out,
                "{:<14} {:<16} {:>9} {:>9} {:>9.1} {:>7.3} {:>6.1}% {:>9} {:>13}",
                if self.limit.is_fio() {
                    "limit"
                } else {
                    "limit (own)"
                },
                self.limit
                    .label()
                    .replace(" bs=", " ")
                    .replace(" qd=", " qd"),
                "-",
                "-",
                self.bytes as f64 / f64::from(1u32 << 30) / s.median * 1e3,
                s.median,
                s.spread_pct(),
                "100%",
                "-"
            );
        }
        let a = self.alloc_summary();
        outln!(
            out,
            "{:<14} {:<16} {:>9.1} {:>9} {:>9.1} {:>7.3} {:>6.1}% {:>9} {:>13}",
            "alloc only",
            self.alloc_heap,
            Summary::of(&self.alloc_limit).median * 1e3,
            "-",
            Summary::of(&self.alloc_limit).median * 1e3,
            a.median,
            a.spread_pct(),
            limit.map_or("-".to_string(), |l| format!(
                "{:.0}%",
                a.median / l.median * 100.0
            )),
            "-"
        );
        for n in self.limit.notes() {
            outln!(out, "{n}");
        }
        outln!(
            out,
            "alloc only: {} x {} {} buffers allocated and faulted in (MADV_POPULATE_WRITE), no I/O",
            self.buffers,
            human(self.buffer_size as u64),
            self.alloc_heap
        );
        if let (Some(a), Some(b)) = self.loadavg {
            outln!(
                out,
                "load average (1 min) {a:.2} before, {b:.2} after, on {} CPU(s)",
                std::thread::available_parallelism().map_or(0, |n| n.get())
            );
        }
        for (h, why) in &self.skipped {
            outln!(out, "skipped heap {h}: {why}");
        }
        if self.rows.iter().any(|r| r.heap == "memfd:thp") {
            if let Ok(mode) =
                std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
            {
                if mode.contains("[never]") || mode.contains("[deny]") {
                    outln!(
                        out,
                        "note: memfd:thp gets no huge pages here (shmem_enabled: {})",
                        mode.trim()
                    );
                }
            }
        }
        if self.warm_warnings > 0 {
            outln!(
                out,
                "warning: {} run(s) started with more than 1% of the file cached",
                self.warm_warnings
            );
        }
        out
    }

    /// The table as Markdown (as in BENCHMARKS.md), then its notes.
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        let limit = self.limit_summary();
        let vs = |g: f64| {
            limit.map_or("n/a".to_string(), |l| {
                format!("{:.0}%", g / l.median * 100.0)
            })
        };
        outln!(
            out,
            "{} x {} buffers from a {} file on {}, {} run(s), each from a cold page cache; medians, spread = (max-min)/median.",
            self.buffers,
            human(self.buffer_size as u64),
            human(self.bytes),
            self.fs,
            self.runs
        );
        outln!(out);
        outln!(out, "| heap | method | alloc ms | read ms | total ms | GiB/s | spread | vs limit | page cache growth |");
        outln!(out, "|---|---|---:|---:|---:|---:|---:|---:|---:|");
        for r in &self.rows {
            let g = Summary::of(&r.gib_per_s);
            let method = if r.method == r.used {
                r.method.to_string()
            } else {
                format!("{} ({})", r.method, r.used)
            };
            outln!(
                out,
                "| {} | {} | {:.1} | {:.1} | {:.1} | {:.3} | {:.1}% | {} | {} |",
                r.heap,
                method,
                Summary::of(&r.alloc_ms).median,
                Summary::of(&r.read_ms).median,
                Summary::of(&r.total_ms).median,
                g.median,
                g.spread_pct(),
                vs(g.median),
                human(r.cache_growth)
            );
        }
        if let Some(l) = limit {
            outln!(
                out,
                "| {} | {} | - | - | {:.1} | {:.3} | {:.1}% | 100% | - |",
                if self.limit.is_fio() {
                    "limit"
                } else {
                    "limit (own, no fio)"
                },
                self.limit.label(),
                self.bytes as f64 / f64::from(1u32 << 30) / l.median * 1e3,
                l.median,
                l.spread_pct()
            );
        }
        let a = self.alloc_summary();
        let alloc_ms = Summary::of(&self.alloc_limit).median * 1e3;
        outln!(
            out,
            "| alloc only | {} | {alloc_ms:.1} | - | {alloc_ms:.1} | {:.3} | {:.1}% | {} | - |",
            self.alloc_heap,
            a.median,
            a.spread_pct(),
            vs(a.median)
        );
        outln!(out);
        for n in self.limit.notes() {
            outln!(out, "{n}");
            outln!(out);
        }
        for (h, why) in &self.skipped {
            outln!(out, "skipped heap {h}: {why}");
            outln!(out);
        }
        out
    }

    /// Writes the chart: one bar per heap x method, allocation time with
    /// read time stacked on it, the alloc-only bound, the limit's time as a
    /// line.
    ///
    /// # Errors
    /// [`Error::Plot`].
    pub fn plot(&self, path: &Path) -> Result<()> {
        use crate::plot::{Bar, Line, Panel, OTHER, PRIMARY, SECONDARY};
        let mut bars: Vec<Bar> = self
            .rows
            .iter()
            .map(|r| {
                let a = Summary::of(&r.alloc_ms).median;
                let rd = Summary::of(&r.read_ms).median;
                Bar {
                    label: format!("{} {}", r.heap.replace("memfd:", ""), r.method),
                    segments: vec![(0.0, a, PRIMARY), (a, a + rd, SECONDARY)],
                    whisker: None,
                }
            })
            .collect();
        let alloc_ms = Summary::of(&self.alloc_limit).median * 1e3;
        bars.push(Bar {
            label: "alloc only".into(),
            segments: vec![(0.0, alloc_ms, OTHER)],
            whisker: None,
        });
        let mut lines = Vec::new();
        if let Some(l) = self.limit_summary() {
            let ms = self.bytes as f64 / f64::from(1u32 << 30) / l.median * 1e3;
            lines.push(Line::across(
                format!("limit: {} ({ms:.0} ms)", self.limit.label()),
                bars.len(),
                ms,
            ));
        }
        let panel = Panel {
            title: format!(
                "{} x {} buffers from a cold {} file ({}), medians of {} runs",
                self.buffers,
                human(self.buffer_size as u64),
                human(self.bytes),
                self.fs,
                self.runs
            ),
            y_desc: "ms (lower is faster)".into(),
            log: false,
            bars,
            lines,
            legend: vec![
                ("allocation ms".into(), PRIMARY),
                ("read ms".into(), SECONDARY),
                ("alloc only".into(), OTHER),
            ],
        };
        crate::plot::draw(path, "bench heap: fill buffers from a file", &[panel], 1)
    }

    /// Every row, the limit and the bounds, for scripts.
    pub fn json(&self) -> serde_json::Value {
        let limit = self.limit_summary();
        let rows: Vec<_> = self
            .rows
            .iter()
            .map(|r| {
                let g = Summary::of(&r.gib_per_s);
                serde_json::json!({
                    "heap": r.heap,
                    "method": r.method.name(),
                    "method_used": r.used.name(),
                    "alloc_ms": Summary::of(&r.alloc_ms).median,
                    "read_ms": Summary::of(&r.read_ms).median,
                    "total_ms": Summary::of(&r.total_ms).median,
                    "gib_per_s": g.median,
                    "gib_per_s_runs": g.json(),
                    "spread_pct": g.spread_pct(),
                    "vs_limit": limit.map(|l| g.median / l.median),
                    "cache_growth_bytes": r.cache_growth,
                    "fallbacks": r.fallbacks,
                })
            })
            .collect();
        serde_json::json!({
            "file": self.file,
            "fs": self.fs,
            "bytes": self.bytes,
            "buffers": self.buffers,
            "buffer_size": self.buffer_size,
            "runs": self.runs,
            "rows": rows,
            "limit": self.limit.json(),
            "fio_limit": if self.limit.is_fio() { self.limit.json() } else { serde_json::Value::Null },
            "missing": match &self.limit.source {
                crate::limit::Source::Own { missing, .. } => vec![serde_json::json!({"row": "limit", "missing": missing.json()})],
                crate::limit::Source::Fio { .. } => Vec::new(),
            },
            "alloc_only": {
                "heap": self.alloc_heap,
                "gib_per_s": self.alloc_summary().median,
                "gib_per_s_runs": self.alloc_summary().json(),
            },
            "loadavg": [self.loadavg.0, self.loadavg.1],
            "skipped": self.skipped.iter().map(|(h, w)| serde_json::json!({"heap": h, "reason": w})).collect::<Vec<_>>(),
        })
    }
}
