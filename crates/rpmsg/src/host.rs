//! The host role: the virtio driver side.
//!
//! The host owns every buffer: `2 * num` buffers of 512 bytes from the pool
//! in the shared memory ([`ResourceTable::buffer_pool`]), the first `num`
//! pre-posted device-writable on vq0 (rx), the rest used for sends on vq1
//! (tx). It negotiates features through the vdev's `gfeatures` word and
//! sets DRIVER_OK in its status byte, as Linux's remoteproc and OpenAMP's
//! driver role do.
//!
//! The rings are legacy split rings at the device addresses the resource
//! table gives (offsets into the shared memory), laid out by
//! [`VringLayout`]. Ring fields are little-endian: legacy virtio is
//! native-endian and iopath supports little-endian machines only here.
//!
//! [`DriverRing`] is the only code that knows the ring format on this side;
//! it is written here because the rings live at fixed addresses in a region
//! the driver does not allocate (the shared virtqueue of `iopath-virtio`
//! allocates its own coherent ring memory).

use std::sync::atomic::{fence, Ordering};

use crate::link::{Link, LinkError, Role, Rx};
use crate::rsc_table::{status, ResourceTable};
use crate::shm::SharedMem;
use crate::vring::{need_event, VringLayout, VIRTIO_RING_F_EVENT_IDX, VRING_DESC_F_WRITE};
use crate::wire::{BUF_SIZE, VIRTIO_RPMSG_F_NS};

/// `VRING_USED_F_NO_NOTIFY`: the device asks not to be kicked.
const VRING_USED_F_NO_NOTIFY: u16 = 1;

/// Features the host accepts when the remote offers them.
pub const HOST_FEATURES: u32 = (1 << VIRTIO_RPMSG_F_NS) | (1 << VIRTIO_RING_F_EVENT_IDX);

/// Driver-side state of one legacy split ring in the shared memory.
#[derive(Debug)]
pub struct DriverRing {
    name: &'static str,
    layout: VringLayout,
    event_idx: bool,
    /// Next available index to publish.
    avail_idx: u16,
    /// Next used index to consume.
    last_used: u16,
    /// Available index at the last kick decision.
    kicked_at: u16,
    /// Which descriptors the device holds.
    outstanding: Vec<bool>,
}

impl DriverRing {
    /// Takes over the ring at `layout`, zeroing it.
    ///
    /// # Errors
    /// [`LinkError::Shm`] if the ring is not inside the shared memory.
    pub fn new(
        shm: &SharedMem,
        name: &'static str,
        layout: VringLayout,
        event_idx: bool,
    ) -> Result<Self, LinkError> {
        shm.write(layout.desc, &vec![0u8; layout.size as usize])?;
        Ok(DriverRing {
            name,
            layout,
            event_idx,
            avail_idx: 0,
            last_used: 0,
            kicked_at: 0,
            outstanding: vec![false; usize::from(layout.num)],
        })
    }

    /// Entries.
    pub fn num(&self) -> u16 {
        self.layout.num
    }

    /// Hands descriptor `id` (a single buffer) to the device.
    ///
    /// # Errors
    /// [`LinkError::Shm`].
    pub fn post(
        &mut self,
        shm: &SharedMem,
        id: u16,
        addr: u64,
        len: u32,
        flags: u16,
    ) -> Result<(), LinkError> {
        let l = &self.layout;
        let mut d = [0u8; 16];
        d[0..8].copy_from_slice(&addr.to_le_bytes());
        d[8..12].copy_from_slice(&len.to_le_bytes());
        d[12..14].copy_from_slice(&flags.to_le_bytes());
        shm.write(l.desc + 16 * u64::from(id), &d)?;
        let slot = self.avail_idx % l.num;
        shm.store_u16(l.avail + 4 + 2 * u64::from(slot), id, Ordering::Relaxed)?;
        self.avail_idx = self.avail_idx.wrapping_add(1);
        self.outstanding[usize::from(id)] = true;
        // Virtio spec 2.7.13.2: the descriptor and ring entry must be
        // visible before the new index; the release store orders them.
        shm.store_u16(l.avail + 2, self.avail_idx, Ordering::Release)?;
        Ok(())
    }

