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
use std::time::Instant;

use iopath_heap::{
    open_heap, BufferedEngine, DirectEngine, Engine, Heap, Loaded, Method, Pool, SendfileEngine,
};
use iopath_sys::error_chain;

use super::{load_ms, needs, push_run, Plan};

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

    /// Adds a run's figures, or records why the row has none.
    fn record(&mut self, r: Result<[f64; 3], (String, String)>) {
        match r {
            Ok(ms) => push_run(&mut self.ms, ms),
            Err(e) => self.missing = Some(e),
        }
    }

    /// Adds a load's figures, or records why it failed on heap `heap`.
    fn loaded(&mut self, heap: &str, r: iopath_heap::Result<Loaded>) {
        self.record(r.map(|l| load_ms(&l.stats)).map_err(|e| missing(heap, &e)));
    }
}

/// Why a row on `heap` has no figures (`e`) and what it needs.
fn missing(heap: &str, e: &iopath_heap::Error) -> (String, String) {
    (error_chain(e), needs(heap, e))
}

/// How a proposal row fills a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fill {
    Buffered,
    Direct,
    Sendfile,
    DirectSendfile,
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
    let (mut off, end) = (file_off, file_off + len as u64);
    while off < end {
        let want = (end - off) as usize;
        if rustix::fs::sendfile(&out, dfd, Some(&mut off), want)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(())
}

/// One run of a proposal row: allocate and fill each buffer in turn; ms
/// allocating, reading and in all.
fn proposal_run(plan: &Plan<'_>, heap: &dyn Heap, fill: Fill) -> Result<[f64; 3], String> {
    let start = Instant::now();
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
    Ok([alloc, read, start.elapsed().as_secs_f64()].map(|s| s * 1e3))
}

/// Measures every row `runs` times, each from a cold page cache.
pub(super) fn measure(plan: &Plan<'_>, runs: usize) -> Vec<DmaBufRow> {
    let mut steps = [
        ("udmabuf buffered read", "udmabuf", Fill::Buffered),
        ("udmabuf direct read", "udmabuf", Fill::Direct),
        ("udmabuf buffered sendfile", "udmabuf", Fill::Sendfile),
        ("udmabuf direct sendfile", "udmabuf", Fill::DirectSendfile),
        ("dmabuf buffered read", "dma-heap:system", Fill::Buffered),
    ]
    .map(|(label, heap, fill)| (DmaBufRow::new(label), heap, fill));
    let mut kernel_side = DmaBufRow::new("dmabuf direct read");
    kernel_side.missing = Some((
        kernel_side_missing(plan),
        "DMA_BUF_IOCTL_RW_FILE, which was not merged".into(),
    ));
    let mut loaders = [
        ("udmabuf", Method::Uring),
        ("memfd", Method::Auto),
        ("dma-heap:system", Method::Auto),
    ]
    .map(|(heap, method)| {
        let row = DmaBufRow::new(format!("iopath {heap} {method}"));
        (row, heap, method)
    });
    let mut pools = ["memfd", "udmabuf", "dma-heap:system"].map(|heap| {
        let load = |nth| DmaBufRow::new(format!("pool {heap} auto, {nth} load"));
        (heap, [load("1st"), load("2nd")])
    });
    let cold = || {
        let _ = plan.file.drop_cache();
    };
    for _ in 0..runs {
        for (row, heap, fill) in steps.iter_mut().filter(|s| s.0.missing.is_none()) {
            let r = open_heap(heap)
                .map_err(|e| missing(heap, &e))
                .and_then(|h| {
                    cold();
                    proposal_run(plan, h.as_ref(), *fill).map_err(|e| (e.clone(), e))
                });
            row.record(r);
        }
        for (row, heap, method) in loaders.iter_mut().filter(|l| l.0.missing.is_none()) {
            cold();
            let r = open_heap(heap).and_then(|h| plan.load(h.as_ref(), *method));
            if let Ok(l) = &r {
                if l.stats.method != *method {
                    row.label = format!("iopath {heap} {method} ({})", l.stats.method);
                }
            }
            row.loaded(heap, r);
        }
        // The second load takes the first one's buffers back; a pool whose
        // first load failed is not loaded again.
        for (heap, loads) in pools.iter_mut().filter(|p| p.1[0].missing.is_none()) {
            let bytes = (plan.buffers * plan.buffer_size) as u64;
            match open_heap(heap).and_then(|h| Pool::new(h, bytes)) {
                Ok(pool) => {
                    for row in loads {
                        cold();
                        row.loaded(heap, plan.load(&pool, Method::Auto));
                    }
                }
                Err(e) => loads
                    .iter_mut()
                    .for_each(|r| r.missing = Some(missing(heap, &e))),
            }
        }
    }
    let mut rows: Vec<DmaBufRow> = steps.into_iter().map(|s| s.0).collect();
    rows.push(kernel_side);
    rows.extend(loaders.into_iter().map(|l| l.0));
    rows.extend(pools.into_iter().flat_map(|p| p.1));
    rows
}
