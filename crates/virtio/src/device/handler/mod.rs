//! The device side's vhost-user request handler: the state one front end
//! builds up (features, memory table, vrings) and the queue workers it
//! starts, behind the `vhost` crate's `VhostUserBackendReqHandlerMut`.

use std::fs::File;
use std::os::fd::{OwnedFd, RawFd};
use std::sync::Arc;
use std::thread::JoinHandle;

use vhost::vhost_user::message::VhostUserProtocolFeatures;
use vhost::vhost_user::{Error as VhostError, Result as VhostResult};
use vhost::VhostUserMemoryRegionBase;
use virtio_queue::{Queue, QueueT};
use vm_memory::{
    GuestAddress, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap, GuestMemoryRegion,
    GuestRegionMmap, IommuMemory,
};

use super::call::CallFd;
use super::inflight::InflightRegion;
use super::memory::{map_region, Region, MAX_MEM_SLOTS};
use super::{
    DeviceMemory, DmaFence, QueueContext, ServerOptions, VhostIommu, VirtioDevice,
    VHOST_USER_F_PROTOCOL_FEATURES, VIRTIO_F_ACCESS_PLATFORM, VIRTIO_RING_F_EVENT_IDX,
};

struct Worker {
    stop: Arc<OwnedFd>,
    join: JoinHandle<Queue>,
}

struct Vring {
    size: u16,
    addr: Option<(u64, u64, u64)>,
    next_avail: u16,
    next_used: u16,
    kick: Option<File>,
    call: Arc<CallFd>,
    enabled: bool,
    worker: Option<Worker>,
}

impl Vring {
    fn new() -> Self {
        Self {
            size: 0,
            addr: None,
            next_avail: 0,
            next_used: 0,
            kick: None,
            call: Arc::new(CallFd::default()),
            enabled: false,
            worker: None,
        }
    }
}

/// The state one front end builds up: features, memory, vrings.
pub(super) struct Handler<D: VirtioDevice> {
    device: Arc<D>,
    /// The feature bits offered: the device's, less what the server's
    /// options withhold, plus `VHOST_USER_F_PROTOCOL_FEATURES`.
    offered: u64,
    /// The front end's connection (shut down if it truncates its memory).
    pub(super) conn: RawFd,
    /// The front end's process (`SO_PEERCRED`), if known.
    pub(super) peer: Option<rustix::process::Pid>,
    acked_features: u64,
    pub(super) acked_protocol: u64,
    regions: Vec<Region>,
    mem: GuestMemoryAtomic<DeviceMemory>,
    /// The same memory per queue, each through its own view of the IOMMU
    /// (which holds the queue's miss-wait hook).
    queue_mem: Vec<GuestMemoryAtomic<DeviceMemory>>,
    vrings: Vec<Vring>,
    pub(super) fence: Arc<DmaFence>,
    /// The inflight record (`GET_INFLIGHT_FD` / `SET_INFLIGHT_FD`).
    inflight: Option<Arc<InflightRegion>>,
    /// Queue workers started for this front end so far.
    started: usize,
}

fn invalid(reason: &'static str) -> VhostError {
    VhostError::InvalidOperation(reason)
}

impl<D: VirtioDevice> Handler<D> {
    pub(super) fn new(device: Arc<D>, options: ServerOptions) -> Self {
        let mut offered = device.features() | VHOST_USER_F_PROTOCOL_FEATURES;
        if !options.access_platform {
            offered &= !VIRTIO_F_ACCESS_PLATFORM;
        }
        let vrings = (0..device.num_queues()).map(|_| Vring::new()).collect();
        let fence = Arc::new(DmaFence::default());
        let iommu = VhostIommu::with_fence(Arc::clone(&fence));
        let queue_mem = (0..device.num_queues())
            .map(|_| {
                let view = iommu.queue_view();
                GuestMemoryAtomic::new(IommuMemory::new(GuestMemoryMmap::new(), view, false, ()))
            })
            .collect();
        let mem = IommuMemory::new(GuestMemoryMmap::new(), iommu, false, ());
        Self {
            device,
            offered,
            conn: -1,
            peer: None,
            acked_features: 0,
            acked_protocol: 0,
            regions: Vec::new(),
            mem: GuestMemoryAtomic::new(mem),
            queue_mem,
            vrings,
            fence,
            inflight: None,
            started: 0,
        }
    }

    /// The limits an inflight region must fit in: this device's queues.
    fn inflight_limits(&self) -> (u16, u16) {
        (
            u16::try_from(self.device.num_queues()).unwrap_or(u16::MAX),
            self.device.max_queue_size(),
        )
    }

