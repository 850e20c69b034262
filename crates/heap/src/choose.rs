//! Which heap: one named ([`open_heap`]), or `auto`, the heap this kernel
//! does best, and why; and the method for a load whose reads are small.
//!
//! For `auto`: a dma-heap (`/dev/dma_heap/system`) when the kernel has
//! one and direct I/O can fill its buffers through their mapping; else
//! udmabuf (direct I/O fills the memfd under it, which then backs the
//! dma-buf); else memfd. On Linux 6.12 the `system` heap maps its pages as
//! PFNs, which direct I/O cannot pin, so udmabuf is chosen where it exists.

use std::fmt;

use crate::heap::{DmaHeap, Heap, HugePages, MemfdHeap, UdmabufHeap};
use crate::{page_size, Error, LoadOptions, Method, Result};
use iopath_sys::error_chain;

/// Mean read below which `auto` takes `buffered`: 16 pages (64 KiB).
/// io_uring and direct I/O move whole blocks and pay a submission per read
/// (an unaligned tail costs a staged block), so for a safetensors file of
/// many small tensors (100,000 of about 70 bytes: 6 to 14 s with io_uring
/// against 2 to 4 s buffered) they move far more than the data; from a few
/// dozen KiB per read on, they win on a cold file as the probe measures.
pub(crate) const SMALL_READS: usize = 16;

/// `opts` for a load made of `reads` reads of `bytes` in all: with
/// `auto`, `buffered` when the mean read is under [`SMALL_READS`] pages
/// (no probe would be worth its reads); otherwise as given.
pub(crate) fn for_reads(opts: &LoadOptions, reads: usize, bytes: u64) -> LoadOptions {
    let mut o = *opts;
    if o.method == Method::Auto
        && reads > 0
        && bytes / (reads as u64) < (SMALL_READS * page_size()) as u64
    {
        o.method = Method::Buffered;
    }
    o
}

/// The heap `auto` chose and why.
pub struct HeapChoice {
    /// The heap.
    pub heap: Box<dyn Heap>,
    /// Why it, and why not the ones before it, in one line.
    pub why: String,
}

impl fmt::Debug for HeapChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HeapChoice")
            .field("heap", &self.heap.name())
            .field("why", &self.why)
            .finish()
    }
}

/// Chooses the heap for `auto` (see the module docs). Never fails: memfd
/// is always there.
pub fn choose_heap() -> HeapChoice {
    let mut passed = Vec::new();
    match DmaHeap::open("system") {
        Ok(h) => match h.probe_direct_io() {
            Ok(()) => {
                return HeapChoice {
                    heap: Box::new(h),
                    why: "the kernel has dma-heap:system and direct I/O can fill its buffers"
                        .into(),
                }
            }
            Err(e) => passed.push(format!(
                "dma-heap:system refuses direct I/O into its mapping ({})",
                error_chain(&e)
            )),
        },
        Err(e) => passed.push(format!("no dma-heap:system ({})", error_chain(&e))),
    }
    match UdmabufHeap::open().and_then(|h| h.alloc(page_size()).map(|_| h)) {
        Ok(h) => {
            passed.push("udmabuf: direct I/O fills the memfd under each dma-buf".to_string());
            return HeapChoice {
                heap: Box::new(h),
                why: passed.join("; "),
            };
        }
        Err(e) => passed.push(format!("no udmabuf ({})", error_chain(&e))),
    }
    passed.push("memfd, which is always there".to_string());
    HeapChoice {
        heap: Box::new(MemfdHeap::new(HugePages::None)),
        why: passed.join("; "),
    }
}

/// Opens a heap by name: `memfd`, `memfd:thp`, `memfd:hugetlb`, `udmabuf`,
/// `dma-heap` (the `system` heap), `dma-heap:NAME`, or `auto` (the best this
/// kernel has, see [`choose_heap`]).
///
/// # Errors
/// [`Error::UnknownHeap`] for another name, [`Error::Unavailable`] when the
/// heap's device node does not exist here, [`Error::NoSuchDmaHeap`] for a
/// dma-heap name the kernel does not have.
pub fn open_heap(name: &str) -> Result<Box<dyn Heap>> {
    Ok(match name {
        "auto" => {
            let c = choose_heap();
            tracing::info!("heap auto: {}: {}", c.heap.name(), c.why);
            c.heap
        }
        "memfd" => Box::new(MemfdHeap::new(HugePages::None)),
        "memfd:thp" => Box::new(MemfdHeap::new(HugePages::Transparent)),
        "memfd:hugetlb" => Box::new(MemfdHeap::new(HugePages::Hugetlb)),
        "udmabuf" => Box::new(UdmabufHeap::open()?),
        "dma-heap" => Box::new(DmaHeap::open("system")?),
        other => match other.strip_prefix("dma-heap:") {
            Some(heap) if !heap.is_empty() && !heap.contains('/') => Box::new(DmaHeap::open(heap)?),
            _ => return Err(Error::UnknownHeap(other.to_string())),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn unknown_names_are_refused() {
        assert!(matches!(open_heap("nope"), Err(Error::UnknownHeap(n)) if n == "nope"));
        assert!(matches!(
            open_heap("dma-heap:../x"),
            Err(Error::UnknownHeap(_))
        ));
    }

    #[test]
    fn absent_devices_say_so() {
        if !Path::new(UdmabufHeap::PATH).exists() {
            let err = open_heap("udmabuf").unwrap_err();
            assert!(
                matches!(&err, Error::Unavailable { heap, .. } if heap == "udmabuf"),
                "{err}"
            );
        }
        if !Path::new("/dev/dma_heap/system").exists() {
            assert!(matches!(
                open_heap("dma-heap"),
                Err(Error::Unavailable { .. })
            ));
        }
    }

    #[test]
    fn small_reads_take_buffered_others_keep_their_method() {
        let auto = LoadOptions::default();
        assert_eq!(auto.method, Method::Auto);
        assert_eq!(
            for_reads(&auto, 100_000, 7_000_000).method,
            Method::Buffered
        );
        assert_eq!(for_reads(&auto, 10, 1 << 30).method, Method::Auto);
        assert_eq!(for_reads(&auto, 0, 0).method, Method::Auto);
        let uring = LoadOptions {
            method: Method::Uring,
            ..auto
        };
        assert_eq!(for_reads(&uring, 100_000, 7_000_000).method, Method::Uring);
    }
}
