//! `iopath heaps`: which heaps this kernel has, what direct I/O can do with
//! each, and what `--heap auto` takes.

use iopath_heap::{open_heap, page_size, DmaHeap, Heap, UdmabufHeap};
use iopath_sys::error_chain;

/// One line per heap: `NAME available (notes)` or `NAME unavailable: why`,
/// then the `auto` line.
pub fn run() {
    let mut names: Vec<String> = ["memfd", "memfd:thp", "memfd:hugetlb", "udmabuf"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let dma = DmaHeap::names();
    if dma.is_empty() {
        names.push("dma-heap".into());
    }
    names.extend(dma.iter().map(|n| format!("dma-heap:{n}")));
    for name in &names {
        match open_heap(name).and_then(|h| h.alloc(page_size() * 512).map(|_| h)) {
            Ok(h) => println!("{name:<16} available{}", notes(name, h.as_ref())),
            Err(e) => println!("{name:<16} unavailable: {}", error_chain(&e)),
        }
    }
    let c = iopath_heap::choose_heap();
    println!("{:<16} {}: {}", "auto", c.heap.name(), c.why);
}

/// What a heap's loads are like: udmabuf's size limit; whether direct I/O
/// fills a dma-heap's mapping.
fn notes(name: &str, heap: &dyn Heap) -> String {
    if name == "udmabuf" {
        let limit = UdmabufHeap::open().ok().and_then(|u| u.limit_mb());
        return match limit {
            Some(mb) => format!(
                " (direct I/O fills the memfd under each dma-buf; at most {mb} MiB per buffer: size_limit_mb)"
            ),
            None => " (direct I/O fills the memfd under each dma-buf)".into(),
        };
    }
    if let Some(h) = name.strip_prefix("dma-heap:") {
        return match DmaHeap::open(h).map(|d| d.probe_direct_io()) {
            Ok(Ok(())) => " (direct I/O fills its mapping)".into(),
            Ok(Err(e)) => format!(
                " (its mapping refuses direct I/O: {}; loads take bounce or buffered)",
                error_chain(&e)
            ),
            Err(_) => String::new(),
        };
    }
    let _ = heap;
    String::new()
}
