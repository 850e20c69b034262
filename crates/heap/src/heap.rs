//! Heaps: where buffers come from.
//!
//! - [`MemfdHeap`]: always available; `memfd_create(2)` sealed against
//!   shrinking, optionally backed by transparent or hugetlb huge pages.
//! - [`UdmabufHeap`]: a memfd turned into a dma-buf by `/dev/udmabuf`
//!   (`UDMABUF_CREATE`, include/uapi/linux/udmabuf.h).
//! - [`DmaHeap`]: a Linux dma-buf heap, `/dev/dma_heap/<name>`
//!   (`DMA_HEAP_IOCTL_ALLOC`, include/uapi/linux/dma-heap.h).
//!
//! A heap whose device node is absent fails with [`Error::Unavailable`].

use std::fmt;
use std::fs::OpenOptions;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use memfd::{FileSeal, HugetlbSize, MemfdOptions};

use crate::{Buffer, Error, Result};

/// Which heap a buffer came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HeapKind {
    /// A memfd (or any shared-memory file).
    Memfd,
    /// A udmabuf dma-buf over a memfd.
    Udmabuf,
    /// A dma-buf from a dma-heap.
    DmaHeap,
    /// A regular file's own pages, mapped private (copy-on-write): views
    /// of the page cache, not memory of their own (see
    /// [`crate::Buffer::map_file`]).
    File,
}

impl HeapKind {
    pub(crate) fn to_wire(self) -> u32 {
        match self {
            HeapKind::Memfd => 1,
            HeapKind::Udmabuf => 2,
            HeapKind::DmaHeap => 3,
            HeapKind::File => 4,
        }
    }

    pub(crate) fn from_wire(v: u32) -> Option<Self> {
        Some(match v {
            1 => HeapKind::Memfd,
            2 => HeapKind::Udmabuf,
            3 => HeapKind::DmaHeap,
            4 => HeapKind::File,
            _ => return None,
        })
    }

    /// Whether the buffer is a dma-buf (CPU access should be bracketed by
    /// `DMA_BUF_IOCTL_SYNC`).
    pub fn is_dma_buf(self) -> bool {
        !matches!(self, HeapKind::Memfd | HeapKind::File)
    }
}

impl fmt::Display for HeapKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HeapKind::Memfd => "memfd",
            HeapKind::Udmabuf => "udmabuf",
            HeapKind::DmaHeap => "dma-heap",
            HeapKind::File => "file",
        })
    }
}

/// A source of [`Buffer`]s.
pub trait Heap: Send + Sync + fmt::Debug {
    /// Short name, as accepted by [`crate::open_heap`].
    fn name(&self) -> String;

    /// Allocates a zero-filled buffer of `len` bytes (a page multiple).
    ///
    /// # Errors
    /// [`Error::BadSize`] for a length that is zero or not a page multiple;
    /// [`Error::Sys`] when the kernel refuses.
    fn alloc(&self, len: usize) -> Result<Buffer>;

    /// The unit buffer lengths must be a multiple of (the page size, or the
    /// huge page size for hugetlb).
    fn granule(&self) -> usize {
        crate::page_size()
    }

    /// Bytes this heap can allocate now and what limits it (`None` when
    /// unknown). The default is ordinary memory: `MemAvailable`, or less
    /// under a memory cgroup.
    fn available(&self) -> Option<(u64, &'static str)> {
        crate::limits::available_memory().map(|a| (a.bytes, a.what))
    }

    /// Checks that one buffer of `len` bytes is not over a limit of the
    /// heap's (udmabuf's `size_limit_mb`), before anything is allocated.
    ///
    /// # Errors
    /// [`Error::UdmabufLimit`] for a udmabuf over the module's limit.
    fn check_len(&self, len: usize) -> Result<()> {
        let _ = len;
        Ok(())
    }
}

fn check_size(len: usize) -> Result<()> {
    let page = crate::page_size();
    if len == 0 || len % page != 0 {
        return Err(Error::BadSize { size: len, page });
    }
    Ok(())
}

/// Huge-page backing for memfd buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HugePages {
    /// Ordinary pages.
    None,
    /// Ask for transparent huge pages (`MADV_HUGEPAGE`); the kernel decides.
    Transparent,
    /// `MFD_HUGETLB` 2 MiB pages from the hugetlb pool; fails when the pool
    /// (`/proc/sys/vm/nr_hugepages`) has too few pages.
    Hugetlb,
}

/// memfd-backed buffers: always available, sealed against shrinking so a
/// peer cannot truncate the memory under a mapping.
#[derive(Debug, Clone)]
pub struct MemfdHeap {
    huge: HugePages,
}

impl MemfdHeap {
    /// A memfd heap with the given huge-page policy.
    pub fn new(huge: HugePages) -> Self {
        MemfdHeap { huge }
    }

