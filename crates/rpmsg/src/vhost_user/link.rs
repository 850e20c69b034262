//! The remote's [`Link`] over vhost-user: the same checks and bookkeeping
//! as the shared-memory remote ([`crate::RemoteLink`]), on two
//! `QueueContext`s whose rings and buffers are in the front end's memory
//! (translated, and checked against the IOTLB when negotiated, by
//! `iopath-virtio`).

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use iopath_virtio::device::{MemoryAccess, QueueContext};
use virtio_queue::QueueT;
use vm_memory::Permissions;

use super::{Negotiated, Slots};
use crate::link::mismatch::SizeWatch;
use crate::link::remote::{check_rx_chain, check_tx_desc, Desc, MAX_RX_MSG};
use crate::link::{Held, Link, LinkError, LinkMemory, Slot};
use crate::role::Role;
use crate::shm::ShmError;

/// vq0: device → driver (the driver's receive buffers).
const TXQ: usize = 0;
/// vq1: driver → device (the driver's messages).
const RXQ: usize = 1;

/// The front end's memory as the bus reads and writes messages in it.
#[derive(Debug)]
struct FrontEndMemory(MemoryAccess);

impl LinkMemory for FrontEndMemory {
    fn read(&self, addr: u64, dst: &mut [u8]) -> Result<(), ShmError> {
        self.0.read(addr, dst).map_err(|_| ShmError::Outside {
            addr,
            len: dst.len(),
        })
    }

    fn write(&self, addr: u64, src: &[u8]) -> Result<(), ShmError> {
        self.0.write(addr, src).map_err(|_| ShmError::Outside {
            addr,
            len: src.len(),
        })
    }
}

/// The device side of an rpmsg link whose driver is a vhost-user front end.
#[derive(Debug)]
pub struct VhostUserLink {
    /// `None` once given back to the queues' workers.
    ctxs: Option<[QueueContext; 2]>,
    slots: Arc<Slots>,
    access: MemoryAccess,
    mem: Arc<dyn LinkMemory>,
    features: u32,
    /// Queues (bit = index) whose driver wants a notification, since the
    /// last [`Link::take_kick`].
    calls: u8,
    /// Handed to the notifier, which signals these queues' call fds.
    pending: Arc<AtomicU8>,
    /// A sender found vq0 empty: ask the driver to kick when it adds
    /// buffers.
    tx_wanted: bool,
    /// Driver buffers taken from vq0 and not used for a send yet.
    spare: Vec<Slot>,
    /// The buffer sizes of the session.
    sizes: Negotiated,
    /// Fixed sizes: the driver's buffers and messages checked against them.
    watch: SizeWatch,
}

impl VhostUserLink {
    pub(super) fn new(
        ctxs: [QueueContext; 2],
        slots: Arc<Slots>,
        pending: Arc<AtomicU8>,
        sizes: Negotiated,
    ) -> Self {
        let access = ctxs[TXQ].memory_access();
        let features = ctxs[TXQ].acked_features() as u32;
        VhostUserLink {
            mem: Arc::new(FrontEndMemory(access.clone())),
            access,
            ctxs: Some(ctxs),
            slots,
            features,
            calls: 0,
            pending,
            tx_wanted: false,
            spare: Vec::new(),
            watch: SizeWatch::new(sizes.fixed.then_some(sizes.sizes)),
            sizes,
        }
    }

    fn ctx(&mut self, q: usize) -> Result<&mut QueueContext, LinkError> {
        match self.ctxs.as_mut() {
            Some(c) => Ok(&mut c[q]),
            None => Err(LinkError::Reset { status: 0 }),
        }
    }

    /// Puts `head` on queue `q`'s used ring and notes whether the driver
    /// wants a notification.
    fn put(&mut self, q: usize, head: u16, len: u32) -> Result<(), LinkError> {
        let ctx = self.ctx(q)?;
        let _t = ctx.dma_batch();
        let mem = ctx.memory();
        ctx.add_used(&mem, head, len)
            .map_err(|e| LinkError::Broken(format!("vq{q}: {e}")))?;
        if ctx.needs_notification(&mem) {
            self.calls |= 1 << q;
        }
        Ok(())
    }

    /// The next chain the driver made available on queue `q`: its head
    /// and descriptors (at most two: rpmsg uses one).
    fn pop(&mut self, q: usize) -> Result<Option<(u16, Vec<Desc>)>, LinkError> {
        let ctx = self.ctx(q)?;
        let _t = ctx.dma_batch();
        let mem = ctx.memory();
        Ok(ctx
            .pop_chain(&mem)
            .map(|c| (c.head_index(), c.take(2).map(Desc::from).collect())))
    }

    fn inside(&self, addr: u64, len: usize, access: Permissions) -> bool {
        self.access.check_range(addr, len, access)
    }
}

impl Link for VhostUserLink {
    fn role(&self) -> Role {
        Role::Remote
    }

    fn memory(&self) -> &Arc<dyn LinkMemory> {
        &self.mem
    }

