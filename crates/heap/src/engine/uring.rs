//! `uring`: io_uring on `O_DIRECT`, the buffer registered as a fixed buffer,
//! `queue_depth` requests of `chunk` bytes in flight.
//!
//! Each transfer registers its buffer range into slot 0 of a sparse fixed-
//! buffer table (`IORING_REGISTER_BUFFERS2` + `_UPDATE2`), which pins the
//! pages once instead of once per request, runs `READ_FIXED`/`WRITE_FIXED`
//! requests, and clears the slot again. If registration is refused (e.g. a
//! `RLIMIT_MEMLOCK` too small for an unprivileged user, or memory that cannot
//! be pinned), the same requests run as plain `READ`/`WRITE`.

use std::collections::{BTreeMap, VecDeque};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::Mutex;

use io_uring::{opcode, types, IoUring};

use super::direct::{self, Dir, Fail, Piece};
use super::{check_read, check_write, Engine, EngineOptions, Method, Transfer};
use crate::file::IoFile;
use crate::{Buffer, Error, Result};

/// Largest range one fixed buffer may cover (the kernel's limit).
const MAX_FIXED: usize = 1 << 30;

/// io_uring transfers.
#[derive(Debug)]
pub struct UringEngine {
    ring: Mutex<Ring>,
    depth: u32,
    chunk: usize,
}

struct Ring {
    ring: IoUring,
    /// Whether the sparse fixed-buffer table could be registered.
    fixed: bool,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("fd", &self.ring.as_raw_fd())
            .field("fixed", &self.fixed)
            .finish()
    }
}

impl UringEngine {
    /// Sets up a ring for `opts.queue_depth` requests of `opts.chunk` bytes.
    ///
    /// # Errors
    /// [`Error::Sys`] when io_uring is unavailable; [`Error::BadSize`] for a
    /// zero depth or a chunk that is not a non-zero multiple of 4096 below
    /// 2 GiB.
    pub fn new(opts: EngineOptions) -> Result<Self> {
        if opts.queue_depth == 0 || opts.queue_depth > 4096 {
            return Err(Error::BadSize {
                size: opts.queue_depth as usize,
                page: 1,
            });
        }
        if opts.chunk == 0 || opts.chunk % 4096 != 0 || opts.chunk > (1 << 30) {
            return Err(Error::BadSize {
                size: opts.chunk,
                page: 4096,
            });
        }
        let ring = IoUring::new(opts.queue_depth.next_power_of_two())
            .map_err(|e| Error::sys("io_uring_setup", e))?;
        let fixed = match ring.submitter().register_buffers_sparse(1) {
            Ok(()) => true,
            Err(e) => {
                tracing::info!("io_uring fixed buffers unavailable ({e}); using plain reads");
                false
            }
        };
        Ok(UringEngine {
            ring: Mutex::new(Ring { ring, fixed }),
            depth: opts.queue_depth,
            chunk: opts.chunk,
        })
    }

    /// Requests kept in flight.
    pub fn queue_depth(&self) -> u32 {
        self.depth
    }

