//! What one queue hands the kernel: its io_uring, the requests in flight
//! (everything an SQE points at lives in one [`InFlight`] until its CQE
//! arrives), and how a completion becomes a status byte.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

use io_uring::IoUring;
use iopath_heap::AlignedBuf;
use iopath_virtio::device::{DeviceMemory, DeviceMemoryGuard, DmaTicket};
use vm_memory::{Bytes, GuestAddress, GuestMemory, Permissions};

use crate::request::Segment;
use crate::wire::{VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK};

/// `IOV_MAX`: more segments than this go through a staging buffer.
pub(super) const IOV_MAX: usize = 1024;

#[derive(Clone, Copy, Debug, Eq, PartialEq)]
pub(super) enum Op {
    Read,
    Write,
    Flush,
}

/// A request handed to io_uring; everything its SQE points at lives here
/// (and `mem` keeps the front end's memory mapped) until its CQE arrives.
pub(super) struct InFlight {
    pub(super) head: u16,
    pub(super) status: GuestAddress,
    pub(super) op: Op,
    pub(super) data: Vec<Segment>,
    pub(super) offset: u64,
    pub(super) total: usize,
    pub(super) iovecs: Box<[libc::iovec]>,
    /// The request's data in aligned memory of the back end's own, when
    /// the front end's buffers do not suit `O_DIRECT` (or are too many).
    pub(super) staging: Option<AlignedBuf>,
    pub(super) _mem: DeviceMemoryGuard,
    /// Held while the kernel may still access the front end's memory.
    pub(super) _dma: Option<DmaTicket>,
}

// SAFETY: the iovecs point into `staging` (owned) or into the front end's
// memory kept mapped by `_mem`; neither is tied to the creating thread.
unsafe impl Send for InFlight {}

/// What the kernel holds of one queue: the ring and the requests its
/// entries point at. Shared with the queue thread's before-miss-wait hook
/// (the same thread: the lock is never contended, and never held across a
/// translation, which is where the hook runs).
pub(super) struct IoState {
    pub(super) ring: IoUring,
    pub(super) slots: Vec<Option<InFlight>>,
    pub(super) free: Vec<usize>,
    pub(super) in_flight: usize,
    /// Completions taken out of the ring, their tickets dropped, not yet
    /// written to the used ring.
    pub(super) done: Vec<(InFlight, i32)>,
}

impl IoState {
    /// Takes every completion the kernel has posted: out of its slot, its
    /// ticket dropped (the kernel is done with the memory).
    pub(super) fn take_completions(&mut self) {
        let posted: Vec<(u64, i32)> = self
            .ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        for (slot, res) in posted {
            let Some(mut flight) = self.slots.get_mut(slot as usize).and_then(Option::take) else {
                continue;
            };
            drop(flight._dma.take());
            self.free.push(slot as usize);
            self.in_flight -= 1;
            self.done.push((flight, res));
        }
    }

    /// Lets every request in flight finish (see
    /// [`QueueContext::set_before_miss_wait`]).
    pub(super) fn finish_in_flight(&mut self) {
        while self.in_flight > 0 {
            let waited = self.ring.submit_and_wait(1);
            // Whatever the wait says, what was posted is taken.
            self.take_completions();
            match waited {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) => {
                    tracing::warn!("io_uring wait: {e}");
                    return;
                }
            }
        }
    }
}

impl Drop for IoState {
    /// The kernel may still read or write the memory of requests in
    /// flight (staging buffers owned here, the front end's memory these
    /// requests' tickets hold): let them finish before any of it goes.
    fn drop(&mut self) {
        self.finish_in_flight();
    }
}