    fn install_inflight(&mut self, region: InflightRegion) {
        if self.conn >= 0 {
            // SAFETY: `conn` is this front end's connection, open for as
            // long as its handler (and so this call) runs; the guard keeps
            // a duplicate of it, not the number.
            let sock = unsafe { std::os::fd::BorrowedFd::borrow_raw(self.conn) };
            region.shutdown_on_fault(sock);
        }
        self.inflight = Some(Arc::new(region));
    }

    fn iommu_on(&self) -> bool {
        self.acked_features & VIRTIO_F_ACCESS_PLATFORM != 0
    }

    /// vhost-user has no protocol bit for the IOTLB: `IOTLB_MSG` is valid
    /// once `VIRTIO_F_ACCESS_PLATFORM` is negotiated (front ends also want
    /// `BACKEND_REQ` and `REPLY_ACK`, which are offered).
    pub(super) fn iotlb_enabled(&self) -> bool {
        self.iommu_on()
    }

    /// `REPLY_ACK` is in force. As in the `vhost` crate, this follows the
    /// protocol features alone: front ends negotiate them (and may send
    /// `SET_BACKEND_REQ_FD`) before `SET_FEATURES`.
    pub(super) fn reply_ack(&self) -> bool {
        self.acked_protocol & VhostUserProtocolFeatures::REPLY_ACK.bits() != 0
    }

    pub(super) fn iommu(&self) -> Arc<VhostIommu> {
        Arc::clone(self.mem.memory().iommu())
    }

    /// Rebuilds the device memory from the region table: keyed by guest
    /// physical address normally, by front-end user address (what IOTLB
    /// entries point at) when the IOMMU is on.
    fn rebuild_memory(&mut self) -> VhostResult<()> {
        let iommu_on = self.iommu_on();
        let mut regions = Vec::with_capacity(self.regions.len());
        for r in &self.regions {
            let base = if iommu_on { r.user_addr } else { r.guest_phys };
            let region = GuestRegionMmap::with_arc(Arc::clone(&r.mapping), GuestAddress(base))
                .ok_or(VhostError::InvalidParam)?;
            regions.push(Arc::new(region));
        }
        // vm-memory wants the regions sorted by address (the order of the
        // front end's table follows guest physical addresses, not user
        // addresses) and refuses an empty list; no table yet is no memory.
        regions.sort_by_key(|r| r.start_addr());
        let phys = if regions.is_empty() {
            GuestMemoryMmap::new()
        } else {
            GuestMemoryMmap::from_arc_regions(regions).map_err(|e| {
                tracing::warn!("memory table refused: {e}");
                VhostError::InvalidParam
            })?
        };
        for atomic in std::iter::once(&self.mem).chain(&self.queue_mem) {
            let mut mem = atomic.memory().with_replaced_backend(phys.clone());
            mem.set_iommu_enabled(iommu_on);
            atomic
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .replace(mem);
        }
        Ok(())
    }

    /// Front-end virtual address to guest physical address (rings without
    /// an IOMMU are given as front-end virtual addresses).
    fn va_to_gpa(&self, va: u64) -> Option<u64> {
        self.regions.iter().find_map(|r| {
            let off = va.checked_sub(r.user_addr)?;
            (off < r.size).then(|| r.guest_phys + off)
        })
    }

    fn vring(&mut self, index: u32) -> VhostResult<&mut Vring> {
        self.vrings
            .get_mut(index as usize)
            .ok_or(VhostError::InvalidParam)
    }

