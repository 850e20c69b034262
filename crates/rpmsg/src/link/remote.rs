//! The remote role: the virtio device side, on rust-vmm's `virtio-queue`
//! over the shared memory's `vm-memory` view.
//!
//! As in OpenAMP (`rpmsg_virtio.c`, device role): the remote receives on
//! vq1 (the host's tx ring: take an available buffer, read it, return it
//! used with its length) and sends on vq0 (the host's rx ring: take an
//! available, device-writable buffer, fill it, return it used with the
//! message length). It starts serving once the host has set DRIVER_OK in
//! the vdev status byte of the resource table.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::warn;
use virtio_queue::{Queue, QueueOwnedT, QueueT};

use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;

use super::mismatch::SizeWatch;
use crate::bufsz::BufSizes;
use crate::link::{Held, Link, LinkError, LinkMemory, Slot};
use crate::notify::Notifier;
use crate::role::Role;
use crate::rsc_table::{status, ResourceTable};
use crate::shm::{SharedMem, ShmError};
use crate::wire::HDR_LEN;

/// Largest message the remote copies out of one host buffer, whatever
/// was negotiated.
pub const MAX_RX_MSG: usize = crate::bufsz::MAX_BUF_SIZE as usize;

/// The device side of an rpmsg link.
#[derive(Debug)]
pub struct RemoteLink {
    shm: SharedMem,
    /// The same memory, as the bus reads and writes it.
    mem: Arc<dyn LinkMemory>,
    table: ResourceTable,
    features: u32,
    sizes: BufSizes,
    /// vq0: device → driver (the host's rx buffers).
    txq: Queue,
    /// vq1: driver → device (the host's tx buffers).
    rxq: Queue,
    kick: bool,
    /// A sender found vq0 empty: ask the host to kick when it adds
    /// buffers. Otherwise refills go unannounced (the host re-posts one
    /// per message it reads; a kick for each would double the wake-ups).
    tx_wanted: bool,
    /// Host buffers taken from vq0 and not used for a send yet.
    spare: Vec<Slot>,
    /// Fixed sizes: the host's buffers and messages checked against them.
    watch: SizeWatch,
}

/// `VRING_AVAIL_F_NO_INTERRUPT` (virtio 1.x §2.7.7.1), as the ring's u16 holds it.
const AVAIL_F_NO_INTERRUPT: u16 = virtio_bindings::virtio_ring::VRING_AVAIL_F_NO_INTERRUPT as u16;

/// Whether the driver wants an interrupt for what was just added to `q`'s
/// used ring. `virtio-queue` answers for `EVENT_IDX` only ("the
/// VRING_AVAIL_F_NO_INTERRUPT flag isn't supported yet"); without it the
/// driver's flag is read here.
pub(crate) fn wants_interrupt<M: vm_memory::GuestMemory>(
    q: &mut Queue,
    mem: &M,
    event_idx: bool,
) -> Result<bool, virtio_queue::Error> {
    let by_queue = q.needs_notification(mem)?;
    if event_idx {
        return Ok(by_queue);
    }
    // needs_notification fenced after the used-ring writes.
    let flags: u16 = vm_memory::Bytes::read_obj(mem, vm_memory::GuestAddress(q.avail_ring()))
        .map_err(virtio_queue::Error::GuestMemory)?;
    Ok(flags & AVAIL_F_NO_INTERRUPT == 0)
}

/// One descriptor as the remote checks it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Desc {
    pub(crate) addr: u64,
    pub(crate) len: u32,
    pub(crate) write_only: bool,
}

impl From<virtio_queue::desc::split::Descriptor> for Desc {
    fn from(d: virtio_queue::desc::split::Descriptor) -> Self {
        Desc {
            addr: d.addr().0,
            len: d.len(),
            write_only: d.is_write_only(),
        }
    }
}

