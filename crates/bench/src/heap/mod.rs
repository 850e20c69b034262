//! `iopath bench heap`: filling shareable buffers from a file
//! (`DMA_BUF_IOCTL_RW_FILE`'s use case). N buffers of one size are filled
//! from a cold file with every heap and method that works here, beside the
//! limit: the best of a sweep of fio's O_DIRECT io_uring read of the same
//! file (block sizes 1 MiB and 8 MiB, queue depths 4, 16, 64), or without
//! fio the bench's own plain O_DIRECT read, labelled so. Then the dma-buf
//! table (`dma_buf_table`).

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use iopath_heap::{
    load, open_heap, EngineOptions, Heap, IoFile, LoadOptions, LoadStats, Loaded, Method,
};
use iopath_sys::{error_chain, human};

use crate::error::{check, check_failed, invalid};
use crate::limit::Limit;
use crate::{fio, loadavg, scratch_dir, Error, ProgressBar, Report, Result};

mod dma_buf_table;
mod report;

const HEAPS: [&str; 5] = ["memfd", "memfd:thp", "memfd:hugetlb", "udmabuf", "dma-heap"];

/// What `iopath bench heap` measures.
#[derive(Debug, Clone)]
pub struct HeapConfig {
    /// Read this file (it must hold buffers x buffer-size bytes).
    pub file: Option<PathBuf>,
    /// Without `file`: a scratch file of this size on a disk file system,
    /// removed afterwards [default 1 GiB].
    pub size: Option<usize>,
    /// Buffers per load [default: file size / buffer size].
    pub buffers: Option<usize>,
    /// Bytes per buffer.
    pub buffer_size: usize,
    /// Runs per row.
    pub runs: usize,
    /// Heaps to try [empty: all].
    pub heaps: Vec<String>,
    /// Methods to try, by name [empty: all].
    pub methods: Vec<String>,
    /// io_uring requests in flight.
    pub queue_depth: u32,
    /// Only the dma-buf table, not every heap x method nor the limit.
    pub dma_buf_only: bool,
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
            dma_buf_only: false,
        }
    }

    /// The full sizes: a 1 GiB file into 32 x 32 MiB buffers, 3 runs.
    pub fn full() -> HeapConfig {
        HeapConfig {
            size: Some(1 << 30),
            buffers: Some(32),
            ..HeapConfig::quick()
        }
    }
}

/// One heap x method row: the method asked for and the one that ran, and
/// per run the milliseconds allocating, reading and in all, and GiB/s.
#[derive(Debug)]
struct Row {
    heap: String,
    method: Method,
    used: Method,
    ms: [Vec<f64>; 3],
    gib_per_s: Vec<f64>,
    cache_growth: u64,
    fallbacks: u64,
}

#[derive(Debug, Default)]
struct Measured {
    /// Seconds to allocate and fault in the buffers, no I/O, per run.
    alloc_limit: Vec<f64>,
    alloc_heap: String,
    loadavg: (Option<f64>, Option<f64>),
    file: PathBuf,
    fs: &'static str,
    bytes: u64,
    buffers: usize,
    buffer_size: usize,
    runs: usize,
    rows: Vec<Row>,
    /// `None` with only the dma-buf table.
    limit: Option<Limit>,
    /// The heaps that did not open: (heap, what it needs, why).
    skipped: Vec<(String, String, String)>,
    warm_warnings: u64,
    dma_buf: Vec<dma_buf_table::DmaBufRow>,
}

/// What a row of `heap` needs when the heap does not open here with `e`:
/// the kernel feature (and where to find one) for a device that is not
/// there, else the error itself.
fn needs(heap: &str, e: &iopath_heap::Error) -> String {
    let lab = "scripts/linux-lab boots a kernel with it";
    match e {
        iopath_heap::Error::Unavailable { path, .. } if heap.starts_with("udmabuf") => {
            format!("{} (CONFIG_UDMABUF; {lab})", path.display())
        }
        iopath_heap::Error::Unavailable { path, .. } => {
            format!("{} (CONFIG_DMABUF_HEAPS_SYSTEM; {lab})", path.display())
        }
        _ => error_chain(e),
    }
}