    /// Creates the sealed memfd of `len` bytes without mapping it.
    pub(crate) fn create_memfd(&self, len: usize) -> Result<OwnedFd> {
        check_size(len)?;
        let mut opts = MemfdOptions::new().allow_sealing(true).close_on_exec(true);
        if self.huge == HugePages::Hugetlb {
            opts = opts.hugetlb(Some(HugetlbSize::Huge2MB));
        }
        let mfd = opts
            .create("iopath-buffer")
            .map_err(|e| Error::sys("memfd_create", memfd_err(e)))?;
        mfd.as_file()
            .set_len(len as u64)
            .map_err(|e| Error::sys("ftruncate(memfd)", e))?;
        mfd.add_seals(&[FileSeal::SealShrink, FileSeal::SealGrow])
            .map_err(|e| Error::sys("fcntl(F_ADD_SEALS)", memfd_err(e)))?;
        Ok(OwnedFd::from(mfd.into_file()))
    }
}

fn memfd_err(e: memfd::Error) -> std::io::Error {
    match e {
        memfd::Error::Create(e) | memfd::Error::AddSeals(e) | memfd::Error::GetSeals(e) => e,
    }
}

impl Heap for MemfdHeap {
    fn name(&self) -> String {
        match self.huge {
            HugePages::None => "memfd".into(),
            HugePages::Transparent => "memfd:thp".into(),
            HugePages::Hugetlb => "memfd:hugetlb".into(),
        }
    }

    fn granule(&self) -> usize {
        match self.huge {
            HugePages::Hugetlb => 2 << 20,
            _ => crate::page_size(),
        }
    }

    fn available(&self) -> Option<(u64, &'static str)> {
        match self.huge {
            HugePages::Hugetlb => crate::limits::available_hugetlb(),
            _ => crate::limits::available_memory(),
        }
        .map(|a| (a.bytes, a.what))
    }

    fn alloc(&self, len: usize) -> Result<Buffer> {
        if self.huge == HugePages::Hugetlb && len % (2 << 20) != 0 {
            return Err(Error::BadSize {
                size: len,
                page: 2 << 20,
            });
        }
        let fd = self.create_memfd(len)?;
        let buf = Buffer::from_fd(fd, len, HeapKind::Memfd)?;
        if self.huge == HugePages::Transparent {
            buf.advise_hugepage()?;
        }
        Ok(buf)
    }
}

/// udmabuf: a memfd (sealed against shrinking, as the driver requires)
/// turned into a dma-buf by `/dev/udmabuf`. Note the kernel's default limit
/// of 64 MiB per buffer (`udmabuf.size_limit_mb`).
#[derive(Debug)]
pub struct UdmabufHeap {
    dev: std::fs::File,
    memfd: MemfdHeap,
    /// The module's `size_limit_mb`, when it can be read.
    limit_mb: Option<u64>,
}

impl UdmabufHeap {
    /// The device node.
    pub const PATH: &'static str = "/dev/udmabuf";
    /// Where the kernel shows the per-buffer limit, in MiB.
    pub const LIMIT_PATH: &'static str = "/sys/module/udmabuf/parameters/size_limit_mb";
    /// The kernel's default `size_limit_mb`.
    pub const DEFAULT_LIMIT_MB: u64 = 64;

    /// The largest buffer the kernel's udmabuf takes, in MiB
    /// (`size_limit_mb`); `None` when it cannot be read.
    pub fn limit_mb(&self) -> Option<u64> {
        self.limit_mb
    }

    /// Opens `/dev/udmabuf`.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when the node does not exist.
    pub fn open() -> Result<Self> {
        let dev = open_dev("udmabuf", Path::new(Self::PATH))?;
        let limit_mb = std::fs::read_to_string(Self::LIMIT_PATH)
            .ok()
            .and_then(|s| s.trim().parse().ok());
        Ok(UdmabufHeap {
            dev,
            memfd: MemfdHeap::new(HugePages::None),
            limit_mb,
        })
    }
}

impl Heap for UdmabufHeap {
    fn name(&self) -> String {
        "udmabuf".into()
    }

    fn check_len(&self, len: usize) -> Result<()> {
        match self.limit_mb {
            Some(mb) if len as u64 > mb << 20 => Err(Error::UdmabufLimit {
                size: len,
                limit_mb: Some(mb),
            }),
            _ => Ok(()),
        }
    }

    fn alloc(&self, len: usize) -> Result<Buffer> {
        self.check_len(len)?;
        let memfd = self.memfd.create_memfd(len)?;
        let dmabuf =
            crate::sys::udmabuf_create(self.dev.as_fd(), memfd.as_fd(), len).map_err(|e| {
                // The limit could not be read but the kernel refused the size.
                if crate::sys::is_einval(&e)
                    && self.limit_mb.is_none()
                    && len as u64 > Self::DEFAULT_LIMIT_MB << 20
                {
                    Error::UdmabufLimit {
                        size: len,
                        limit_mb: None,
                    }
                } else {
                    Error::sys("ioctl(UDMABUF_CREATE)", e)
                }
            })?;
        Buffer::from_udmabuf(dmabuf, memfd, len)
    }
}

