//! Which heaps this kernel has and what direct I/O can do with each:
//! [`survey_heaps`], what `iopath heaps` lists.

use std::fmt;

use crate::{open_heap, page_size, DmaHeap, Error, UdmabufHeap};

/// One heap as this kernel has it.
#[derive(Debug)]
pub struct HeapStatus {
    /// Its name for [`open_heap`].
    pub name: String,
    /// What its loads are like (empty when nothing is worth saying), or
    /// why it cannot give a buffer.
    pub usable: Result<String, Error>,
}

/// `NAME  available (notes)` or `NAME  unavailable: why`.
impl fmt::Display for HeapStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.usable {
            Ok(n) if n.is_empty() => write!(f, "{:<16} available", self.name),
            Ok(n) => write!(f, "{:<16} available ({n})", self.name),
            Err(e) => write!(
                f,
                "{:<16} unavailable: {}",
                self.name,
                iopath_sys::error_chain(e)
            ),
        }
    }
}

/// Every heap [`open_heap`] knows, each tried with a 2 MiB buffer (at 4K
/// pages): memfd and its huge-page forms, udmabuf (and its size limit),
/// and each dma-heap (or `dma-heap` when there is none), with whether
/// direct I/O fills its mapping.
pub fn survey_heaps() -> Vec<HeapStatus> {
    let mut names: Vec<String> = ["memfd", "memfd:thp", "memfd:hugetlb", "udmabuf"]
        .map(String::from)
        .to_vec();
    let dma = DmaHeap::names();
    if dma.is_empty() {
        names.push("dma-heap".into());
    }
    names.extend(dma.iter().map(|n| format!("dma-heap:{n}")));
    names
        .into_iter()
        .map(|name| {
            let usable = open_heap(&name)
                .and_then(|h| h.alloc(page_size() * 512))
                .map(|_| notes(&name));
            HeapStatus { name, usable }
        })
        .collect()
}

/// What a heap's loads are like: udmabuf's size limit; whether direct I/O
/// fills a dma-heap's mapping.
fn notes(name: &str) -> String {
    if name == "udmabuf" {
        let limit = UdmabufHeap::open().ok().and_then(|u| u.limit_mb());
        return match limit {
            Some(mb) => format!(
                "direct I/O fills the memfd under each dma-buf; at most {mb} MiB per buffer: size_limit_mb"
            ),
            None => "direct I/O fills the memfd under each dma-buf".into(),
        };
    }
    match name.strip_prefix("dma-heap:").map(DmaHeap::open) {
        Some(Ok(d)) => match d.probe_direct_io() {
            Ok(()) => "direct I/O fills its mapping".into(),
            Err(e) => format!(
                "its mapping refuses direct I/O: {}; loads take bounce or buffered",
                iopath_sys::error_chain(&e)
            ),
        },
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memfd_first_and_every_kind_listed() {
        let all = survey_heaps();
        assert_eq!(all[0].to_string(), "memfd            available");
        let names: Vec<&str> = all.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(names[1..4], ["memfd:thp", "memfd:hugetlb", "udmabuf"]);
        assert!(names[4..].iter().all(|n| n.starts_with("dma-heap")));
        for h in all.iter().filter(|h| h.usable.is_err()) {
            assert!(h.to_string().contains(" unavailable: "), "{h}");
        }
    }
}