/// Checks the chain at `head` of vq1 (the driver's message): one
/// device-readable descriptor of at most `max` bytes, all of it where
/// `inside` says the peer shared memory. Returns its address and length.
pub(crate) fn check_rx_chain(
    head: u16,
    mut descs: impl Iterator<Item = Desc>,
    max: usize,
    inside: impl Fn(u64, usize) -> bool,
) -> Result<(u64, usize), String> {
    match (descs.next(), descs.next()) {
        (None, _) => Err(format!("chain at {head} on vq1 has no valid descriptor")),
        (Some(_), Some(_)) => Err(format!(
            "chain at {head} on vq1 has several descriptors (rpmsg uses one)"
        )),
        (Some(d), None) if d.write_only => {
            Err(format!("descriptor {head} on vq1 is device-writable"))
        }
        (Some(d), None) if d.len as usize > max => Err(format!(
            "descriptor {head} on vq1 holds {} bytes, more than a {max}-byte buffer",
            d.len
        )),
        (Some(d), None) if !inside(d.addr, d.len as usize) => Err(format!(
            "descriptor {head} on vq1: {} bytes at {:#x} lie outside the shared memory",
            d.len, d.addr
        )),
        (Some(d), None) => Ok((d.addr, d.len as usize)),
    }
}

/// Checks the first descriptor of the chain at `head` of vq0 (a buffer
/// for a message to the driver): device-writable, room for a header,
/// where `inside` says the peer shared memory. Returns its address and
/// the bytes usable (at most `max`).
pub(crate) fn check_tx_desc(
    head: u16,
    first: Option<Desc>,
    max: usize,
    inside: impl Fn(u64, usize) -> bool,
) -> Result<(u64, usize), String> {
    match first {
        None => Err(format!("chain at {head} on vq0 has no valid descriptor")),
        Some(d) if !d.write_only => Err(format!("descriptor {head} on vq0 is not device-writable")),
        Some(d) if (d.len as usize) < HDR_LEN => Err(format!(
            "descriptor {head} on vq0 holds {} bytes, less than a header",
            d.len
        )),
        Some(d) => {
            let cap = (d.len as usize).min(max);
            if inside(d.addr, cap) {
                Ok((d.addr, cap))
            } else {
                Err(format!(
                    "descriptor {head} on vq0: {cap} bytes at {:#x} lie outside the shared memory",
                    d.addr
                ))
            }
        }
    }
}

fn queue(
    shm: &SharedMem,
    table: &ResourceTable,
    i: usize,
    event_idx: bool,
) -> Result<Queue, LinkError> {
    let r = &table.vdev.vrings[i];
    let l = r
        .layout()
        .ok_or_else(|| LinkError::Queue(format!("vring {i} has no valid layout")))?;
    let err = |e: virtio_queue::Error| LinkError::Queue(format!("vring {i}: {e}"));
    let mut q = Queue::new(l.num).map_err(err)?;
    q.set_size(l.num);
    q.try_set_desc_table_address(vm_memory::GuestAddress(l.desc))
        .map_err(err)?;
    q.try_set_avail_ring_address(vm_memory::GuestAddress(l.avail))
        .map_err(err)?;
    q.try_set_used_ring_address(vm_memory::GuestAddress(l.used))
        .map_err(err)?;
    q.set_event_idx(event_idx);
    q.set_ready(true);
    if !q.is_valid(shm.mem()) {
        return Err(LinkError::Queue(format!(
            "vring {i} at {:#x} is not valid in the shared memory",
            l.desc
        )));
    }
    Ok(q)
}

impl RemoteLink {
    /// Waits (forever with `None`) for the host to set DRIVER_OK, then
    /// attaches to the rings with the features the host accepted.
    ///
    /// # Errors
    /// [`LinkError::NotReady`] on timeout, [`LinkError::Shm`] if the table
    /// went bad, [`LinkError::Notify`] if the host went away.
    pub fn wait_ready(
        shm: SharedMem,
        notifier: &dyn Notifier,
        timeout: Option<Duration>,
    ) -> Result<Self, LinkError> {
        Self::wait_ready_with(shm, notifier, timeout, None)
    }