/// Runs the experiment.
///
/// # Errors
/// [`Error::Invalid`] for bad settings or a file too short; I/O and heap
/// failures. A missing fio changes the limit, it does not stop the run.
pub fn run(args: &HeapConfig) -> Result<Report> {
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
    let parsed: Result<Vec<Method>, _> = args.methods.iter().map(|m| m.parse()).collect();
    let methods = match (args.methods.is_empty(), parsed) {
        (true, _) => Method::ALL.to_vec(),
        (false, Ok(methods)) => methods,
        (false, Err(e)) => invalid!("--methods", "{e}"),
    };
    // The file: given, or a scratch file removed when `_scratch` drops.
    let (_scratch, path) = match &args.file {
        Some(f) => (None, f.clone()),
        None => {
            let t = make_scratch(args.size.unwrap_or(1 << 30) as u64)?;
            let p = t.path().to_path_buf();
            (Some(t), p)
        }
    };
    let file = IoFile::open(&path).map_err(Error::layer("opening the file to read"))?;
    let size = file
        .size()
        .map_err(Error::layer("reading the file's size"))?;
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
    let mut m = Measured {
        loadavg: (loadavg(), None),
        fs: fs_name(&path),
        file: path.clone(),
        bytes,
        buffers,
        buffer_size: args.buffer_size,
        runs: args.runs,
        ..Measured::default()
    };
    let plan = Plan {
        path: &path,
        file: &file,
        buffers,
        buffer_size: args.buffer_size,
        queue_depth: args.queue_depth,
    };
    if !args.dma_buf_only {
        measure(args, &methods, &plan, &mut m)?;
    }
    m.dma_buf = dma_buf_table::measure(&plan, args.runs);
    m.loadavg.1 = loadavg();
    Ok(m.report())
}

/// Every heap x method row and the two bounds, `args.runs` times.
fn measure(args: &HeapConfig, methods: &[Method], plan: &Plan<'_>, r: &mut Measured) -> Result<()> {
    let names: Vec<String> = match args.heaps.is_empty() {
        true => HEAPS.map(String::from).to_vec(),
        false => args.heaps.clone(),
    };
    let mut heaps: Vec<Box<dyn Heap>> = Vec::new();
    for name in &names {
        match open_heap(name).and_then(|h| h.alloc(plan.buffer_size).map(|_| h)) {
            Ok(h) => heaps.push(h),
            Err(e) => r
                .skipped
                .push((name.clone(), needs(name, &e), error_chain(&e))),
        }
    }
    check!(!heaps.is_empty(), "no heap works here: {:?}", r.skipped);
    r.alloc_heap = heaps[0].name();
    for h in &heaps {
        r.rows.extend(methods.iter().map(|&m| Row {
            heap: h.name(),
            method: m,
            used: m,
            ms: Default::default(),
            gib_per_s: Vec::new(),
            cache_growth: 0,
            fallbacks: 0,
        }));
    }
    let (file, path, bytes) = (plan.file, plan.path, r.bytes);
    let base = fio::Job::new(false, path, bytes, 1 << 20, plan.queue_depth);
    let drop_cache = || {
        file.drop_cache()
            .map_err(Error::layer("dropping the file's cache"))
    };
    let cached = || {
        file.cached_bytes()
            .map_err(Error::layer("counting the file's cached pages"))
    };
    let mut limit = Limit::new(&base, &[1 << 20, 8 << 20]);
    let nrows = r.rows.len();
    let steps = args.runs as u64 * nrows as u64 + limit.steps(args.runs);
    let bar = ProgressBar::new("bench heap", steps);
    for run in 0..args.runs {
        limit.measure(None, &mut || drop_cache(), &bar)?;
        // The other bound: allocating and faulting in the same buffers with
        // no I/O at all (first heap).
        let t = Instant::now();
        let mut held = Vec::with_capacity(plan.buffers);
        for _ in 0..plan.buffers {
            let b = heaps[0]
                .alloc(plan.buffer_size)
                .map_err(Error::layer("allocating a buffer"))?;
            b.populate().map_err(Error::layer("faulting in a buffer"))?;
            held.push(b);
        }
        r.alloc_limit.push(t.elapsed().as_secs_f64());
        drop(held);
        // Rotate the order from run to run, so that no row always runs first
        // (right after fio) or last: memory the previous row freed is cheaper
        // to allocate again on a VM than memory returned to the host.
        for i in crate::turns(nrows, run * nrows / args.runs) {
            // The rows go heap by heap, a method each.
            let (row, heap) = (&mut r.rows[i], &heaps[i / methods.len()]);
            let what = format!("{} {}", row.heap, row.method);
            bar.set_message(format!("run {}/{}: {what}", run + 1, args.runs));
            drop_cache()?;
            let cold = cached()?;
            if cold > bytes / 100 {
                r.warm_warnings += 1;
                let file = path.display();
                tracing::warn!("{file} still has {cold} bytes cached after dropping");
            }
            let loaded = plan
                .load(heap.as_ref(), row.method)
                .map_err(Error::layer(what))?;
            let growth = cached()?.saturating_sub(cold);
            drop(loaded.buffers);
            let s = loaded.stats;
            row.used = s.method;
            push_run(&mut row.ms, load_ms(&s));
            row.gib_per_s.push(s.gib_per_s());
            row.cache_growth = row.cache_growth.max(growth);
            row.fallbacks += s.fallbacks;
            bar.inc(1);
        }
    }
    bar.finish();
    r.limit = Some(limit);
    Ok(())
}

