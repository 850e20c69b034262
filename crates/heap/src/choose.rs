//! `auto`: the heap this kernel does best, and why; and the method for a
//! load whose reads are small.
//!
//! A dma-heap (`/dev/dma_heap/system`) when the kernel has one and direct
//! I/O can fill its buffers through their mapping; else udmabuf (direct
//! I/O fills the memfd under it, which then backs the dma-buf); else memfd.
//! On Linux 6.12 the `system` heap maps its pages as PFNs, which direct I/O
//! cannot pin, so udmabuf is chosen where it exists.

use std::fmt;

use crate::heap::{DmaHeap, Heap, HugePages, MemfdHeap, UdmabufHeap};
use crate::{page_size, LoadOptions, Method};
use iopath_sys::error_chain;

/// Mean read below which `auto` takes `buffered`: 16 pages (64 KiB).
/// io_uring and direct I/O move whole blocks and pay a submission per read
/// (an unaligned tail costs a bounced block), so for a safetensors file of
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

#[cfg(test)]
mod tests {
    use super::*;

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
