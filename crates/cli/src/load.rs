//! `iopath load`: fill shareable buffers from a file, as fast as the storage
//! allows, and say how fast that was.

use std::io::{IsTerminal, Read};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use iopath_heap::{
    load, load_safetensors, EngineOptions, LoadOptions, LoadStats, Loaded, Method, Prefault,
    Tensors,
};

use crate::size::{human, parse_size};

/// Arguments of `iopath load`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  iopath load model.bin                       # memfd buffers, fastest method
  iopath load model.bin --method buffered     # through the page cache
  iopath load disk.img --buffer-size 4M --verify --json
  iopath load model.safetensors --format safetensors --verify")]
pub struct LoadArgs {
    /// The file to load (all of it, unless --buffers says how much).
    pub file: PathBuf,
    /// Where buffers come from: memfd, memfd:thp, memfd:hugetlb, udmabuf,
    /// dma-heap or dma-heap:NAME.
    #[arg(long, default_value = "memfd")]
    pub heap: String,
    /// Size of each buffer (a multiple of the page size), e.g. 4M, 32M. A
    /// file smaller than this gets one buffer of its own size.
    #[arg(long, default_value = "32M", value_parser = parse_size)]
    pub buffer_size: usize,
    /// Fill exactly this many buffers; the file must hold that many bytes.
    /// Default: as many as the whole file needs.
    #[arg(long)]
    pub buffers: Option<usize>,
    /// How to move the bytes: auto (uring or direct, whichever measures
    /// faster over 48 MiB each, in alternating slices; direct only when
    /// more than 10% faster), buffered (pread),
    /// direct (O_DIRECT), sendfile (sendfile/splice), uring (io_uring,
    /// fixed buffers, O_DIRECT).
    #[arg(long, default_value = "auto")]
    pub method: String,
    /// io_uring requests kept in flight (uring and auto), 1 to 4096.
    #[arg(long, default_value_t = 16)]
    pub queue_depth: u32,
    /// io_uring bytes per request (uring and auto), a multiple of 4096 up
    /// to 1G, e.g. 1M, 4M.
    #[arg(long, default_value = "4M", value_parser = parse_size)]
    pub request_size: usize,
    /// Threads allocating buffers (and their pages) while the reads run.
    #[arg(long, default_value_t = 1)]
    pub alloc_threads: usize,
    /// What the allocator thread does to new buffers' pages: allocate
    /// (fallocate; the reads map them), map (MADV_POPULATE_WRITE), none, or
    /// auto (map, measured the fastest for every method).
    #[arg(long, default_value = "auto", value_parser = parse_prefault)]
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
}

