//! `iopath load`: fill shareable buffers from a file, as fast as the storage
//! allows, and say how fast that was.

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::Result;
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use iopath_heap::{
    load, load_checkpoint, EngineOptions, LoadOptions, LoadStats, Prefault, Tensors,
    DEFAULT_SHARDS_AT_ONCE,
};

use iopath_sys::{human, parse_size};

/// Arguments of `iopath load`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  iopath load model.bin                       # memfd buffers, fastest method
  iopath load model.bin --method buffered     # through the page cache
  iopath load disk.img --buffer-size 4M --verify --json
  iopath load model.safetensors --format safetensors --verify
  iopath load llama/ --format safetensors --json   # every shard of its index
  iopath load llama/ --format safetensors --method map   # cached tensors: views of the files")]
pub struct LoadArgs {
    /// The file to load (all of it, unless --buffers says how much). With
    /// --format safetensors also a sharded checkpoint: a directory (its
    /// *.safetensors.index.json, else its *.safetensors files) or the
    /// index itself.
    pub file: PathBuf,
    /// Where buffers come from: auto (a dma-heap if direct I/O can fill
    /// it, else udmabuf, else memfd; says which and why), memfd, memfd:thp,
    /// memfd:hugetlb, udmabuf, dma-heap or dma-heap:NAME.
    #[arg(long, default_value = "auto")]
    pub heap: String,
    /// Size of each buffer (a multiple of the page size), e.g. 4M, 32M. A
    /// file smaller than this gets one buffer of its own size.
    #[arg(long, default_value = "32M", value_parser = parse_size::<usize>)]
    pub buffer_size: usize,
    /// Fill exactly this many buffers; the file must hold that many bytes.
    /// Default: as many as the whole file needs.
    #[arg(long)]
    pub buffers: Option<usize>,
    /// How to move the bytes: auto (what the page cache holds is copied
    /// out of it, the rest read with uring or direct at the same time,
    /// whichever measures faster over 48 MiB each, in alternating slices;
    /// direct only when more than 10% faster; for a dma-heap, whose
    /// mapping refuses direct I/O, bounce or buffered, whichever measures
    /// faster), buffered
    /// (pread), direct (O_DIRECT), sendfile (sendfile/splice), uring
    /// (io_uring, fixed buffers, O_DIRECT), bounce (O_DIRECT io_uring into
    /// a memfd bounce buffer, then a copy). Direct methods fall back to
    /// buffered per request where direct I/O is refused, and count it.
    /// With --format safetensors also map: every tensor the page cache
    /// holds whole becomes a view of the file (mapped private, pages made
    /// resident, no copy; later writes to the file show through, a
    /// truncated file reads as zeros), the rest read as auto reads them:
    /// the fastest on a warm page cache, where auto copies.
    #[arg(long, default_value = "auto")]
    pub method: String,
    /// io_uring requests kept in flight (uring and auto), 1 to 4096.
    #[arg(long, default_value_t = 16)]
    pub queue_depth: u32,
    /// io_uring bytes per request (uring and auto), a multiple of 4096 up
    /// to 1G, e.g. 1M, 4M.
    #[arg(long, default_value = "4M", value_parser = parse_size::<usize>)]
    pub request_size: usize,
    /// Threads allocating buffers (and their pages) while the reads run,
    /// 1 to 64; for a sharded checkpoint, that many for each shard loading
    /// at once.
    #[arg(long, default_value_t = 1, value_parser = parse_alloc_threads)]
    pub alloc_threads: usize,
    /// What the allocator thread does to new buffers' pages: allocate
    /// (fallocate; the reads map them), map (MADV_POPULATE_WRITE), none, or
    /// auto (map, measured the fastest for every method).
    #[arg(long, default_value = "auto")]
    pub prefault: Prefault,
    /// Read the file again afterwards and compare every byte; exit non-zero
    /// on any difference.
    #[arg(long)]
    pub verify: bool,
    /// Print one JSON object instead of the summary line.
    #[arg(long)]
    pub json: bool,
    /// What the file is: raw (its bytes into equal buffers) or safetensors
    /// (every tensor whole in one buffer, aligned for its dtype; the
    /// header is checked, --verify compares every tensor with the file).
    #[arg(long, default_value = "raw", value_parser = ["raw", "safetensors"])]
    pub format: String,
    /// Shards of a sharded safetensors checkpoint loaded at the same time,
    /// each with its own engine, 1 to 64.
    #[arg(long, default_value_t = DEFAULT_SHARDS_AT_ONCE, value_parser = parse_shards_at_once)]
    pub shards_at_once: usize,
}

