//! A safe io_uring queue over buffer memory.
//!
//! io_uring reads and writes user memory after the call that queued them
//! returns, so a pointer handed to the kernel must stay valid until its
//! completion is reaped; the `io-uring` crate leaves that to `unsafe` callers.
//! [`Ring`] takes [`BufRange`]s instead and keeps a clone of each range's
//! [`Buffer`] (so its mapping) until the kernel is done with it: per request
//! until its completion is reaped, per fixed-buffer slot until the slot is
//! cleared, and on drop it waits for whatever is still in flight.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use io_uring::{opcode, types, IoUring};

use crate::range::BufRange;
use crate::Buffer;

/// Direction of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    /// File to memory (`READ`/`READ_FIXED`).
    Read,
    /// Memory to file (`WRITE`/`WRITE_FIXED`).
    Write,
}

/// The submission queue is full: submit (or reap) and push again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Full;

/// What a fixed-buffer slot holds: the buffer kept alive and the registered
/// range of it.
#[derive(Debug)]
struct Slot {
    buf: Buffer,
    off: usize,
    len: usize,
}

/// An io_uring instance with a sparse fixed-buffer table.
pub(crate) struct Ring {
    ring: IoUring,
    /// `Some` when the sparse fixed-buffer table could be registered.
    slots: Option<Vec<Option<Slot>>>,
    /// Requests the kernel owns: ring id → (caller's tag, buffer kept alive).
    inflight: HashMap<u64, (u64, Buffer)>,
    next_id: u64,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("fd", &self.ring.as_raw_fd())
            .field("fixed", &self.fixed())
            .field("inflight", &self.inflight.len())
            .finish()
    }
}

impl Ring {
    /// A ring of `entries` submission entries and, if the kernel lets us, a
    /// sparse table of `slots` fixed buffers (`IORING_REGISTER_BUFFERS2`).
    pub(crate) fn new(entries: u32, slots: u16) -> io::Result<Self> {
        let ring = IoUring::new(entries)?;
        let slots = match ring.submitter().register_buffers_sparse(u32::from(slots)) {
            Ok(()) => Some((0..slots).map(|_| None).collect()),
            Err(e) => {
                tracing::info!("io_uring fixed buffers unavailable ({e}); using plain reads");
                None
            }
        };
        Ok(Ring {
            ring,
            slots,
            inflight: HashMap::new(),
            next_id: 0,
        })
    }

    /// Whether fixed buffers can be registered.
    pub(crate) fn fixed(&self) -> bool {
        self.slots.is_some()
    }

    /// Registers `mem` as fixed buffer `slot` (`IORING_REGISTER_BUFFERS_UPDATE`),
    /// which pins its pages once for every request that uses the slot. The
    /// slot keeps the buffer alive until [`Ring::clear`].
    pub(crate) fn register(&mut self, slot: u16, mem: BufRange<'_>) -> io::Result<()> {
        let Some(entry) = self
            .slots
            .as_mut()
            .and_then(|s| s.get_mut(usize::from(slot)))
        else {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        };
        let iov = libc::iovec {
            iov_base: mem.as_ptr().cast(),
            iov_len: mem.len(),
        };
        // SAFETY: the iovec describes mapped buffer memory; the slot keeps a
        // clone of that buffer (so the mapping) until it is cleared, and the
        // kernel pins the pages, so they outlive any request using the slot.
        unsafe {
            self.ring
                .submitter()
                .register_buffers_update(u32::from(slot), &[iov], None)
        }?;
        *entry = Some(Slot {
            buf: mem.buffer().clone(),
            off: mem.offset(),
            len: mem.len(),
        });
        Ok(())
    }

    /// Clears fixed buffer `slot`. Requests already using it keep the kernel's
    /// own reference to the registration until they complete.
    pub(crate) fn clear(&mut self, slot: u16) {
        let Some(entry) = self
            .slots
            .as_mut()
            .and_then(|s| s.get_mut(usize::from(slot)))
        else {
            return;
        };
        let clear = libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        // SAFETY: an empty iovec only unregisters the slot.
        match unsafe {
            self.ring
                .submitter()
                .register_buffers_update(u32::from(slot), &[clear], None)
        } {
            Ok(()) => *entry = None,
            // The slot stays registered, so its buffer stays alive with it.
            Err(e) => tracing::warn!("io_uring: clearing fixed buffer {slot} failed: {e}"),
        }
    }