    /// Takes the next used element: `(id, len)`.
    ///
    /// # Errors
    /// [`LinkError::Broken`] if the used index jumped by more than the ring
    /// size or the device returned a descriptor it does not hold.
    pub fn pop_used(&mut self, shm: &SharedMem) -> Result<Option<(u16, u32)>, LinkError> {
        let l = &self.layout;
        // Acquire pairs with the device's release of used->idx (spec 2.7.14).
        let used_idx = shm.load_u16(l.used + 2, Ordering::Acquire)?;
        let pending = used_idx.wrapping_sub(self.last_used);
        if pending == 0 {
            return Ok(None);
        }
        if pending > l.num {
            return Err(LinkError::Broken(format!(
                "{}: used index jumped from {} to {used_idx} (ring of {})",
                self.name, self.last_used, l.num
            )));
        }
        let slot = self.last_used % l.num;
        let mut e = [0u8; 8];
        shm.read(l.used + 4 + 8 * u64::from(slot), &mut e)?;
        let id = u32::from_le_bytes([e[0], e[1], e[2], e[3]]);
        let len = u32::from_le_bytes([e[4], e[5], e[6], e[7]]);
        if id >= u32::from(l.num) || !self.outstanding[id as usize] {
            return Err(LinkError::Broken(format!(
                "{}: device returned descriptor {id}, which it does not hold",
                self.name
            )));
        }
        self.outstanding[id as usize] = false;
        self.last_used = self.last_used.wrapping_add(1);
        Ok(Some((id as u16, len)))
    }

    /// Whether the device wants a kick for what was posted since the last
    /// call (spec 2.7.10: `avail_event` with `EVENT_IDX`, else the used
    /// ring's `NO_NOTIFY` flag).
    ///
    /// # Errors
    /// [`LinkError::Shm`].
    pub fn need_kick(&mut self, shm: &SharedMem) -> Result<bool, LinkError> {
        let old = std::mem::replace(&mut self.kicked_at, self.avail_idx);
        if old == self.avail_idx {
            return Ok(false);
        }
        // Spec 2.7.13.4: the index update must be visible before reading
        // the device's suppression fields.
        fence(Ordering::SeqCst);
        if self.event_idx {
            let ev = shm.load_u16(self.layout.avail_event(), Ordering::Relaxed)?;
            Ok(need_event(ev, self.avail_idx, old))
        } else {
            let flags = shm.load_u16(self.layout.used, Ordering::Relaxed)?;
            Ok(flags & VRING_USED_F_NO_NOTIFY == 0)
        }
    }

    /// Asks for a notification on the next used buffer; returns whether
    /// one is already there.
    ///
    /// # Errors
    /// [`LinkError::Shm`].
    pub fn arm(&mut self, shm: &SharedMem) -> Result<bool, LinkError> {
        if self.event_idx {
            shm.store_u16(self.layout.used_event(), self.last_used, Ordering::Relaxed)?;
        } else {
            shm.store_u16(self.layout.avail, 0, Ordering::Relaxed)?;
        }
        // Spec 2.7.10: publish the request before re-checking the used index.
        fence(Ordering::SeqCst);
        Ok(shm.load_u16(self.layout.used + 2, Ordering::Acquire)? != self.last_used)
    }
}

/// The driver side of an rpmsg link.
#[derive(Debug)]
pub struct HostLink {
    shm: SharedMem,
    table: ResourceTable,
    features: u32,
    rx: DriverRing,
    tx: DriverRing,
    pool: u64,
    tx_free: Vec<u16>,
}

impl HostLink {
    /// Takes the device over: negotiates features, zeroes and sets up both
    /// rings, pre-posts every rx buffer, then sets DRIVER_OK. The caller
    /// kicks the remote afterwards.
    ///
    /// # Errors
    /// [`LinkError::Shm`] (table refused, region too small).
    pub fn start(shm: SharedMem, features: u32) -> Result<Self, LinkError> {
        let table = shm.table(0)?;
        let (pool, _) = table
            .buffer_pool(shm.len() as u64)
            .map_err(|e| LinkError::Shm(e.into()))?;
        let v = &table.vdev;
        let st = v.status_offset() as u64;
        shm.store_u8(st, 0)?;
        shm.store_u8(st, status::ACKNOWLEDGE | status::DRIVER)?;
        let features = v.dfeatures & features;
        shm.write_u32(v.gfeatures_offset() as u64, features)?;
        let event_idx = features & (1 << VIRTIO_RING_F_EVENT_IDX) != 0;
        let layout = |i: usize| {
            v.vrings[i]
                .layout()
                .ok_or_else(|| LinkError::Broken(format!("vring {i} has no layout")))
        };
        let mut rx = DriverRing::new(&shm, "vq0", layout(0)?, event_idx)?;
        let tx = DriverRing::new(&shm, "vq1", layout(1)?, event_idx)?;
        let zero = [0u8; BUF_SIZE];
        for id in 0..rx.num() {
            let addr = pool + u64::from(id) * BUF_SIZE as u64;
            shm.write(addr, &zero)?;
            rx.post(&shm, id, addr, BUF_SIZE as u32, VRING_DESC_F_WRITE)?;
        }
        rx.arm(&shm)?;
        let tx_free = (0..tx.num()).rev().collect();
        shm.store_u8(
            st,
            status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK | status::DRIVER_OK,
        )?;
        Ok(HostLink {
            shm,
            table,
            features,
            rx,
            tx,
            pool,
            tx_free,
        })
    }

