//! The dma-buf table of `iopath bench heap`: the six ways the
//! `DMA_BUF_IOCTL_RW_FILE` proposal measured to fill dma-bufs from a file,
//! beside iopath's own routes and a buffer pool's second load.
//!
//! The six rows follow the proposal's steps: for each buffer, allocate it
//! (timed as allocation), then fill it with one call (timed as read), one
//! buffer after the other:
//!
//! | row | allocation | fill |
//! |---|---|---|
//! | udmabuf buffered read | memfd + `UDMABUF_CREATE` | `pread` into the memfd's mapping |
//! | udmabuf direct read | the same | `O_DIRECT` `pread` into the memfd's mapping |
//! | udmabuf buffered sendfile | the same | `sendfile(memfd, file)` |
//! | udmabuf direct sendfile | the same | `sendfile(memfd, O_DIRECT file)` |
//! | dmabuf buffered read | `DMA_HEAP_IOCTL_ALLOC` | `pread` into the dma-buf's mapping |
//! | dmabuf direct read | the same | the kernel-side direct read of the unmerged ioctl: missing |
//!
//! iopath's routes run [`iopath_heap::load`] (allocation overlapped with
//! the reads); the pool rows load twice through one [`Pool`], the second
//! load taking the first one's buffers back.

use std::fs::OpenOptions;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::path::Path;
use std::time::Instant;

use iopath_heap::{
    load, open_heap, BufferedEngine, DirectEngine, Engine, Heap, IoFile, LoadOptions, Method, Pool,
    SendfileEngine,
};
use iopath_sys::error_chain;

/// One row of the dma-buf table: ms allocating, reading and in all per
/// run, or why it has none (the kernel's own error) and what it needs.
#[derive(Debug)]
pub(super) struct DmaBufRow {
    pub label: String,
    pub ms: [Vec<f64>; 3],
    pub missing: Option<(String, String)>,
}

impl DmaBufRow {
    fn new(label: impl Into<String>) -> DmaBufRow {
        DmaBufRow {
            label: label.into(),
            ms: Default::default(),
            missing: None,
        }
    }

    fn push(&mut self, figures: [f64; 3]) {
        for (v, x) in self.ms.iter_mut().zip(figures) {
            v.push(x);
        }
    }

    /// Adds a load's figures, or records why it failed (the heap `heap`'s
    /// error and what the row needs).
    fn loaded(&mut self, heap: &str, r: iopath_heap::Result<iopath_heap::Loaded>) {
        match r {
            Ok(l) => self.push(
                [l.stats.alloc_time, l.stats.read_time, l.stats.elapsed]
                    .map(|d| d.as_secs_f64() * 1e3),
            ),
            Err(e) => self.missing = Some((error_chain(&e), super::needs(heap, &e))),
        }
    }
}

/// How a proposal row fills a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fill {
    Buffered,
    Direct,
    Sendfile,
    DirectSendfile,
}

/// What the rows read, into what.
pub(super) struct Plan<'a> {
    pub path: &'a Path,
    pub file: &'a IoFile,
    pub buffers: usize,
    pub buffer_size: usize,
    pub queue_depth: u32,
}

/// The kernel-side direct read the proposal adds has no user-space
/// equivalent: the reason, with what the kernel answers an `O_DIRECT` read
/// into a dma-heap buffer's mapping.
fn kernel_side_missing(plan: &Plan<'_>) -> String {
    let why = "DMA_BUF_IOCTL_RW_FILE (the kernel-side direct read) was not merged";
    let heap = match open_heap("dma-heap:system") {
        Ok(h) => h,
        Err(e) => return format!("{why}; and no dma-heap here: {}", error_chain(&e)),
    };
    if !matches!(plan.file.direct_fd(), Ok(Some(_))) {
        return format!("{why}; no O_DIRECT on this file system");
    }
    // iopath's direct engine: O_DIRECT pread into the dma-buf's mapping.
    let r = heap
        .alloc(plan.buffer_size)
        .and_then(|b| DirectEngine.read(plan.file, 0, &b, 0, plan.buffer_size))
        .map_err(|e| error_chain(&e))
        .and_then(|t| match t.fallbacks {
            0 => Ok(()),
            _ => Err("refused (the engine fell back to buffered)".to_string()),
        });
    match r {
        Err(e) => format!("{why}; O_DIRECT pread into the dma-buf's mapping: {e}"),
        Ok(()) => format!("{why}; O_DIRECT pread into the dma-buf's mapping worked here"),
    }
}