    fn hold_rx(&mut self) -> Result<Option<Result<Held, String>>, LinkError> {
        let Some((head, descs)) = self.pop(RXQ)? else {
            return Ok(None);
        };
        // A negotiated size is the driver's too: a longer message is
        // refused, not read. Given sizes (fixed) are read up to
        // MAX_RX_MSG, as on shared memory.
        let max = if self.sizes.fixed {
            MAX_RX_MSG
        } else {
            self.sizes.sizes.to_remote as usize
        };
        let checked = check_rx_chain(head, descs.into_iter(), max, |a, l| {
            self.inside(a, l, Permissions::Read)
        });
        if let Some(m) = checked
            .as_ref()
            .ok()
            .and_then(|&(_, len)| self.watch.driver_message(len))
        {
            tracing::warn!(target: "iopath_rpmsg", "remote: {m}");
        }
        match checked {
            Ok((addr, len)) => Ok(Some(Ok(Held::new(u64::from(head), addr, len)))),
            Err(reason) => {
                self.put(RXQ, head, 0)?;
                Ok(Some(Err(reason)))
            }
        }
    }

    fn release_rx(&mut self, held: Held) -> Result<(), LinkError> {
        // A device that only reads a buffer writes nothing into it.
        self.put(RXQ, held.token() as u16, 0)
    }

    fn get_tx(&mut self) -> Result<Option<Slot>, LinkError> {
        if let Some(s) = self.spare.pop() {
            return Ok(Some(s));
        }
        loop {
            let Some((head, descs)) = self.pop(TXQ)? else {
                self.tx_wanted = true;
                return Ok(None);
            };
            if let Some(m) = descs.first().and_then(|d| self.watch.driver_buffer(d.len)) {
                tracing::warn!(target: "iopath_rpmsg", "remote: {m}");
            }
            let max = self.sizes.sizes.to_host as usize;
            let checked = check_tx_desc(head, descs.first().copied(), max, |a, l| {
                self.inside(a, l, Permissions::Write)
            });
            match checked {
                Ok((addr, cap)) => {
                    self.tx_wanted = false;
                    return Ok(Some(Slot::new(u64::from(head), addr, cap)));
                }
                Err(reason) => {
                    tracing::warn!(target: "iopath_rpmsg", "remote: refused driver buffer: {reason}");
                    self.put(TXQ, head, 0)?;
                }
            }
        }
    }

    fn put_tx(&mut self, slot: Slot, len: usize) -> Result<(), LinkError> {
        if len > slot.cap {
            self.drop_tx(slot);
            return Err(LinkError::Broken(format!(
                "send of {len} bytes from a smaller buffer"
            )));
        }
        self.put(TXQ, slot.token() as u16, len as u32)
    }

    fn drop_tx(&mut self, slot: Slot) {
        self.spare.push(slot);
    }

    fn buf_size(&self) -> usize {
        self.sizes.sizes.to_host as usize
    }

    fn rx_buf_size(&self) -> usize {
        self.sizes.sizes.to_remote as usize
    }

    fn take_kick(&mut self) -> bool {
        let calls = std::mem::take(&mut self.calls);
        if calls != 0 {
            self.pending.fetch_or(calls, Ordering::AcqRel);
        }
        calls != 0
    }

    fn arm(&mut self) -> Result<bool, LinkError> {
        let tx_wanted = self.tx_wanted;
        let err = |q: usize| move |e: virtio_queue::Error| LinkError::Broken(format!("vq{q}: {e}"));
        let ctx = self.ctx(TXQ)?;
        let _t = ctx.dma_batch();
        let mem = ctx.memory();
        // A kick for new buffers only while a sender waits for one.
        if tx_wanted {
            ctx.queue_mut()
                .enable_notification(&*mem)
                .map_err(err(TXQ))?;
        } else {
            ctx.queue_mut()
                .disable_notification(&*mem)
                .map_err(err(TXQ))?;
        }
        let ctx = self.ctx(RXQ)?;
        ctx.queue_mut().enable_notification(&*mem).map_err(err(RXQ))
    }

    fn disarm(&mut self) -> Result<(), LinkError> {
        let ctx = self.ctx(RXQ)?;
        let _t = ctx.dma_batch();
        let mem = ctx.memory();
        ctx.queue_mut()
            .disable_notification(&*mem)
            .map_err(|e| LinkError::Broken(format!("vq{RXQ}: {e}")))
    }

    fn check(&mut self) -> Result<(), LinkError> {
        match &self.ctxs {
            Some(c) if !c[TXQ].stop_requested() && !c[RXQ].stop_requested() => Ok(()),
            _ => Err(LinkError::Reset { status: 0 }),
        }
    }

    fn features(&self) -> u32 {
        self.features
    }

    fn shutdown(&mut self) {
        if let Some(c) = self.ctxs.take() {
            self.slots.give_back(c);
        }
    }
}

impl Drop for VhostUserLink {
    fn drop(&mut self) {
        self.shutdown();
    }
}