/// What every load reads, into how many buffers of what size.
struct Plan<'a> {
    path: &'a Path,
    file: &'a IoFile,
    buffers: usize,
    buffer_size: usize,
    queue_depth: u32,
}

impl Plan<'_> {
    /// Loads the buffers from the file into `heap` with `method`.
    fn load(&self, heap: &dyn Heap, method: Method) -> iopath_heap::Result<Loaded> {
        let opts = LoadOptions {
            buffer_size: self.buffer_size,
            buffers: Some(self.buffers),
            method,
            engine: EngineOptions {
                queue_depth: self.queue_depth,
                ..EngineOptions::default()
            },
            ..LoadOptions::default()
        };
        load(self.path, heap, &opts, &mut |_| {})
    }
}

/// A load's milliseconds allocating, reading and in all.
fn load_ms(s: &LoadStats) -> [f64; 3] {
    [s.alloc_time, s.read_time, s.elapsed].map(|d| d.as_secs_f64() * 1e3)
}

/// Adds a run's three figures to the runs of each.
fn push_run(runs: &mut [Vec<f64>; 3], figures: [f64; 3]) {
    for (v, x) in runs.iter_mut().zip(figures) {
        v.push(x);
    }
}

/// Writes `size` pseudo-random bytes to a new file on a disk file system.
fn make_scratch(size: u64) -> Result<tempfile::NamedTempFile> {
    let dir = scratch_dir()?;
    let mut t = tempfile::Builder::new()
        .prefix("iopath-bench-")
        .suffix(".bin")
        .tempfile_in(&dir)
        .map_err(Error::io(&dir))?;
    crate::cleanup::path(t.path());
    if std::io::stderr().is_terminal() {
        let (size, path) = (human(size), t.path().display());
        eprintln!("writing {size} scratch file {path}");
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

fn fs_name(path: &Path) -> &'static str {
    match crate::fs_type(path) {
        Some(0xEF53) => "ext4",
        Some(crate::TMPFS_MAGIC) => "tmpfs",
        Some(0x5846_5342) => "xfs",
        Some(0x9123_683E) => "btrfs",
        _ => "other fs",
    }
}