impl InFlight {
    /// Turns this request's completion (`res`, the CQE's result) into a
    /// status and the number of data bytes written to the front end.
    pub(super) fn finish(&self, file: &File, mem: &DeviceMemory, res: i32) -> (u8, u32) {
        let f = self;
        if res < 0 {
            tracing::warn!(
                "{:?} at {}: {}",
                f.op,
                f.offset,
                io::Error::from_raw_os_error(-res)
            );
            return (VIRTIO_BLK_S_IOERR, 0);
        }
        if f.op == Op::Flush {
            return (VIRTIO_BLK_S_OK, 0);
        }
        let done = res as usize;
        if done < f.total {
            if let Err(e) = f.finish_sync(file, done) {
                tracing::warn!("{:?} at {} short and failed: {e}", f.op, f.offset);
                return (VIRTIO_BLK_S_IOERR, 0);
            }
        }
        if f.op == Op::Read {
            if let Some(buf) = &f.staging {
                let mut off = 0usize;
                for s in &f.data {
                    let n = s.len as usize;
                    if mem
                        .write_slice(&buf.as_slice()[off..off + n], s.addr)
                        .is_err()
                    {
                        return (VIRTIO_BLK_S_IOERR, 0);
                    }
                    off += n;
                }
            }
            return (VIRTIO_BLK_S_OK, f.total as u32);
        }
        (VIRTIO_BLK_S_OK, 0)
    }

    /// Does the whole read or write now with `preadv`/`pwritev` (see
    /// [`crate::image::Image::nowait`]) and turns it into a status and the
    /// number of data bytes written to the front end, as
    /// [`InFlight::finish`] does for a completion.
    pub(super) fn run_inline(&self, file: &File, mem: &DeviceMemory) -> (u8, u32) {
        if let Err(e) = self.finish_sync(file, 0) {
            tracing::warn!("{:?} at {}: {e}", self.op, self.offset);
            return (VIRTIO_BLK_S_IOERR, 0);
        }
        self.finish(file, mem, self.total as i32)
    }

    /// Finishes a short read or write with plain `preadv`/`pwritev`.
    fn finish_sync(&self, file: &File, mut done: usize) -> io::Result<()> {
        let f = self;
        while done < f.total {
            // Rebuild the iovecs past the first `done` bytes.
            let mut skip = done;
            let mut rest: Vec<libc::iovec> = Vec::with_capacity(f.iovecs.len());
            for v in f.iovecs.iter() {
                if skip >= v.iov_len {
                    skip -= v.iov_len;
                    continue;
                }
                rest.push(libc::iovec {
                    // SAFETY: `skip < iov_len`, so the pointer stays inside
                    // the same buffer.
                    iov_base: unsafe { v.iov_base.cast::<u8>().add(skip) }.cast(),
                    iov_len: v.iov_len - skip,
                });
                skip = 0;
            }
            let off = (f.offset + done as u64) as libc::off_t;
            let fd = file.as_raw_fd();
            let n_iov = rest.len().min(IOV_MAX) as libc::c_int;
            // SAFETY: the iovecs point into memory kept alive by `f` (its
            // staging buffer or the front end's mapped memory).
            let n = unsafe {
                match f.op {
                    Op::Read => libc::preadv(fd, rest.as_ptr(), n_iov, off),
                    _ => libc::pwritev(fd, rest.as_ptr(), n_iov, off),
                }
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            done += n as usize;
        }
        Ok(())
    }
}

/// The host addresses of `data`, checked for `access` (with an IOMMU, every
/// piece is translated through the IOTLB).
pub(super) fn guest_iovecs(
    mem: &DeviceMemory,
    data: &[Segment],
    access: Permissions,
) -> Result<Vec<libc::iovec>, ()> {
    let mut out = Vec::with_capacity(data.len());
    for s in data {
        let slices = mem
            .get_slices(s.addr, s.len as usize, access)
            .map_err(|_| ())?;
        for slice in slices {
            let slice = slice.map_err(|_| ())?;
            out.push(libc::iovec {
                iov_base: slice.ptr_guard_mut().as_ptr().cast(),
                iov_len: slice.len(),
            });
        }
    }
    Ok(out)
}
