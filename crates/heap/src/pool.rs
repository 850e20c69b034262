//! [`Pool`]: buffers kept for the next load instead of freed.
//!
//! Allocating a buffer is most of a cold load's cost on some heaps (a
//! udmabuf's creation pins every page of its memfd; every heap's pages are
//! zeroed and faulted in). A pool keeps every buffer it made: when the last
//! handle to one drops, it is free again, and the next allocation of the
//! same size takes it as it is, pages in place. A pool is a [`Heap`], so
//! [`crate::load`] takes one as it takes any heap.
//!
//! A buffer is free only when the pool holds its one handle, no device pin
//! is alive, and its fd never left the process ([`Buffer::mark_exported`]:
//! [`Buffer::export`] and a share's attach set it). An exported buffer is
//! never reused, since a peer may still map it: the pool lets it go when
//! its last handle here drops.
//!
//! ```text
//!   Pool::alloc ─► free buffer of that size? ─yes─► reuse (no syscall)
//!                          │ no
//!                          └──► heap.alloc ─► kept by the pool (within capacity)
//!   last handle dropped ─► free again (exported: freed for good)
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use iopath_sys::lock;

use crate::{Buffer, Error, Heap, Result};

/// A pool of buffers over a heap (see the module docs).
///
/// A buffer from the pool is *not* zero-filled when it is reused: it holds
/// what its last user left. A load overwrites every byte it reports.
#[derive(Debug)]
pub struct Pool {
    heap: Box<dyn Heap>,
    capacity: u64,
    /// Every buffer the pool holds; free when the pool's is the only handle.
    kept: Mutex<Vec<Buffer>>,
    reused: AtomicU64,
    made: AtomicU64,
}

impl Pool {
    /// A pool over `heap` that keeps up to `capacity` bytes of buffers
    /// (buffers asked for beyond it are allocated and freed as usual).
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] when `capacity` is more than the heap can give
    /// now ([`Heap::available`]); nothing is allocated then.
    pub fn new(heap: Box<dyn Heap>, capacity: u64) -> Result<Self> {
        if let Some((available, what)) = heap.available() {
            if capacity > available {
                return Err(Error::OutOfMemory {
                    needed: capacity,
                    available,
                    what,
                });
            }
        }
        Ok(Pool::keeping(heap, capacity))
    }

    /// A pool over `heap` that keeps every buffer it makes (each load
    /// still checks that its buffers fit in memory, free kept ones
    /// counted: [`Heap::available`]).
    pub fn unbounded(heap: Box<dyn Heap>) -> Self {
        Pool::keeping(heap, u64::MAX)
    }

    fn keeping(heap: Box<dyn Heap>, capacity: u64) -> Self {
        Pool {
            heap,
            capacity,
            kept: Mutex::new(Vec::new()),
            reused: AtomicU64::new(0),
            made: AtomicU64::new(0),
        }
    }

    /// Bytes the pool may keep.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes of buffers the pool keeps (free or in use; exported ones are
    /// not kept).
    pub fn kept_bytes(&self) -> u64 {
        let mut kept = lock(&self.kept);
        forget_exported(&mut kept);
        kept.iter().map(|b| b.len() as u64).sum()
    }

    /// Bytes of kept buffers that are free now.
    pub fn free_bytes(&self) -> u64 {
        let mut kept = lock(&self.kept);
        forget_exported(&mut kept);
        kept.iter()
            .filter(|b| b.handles() == 1)
            .map(|b| b.len() as u64)
            .sum()
    }

    /// Allocations served by reusing a buffer, and by the heap.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.reused.load(Ordering::Relaxed),
            self.made.load(Ordering::Relaxed),
        )
    }

    /// Frees every buffer that is not in use.
    pub fn shrink(&self) {
        lock(&self.kept).retain(|b| b.handles() > 1 && !b.exported());
    }
}

/// Lets go of every kept buffer whose fd left the process: it is freed
/// here when its last other handle drops, and never handed out again.
fn forget_exported(kept: &mut Vec<Buffer>) {
    kept.retain(|b| !b.exported());
}

impl Heap for Pool {
    fn name(&self) -> String {
        self.heap.name()
    }

    /// A free kept buffer of `len` bytes, or a new one from the heap (kept
    /// while the pool has room).
    fn alloc(&self, len: usize) -> Result<Buffer> {
        self.heap.check_len(len)?;
        {
            let mut kept = lock(&self.kept);
            forget_exported(&mut kept);
            // Under the lock no other handle can be made to a buffer only
            // the pool holds, so a count of 1 means free (a device pin holds
            // a handle too). An exported buffer was forgotten above; one
            // exported now, by a handle outside, has a count above 1.
            if let Some(b) = kept.iter().find(|b| b.len() == len && b.handles() == 1) {
                self.reused.fetch_add(1, Ordering::Relaxed);
                return Ok(b.clone());
            }
        }
        let b = self.heap.alloc(len)?;
        self.made.fetch_add(1, Ordering::Relaxed);
        let mut kept = lock(&self.kept);
        forget_exported(&mut kept);
        let bytes: u64 = kept.iter().map(|b| b.len() as u64).sum();
        if bytes.saturating_add(len as u64) <= self.capacity {
            kept.push(b.clone());
        }
        Ok(b)
    }

    fn granule(&self) -> usize {
        self.heap.granule()
    }

    /// The heap's, plus the pool's free bytes.
    fn available(&self) -> Option<(u64, &'static str)> {
        let free = self.free_bytes();
        self.heap
            .available()
            .map(|(a, what)| (a.saturating_add(free), what))
    }