/// A Linux dma-buf heap, `/dev/dma_heap/<name>` (e.g. `system`).
#[derive(Debug)]
pub struct DmaHeap {
    name: String,
    dev: std::fs::File,
    /// Whether its buffers' mappings take direct I/O (probed once).
    direct_io: std::sync::OnceLock<bool>,
}

impl DmaHeap {
    /// Where the kernel's dma-heaps are.
    pub const DIR: &'static str = "/dev/dma_heap";

    /// Opens `/dev/dma_heap/<name>`.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when the kernel has no dma-heaps at all,
    /// [`Error::NoSuchDmaHeap`] (listing those it has) when it has others.
    pub fn open(name: &str) -> Result<Self> {
        let path = PathBuf::from(Self::DIR).join(name);
        let dev = match open_dev(&format!("dma-heap:{name}"), &path) {
            Err(Error::Unavailable { .. }) if !Self::names().is_empty() => {
                return Err(Error::NoSuchDmaHeap {
                    name: name.to_string(),
                    known: Self::names().join(", "),
                })
            }
            r => r?,
        };
        Ok(DmaHeap {
            name: name.to_string(),
            dev,
            direct_io: std::sync::OnceLock::new(),
        })
    }

    /// The dma-heaps this kernel has (the names in `/dev/dma_heap`), sorted.
    pub fn names() -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(Self::DIR)
            .map(|d| {
                d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    /// Whether direct I/O can fill this heap's buffers straight through
    /// their mapping: a page of a fresh buffer is pinned as `O_DIRECT`
    /// would pin it. `Err` holds the kernel's refusal.
    ///
    /// # Errors
    /// The allocation's error, or the pin's (`EFAULT` for a mapping of
    /// PFNs, as the `system` heap's).
    pub fn probe_direct_io(&self) -> Result<()> {
        let buf = self.alloc_raw(crate::page_size())?;
        let r = crate::sys::pin_probe(buf.range(0, buf.len())?)
            .map_err(|e| Error::sys("pinning a page of its mapping (vmsplice)", e));
        let _ = self.direct_io.set(r.is_ok());
        r
    }

    fn alloc_raw(&self, len: usize) -> Result<Buffer> {
        check_size(len)?;
        let fd = crate::sys::dma_heap_alloc(self.dev.as_fd(), len)
            .map_err(|e| Error::sys("ioctl(DMA_HEAP_IOCTL_ALLOC)", e))?;
        Buffer::from_fd(fd, len, HeapKind::DmaHeap)
    }
}

impl Heap for DmaHeap {
    fn name(&self) -> String {
        format!("dma-heap:{}", self.name)
    }

    fn alloc(&self, len: usize) -> Result<Buffer> {
        let direct = match self.direct_io.get() {
            Some(&d) => d,
            None => self.probe_direct_io().is_ok(),
        };
        Ok(self.alloc_raw(len)?.set_takes_direct_io(direct))
    }
}

fn open_dev(heap: &str, path: &Path) -> Result<std::fs::File> {
    match OpenOptions::new().read(true).write(true).open(path) {
        Ok(f) => Ok(f),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Error::Unavailable {
            heap: heap.to_string(),
            path: path.to_path_buf(),
        }),
        Err(e) => Err(Error::sys("open heap device", e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memfd_alloc_is_zeroed_and_sealed() {
        let heap = MemfdHeap::new(HugePages::None);
        let buf = heap.alloc(4 * crate::page_size()).unwrap();
        let mut out = vec![1u8; buf.len()];
        buf.read_at(0, &mut out).unwrap();
        assert!(out.iter().all(|&b| b == 0));
        // F_SEAL_SHRINK: truncating the memfd must fail with EPERM.
        let err = rustix::fs::ftruncate(buf.fd(), 0).unwrap_err();
        assert_eq!(err, rustix::io::Errno::PERM);
    }

    #[test]
    fn bad_sizes() {
        let heap = MemfdHeap::new(HugePages::None);
        assert!(matches!(heap.alloc(0), Err(Error::BadSize { size: 0, .. })));
        assert!(matches!(
            heap.alloc(100),
            Err(Error::BadSize { size: 100, .. })
        ));
    }

    #[test]
    fn busy_while_pinned() {
        let buf = MemfdHeap::new(HugePages::None)
            .alloc(crate::page_size())
            .unwrap();
        let pin = buf.pin_for_device();
        assert!(matches!(
            buf.write_at(0, b"x"),
            Err(Error::Busy { maps: 1 })
        ));
        pin.write_back(0, b"dev").unwrap();
        drop(pin);
        buf.write_at(3, b"cpu").unwrap();
        let mut out = [0u8; 6];
        buf.read_at(0, &mut out).unwrap();
        assert_eq!(&out, b"devcpu");
        assert!(matches!(
            buf.read_at(buf.len() - 1, &mut out),
            Err(Error::OutOfRange { len: 6, .. })
        ));
    }
}