    /// As [`RemoteLink::wait_ready`]; with `fixed`, the buffer sizes are
    /// these, whatever the table offers (upstream OpenAMP's way: nothing
    /// negotiated, both sides set alike).
    ///
    /// # Errors
    /// As [`RemoteLink::wait_ready`]; [`LinkError::BufSize`] for a size
    /// no buffer can have.
    pub fn wait_ready_with(
        shm: SharedMem,
        notifier: &dyn Notifier,
        timeout: Option<Duration>,
        fixed: Option<BufSizes>,
    ) -> Result<Self, LinkError> {
        let start = Instant::now();
        let table = shm.table(0)?;
        let st_addr = table.vdev.status_offset() as u64;
        loop {
            let st = shm.load_u8(st_addr)?;
            if st & status::DRIVER_OK != 0
                && st & (status::FAILED | status::DEVICE_NEEDS_RESET) == 0
            {
                break;
            }
            if let Some(t) = timeout {
                if start.elapsed() >= t {
                    return Err(LinkError::NotReady { secs: t.as_secs() });
                }
            }
            // OpenAMP's remote polls the status every millisecond; a kick
            // (the host sends one after DRIVER_OK) wakes us sooner.
            notifier.wait(Duration::from_millis(1))?;
        }
        // Re-read the table: the host wrote gfeatures before DRIVER_OK
        // (release/acquire through the status byte).
        let table = shm.table(0)?;
        Self::attach_with(shm, table, fixed)
    }

    /// Resets the device in `shm` for the next host: the vdev status byte
    /// goes back to 0, so a host that comes finds a fresh device, not the
    /// status the last one left (DRIVER_OK if it was killed).
    ///
    /// # Errors
    /// [`ShmError`] if the resource table is no longer valid.
    pub fn reset_device(shm: &SharedMem) -> Result<(), ShmError> {
        let st = shm.table(0)?.vdev.status_offset() as u64;
        shm.store_u8(st, 0)
    }

    /// Attaches to the rings now (the host has set DRIVER_OK).
    ///
    /// # Errors
    /// [`LinkError::Queue`] if a ring is not valid, [`LinkError::BufSize`]
    /// if the buffer sizes in the table no longer hold.
    pub fn attach(shm: SharedMem, table: ResourceTable) -> Result<Self, LinkError> {
        Self::attach_with(shm, table, None)
    }

    /// As [`RemoteLink::attach`], with the `fixed` sizes of
    /// [`RemoteLink::wait_ready_with`].
    ///
    /// # Errors
    /// As [`RemoteLink::attach`].
    pub fn attach_with(
        shm: SharedMem,
        table: ResourceTable,
        fixed: Option<BufSizes>,
    ) -> Result<Self, LinkError> {
        let features = table.vdev.gfeatures & table.vdev.dfeatures;
        let v = &table.vdev;
        let sizes = crate::bufsz::remote_sizes(v.dfeatures, features, &v.config, fixed)?;
        let event_idx = features & (1 << VIRTIO_RING_F_EVENT_IDX) != 0;
        let txq = queue(&shm, &table, 0, event_idx)?;
        let rxq = queue(&shm, &table, 1, event_idx)?;
        Ok(RemoteLink {
            mem: Arc::new(shm.clone()),
            shm,
            table,
            features,
            sizes,
            txq,
            rxq,
            kick: false,
            tx_wanted: false,
            spare: Vec::new(),
            watch: SizeWatch::new(fixed),
        })
    }

    fn event_idx(&self) -> bool {
        self.features & (1 << VIRTIO_RING_F_EVENT_IDX) != 0
    }

    /// Whether `addr..addr + len` lies in the shared memory.
    fn inside(&self, addr: u64, len: usize) -> bool {
        addr.checked_add(len as u64)
            .is_some_and(|end| end <= self.shm.len() as u64)
    }

    fn give_back(&mut self, head: u16, len: u32) -> Result<(), LinkError> {
        let event_idx = self.event_idx();
        let mem = self.shm.mem();
        self.rxq
            .add_used(mem, head, len)
            .map_err(|e| Self::broken("vq1", e))?;
        self.kick |=
            wants_interrupt(&mut self.rxq, mem, event_idx).map_err(|e| Self::broken("vq1", e))?;
        Ok(())
    }