    fn check_len(&self, len: usize) -> Result<()> {
        self.heap.check_len(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{HugePages, MemfdHeap};

    #[test]
    fn dropped_buffers_are_reused() {
        let page = crate::page_size();
        let pool = Pool::new(Box::new(MemfdHeap::new(HugePages::None)), 8 * page as u64).unwrap();
        let a = pool.alloc(4 * page).unwrap();
        a.write_at(0, b"kept").unwrap();
        let addr = a.addr();
        // In use: a second one is made.
        let b = pool.alloc(4 * page).unwrap();
        assert_ne!(b.addr(), addr);
        assert_eq!(pool.counts(), (0, 2));
        assert_eq!(pool.free_bytes(), 0);
        drop(a);
        assert_eq!(pool.free_bytes(), 4 * page as u64);
        let c = pool.alloc(4 * page).unwrap();
        assert_eq!(c.addr(), addr, "the freed buffer came back");
        let mut got = [0u8; 4];
        c.read_at(0, &mut got).unwrap();
        assert_eq!(&got, b"kept", "reused as it was left");
        assert_eq!(pool.counts(), (1, 2));
        // Over capacity: made, not kept.
        let d = pool.alloc(page).unwrap();
        drop(d);
        assert_eq!(pool.kept_bytes(), 8 * page as u64);
        // A pinned buffer is in use even with no other handle.
        drop((b, c));
        let e = pool.alloc(4 * page).unwrap();
        let pin = e.pin_for_device();
        drop(e);
        let f = pool.alloc(4 * page).unwrap();
        assert!(!f.same_as(pin.buffer()));
        drop(pin);
        pool.shrink();
        assert_eq!(pool.kept_bytes(), 4 * page as u64);
    }

    #[test]
    fn an_exported_buffer_is_never_reused() {
        let page = crate::page_size();
        let pool = Pool::new(Box::new(MemfdHeap::new(HugePages::None)), 8 * page as u64).unwrap();
        let a = pool.alloc(2 * page).unwrap();
        a.write_at(0, b"peer sees this").unwrap();
        let (mine, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        a.export(&mine).unwrap();
        let peer = Buffer::import(&theirs).unwrap();
        assert!(a.exported());
        drop(a);
        // Only the pool held it here, but a peer maps it: not free, not
        // kept.
        assert_eq!((pool.free_bytes(), pool.kept_bytes()), (0, 0));
        let b = pool.alloc(2 * page).unwrap();
        b.write_at(0, b"new load......").unwrap();
        let mut got = [0u8; 14];
        peer.read_at(0, &mut got).unwrap();
        assert_eq!(&got, b"peer sees this", "the peer's memory was not reused");
        assert_eq!(pool.counts(), (0, 2));
        // Marked by hand (an fd sent some other way): the same.
        b.mark_exported();
        drop(b);
        assert_eq!(pool.kept_bytes(), 0);
        pool.alloc(2 * page).unwrap();
        assert_eq!(pool.counts(), (0, 3));
    }

    #[test]
    fn an_unbounded_pool_keeps_every_buffer() {
        let page = crate::page_size();
        let pool = Pool::unbounded(Box::new(MemfdHeap::new(HugePages::None)));
        let bufs: Vec<Buffer> = (1..=3).map(|k| pool.alloc(k * page).unwrap()).collect();
        drop(bufs);
        assert_eq!(pool.free_bytes(), 6 * page as u64);
        for k in (1..=3).rev() {
            pool.alloc(k * page).unwrap();
        }
        assert_eq!(pool.counts(), (3, 3));
    }

    /// memfd with udmabuf's kind of per-buffer limit.
    #[derive(Debug)]
    struct Limited(MemfdHeap);

    impl Heap for Limited {
        fn name(&self) -> String {
            "limited".into()
        }
        fn alloc(&self, len: usize) -> Result<Buffer> {
            self.check_len(len)?;
            self.0.alloc(len)
        }
        fn check_len(&self, len: usize) -> Result<()> {
            if len > 2 * crate::page_size() {
                return Err(Error::UdmabufLimit {
                    size: len,
                    limit_mb: Some(0),
                });
            }
            Ok(())
        }
    }

    #[test]
    fn a_refused_size_leaves_the_pool_as_it_was() {
        let page = crate::page_size();
        let pool = Pool::new(Box::new(Limited(MemfdHeap::new(HugePages::None))), 1 << 20).unwrap();
        let a = pool.alloc(page).unwrap();
        drop(a);
        assert!(matches!(
            pool.alloc(4 * page),
            Err(Error::UdmabufLimit { size, .. }) if size == 4 * page
        ));
        assert_eq!(
            (pool.kept_bytes(), pool.free_bytes()),
            (page as u64, page as u64)
        );
        assert_eq!(pool.counts(), (0, 1));
        pool.alloc(page).unwrap();
        assert_eq!(pool.counts(), (1, 1));
    }

    #[test]
    fn more_than_available_is_refused_before_allocating() {
        let heap = MemfdHeap::new(HugePages::None);
        let Some((available, _)) = heap.available() else {
            return;
        };
        match Pool::new(Box::new(heap), available + (1 << 30)) {
            Err(Error::OutOfMemory {
                needed,
                available: a,
                ..
            }) => {
                assert_eq!(needed, available + (1 << 30));
                assert!(a >= available / 2);
            }
            other => panic!("expected OutOfMemory, got {other:?}"),
        }
    }
}