    /// Runs one direct piece through the ring.
    fn middle(
        &self,
        ring: &mut Ring,
        file: &IoFile,
        dir: Dir,
        dfd: BorrowedFd<'_>,
        p: Piece,
    ) -> Result<(), Fail> {
        let slot = register(ring, p);
        let r = self.run_piece(ring, file, dir, dfd, p, slot);
        if slot.is_some() {
            let clear = libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            };
            // SAFETY: an empty iovec clears slot 0; no request is in flight
            // (`run_piece` drains the ring before returning).
            if let Err(e) = unsafe {
                ring.ring
                    .submitter()
                    .register_buffers_update(0, &[clear], None)
            } {
                tracing::warn!("io_uring: clearing fixed buffer failed: {e}");
            }
        }
        r
    }

    fn run_piece(
        &self,
        ring: &mut Ring,
        file: &IoFile,
        dir: Dir,
        dfd: BorrowedFd<'_>,
        p: Piece,
        slot: Option<u16>,
    ) -> Result<(), Fail> {
        let mut pending: VecDeque<(usize, usize)> = (0..p.len)
            .step_by(self.chunk)
            .map(|o| (o, self.chunk.min(p.len - o)))
            .collect();
        let mut inflight: BTreeMap<u64, usize> = BTreeMap::new();
        let mut failed: Option<Fail> = None;
        let fd = types::Fd(dfd.as_raw_fd());
        loop {
            while failed.is_none() && inflight.len() < self.depth as usize {
                let Some((rel, len)) = pending.pop_front() else {
                    break;
                };
                // SAFETY: `rel + len <= p.len`: inside the piece.
                let mem = unsafe { p.mem.add(rel) };
                let off = p.file_off + rel as u64;
                let sqe = match (dir, slot) {
                    (Dir::Read, Some(i)) => opcode::ReadFixed::new(fd, mem, len as u32, i)
                        .offset(off)
                        .build(),
                    (Dir::Read, None) => opcode::Read::new(fd, mem, len as u32).offset(off).build(),
                    (Dir::Write, Some(i)) => opcode::WriteFixed::new(fd, mem, len as u32, i)
                        .offset(off)
                        .build(),
                    (Dir::Write, None) => {
                        opcode::Write::new(fd, mem, len as u32).offset(off).build()
                    }
                };
                // SAFETY: the memory (buffer, registered or not) stays mapped
                // until the completion is reaped: this function never returns
                // with requests in flight.
                let pushed = unsafe { ring.ring.submission().push(&sqe.user_data(rel as u64)) };
                if pushed.is_err() {
                    pending.push_front((rel, len));
                    break;
                }
                inflight.insert(rel as u64, len);
            }
            if inflight.is_empty() {
                break;
            }
            if let Err(e) = ring.ring.submit_and_wait(1) {
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                // Without a working ring we cannot reap; the kernel still
                // owns the requests, so waiting again is the only safe move.
                tracing::error!("io_uring_enter failed: {e}; retrying");
                std::thread::sleep(std::time::Duration::from_millis(1));
                continue;
            }
            let cqes: Vec<_> = ring
                .ring
                .completion()
                .map(|c| (c.user_data(), c.result()))
                .collect();
            for (rel, res) in cqes {
                let Some(len) = inflight.remove(&rel) else {
                    continue;
                };
                let off = p.file_off + rel;
                if res < 0 {
                    let e = std::io::Error::from_raw_os_error(-res);
                    let op = if dir == Dir::Read {
                        "io_uring read"
                    } else {
                        "io_uring write"
                    };
                    failed.get_or_insert_with(|| direct::fail(file, op, off, len, e));
                } else if res == 0 {
                    let size = file.size().unwrap_or(0);
                    failed.get_or_insert_with(|| Fail::Err(file.short(size, p.file_off, p.len)));
                } else if (res as usize) < len {
                    let n = res as usize;
                    pending.push_front((rel as usize + n, len - n));
                }
            }
        }
        match failed {
            Some(f) => Err(f),
            None => Ok(()),
        }
    }

    fn transfer(
        &self,
        file: &IoFile,
        dir: Dir,
        file_off: u64,
        mem: *mut u8,
        len: usize,
    ) -> Result<Transfer> {
        if len == 0 {
            return Ok(Transfer::default());
        }
        let mut ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        let mut mid = |dfd: BorrowedFd<'_>, p: Piece| self.middle(&mut ring, file, dir, dfd, p);
        // SAFETY: callers checked `mem..mem+len` is inside a live buffer.
        let r = unsafe { direct::run(file, dir, file_off, mem, len, &mut mid) };
        // SAFETY: as above.
        unsafe { direct::finish(r, file, dir, file_off, mem, len) }
    }
}

/// Registers the piece's memory as fixed buffer 0; `None` to use plain ops.
fn register(ring: &mut Ring, p: Piece) -> Option<u16> {
    if !ring.fixed || p.len > MAX_FIXED {
        return None;
    }
    let iov = libc::iovec {
        iov_base: p.mem.cast(),
        iov_len: p.len,
    };
    // SAFETY: the iovec describes live buffer memory that stays mapped until
    // the slot is cleared in `middle`, after every request completed.
    match unsafe {
        ring.ring
            .submitter()
            .register_buffers_update(0, &[iov], None)
    } {
        Ok(()) => Some(0),
        Err(e) => {
            tracing::debug!("io_uring: cannot register buffer ({e}); plain requests");
            None
        }
    }
}

impl Engine for UringEngine {
    fn method(&self) -> Method {
        Method::Uring
    }

    fn read(
        &self,
        file: &IoFile,
        file_off: u64,
        buf: &Buffer,
        buf_off: usize,
        len: usize,
    ) -> Result<Transfer> {
        let mem = check_read(file, file_off, buf, buf_off, len)?;
        self.transfer(file, Dir::Read, file_off, mem, len)
    }

    fn write(
        &self,
        buf: &Buffer,
        buf_off: usize,
        len: usize,
        file: &IoFile,
        file_off: u64,
    ) -> Result<Transfer> {
        let mem = check_write(buf, buf_off, len)?;
        self.transfer(file, Dir::Write, file_off, mem, len)
    }
}