/// `sendfile(memfd, O_DIRECT file)` of `len` bytes at `file_off`, into the
/// memfd from offset 0.
fn direct_sendfile(
    memfd: BorrowedFd<'_>,
    dfd: BorrowedFd<'_>,
    file_off: u64,
    len: usize,
) -> std::io::Result<()> {
    let out = OpenOptions::new()
        .write(true)
        .open(format!("/proc/self/fd/{}", memfd.as_raw_fd()))?;
    let mut off = file_off;
    let end = file_off + len as u64;
    while off < end {
        let want = (end - off) as usize;
        let n = rustix::fs::sendfile(&out, dfd, Some(&mut off), want)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(())
}

/// One run of a proposal row: allocate and fill each buffer in turn.
fn proposal_run(plan: &Plan<'_>, heap: &dyn Heap, fill: Fill) -> Result<(f64, f64), String> {
    let (mut alloc, mut read) = (0.0, 0.0);
    let err = |e: iopath_heap::Error| error_chain(&e);
    for i in 0..plan.buffers {
        let t = Instant::now();
        let b = heap.alloc(plan.buffer_size).map_err(err)?;
        alloc += t.elapsed().as_secs_f64();
        let off = (i * plan.buffer_size) as u64;
        let t = Instant::now();
        let engine: &dyn Engine = match fill {
            Fill::Buffered => &BufferedEngine,
            Fill::Direct => &DirectEngine,
            Fill::Sendfile => &SendfileEngine,
            Fill::DirectSendfile => {
                let memfd = b.memfd().ok_or("no memfd under this buffer")?;
                let dfd = plan.file.direct_fd().map_err(err)?;
                let dfd = dfd.ok_or("no O_DIRECT on this file system")?;
                direct_sendfile(memfd, dfd, off, plan.buffer_size)
                    .map_err(|e| format!("sendfile from O_DIRECT: {e}"))?;
                read += t.elapsed().as_secs_f64();
                continue;
            }
        };
        // Only the direct engine falls back.
        let moved = engine.read(plan.file, off, &b, 0, plan.buffer_size);
        if moved.map_err(err)?.fallbacks > 0 {
            return Err("direct I/O was refused (fell back to buffered)".into());
        }
        read += t.elapsed().as_secs_f64();
    }
    Ok((alloc * 1e3, read * 1e3))
}

fn options(plan: &Plan<'_>, method: Method) -> LoadOptions {
    super::load_options(plan.buffer_size, plan.buffers, method, plan.queue_depth)
}

/// Measures every row `runs` times, each from a cold page cache.
pub(super) fn measure(plan: &Plan<'_>, runs: usize) -> Vec<DmaBufRow> {
    let proposal_rows: [(&str, &str, Fill); 5] = [
        ("udmabuf buffered read", "udmabuf", Fill::Buffered),
        ("udmabuf direct read", "udmabuf", Fill::Direct),
        ("udmabuf buffered sendfile", "udmabuf", Fill::Sendfile),
        ("udmabuf direct sendfile", "udmabuf", Fill::DirectSendfile),
        ("dmabuf buffered read", "dma-heap:system", Fill::Buffered),
    ];
    let iopath_rows: [(&str, Method); 3] = [
        ("udmabuf", Method::Uring),
        ("memfd", Method::Auto),
        ("dma-heap:system", Method::Auto),
    ];
    let pool_heaps = ["memfd", "udmabuf", "dma-heap:system"];
    let mut rows: Vec<DmaBufRow> = proposal_rows
        .iter()
        .map(|(l, _, _)| DmaBufRow::new(*l))
        .collect();
    let mut kernel_side = DmaBufRow::new("dmabuf direct read");
    kernel_side.missing = Some((
        kernel_side_missing(plan),
        "DMA_BUF_IOCTL_RW_FILE, which was not merged".into(),
    ));
    rows.push(kernel_side);
    rows.extend(
        iopath_rows
            .iter()
            .map(|(h, m)| DmaBufRow::new(format!("iopath {h} {m}"))),
    );
    for h in pool_heaps {
        rows.push(DmaBufRow::new(format!("pool {h} auto, 1st load")));
        rows.push(DmaBufRow::new(format!("pool {h} auto, 2nd load")));
    }
    let cold = || {
        let _ = plan.file.drop_cache();
    };
    for _ in 0..runs {
        for (k, (_, heap, fill)) in proposal_rows.iter().enumerate() {
            if rows[k].missing.is_some() {
                continue;
            }
            let r = open_heap(heap)
                .map_err(|e| (error_chain(&e), super::needs(heap, &e)))
                .and_then(|h| {
                    cold();
                    let t = Instant::now();
                    let (a, rd) =
                        proposal_run(plan, h.as_ref(), *fill).map_err(|e| (e.clone(), e))?;
                    Ok((a, rd, t.elapsed().as_secs_f64() * 1e3))
                });
            match r {
                Ok((a, rd, total)) => rows[k].push([a, rd, total]),
                Err(e) => rows[k].missing = Some(e),
            }
        }
        for (j, (heap, method)) in iopath_rows.iter().enumerate() {
            let row = &mut rows[6 + j];
            if row.missing.is_some() {
                continue;
            }
            cold();
            let r = open_heap(heap)
                .and_then(|h| load(plan.path, h.as_ref(), &options(plan, *method), &mut |_| {}));
            if let Ok(l) = &r {
                if l.stats.method != *method {
                    row.label = format!("iopath {heap} {method} ({})", l.stats.method);
                }
            }
            row.loaded(heap, r);
        }
        for (j, heap) in pool_heaps.iter().enumerate() {
            let at = 9 + 2 * j;
            if rows[at].missing.is_some() {
                continue;
            }
            let bytes = (plan.buffers * plan.buffer_size) as u64;
            let pool = match open_heap(heap).and_then(|h| Pool::new(h, bytes)) {
                Ok(p) => p,
                Err(e) => {
                    let why = (error_chain(&e), super::needs(heap, &e));
                    rows[at].missing = Some(why.clone());
                    rows[at + 1].missing = Some(why);
                    continue;
                }
            };
            for second in [0, 1] {
                cold();
                let r = load(plan.path, &pool, &options(plan, Method::Auto), &mut |_| {});
                rows[at + second].loaded(heap, r);
            }
        }
    }
    rows
}