    fn broken(q: &str, e: virtio_queue::Error) -> LinkError {
        match e {
            virtio_queue::Error::InvalidAvailRingIndex => LinkError::Broken(format!(
                "{q}: the host's available index moved by more than the ring size"
            )),
            e => LinkError::Broken(format!("{q}: {e}")),
        }
    }
}

impl Link for RemoteLink {
    fn role(&self) -> Role {
        Role::Remote
    }

    fn memory(&self) -> &Arc<dyn LinkMemory> {
        &self.mem
    }

    fn hold_rx(&mut self) -> Result<Option<Result<Held, String>>, LinkError> {
        let mem = self.shm.mem();
        let chain = {
            let mut it = self.rxq.iter(mem).map_err(|e| Self::broken("vq1", e))?;
            match it.next() {
                Some(c) => c,
                None => return Ok(None),
            }
        };
        let head = chain.head_index();
        // Up to MAX_RX_MSG, whatever was negotiated: a driver configured
        // alike without negotiation (upstream OpenAMP's local sizes) is
        // read as it wrote.
        let checked = check_rx_chain(
            head,
            chain.into_iter().map(Desc::from),
            MAX_RX_MSG,
            |a, l| self.inside(a, l),
        );
        if let Ok((_, len)) = checked {
            if let Some(m) = self.watch.driver_message(len) {
                warn!(target: "iopath_rpmsg", "remote: {m}");
            }
        }
        match checked {
            Ok((addr, len)) => Ok(Some(Ok(Held {
                token: u64::from(head),
                addr,
                len,
            }))),
            Err(reason) => {
                self.give_back(head, 0)?;
                Ok(Some(Err(reason)))
            }
        }
    }

    fn release_rx(&mut self, held: Held) -> Result<(), LinkError> {
        // Returned with its length, as OpenAMP's device does (its driver
        // reuses the used length as the buffer size).
        self.give_back(held.token as u16, held.len as u32)
    }