/// Runs `iopath load`.
///
/// # Errors
/// Bad input (missing file, directory, empty or short file, bad buffer size,
/// unknown heap or method), I/O failures and verification differences.
pub fn run(args: &LoadArgs) -> Result<()> {
    let (heap, heap_why) = if args.heap == "auto" {
        let c = iopath_heap::choose_heap();
        (c.heap, Some(c.why))
    } else {
        let h = iopath_heap::open_heap(&args.heap).map_err(|e| at_fault(args, e))?;
        (h, None)
    };
    let mut opts = LoadOptions {
        buffer_size: args.buffer_size,
        buffers: args.buffers,
        engine: EngineOptions {
            queue_depth: args.queue_depth,
            chunk: args.request_size,
        },
        alloc_threads: args.alloc_threads,
        prefault: args.prefault,
        ..LoadOptions::default()
    };
    opts.set_method(&args.method)
        .map_err(|e| at_fault(args, e))?;
    if opts.map_cached && args.format != "safetensors" {
        return Err(crate::usage::usage(
            "--method map: only with --format safetensors (tensors are what is mapped)",
        ));
    }
    let mut bars = progress_bars(args);
    let mut on_progress = |p: &iopath_heap::Progress| {
        if let Some(bars) = &mut bars {
            bars.update(p);
        }
    };
    let heap_name = heap.name();
    let safetensors = args.format == "safetensors";
    if safetensors && args.buffers.is_some() {
        return Err(crate::usage::usage(
            "--buffers: not with --format safetensors (the tensors decide the buffers)",
        ));
    }
    let (stats, tensors) = if safetensors {
        let t = load_checkpoint(
            &args.file,
            heap.as_ref(),
            &opts,
            args.shards_at_once,
            &mut on_progress,
        )
        .map_err(|e| at_fault(args, e))?;
        if let Some(bars) = &bars {
            bars.clear();
        }
        if args.verify {
            t.verify()?;
        }
        (t.stats, Some(t))
    } else {
        let loaded = load(&args.file, heap.as_ref(), &opts, &mut on_progress)
            .map_err(|e| at_fault(args, e))?;
        if let Some(bars) = &bars {
            bars.clear();
        }
        if args.verify {
            loaded.verify(&args.file)?;
        }
        (loaded.stats, None)
    };
    let verified = args.verify.then_some(true);
    if args.json {
        let mut v = serde_json::json!({
            "file": args.file,
            "bytes": stats.bytes,
            "seconds": stats.elapsed.as_secs_f64(),
            "gib_per_s": stats.gib_per_s(),
            "method": stats.method.name(),
            "requested_method": opts.method_name(),
            "mapped_bytes": stats.mapped,
            "populate": stats.populate,
            "heap": heap_name,
            "heap_why": heap_why,
            "buffers": stats.buffers,
            "buffer_size": stats.buffer_size,
            "fallbacks": stats.fallbacks,
            "from_cache_bytes": stats.from_cache,
            "auto_probe": probe_json(&stats),
            "alloc_ms": stats.alloc_time.as_secs_f64() * 1e3,
            "read_ms": stats.read_time.as_secs_f64() * 1e3,
            "verified": verified,
        });
        if let Some(t) = &tensors {
            v["format"] = "safetensors".into();
            v["tensors"] = t.tensors.len().into();
            v["shards"] = shards_json(t);
        }
        println!("{v}");
        return Ok(());
    }
    let s = &stats;
    let method = if s.mapped > 0 {
        format!("map + {}", s.method)
    } else {
        s.method.to_string()
    };
    let verified = if args.verify { "; verified" } else { "" };
    match tensors.as_ref().map(|t| (t.tensors.len(), t.shards.len())) {
        Some((n, shards)) => println!(
            "loaded {n} tensors{} ({}, {} bytes) into {} {heap_name} buffers of up to {} in {:.3} s: {:.2} GiB/s, method {method}{}, {} fallback(s), {}{}{verified}",
            if shards > 1 { format!(" from {shards} shards") } else { String::new() },
            human(s.bytes + s.mapped),
            s.bytes + s.mapped,
            s.buffers,
            human(s.buffer_size as u64),
            s.elapsed.as_secs_f64(),
            s.gib_per_s(),
            auto_note(s),
            s.fallbacks,
            cache_note(s),
            map_note(s),
        ),
        None => println!(
            "loaded {} ({} bytes) into {} x {} {heap_name} buffers in {:.3} s: {:.2} GiB/s, method {}{}, {} fallback(s), {}; alloc {:.0} ms (overlapped), read {:.0} ms{verified}",
            human(s.bytes),
            s.bytes,
            s.buffers,
            human(s.buffer_size as u64),
            s.elapsed.as_secs_f64(),
            s.gib_per_s(),
            s.method,
            auto_note(s),
            s.fallbacks,
            cache_note(s),
            s.alloc_time.as_secs_f64() * 1e3,
            s.read_time.as_secs_f64() * 1e3,
        ),
    }
    if let Some(why) = heap_why {
        println!("heap auto chose {heap_name}: {why}");
    }
    Ok(())
}