/// Runs `iopath load`.
///
/// # Errors
/// Bad input (missing file, directory, empty or short file, bad buffer size,
/// unknown heap or method), I/O failures and verification differences.
pub fn run(args: &LoadArgs) -> Result<()> {
    let method: Method = args.method.parse().map_err(|e| at_fault(args, e))?;
    let heap = iopath_heap::open_heap(&args.heap).map_err(|e| at_fault(args, e))?;
    let opts = LoadOptions {
        buffer_size: args.buffer_size,
        buffers: args.buffers,
        method,
        engine: EngineOptions {
            queue_depth: args.queue_depth,
            chunk: args.request_size,
        },
        alloc_threads: args.alloc_threads,
        prefault: args.prefault,
    };
    let bar = (!args.json && std::io::stderr().is_terminal()).then(|| {
        let bar = ProgressBar::new(0);
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} loading [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        bar
    });
    let mut on_progress = |p: &iopath_heap::Progress| {
        if let Some(bar) = &bar {
            bar.set_length(p.total);
            bar.set_position(p.bytes);
        }
    };
    if args.format == "safetensors" {
        if args.buffers.is_some() {
            bail!("--buffers: not with --format safetensors (the tensors decide the buffers)");
        }
        let t = load_safetensors(&args.file, heap.as_ref(), &opts, &mut on_progress)
            .map_err(|e| at_fault(args, e))?;
        if let Some(bar) = &bar {
            bar.finish_and_clear();
        }
        return report_tensors(args, method, heap.name(), &t);
    }
    let loaded =
        load(&args.file, heap.as_ref(), &opts, &mut on_progress).map_err(|e| at_fault(args, e))?;
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    let verified = if args.verify {
        verify(&args.file, &loaded)?;
        Some(true)
    } else {
        None
    };
    let s = &loaded.stats;
    if args.json {
        let v = serde_json::json!({
            "file": args.file,
            "bytes": s.bytes,
            "seconds": s.elapsed.as_secs_f64(),
            "gib_per_s": s.gib_per_s(),
            "method": s.method.name(),
            "requested_method": method.name(),
            "heap": heap.name(),
            "buffers": s.buffers,
            "buffer_size": s.buffer_size,
            "fallbacks": s.fallbacks,
            "auto_probe": probe_json(s),
            "alloc_ms": s.alloc_time.as_secs_f64() * 1e3,
            "read_ms": s.read_time.as_secs_f64() * 1e3,
            "verified": verified,
        });
        println!("{v}");
    } else {
        println!(
            "loaded {} ({} bytes) into {} x {} {} buffers in {:.3} s: {:.2} GiB/s, method {}{}, {} fallback(s); alloc {:.0} ms (overlapped), read {:.0} ms{}",
            human(s.bytes),
            s.bytes,
            s.buffers,
            human(s.buffer_size as u64),
            heap.name(),
            s.elapsed.as_secs_f64(),
            s.gib_per_s(),
            s.method,
            auto_note(s),
            s.fallbacks,
            s.alloc_time.as_secs_f64() * 1e3,
            s.read_time.as_secs_f64() * 1e3,
            if verified.is_some() { "; verified" } else { "" },
        );
    }
    Ok(())
}

/// Verifies (if asked) and prints a safetensors load.
fn report_tensors(args: &LoadArgs, method: Method, heap: String, t: &Tensors) -> Result<()> {
    let verified = if args.verify {
        verify_tensors(&args.file, t)?;
        Some(true)
    } else {
        None
    };
    let s = &t.stats;
    if args.json {
        let v = serde_json::json!({
            "file": args.file,
            "format": "safetensors",
            "tensors": t.tensors.len(),
            "bytes": s.bytes,
            "seconds": s.elapsed.as_secs_f64(),
            "gib_per_s": s.gib_per_s(),
            "method": s.method.name(),
            "requested_method": method.name(),
            "heap": heap,
            "buffers": s.buffers,
            "buffer_size": s.buffer_size,
            "fallbacks": s.fallbacks,
            "auto_probe": probe_json(s),
            "alloc_ms": s.alloc_time.as_secs_f64() * 1e3,
            "read_ms": s.read_time.as_secs_f64() * 1e3,
            "verified": verified,
        });
        println!("{v}");
    } else {
        println!(
            "loaded {} tensors ({}, {} bytes) into {} {heap} buffers of up to {} in {:.3} s: {:.2} GiB/s, method {}{}, {} fallback(s){}",
            t.tensors.len(),
            human(s.bytes),
            s.bytes,
            s.buffers,
            human(s.buffer_size as u64),
            s.elapsed.as_secs_f64(),
            s.gib_per_s(),
            s.method,
            auto_note(s),
            s.fallbacks,
            if verified.is_some() { "; verified" } else { "" },
        );
    }
    Ok(())
}