    fn tx_addr(&self, id: u16) -> u64 {
        self.pool + (u64::from(self.rx.num()) + u64::from(id)) * BUF_SIZE as u64
    }

    fn rx_addr(&self, id: u16) -> u64 {
        self.pool + u64::from(id) * BUF_SIZE as u64
    }
}

impl Link for HostLink {
    fn role(&self) -> Role {
        Role::Host
    }

    fn recv(&mut self, out: &mut Vec<u8>) -> Result<Option<Rx>, LinkError> {
        let Some((id, len)) = self.rx.pop_used(&self.shm)? else {
            return Ok(None);
        };
        let addr = self.rx_addr(id);
        let res = if len as usize > BUF_SIZE {
            out.clear();
            Rx::Refused(format!(
                "vq0: device wrote {len} bytes into a {BUF_SIZE}-byte buffer"
            ))
        } else {
            out.resize(len as usize, 0);
            self.shm.read(addr, out)?;
            Rx::Message
        };
        self.rx
            .post(&self.shm, id, addr, BUF_SIZE as u32, VRING_DESC_F_WRITE)?;
        Ok(Some(res))
    }

    fn send(&mut self, msg: &[u8]) -> Result<bool, LinkError> {
        while let Some((id, _)) = self.tx.pop_used(&self.shm)? {
            self.tx_free.push(id);
        }
        let Some(id) = self.tx_free.pop() else {
            return Ok(false);
        };
        if msg.len() > BUF_SIZE {
            self.tx_free.push(id);
            return Err(LinkError::Broken(format!(
                "message of {} bytes for a {BUF_SIZE}-byte buffer",
                msg.len()
            )));
        }
        let addr = self.tx_addr(id);
        self.shm.write(addr, msg)?;
        self.tx.post(&self.shm, id, addr, msg.len() as u32, 0)?;
        Ok(true)
    }

    fn buf_size(&self) -> usize {
        BUF_SIZE
    }

    fn take_kick(&mut self) -> bool {
        let a = self.rx.need_kick(&self.shm).unwrap_or(true);
        let b = self.tx.need_kick(&self.shm).unwrap_or(true);
        a || b
    }

    fn arm(&mut self) -> Result<bool, LinkError> {
        // Sent buffers are reclaimed here and on the next send; the host
        // does not ask to be woken for them (OpenAMP suppresses tx-complete
        // interrupts the same way), senders waiting for one poll.
        while let Some((id, _)) = self.tx.pop_used(&self.shm)? {
            self.tx_free.push(id);
        }
        self.rx.arm(&self.shm)
    }

    fn check(&mut self) -> Result<(), LinkError> {
        let st = self.shm.load_u8(self.table.vdev.status_offset() as u64)?;
        if st & (status::NEEDS_RESET | status::FAILED) != 0 || st & status::DRIVER_OK == 0 {
            return Err(LinkError::Reset { status: st });
        }
        Ok(())
    }

    fn features(&self) -> u32 {
        self.features
    }

    fn tx_in_flight(&mut self) -> Result<usize, LinkError> {
        while let Some((id, _)) = self.tx.pop_used(&self.shm)? {
            self.tx_free.push(id);
        }
        Ok(usize::from(self.tx.num()) - self.tx_free.len())
    }

    fn shutdown(&mut self) {
        let _ = self.shm.store_u8(self.table.vdev.status_offset() as u64, 0);
    }
}
