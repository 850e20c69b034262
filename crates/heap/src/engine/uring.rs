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
use std::os::fd::BorrowedFd;
use std::sync::Mutex;

use iopath_sys::lock;

use super::direct::{self, Fail, Piece};
use super::{
    check_read, fall_back, one_by_one, CheckedRead, Dir, Engine, EngineOptions, Method, NextReq,
    Pull, ReadReq, ReqDone, Transfer,
};
use crate::file::IoFile;
use crate::range::BufRange;
use crate::ring::{Op, Ring};
use crate::{AlignedBuf, Error, Result};

/// Largest range one fixed buffer may cover (the kernel's limit).
const MAX_FIXED: usize = 1 << 30;
/// Fixed-buffer slots: slot 0 for single transfers, the rest for batches
/// (one per request in flight).
const SLOTS: u16 = 64;

/// io_uring transfers.
#[derive(Debug)]
pub struct UringEngine {
    ring: Mutex<Ring>,
    depth: u32,
    chunk: usize,
}

impl UringEngine {
    /// Sets up a ring for `opts.queue_depth` requests of `opts.chunk` bytes.
    ///
    /// # Errors
    /// [`Error::Sys`] when io_uring is unavailable; [`Error::BadQueueDepth`]
    /// or [`Error::BadChunk`] as [`EngineOptions::check`].
    pub fn new(opts: EngineOptions) -> Result<Self> {
        opts.check()?;
        let ring = Ring::new(opts.queue_depth.next_power_of_two(), SLOTS)
            .map_err(|e| Error::sys("io_uring_setup", e))?;
        Ok(UringEngine {
            ring: Mutex::new(ring),
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
        p: Piece<'_>,
    ) -> Result<(), Fail> {
        let slot = register_slot(ring, p.mem, 0);
        let r = self.run_piece(ring, file, dir, dfd, p, slot);
        if let Some(slot) = slot {
            // No request is in flight: `run_piece` drains the ring before
            // returning.
            ring.clear(slot);
        }
        r
    }

    fn run_piece(
        &self,
        ring: &mut Ring,
        file: &IoFile,
        dir: Dir,
        dfd: BorrowedFd<'_>,
        p: Piece<'_>,
        slot: Option<u16>,
    ) -> Result<(), Fail> {
        let plen = p.mem.len();
        let mut pending: VecDeque<(usize, usize)> = (0..plen)
            .step_by(self.chunk)
            .map(|o| (o, self.chunk.min(plen - o)))
            .collect();
        let mut inflight: BTreeMap<u64, usize> = BTreeMap::new();
        let mut failed: Option<Fail> = None;
        let op = match dir {
            Dir::Read => Op::Read,
            Dir::Write => Op::Write,
        };
        loop {
            while failed.is_none() && inflight.len() < self.depth as usize {
                let Some((rel, len)) = pending.pop_front() else {
                    break;
                };
                let mem = match p.mem.sub(rel, len) {
                    Ok(m) => m,
                    Err(e) => {
                        failed = Some(Fail::Err(e));
                        break;
                    }
                };
                let off = p.file_off + rel as u64;
                if ring.push(op, dfd, mem, off, slot, rel as u64).is_err() {
                    pending.push_front((rel, len));
                    break;
                }
                inflight.insert(rel as u64, len);
            }
            if inflight.is_empty() {
                break;
            }
            if let Err(e) = ring.submit_and_wait(1) {
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                // Without a working ring we cannot reap; the kernel still
                // owns the requests, so waiting again is the only safe move.
                tracing::error!("io_uring_enter failed: {e}; retrying");
                std::thread::sleep(std::time::Duration::from_millis(1));
                continue;
            }
            for (rel, res) in ring.reap() {
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
                    failed.get_or_insert_with(|| Fail::Err(file.short(size, p.file_off, plen)));
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
        mem: BufRange<'_>,
    ) -> Result<Transfer> {
        if mem.is_empty() {
            return Ok(Transfer::default());
        }
        let mut ring = lock(&self.ring);
        let mut mid = |dfd: BorrowedFd<'_>, p: Piece<'_>| self.middle(&mut ring, file, dir, dfd, p);
        let r = direct::run(file, dir, file_off, mem, &mut mid);
        direct::finish(r, file, dir, file_off, mem)
    }
}

/// Registers `mem` as fixed buffer `slot`; `None` to use plain ops.
fn register_slot(ring: &mut Ring, mem: BufRange<'_>, slot: u16) -> Option<u16> {
    if !ring.fixed() || mem.len() > MAX_FIXED {
        return None;
    }
    match ring.register(slot, mem) {
        Ok(()) => Some(slot),
        Err(e) => {
            tracing::debug!("io_uring: cannot register buffer ({e}); plain requests");
            None
        }
    }
}

/// A request of a batch whose middle is in flight.
struct Active {
    index: usize,
    /// Holds the destination memory alive until every request completed.
    req: ReadReq,
    /// The aligned middle: offset in `req.buf` and in the file.
    mid_off: usize,
    mid_file_off: u64,
    slot: Option<u16>,
    inflight: usize,
    queued: usize,
    fail: Option<Fail>,
}

/// One io_uring request of a batch.
#[derive(Debug, Clone, Copy)]
struct Chunk {
    active: usize,
    rel: usize,
    len: usize,
}

/// State of one `read_batch`.
struct Batch<'f> {
    file: &'f IoFile,
    actives: BTreeMap<usize, Active>,
    pending: VecDeque<Chunk>,
    inflight: BTreeMap<u64, Chunk>,
    next_id: u64,
    free_slots: Vec<u16>,
    total: Transfer,
    fatal: Option<Error>,
    staging: Option<AlignedBuf>,
}

impl UringEngine {
    /// Starts request `index`: head and tail through the staging buffer
    /// now, the middle queued as chunks. Returns the transfer when it
    /// finished at once.
    fn start(
        &self,
        ring: &mut Ring,
        b: &mut Batch<'_>,
        index: usize,
        req: ReadReq,
    ) -> Result<Option<Transfer>> {
        let file = b.file;
        let mem = check_read(file, req.file_off, &req.buf, req.buf_off, req.len)?;
        if req.len == 0 {
            return Ok(Some(Transfer::default()));
        }
        let direct = match (file.dio_align(), file.direct_fd()?) {
            (Some(a), Some(d)) => Some((a, d)),
            _ => None,
        };
        let redo_buffered =
            |mem: BufRange<'_>| fall_back(file, Dir::Read, req.file_off, mem).map(Some);
        let Some((align, dfd)) = direct else {
            return redo_buffered(mem);
        };
        if !req.buf.takes_direct_io() {
            return redo_buffered(mem);
        }
        let s = crate::align::direct_split(req.file_off, mem.addr(), req.len, align);
        let mut ends = Ok(());
        if s.head > 0 {
            let head = mem.sub(0, s.head)?;
            ends = direct::staged_io(
                file,
                dfd,
                align,
                Dir::Read,
                &mut b.staging,
                req.file_off,
                head,
            );
        }
        if s.tail > 0 && ends.is_ok() {
            let skip = s.head + s.middle;
            let tail = mem.sub(skip, s.tail)?;
            let at = req.file_off + skip as u64;
            ends = direct::staged_io(file, dfd, align, Dir::Read, &mut b.staging, at, tail);
        }
        match ends {
            Ok(()) => {}
            Err(Fail::Refused) => return redo_buffered(mem),
            Err(Fail::Err(e)) => return Err(e),
        }
        if s.middle == 0 {
            return Ok(Some(Transfer::moved(req.len as u64)));
        }
        let mid = mem.sub(s.head, s.middle)?;
        let slot = b.free_slots.pop().and_then(|slot| {
            let r = register_slot(ring, mid, slot);
            if r.is_none() {
                b.free_slots.push(slot);
            }
            r
        });
        let mut queued = 0;
        for rel in (0..s.middle).step_by(self.chunk) {
            b.pending.push_back(Chunk {
                active: index,
                rel,
                len: self.chunk.min(s.middle - rel),
            });
            queued += 1;
        }
        let mid_off = mid.offset();
        b.actives.insert(
            index,
            Active {
                index,
                mid_off,
                mid_file_off: req.file_off + s.head as u64,
                req,
                slot,
                inflight: 0,
                queued,
                fail: None,
            },
        );
        Ok(None)
    }

    /// Submits pending chunks up to the queue depth.
    fn fill(&self, ring: &mut Ring, b: &mut Batch<'_>, dfd: BorrowedFd<'_>) {
        while b.inflight.len() < self.depth as usize {
            let Some(c) = b.pending.pop_front() else {
                break;
            };
            let Some(a) = b.actives.get_mut(&c.active) else {
                continue;
            };
            let off = a.mid_file_off + c.rel as u64;
            let mem = match a.req.buf.range(a.mid_off + c.rel, c.len) {
                Ok(m) => m,
                Err(e) => {
                    // Cannot happen (chunks lie inside the middle); end the
                    // batch with the error rather than panic.
                    b.fatal.get_or_insert(e);
                    break;
                }
            };
            let id = b.next_id;
            if ring.push(Op::Read, dfd, mem, off, a.slot, id).is_err() {
                b.pending.push_front(c);
                break;
            }
            b.next_id += 1;
            a.queued -= 1;
            a.inflight += 1;
            b.inflight.insert(id, c);
        }
    }

    /// Reaps completions; finishes requests whose last chunk completed.
    fn reap(&self, ring: &mut Ring, b: &mut Batch<'_>, done: &mut ReqDone<'_>) {
        for (id, res) in ring.reap() {
            let Some(c) = b.inflight.remove(&id) else {
                continue;
            };
            let file = b.file;
            let a = b
                .actives
                .get_mut(&c.active)
                .expect("chunk of an active request");
            a.inflight -= 1;
            let off = a.mid_file_off + c.rel as u64;
            let err = if res < 0 {
                Some(direct::fail(
                    file,
                    "io_uring read",
                    off,
                    c.len,
                    std::io::Error::from_raw_os_error(-res),
                ))
            } else if res == 0 {
                let size = file.size().unwrap_or(0);
                Some(Fail::Err(file.short(size, a.req.file_off, a.req.len)))
            } else {
                let n = res as usize;
                if n < c.len && a.fail.is_none() {
                    b.pending.push_front(Chunk {
                        active: c.active,
                        rel: c.rel + n,
                        len: c.len - n,
                    });
                    a.queued += 1;
                }
                None
            };
            if let Some(e) = err {
                if a.fail.is_none() {
                    a.fail = Some(e);
                    // Stop this request: drop its queued chunks.
                    b.pending.retain(|p| p.active != c.active);
                    a.queued = 0;
                }
            }
            if a.inflight == 0 && a.queued == 0 {
                let a = b.actives.remove(&c.active).expect("present");
                if let Some(slot) = a.slot {
                    ring.clear(slot);
                    b.free_slots.push(slot);
                }
                let t = match a.fail {
                    None => Ok(Transfer::moved(a.req.len as u64)),
                    Some(Fail::Refused) => a
                        .req
                        .buf
                        .range(a.req.buf_off, a.req.len)
                        .and_then(|mem| fall_back(file, Dir::Read, a.req.file_off, mem)),
                    Some(Fail::Err(e)) => Err(e),
                };
                match t {
                    Ok(t) => {
                        b.total += t;
                        done(a.index, t);
                    }
                    Err(e) => {
                        b.fatal.get_or_insert(e);
                    }
                }
            }
        }
    }
}

impl Engine for UringEngine {
    fn read_batch(
        &self,
        file: &IoFile,
        next: &mut NextReq<'_>,
        done: &mut ReqDone<'_>,
    ) -> Result<Transfer> {
        // Without direct I/O here, every request goes the buffered way.
        let dfd = match (file.dio_align(), file.direct_fd()?) {
            (Some(_), Some(d)) => d,
            _ => {
                return one_by_one(next, done, |r| {
                    let mem = check_read(file, r.file_off, &r.buf, r.buf_off, r.len)?;
                    fall_back(file, Dir::Read, r.file_off, mem)
                })
            }
        };
        let mut guard = lock(&self.ring);
        let ring = &mut *guard;
        let mut b = Batch {
            file,
            actives: BTreeMap::new(),
            pending: VecDeque::new(),
            inflight: BTreeMap::new(),
            next_id: 0,
            free_slots: (1..SLOTS).rev().collect(),
            total: Transfer::default(),
            fatal: None,
            staging: None,
        };
        let mut index = 0;
        let mut more = true;
        loop {
            // Keep a queue depth's worth of requests queued beyond those in
            // flight, so the next buffer is registered while the device works.
            while b.fatal.is_none()
                && more
                && b.pending.len() < self.depth as usize
                && b.actives.len() < usize::from(SLOTS)
            {
                // Start what is queued before `next` may block.
                self.fill(ring, &mut b, dfd);
                if let Err(e) = ring.submit() {
                    tracing::debug!("io_uring submit: {e}");
                }
                // Block for the next request only when nothing is queued.
                match next(b.pending.is_empty()) {
                    Ok(Pull::End) => more = false,
                    Ok(Pull::Later) => break,
                    Err(e) => {
                        b.fatal.get_or_insert(e);
                    }
                    Ok(Pull::Req(req)) => {
                        match self.start(ring, &mut b, index, req) {
                            Ok(Some(t)) => {
                                b.total += t;
                                done(index, t);
                            }
                            Ok(None) => {}
                            Err(e) => {
                                b.fatal.get_or_insert(e);
                            }
                        }
                        index += 1;
                    }
                }
            }
            if b.fatal.is_some() {
                b.pending.clear();
            } else {
                self.fill(ring, &mut b, dfd);
            }
            if b.inflight.is_empty() {
                if b.fatal.is_some() || (!more && b.pending.is_empty()) {
                    break;
                }
                continue;
            }
            match ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // The kernel still owns the requests in flight: keep
                    // waiting for them, never return early.
                    tracing::error!("io_uring_enter failed: {e}; retrying");
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }
            self.reap(ring, &mut b, done);
        }
        // Requests that failed with nothing in flight left are finished in
        // `reap`; clear any slot still held (only after a fatal error).
        for (_, a) in std::mem::take(&mut b.actives) {
            if let Some(slot) = a.slot {
                ring.clear(slot);
            }
        }
        match b.fatal {
            Some(e) => Err(e),
            None => Ok(b.total),
        }
    }

    fn method(&self) -> Method {
        Method::Uring
    }

    fn read_checked(&self, r: CheckedRead<'_>) -> Result<Transfer> {
        self.transfer(r.file(), Dir::Read, r.file_off(), r.mem())
    }

    fn write_range(&self, src: BufRange<'_>, file: &IoFile, file_off: u64) -> Result<Transfer> {
        self.transfer(file, Dir::Write, file_off, src)
    }
}