/// How much came from the page cache, as the summary says it.
fn cache_note(s: &LoadStats) -> String {
    let pct = if s.bytes == 0 {
        0.0
    } else {
        s.from_cache as f64 * 100.0 / s.bytes as f64
    };
    format!("{} ({pct:.0}%) from the page cache", human(s.from_cache))
}

/// How much was mapped rather than read, as the summary says it.
fn map_note(s: &LoadStats) -> String {
    match s.populate {
        Some(how) => format!(
            "; {} mapped from the page cache (views of the files, made resident with {how})",
            human(s.mapped)
        ),
        None => String::new(),
    }
}

/// Progress on stderr, when it is a terminal and the output is text: one
/// bar for the whole load and, for a sharded checkpoint, one per shard
/// while it loads.
struct Bars {
    multi: MultiProgress,
    total: ProgressBar,
    shards: Vec<Option<ProgressBar>>,
}

fn progress_bars(args: &LoadArgs) -> Option<Bars> {
    (!args.json && std::io::stderr().is_terminal()).then(|| {
        let multi = MultiProgress::new();
        let total = multi.add(bar("loading", 40));
        Bars {
            multi,
            total,
            shards: Vec::new(),
        }
    })
}

fn bar(label: &str, width: usize) -> ProgressBar {
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template(&format!(
            "{{spinner}} {label} [{{bar:{width}}}] {{bytes}}/{{total_bytes}} {{bytes_per_sec}} eta {{eta}}"
        ))
        .expect("valid template")
        .progress_chars("=> "),
    );
    bar
}

impl Bars {
    fn update(&mut self, p: &iopath_heap::Progress) {
        self.total.set_length(p.total);
        self.total.set_position(p.bytes);
        if p.shards < 2 {
            return;
        }
        self.shards.resize_with(p.shards, || None);
        let slot = &mut self.shards[p.shard];
        let b = slot.get_or_insert_with(|| {
            let label = format!(
                "shard {:>w$}/{}",
                p.shard + 1,
                p.shards,
                w = digits(p.shards)
            );
            self.multi.add(bar(&label, 24))
        });
        b.set_length(p.shard_total);
        b.set_position(p.shard_bytes);
        if p.shard_bytes == p.shard_total {
            b.finish_and_clear();
        }
    }

    fn clear(&self) {
        for b in self.shards.iter().flatten() {
            b.finish_and_clear();
        }
        self.total.finish_and_clear();
    }
}

fn digits(n: usize) -> usize {
    n.to_string().len()
}

