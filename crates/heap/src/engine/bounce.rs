//! `bounce`: direct I/O into a registered memfd bounce buffer, then a copy
//! into the destination.
//!
//! For buffers whose mapping cannot take direct I/O (a dma-heap dma-buf:
//! its pages are PFNs that `O_DIRECT` cannot pin, so the kernel fails such
//! reads with `EFAULT`). The file is read with io_uring `READ_FIXED` on
//! `O_DIRECT` into [`SLOTS`] slots of one memfd (registered as fixed
//! buffers), and each slot is copied into the destination as soon as its
//! read completes, while the reads of the other slots are in flight:
//!
//! ```text
//!   file ─O_DIRECT─► memfd slot k ─copy─► destination (e.g. dma-buf mapping)
//!          (io_uring, SLOTS in flight)
//! ```
//!
//! The page cache is bypassed, as with `direct`; the price is one copy,
//! which `auto` weighs against buffered reads ([`super::AutoEngine`]).

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

use iopath_sys::lock;

use super::{
    check_read, read_as_batch, CheckedRead, Engine, EngineOptions, Method, NextReq, Pull, ReadReq,
    ReqDone, Transfer, UringEngine,
};
use crate::file::IoFile;
use crate::heap::{Heap, HugePages, MemfdHeap};
use crate::range::BufRange;
use crate::{Buffer, Error, Result};

/// Bounce slots, each one request of the engine's request size.
pub const SLOTS: usize = 4;

/// Direct I/O into a memfd bounce buffer, copied out (see the module docs).
#[derive(Debug)]
pub struct BounceEngine {
    uring: UringEngine,
    slot: usize,
    bounce: Mutex<Option<Buffer>>,
}

/// A destination request being filled through the slots.
struct Outer {
    index: usize,
    req: ReadReq,
    /// Bytes not yet handed to a slot.
    next_off: usize,
    /// Slot reads in flight.
    inflight: usize,
    fallbacks: u32,
}

/// One slot read: where its bytes go.
struct SlotRead {
    slot: usize,
    outer: usize,
    rel: usize,
    len: usize,
}

/// State shared by the request source and the completion callback.
struct Batch {
    outers: BTreeMap<usize, Outer>,
    order: VecDeque<usize>,
    reads: BTreeMap<usize, SlotRead>,
    free: Vec<usize>,
    next_outer: usize,
    next_inner: usize,
    ended: bool,
    total: Transfer,
    fatal: Option<Error>,
}

impl BounceEngine {
    /// Sets up the ring; the bounce memfd (`SLOTS` x `opts.chunk` bytes)
    /// is made on first use.
    ///
    /// # Errors
    /// As [`UringEngine::new`].
    pub fn new(opts: EngineOptions) -> Result<Self> {
        let opts = EngineOptions {
            queue_depth: opts.queue_depth.min(SLOTS as u32),
            ..opts
        };
        Ok(BounceEngine {
            uring: UringEngine::new(opts)?,
            slot: opts.chunk,
            bounce: Mutex::new(None),
        })
    }

    fn bounce(&self) -> Result<Buffer> {
        let mut b = lock(&self.bounce);
        if let Some(b) = &*b {
            return Ok(b.clone());
        }
        let buf = MemfdHeap::new(HugePages::None).alloc(self.slot * SLOTS)?;
        if let Err(e) = buf.populate() {
            tracing::debug!("bounce buffer: {e}; pages fault in on first use");
        }
        Ok(b.insert(buf).clone())
    }
}

impl Engine for BounceEngine {
    fn method(&self) -> Method {
        Method::Bounce
    }

    fn read_checked(&self, r: CheckedRead<'_>) -> Result<Transfer> {
        read_as_batch(self, r)
    }

