//! `auto`: the heap this kernel does best, and why.
//!
//! A dma-heap (`/dev/dma_heap/system`) when the kernel has one and direct
//! I/O can fill its buffers through their mapping; else udmabuf (direct
//! I/O fills the memfd under it, which then backs the dma-buf); else memfd.
//! On Linux 6.12 the `system` heap maps its pages as PFNs, which direct I/O
//! cannot pin, so udmabuf is chosen where it exists.

use std::fmt;

use crate::heap::{DmaHeap, Heap, HugePages, MemfdHeap, UdmabufHeap};
use crate::{error_chain, page_size};

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