    fn get_tx(&mut self) -> Result<Option<Slot>, LinkError> {
        if let Some(s) = self.spare.pop() {
            return Ok(Some(s));
        }
        let event_idx = self.event_idx();
        loop {
            let mem = self.shm.mem();
            let chain = {
                let mut it = self.txq.iter(mem).map_err(|e| Self::broken("vq0", e))?;
                match it.next() {
                    Some(c) => c,
                    None => {
                        self.tx_wanted = true;
                        return Ok(None);
                    }
                }
            };
            let head = chain.head_index();
            let first = chain.into_iter().next().map(Desc::from);
            if let Some(m) = first.and_then(|d| self.watch.driver_buffer(d.len)) {
                warn!(target: "iopath_rpmsg", "remote: {m}");
            }
            let max = self.sizes.to_host as usize;
            let checked = check_tx_desc(head, first, max, |a, l| self.inside(a, l));
            match checked {
                Ok((addr, cap)) => {
                    self.tx_wanted = false;
                    return Ok(Some(Slot {
                        token: u64::from(head),
                        addr,
                        cap,
                    }));
                }
                Err(reason) => {
                    warn!(target: "iopath_rpmsg", "remote: refused host buffer: {reason}");
                    let used = self.txq.add_used(mem, head, 0);
                    used.map_err(|e| Self::broken("vq0", e))?;
                    self.kick |= wants_interrupt(&mut self.txq, mem, event_idx)
                        .map_err(|e| Self::broken("vq0", e))?;
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
        let event_idx = self.event_idx();
        let mem = self.shm.mem();
        self.txq
            .add_used(mem, slot.token as u16, len as u32)
            .map_err(|e| Self::broken("vq0", e))?;
        self.kick |=
            wants_interrupt(&mut self.txq, mem, event_idx).map_err(|e| Self::broken("vq0", e))?;
        Ok(())
    }

    fn drop_tx(&mut self, slot: Slot) {
        // Kept for the next send (OpenAMP's reclaimer list does the same).
        self.spare.push(slot);
    }

    fn buf_size(&self) -> usize {
        self.sizes.to_host as usize
    }

    fn rx_buf_size(&self) -> usize {
        self.sizes.to_remote as usize
    }

    fn take_kick(&mut self) -> bool {
        std::mem::take(&mut self.kick)
    }

    fn arm(&mut self) -> Result<bool, LinkError> {
        let mem = self.shm.mem();
        // A kick for new tx buffers only while a sender waits for one.
        if self.tx_wanted {
            self.txq
                .enable_notification(mem)
                .map_err(|e| Self::broken("vq0", e))?;
        } else {
            self.txq
                .disable_notification(mem)
                .map_err(|e| Self::broken("vq0", e))?;
        }
        self.rxq
            .enable_notification(mem)
            .map_err(|e| Self::broken("vq1", e))
    }

    fn disarm(&mut self) -> Result<(), LinkError> {
        let mem = self.shm.mem();
        self.rxq
            .disable_notification(mem)
            .map_err(|e| Self::broken("vq1", e))
    }

    fn check(&mut self) -> Result<(), LinkError> {
        let st = self.shm.load_u8(self.table.vdev.status_offset() as u64)?;
        if st & status::DRIVER_OK == 0 || st & (status::FAILED | status::DEVICE_NEEDS_RESET) != 0 {
            return Err(LinkError::Reset { status: st });
        }
        Ok(())
    }

    fn features(&self) -> u32 {
        self.features
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer that shared 64 KiB at 0x10000.
    fn inside(addr: u64, len: usize) -> bool {
        addr >= 0x10000 && addr.checked_add(len as u64).is_some_and(|e| e <= 0x20000)
    }

    fn d(addr: u64, len: u32, write_only: bool) -> Desc {
        Desc {
            addr,
            len,
            write_only,
        }
    }

    #[test]
    fn driver_messages_checked_before_they_are_read() {
        let rx = |descs: Vec<Desc>| check_rx_chain(3, descs.into_iter(), BUF, inside);
        const BUF: usize = crate::wire::BUF_SIZE;
        assert_eq!(rx(vec![d(0x10000, 512, false)]), Ok((0x10000, 512)));
        assert_eq!(rx(vec![d(0x1fe00, 16, false)]), Ok((0x1fe00, 16)));
        let refused = [
            (vec![], "no valid descriptor"),
            (
                vec![d(0x10000, 600, false)],
                "600 bytes, more than a 512-byte buffer",
            ),
            (vec![d(0xf000, 512, false)], "lie outside"),
            (vec![d(0x1ff00, 512, false)], "lie outside"),
            (vec![d(u64::MAX - 8, 16, false)], "lie outside"),
            (vec![d(0x10000, 512, true)], "device-writable"),
            (
                vec![d(0x10000, 16, false), d(0x10200, 16, false)],
                "several",
            ),
        ];
        for (descs, why) in refused {
            let e = rx(descs.clone()).unwrap_err();
            assert!(e.contains(why), "{descs:?}: {e}");
        }
    }

    #[test]
    fn driver_buffers_checked_before_they_are_written() {
        let tx = |first| check_tx_desc(5, first, crate::wire::BUF_SIZE, inside);
        assert_eq!(tx(Some(d(0x10000, 512, true))), Ok((0x10000, 512)));
        // A longer buffer is used up to rpmsg's 512 bytes.
        assert_eq!(tx(Some(d(0x10000, 4096, true))), Ok((0x10000, 512)));
        let refused = [
            (None, "no valid descriptor"),
            (Some(d(0x10000, 512, false)), "not device-writable"),
            (Some(d(0x10000, 15, true)), "less than a header"),
            (Some(d(0x1ff00, 512, true)), "lie outside"),
            (Some(d(0, 512, true)), "lie outside"),
        ];
        for (first, why) in refused {
            let e = tx(first).unwrap_err();
            assert!(e.contains(why), "{first:?}: {e}");
        }
    }
}