    /// Queues a read into or a write from `mem` at file offset `off` of `fd`,
    /// through fixed buffer `slot` when given (which must hold `mem`), tagged
    /// `tag` for [`Ring::reap`]. At most 4 GiB - 1 per request.
    ///
    /// The ring keeps `mem`'s buffer alive until the completion is reaped.
    /// `fd` must stay open until then (the kernel resolves it at submission).
    pub(crate) fn push(
        &mut self,
        op: Op,
        fd: BorrowedFd<'_>,
        mem: BufRange<'_>,
        off: u64,
        slot: Option<u16>,
        tag: u64,
    ) -> Result<(), Full> {
        let fd = types::Fd(fd.as_raw_fd());
        let ptr = mem.as_ptr();
        let len = u32::try_from(mem.len()).unwrap_or(u32::MAX);
        let slot = slot.filter(|&i| self.slot_holds(i, mem));
        let id = self.next_id;
        let sqe = match (op, slot) {
            (Op::Read, Some(i)) => opcode::ReadFixed::new(fd, ptr, len, i).offset(off).build(),
            (Op::Read, None) => opcode::Read::new(fd, ptr, len).offset(off).build(),
            (Op::Write, Some(i)) => opcode::WriteFixed::new(fd, ptr, len, i).offset(off).build(),
            (Op::Write, None) => opcode::Write::new(fd, ptr, len).offset(off).build(),
        }
        .user_data(id);
        // SAFETY: the request points into `mem`, mapped buffer memory; the
        // clone of its buffer stored below keeps the mapping alive until the
        // completion is reaped (`reap`, or `drop`, which waits for it).
        unsafe { self.ring.submission().push(&sqe) }.map_err(|_| Full)?;
        self.next_id += 1;
        self.inflight.insert(id, (tag, mem.buffer().clone()));
        Ok(())
    }

    /// Whether fixed buffer `slot` is registered over all of `mem`.
    fn slot_holds(&self, slot: u16, mem: BufRange<'_>) -> bool {
        let Some(Some(s)) = self.slots.as_ref().and_then(|s| s.get(usize::from(slot))) else {
            return false;
        };
        s.buf.same_as(mem.buffer())
            && s.off <= mem.offset()
            && mem.offset() + mem.len() <= s.off + s.len
    }

    /// Submits what is queued (`io_uring_enter`).
    pub(crate) fn submit(&mut self) -> io::Result<usize> {
        self.ring.submit()
    }

    /// Submits what is queued and waits for at least `want` completions.
    pub(crate) fn submit_and_wait(&mut self, want: usize) -> io::Result<usize> {
        self.ring.submit_and_wait(want)
    }

    /// Takes the completions that are ready: (tag, result) each, the result a
    /// byte count or a negated errno. Releases their buffers.
    pub(crate) fn reap(&mut self) -> Vec<(u64, i32)> {
        let cqes: Vec<_> = self
            .ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        cqes.into_iter()
            .filter_map(|(id, res)| self.inflight.remove(&id).map(|(tag, _buf)| (tag, res)))
            .collect()
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // The kernel may still write into requests' memory: wait for every
        // completion before the buffers they keep alive are released.
        while !self.inflight.is_empty() {
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::error!("io_uring_enter failed while draining: {e}; retrying");
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }
            let _ = self.reap();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::fd::AsFd;

    use iopath_testkit::Feature;

    use super::*;
    use crate::{Heap, HugePages, MemfdHeap};

    fn wait_all(ring: &mut Ring, n: usize) -> Vec<(u64, i32)> {
        let mut got = Vec::new();
        while got.len() < n {
            ring.submit_and_wait(1).unwrap();
            got.extend(ring.reap());
        }
        got.sort();
        got
    }

    #[test]
    fn fixed_and_plain_reads_land_in_the_range_and_keep_the_buffer_alive() {
        let mut ring = match Ring::new(8, 4) {
            Ok(r) => r,
            Err(e) => {
                iopath_testkit::skip(Feature::IoUring, format_args!("io_uring unavailable: {e}"));
                return;
            }
        };
        let mut f = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..3 * 4096u32).map(|i| (i % 251) as u8).collect();
        f.write_all(&data).unwrap();
        let page = crate::page_size();
        let buf = MemfdHeap::new(HugePages::None).alloc(4 * page).unwrap();
        let fixed = ring.fixed();
        if fixed {
            ring.register(1, buf.range(page, 2 * page).unwrap())
                .unwrap();
            assert!(ring.slot_holds(1, buf.range(page, page).unwrap()));
            // Outside the registration: queued as a plain read instead.
            assert!(!ring.slot_holds(1, buf.range(0, page).unwrap()));
        } else {
            iopath_testkit::skip(
                Feature::IoUring,
                "io_uring fixed buffers unavailable: plain reads only",
            );
        }
        let slot = fixed.then_some(1);
        ring.push(
            Op::Read,
            f.as_fd(),
            buf.range(page, page).unwrap(),
            0,
            slot,
            10,
        )
        .unwrap();
        ring.push(
            Op::Read,
            f.as_fd(),
            buf.range(2 * page, page).unwrap(),
            4096,
            slot,
            11,
        )
        .unwrap();
        ring.push(
            Op::Read,
            f.as_fd(),
            buf.range(0, 100).unwrap(),
            8192,
            slot,
            12,
        )
        .unwrap();
        let got = wait_all(&mut ring, 3);
        assert_eq!(got, vec![(10, 4096), (11, 4096), (12, 100)]);
        let mut out = vec![0u8; 3 * page];
        buf.read_at(0, &mut out).unwrap();
        assert_eq!(&out[page..3 * page], &data[..2 * page]);
        assert_eq!(&out[..100], &data[8192..8292]);
        if fixed {
            ring.clear(1);
            assert!(!ring.slot_holds(1, buf.range(page, page).unwrap()));
        }
    }
}