    fn read_batch(
        &self,
        file: &IoFile,
        next: &mut NextReq<'_>,
        done: &mut ReqDone<'_>,
    ) -> Result<Transfer> {
        let bounce = self.bounce()?;
        let slot = self.slot;
        // Both callbacks below report finished destinations.
        let done = RefCell::new(done);
        let state = RefCell::new(Batch {
            outers: BTreeMap::new(),
            order: VecDeque::new(),
            reads: BTreeMap::new(),
            free: (0..SLOTS).rev().collect(),
            next_outer: 0,
            next_inner: 0,
            ended: false,
            total: Transfer::default(),
            fatal: None,
        });
        let mut inner_next = |wait: bool| -> Result<Pull> {
            let mut guard = state.borrow_mut();
            let b = &mut *guard;
            if b.fatal.is_some() {
                return Ok(Pull::End);
            }
            let Some(&k) = b.free.last() else {
                // Every slot is in flight: the ring reaps one first.
                return Ok(Pull::Later);
            };
            // The oldest destination with bytes left, or a new one.
            let outer = match b.order.front() {
                Some(&o) => o,
                None if b.ended => return Ok(Pull::End),
                None => match next(wait && b.reads.is_empty())? {
                    Pull::Req(r) => {
                        check_read(file, r.file_off, &r.buf, r.buf_off, r.len)?;
                        let o = b.next_outer;
                        b.next_outer += 1;
                        if r.len == 0 {
                            drop(guard);
                            (done.borrow_mut())(o, Transfer::default());
                            return Ok(Pull::Later);
                        }
                        b.outers.insert(
                            o,
                            Outer {
                                index: o,
                                req: r,
                                next_off: 0,
                                inflight: 0,
                                fallbacks: 0,
                            },
                        );
                        b.order.push_back(o);
                        o
                    }
                    Pull::Later => return Ok(Pull::Later),
                    Pull::End => {
                        b.ended = true;
                        return Ok(Pull::End);
                    }
                },
            };
            let out = b.outers.get_mut(&outer).expect("queued destination");
            let rel = out.next_off;
            let len = (out.req.len - rel).min(slot);
            out.next_off += len;
            out.inflight += 1;
            let file_off = out.req.file_off + rel as u64;
            if out.next_off == out.req.len {
                b.order.pop_front();
            }
            b.free.pop();
            let id = b.next_inner;
            b.next_inner += 1;
            b.reads.insert(
                id,
                SlotRead {
                    slot: k,
                    outer,
                    rel,
                    len,
                },
            );
            Ok(Pull::Req(ReadReq {
                buf: bounce.clone(),
                buf_off: k * slot,
                file_off,
                len,
            }))
        };
        let mut inner_done = |id: usize, t: Transfer| {
            let mut guard = state.borrow_mut();
            let b = &mut *guard;
            let Some(r) = b.reads.remove(&id) else {
                return;
            };
            b.free.push(r.slot);
            let Some(out) = b.outers.get_mut(&r.outer) else {
                return;
            };
            let copied = bounce.range(r.slot * slot, r.len).and_then(|src| {
                src.copy_to_range(&out.req.buf.range(out.req.buf_off + r.rel, r.len)?)
            });
            if let Err(e) = copied {
                b.fatal.get_or_insert(e);
            }
            out.inflight -= 1;
            out.fallbacks += t.fallbacks;
            if out.inflight == 0 && out.next_off == out.req.len {
                let out = b.outers.remove(&r.outer).expect("present");
                let t = Transfer {
                    fallbacks: out.fallbacks.min(1),
                    ..Transfer::moved(out.req.len as u64)
                };
                b.total += t;
                (done.borrow_mut())(out.index, t);
            }
        };
        let r = self
            .uring
            .read_batch(file, &mut inner_next, &mut inner_done);
        let b = state.into_inner();
        if let Some(e) = b.fatal {
            return Err(e);
        }
        r?;
        Ok(b.total)
    }

    fn write_range(&self, src: BufRange<'_>, file: &IoFile, file_off: u64) -> Result<Transfer> {
        // Out through the bounce: copy a slot's worth, write it direct.
        let len = src.len();
        let bounce = self.bounce()?;
        let cap = self.slot * SLOTS;
        let mut total = Transfer::default();
        let mut done = 0;
        while done < len {
            let n = (len - done).min(cap);
            src.sub(done, n)?.copy_to_range(&bounce.range(0, n)?)?;
            let t = self
                .uring
                .write(&bounce, 0, n, file, file_off + done as u64)?;
            total.fallbacks += t.fallbacks;
            done += n;
        }
        total.bytes = len as u64;
        Ok(total)
    }
}