    fn start_if_ready(&mut self, index: usize) {
        let Some(v) = self.vrings.get(index) else {
            return;
        };
        if v.worker.is_some() || !v.enabled || v.size == 0 || self.regions.is_empty() {
            return;
        }
        let (Some((desc, avail, used)), Some(kick)) = (v.addr, v.kick.as_ref()) else {
            return;
        };
        let addrs = if self.iommu_on() {
            Some((desc, avail, used))
        } else {
            match (
                self.va_to_gpa(desc),
                self.va_to_gpa(avail),
                self.va_to_gpa(used),
            ) {
                (Some(d), Some(a), Some(u)) => Some((d, a, u)),
                _ => None,
            }
        };
        let Some((desc, avail, used)) = addrs else {
            tracing::warn!("vring {index}: ring address outside the memory table");
            return;
        };
        let queue = match self.build_queue(v, desc, avail, used) {
            Ok(q) => q,
            Err(e) => {
                tracing::warn!("vring {index}: {e}");
                return;
            }
        };
        let (kick, stop) = match (
            kick.try_clone(),
            rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC),
        ) {
            (Ok(k), Ok(s)) => (k, Arc::new(s)),
            _ => {
                tracing::warn!("vring {index}: cannot duplicate the kick fd or make a stop fd");
                return;
            }
        };
        let Some(mem) = self.queue_mem.get(index).cloned() else {
            return;
        };
        let ctx = QueueContext {
            index,
            queue,
            mem: mem.clone(),
            kick,
            stop: Arc::clone(&stop),
            call: Arc::clone(&v.call),
            fence: Arc::clone(&self.fence),
            acked_features: self.acked_features,
            inflight: self.inflight.as_ref().and_then(|r| {
                let q = r.queue(index, v.size);
                if q.is_none() {
                    tracing::warn!(
                        "vring {index}: the inflight region has no room for it; \
                         its requests are not tracked"
                    );
                }
                q
            }),
            resubmit: Vec::new(),
            force_notify: false,
            kicks_suppressed: false,
            peer: self.peer,
        };
        let device = Arc::clone(&self.device);
        let spawned = std::thread::Builder::new()
            .name(format!("vq{index}"))
            .spawn(move || {
                let mut ctx = ctx;
                ctx.recover_inflight();
                let queue = device.run_queue(ctx);
                // The hook belongs to this run of the queue.
                mem.memory().iommu().set_before_miss_wait(None);
                queue
            });
        match spawned {
            Ok(join) => {
                self.vrings[index].worker = Some(Worker { stop, join });
                self.started += 1;
            }
            Err(e) => tracing::warn!("vring {index}: cannot start a worker: {e}"),
        }
    }

    fn build_queue(&self, v: &Vring, desc: u64, avail: u64, used: u64) -> Result<Queue, String> {
        let mut q = Queue::new(self.device.max_queue_size()).map_err(|e| e.to_string())?;
        q.try_set_size(v.size).map_err(|e| format!("size: {e}"))?;
        q.try_set_desc_table_address(GuestAddress(desc))
            .map_err(|e| format!("descriptor table: {e}"))?;
        q.try_set_avail_ring_address(GuestAddress(avail))
            .map_err(|e| format!("available ring: {e}"))?;
        q.try_set_used_ring_address(GuestAddress(used))
            .map_err(|e| format!("used ring: {e}"))?;
        q.set_event_idx(self.acked_features & VIRTIO_RING_F_EVENT_IDX != 0);
        q.set_next_avail(v.next_avail);
        q.set_next_used(v.next_used);
        q.set_ready(true);
        // With an IOMMU the rings are checked at each access instead: they
        // may not be mapped yet (QEMU answers misses lazily), and a miss
        // cannot be answered while this thread, which reads the answers,
        // is busy here.
        if !self.iommu_on() && !q.is_valid(&*self.mem.memory()) {
            return Err("rings are not inside the memory the device may access".into());
        }
        Ok(q)
    }

    fn stop(&mut self, index: usize) {
        let Some(v) = self.vrings.get_mut(index) else {
            return;
        };
        if let Some(w) = v.worker.take() {
            let _ = rustix::io::write(&*w.stop, &1u64.to_ne_bytes());
            match w.join.join() {
                Ok(q) => {
                    v.next_avail = q.next_avail();
                    v.next_used = q.next_used();
                }
                Err(_) => tracing::error!("vring {index}: worker panicked"),
            }
        }
    }

    fn stop_all(&mut self) {
        for i in 0..self.vrings.len() {
            self.stop(i);
        }
    }

    /// The features the front end acknowledged, when it did so with
    /// `VIRTIO_F_ACCESS_PLATFORM` but started no queue: what a front end
    /// that gives up on the offer leaves behind (Linux's `virtio_uml`
    /// without a DMA API fails its probe with `-ENOMEM` and goes).
    pub(super) fn left_at_access_platform(&self) -> Option<(u64, u64)> {
        (self.started == 0 && self.iommu_on()).then_some((self.acked_features, self.offered))
    }

    /// Whether the front end truncated memory it shares (a SIGBUS was
    /// caught in one of its regions).
    pub(super) fn memory_truncated(&self) -> bool {
        self.regions
            .iter()
            .any(|r| r.watch.as_ref().is_some_and(|g| g.peer_truncated()))
            || self.inflight.as_ref().is_some_and(|r| r.truncated())
    }

    /// Drops everything the front end set up.
    pub(super) fn shutdown(&mut self) {
        self.stop_all();
        for v in &mut self.vrings {
            *v = Vring::new();
        }
        self.iommu().clear();
        self.iommu().set_miss_channel(None, false);
        self.regions.clear();
        self.inflight = None;
    }
}

impl<D: VirtioDevice> Drop for Handler<D> {
    fn drop(&mut self) {
        self.stop_all();
    }
}

mod requests;
#[cfg(test)]
mod tests;