/// Compares every tensor with its bytes in the file, read again.
fn verify_tensors(path: &Path, t: &Tensors) -> Result<()> {
    use std::os::unix::fs::FileExt;
    let f =
        std::fs::File::open(path).with_context(|| format!("verify: reopen {}", path.display()))?;
    for (name, x) in &t.tensors {
        let mut want = vec![0u8; x.len];
        f.read_exact_at(&mut want, x.file_offset)
            .with_context(|| format!("verify: read {} at {}", path.display(), x.file_offset))?;
        let mut got = vec![0u8; x.len];
        x.buffer.read_at(x.offset, &mut got)?;
        if let Some(k) = want.iter().zip(&got).position(|(a, b)| a != b) {
            bail!(
                "verify failed: tensor `{name}` byte {k} differs (file offset {}: file has {:#04x}, buffer {} has {:#04x})",
                x.file_offset + k as u64,
                want[k],
                x.buffer_index,
                got[k]
            );
        }
    }
    Ok(())
}

/// `auto`'s measurements, for `--json`.
fn probe_json(s: &LoadStats) -> serde_json::Value {
    match s.probe {
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
        E::BadSize { .. } | E::TooManyBuffers { .. } => Some(size()),
        E::OutOfMemory { .. } => Some(match args.buffers {
            Some(n) => format!("--buffers {n} --buffer-size {}", args.buffer_size),
            None => format!("{}", args.file.display()),
        }),
        E::NoBuffers => Some("--buffers 0".to_string()),
        E::BadQueueDepth { depth } => Some(format!("--queue-depth {depth}")),
        E::BadChunk { chunk } => Some(format!("--request-size {chunk}")),
        E::UnknownMethod(_) => Some("--method".to_string()),
        E::UnknownHeap(_) | E::Unavailable { .. } => Some("--heap".to_string()),
        _ => None,
    };
    match option {
        Some(o) => anyhow::Error::new(e).context(o),
        None => e.into(),
    }
}

fn parse_prefault(s: &str) -> Result<Prefault, String> {
    match s {
        "auto" => Ok(Prefault::Auto),
        "allocate" => Ok(Prefault::Allocate),
        "map" => Ok(Prefault::Map),
        "none" => Ok(Prefault::None),
        _ => Err(format!("`{s}` is not one of auto, allocate, map, none")),
    }
}

/// Compares the loaded buffers with the file, read again independently.
fn verify(path: &Path, loaded: &Loaded) -> Result<()> {
    let mut f =
        std::fs::File::open(path).with_context(|| format!("verify: reopen {}", path.display()))?;
    let mut off = 0u64;
    for (i, (buf, &len)) in loaded.buffers.iter().zip(&loaded.lens).enumerate() {
        let mut want = vec![0u8; len];
        f.read_exact(&mut want)
            .with_context(|| format!("verify: read {} at {off}", path.display()))?;
        let mut got = vec![0u8; len];
        buf.read_at(0, &mut got)?;
        if let Some(k) = want.iter().zip(&got).position(|(a, b)| a != b) {
            bail!(
                "verify failed: byte {} of {} differs (buffer {i}, offset {k}: file has {:#04x}, buffer has {:#04x})",
                off + k as u64,
                path.display(),
                want[k],
                got[k]
            );
        }
        off += len as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use iopath_heap::{HugePages, MemfdHeap};

    #[test]
    fn verify_names_the_first_differing_byte() {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let a = dir.path().join("a");
        let b = dir.path().join("b");
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
        std::fs::write(&a, &data).unwrap();
        let mut other = data.clone();
        other[70_000] ^= 0xff;
        std::fs::write(&b, &other).unwrap();
        let opts = LoadOptions {
            buffer_size: 64 << 10,
            ..LoadOptions::default()
        };
        let heap = MemfdHeap::new(HugePages::None);
        let loaded = load(&a, &heap, &opts, &mut |_| {}).unwrap();
        verify(&a, &loaded).unwrap();
        let err = verify(&b, &loaded).unwrap_err().to_string();
        assert!(
            err.starts_with("verify failed: byte 70000 of ")
                && err.contains("(buffer 1, offset 4464"),
            "{err}"
        );
    }
}
