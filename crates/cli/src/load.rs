//! `iopath load`: fill shareable buffers from a file, as fast as the storage
//! allows, and say how fast that was.

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::Result;
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use iopath_heap::{
    load, load_checkpoint, EngineOptions, LoadOptions, Prefault, DEFAULT_SHARDS_AT_ONCE,
};

use iopath_sys::parse_size;

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
    #[arg(long, default_value_t = 1, value_parser = one_to_64("threads"))]
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
    #[arg(long, default_value_t = DEFAULT_SHARDS_AT_ONCE, value_parser = one_to_64("shards"))]
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
    let (stats, summary, tensors) = if safetensors {
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
        (t.stats, t.summary(&heap_name), Some(t))
    } else {
        let loaded = load(&args.file, heap.as_ref(), &opts, &mut on_progress)
            .map_err(|e| at_fault(args, e))?;
        if let Some(bars) = &bars {
            bars.clear();
        }
        if args.verify {
            loaded.verify(&args.file)?;
        }
        (loaded.stats, loaded.summary(&heap_name), None)
    };
    if args.json {
        let mut v = serde_json::to_value(stats)?;
        v["file"] = serde_json::json!(args.file);
        v["requested_method"] = opts.method_name().into();
        v["heap"] = heap_name.into();
        v["heap_why"] = heap_why.into();
        v["verified"] = args.verify.then_some(true).into();
        if let Some(t) = &tensors {
            v["format"] = "safetensors".into();
            v["tensors"] = t.tensors.len().into();
            v["shards"] = serde_json::to_value(&t.shards)?;
        }
        println!("{v}");
        return Ok(());
    }
    let verified = if args.verify { "; verified" } else { "" };
    println!("{summary}{verified}");
    if let Some(why) = heap_why {
        println!("heap auto chose {heap_name}: {why}");
    }
    Ok(())
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
            let w = p.shards.to_string().len();
            let label = format!("shard {:>w$}/{}", p.shard + 1, p.shards);
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

/// `--alloc-threads` and `--shards-at-once`: 1 to 64 (more threads than
/// that only contend for the same page allocator and address-space lock).
fn one_to_64(what: &'static str) -> impl Fn(&str) -> Result<usize, String> + Clone {
    move |s| match s.parse() {
        Ok(n @ 1..=64) => Ok(n),
        Ok(n) => Err(format!("{n} is out of range: at least 1, at most 64")),
        Err(_) => Err(format!("{s:?} is not a number of {what}")),
    }
}