/// Each shard's file, tensors and load figures, for `--json`.
fn shards_json(t: &Tensors) -> serde_json::Value {
    t.shards
        .iter()
        .map(|s| {
            serde_json::json!({
                "file": s.path,
                "tensors": s.tensors,
                "bytes": s.stats.bytes,
                "buffers": s.stats.buffers,
                "method": s.stats.method.name(),
                "done_seconds": s.stats.elapsed.as_secs_f64(),
                "read_ms": s.stats.read_time.as_secs_f64() * 1e3,
                "fallbacks": s.stats.fallbacks,
                "mapped_bytes": s.stats.mapped,
            })
        })
        .collect()
}

/// `auto`'s measurements, for `--json`.
fn probe_json(s: &LoadStats) -> serde_json::Value {
    match s.probe {
        Some(p) if p.mapping_refused_direct() => serde_json::json!({
            "mapping_refuses_direct_io": true,
            "bounce_gib_per_s": p.bounce_gib_per_s(),
            "bounce_bytes": p.bounce.0,
            "buffered_gib_per_s": p.buffered_gib_per_s(),
            "buffered_bytes": p.buffered.0,
        }),
        Some(p) => serde_json::json!({
            "uring_gib_per_s": p.uring_gib_per_s(),
            "uring_bytes": p.uring.0,
            "direct_gib_per_s": p.direct_gib_per_s(),
            "direct_bytes": p.direct.0,
        }),
        None => serde_json::Value::Null,
    }
}

/// What `auto` measured, for the summary line.
fn auto_note(s: &LoadStats) -> String {
    match s.probe {
        Some(p) if p.mapping_refused_direct() => format!(
            " (auto: the buffers' mapping refuses direct I/O; measured bounce {:.2}, buffered {:.2} GiB/s)",
            p.bounce_gib_per_s(),
            p.buffered_gib_per_s()
        ),
        Some(p) if p.direct.0 > 0 => format!(
            " (auto: measured uring {:.2}, direct {:.2} GiB/s)",
            p.uring_gib_per_s(),
            p.direct_gib_per_s()
        ),
        Some(_) => " (auto)".to_string(),
        None => String::new(),
    }
}

/// Names the option at fault in a load error, when one is.
fn at_fault(args: &LoadArgs, e: iopath_heap::Error) -> anyhow::Error {
    use iopath_heap::Error as E;
    let size = || format!("--buffer-size {}", args.buffer_size);
    let option = match &e {
        E::BadSize { .. } | E::TooManyBuffers { .. } | E::UdmabufLimit { .. } => Some(size()),
        E::OutOfMemory { .. } => Some(match args.buffers {
            Some(n) => format!("--buffers {n} --buffer-size {}", args.buffer_size),
            None => format!("{}", args.file.display()),
        }),
        E::NoBuffers => Some("--buffers 0".to_string()),
        E::BadQueueDepth { depth } => Some(format!("--queue-depth {depth}")),
        E::BadChunk { chunk } => Some(format!("--request-size {chunk}")),
        E::UnknownMethod(_) => Some("--method".to_string()),
        E::UnknownHeap(_) | E::Unavailable { .. } | E::NoSuchDmaHeap { .. } => {
            Some(format!("--heap {}", args.heap))
        }
        E::NotAFile {
            what: "a directory",
            ..
        } if args.format == "raw" => Some(
            "--format raw (a sharded safetensors checkpoint loads with --format safetensors)"
                .to_string(),
        ),
        _ => None,
    };
    match option {
        Some(o) => anyhow::Error::new(e).context(o),
        None => e.into(),
    }
}

/// `--shards-at-once`: 1 to 64.
fn parse_shards_at_once(s: &str) -> Result<usize, String> {
    const MAX: usize = 64;
    let n: usize = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of shards"))?;
    if !(1..=MAX).contains(&n) {
        return Err(format!("{n} is out of range: at least 1, at most {MAX}"));
    }
    Ok(n)
}

/// `--alloc-threads`: 1 to 64 (more threads than that only contend for
/// the same page allocator and address-space lock).
fn parse_alloc_threads(s: &str) -> Result<usize, String> {
    const MAX: usize = 64;
    let n: usize = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of threads"))?;
    if !(1..=MAX).contains(&n) {
        return Err(format!("{n} is out of range: at least 1, at most {MAX}"));
    }
    Ok(n)
}
