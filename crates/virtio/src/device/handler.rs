//! The device side's vhost-user request handler: the state one front end
//! builds up (features, memory table, vrings) and the queue workers it
//! starts, behind the `vhost` crate's `VhostUserBackendReqHandlerMut`.

use std::fs::File;
use std::os::fd::{OwnedFd, RawFd};
use std::sync::Arc;
use std::thread::JoinHandle;

use vhost::vhost_user::message::{
    VhostTransferStateDirection, VhostTransferStatePhase, VhostUserConfigFlags, VhostUserInflight,
    VhostUserLog, VhostUserMemoryRegion, VhostUserProtocolFeatures, VhostUserShMemConfig,
    VhostUserSharedMsg, VhostUserSingleMemoryRegion, VhostUserVringAddrFlags, VhostUserVringState,
};
use vhost::vhost_user::{
    Error as VhostError, GpuBackend, Result as VhostResult, VhostUserBackendReqHandlerMut,
};
use vhost::VhostUserMemoryRegionBase;
use virtio_queue::{Queue, QueueT};
use vm_memory::{
    GuestAddress, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap, GuestMemoryRegion,
    GuestRegionMmap, IommuMemory,
};

use super::inflight::InflightRegion;
use super::memory::{map_region, Region, MAX_MEM_SLOTS};
use super::{
    CallFd, DeviceMemory, DmaFence, QueueContext, VhostIommu, VirtioDevice,
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
    /// The front end's connection (shut down if it truncates its memory).
    pub(super) conn: RawFd,
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
}

fn invalid(reason: &'static str) -> VhostError {
    VhostError::InvalidOperation(reason)
}

impl<D: VirtioDevice> Handler<D> {
    pub(super) fn new(device: Arc<D>) -> Self {
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
            conn: -1,
            acked_features: 0,
            acked_protocol: 0,
            regions: Vec::new(),
            mem: GuestMemoryAtomic::new(mem),
            queue_mem,
            vrings,
            fence,
            inflight: None,
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
            Ok(join) => self.vrings[index].worker = Some(Worker { stop, join }),
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

    /// Drops everything the front end set up.
    /// Whether the front end truncated memory it shares (a SIGBUS was
    /// caught in one of its regions).
    pub(super) fn memory_truncated(&self) -> bool {
        self.regions
            .iter()
            .any(|r| r.watch.as_ref().is_some_and(|g| g.peer_truncated()))
            || self.inflight.as_ref().is_some_and(|r| r.truncated())
    }

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

impl<D: VirtioDevice> VhostUserBackendReqHandlerMut for Handler<D> {
    fn set_owner(&mut self) -> VhostResult<()> {
        Ok(())
    }

    fn reset_owner(&mut self) -> VhostResult<()> {
        self.shutdown();
        Ok(())
    }

    fn reset_device(&mut self) -> VhostResult<()> {
        self.shutdown();
        self.acked_features = 0;
        Ok(())
    }

    fn get_features(&mut self) -> VhostResult<u64> {
        Ok(self.device.features() | VHOST_USER_F_PROTOCOL_FEATURES)
    }

    fn set_features(&mut self, features: u64) -> VhostResult<()> {
        let offered = self.device.features() | VHOST_USER_F_PROTOCOL_FEATURES;
        if features & !offered != 0 {
            return Err(VhostError::InvalidParam);
        }
        let iommu_changed = (features ^ self.acked_features) & VIRTIO_F_ACCESS_PLATFORM != 0;
        self.acked_features = features;
        if iommu_changed {
            self.rebuild_memory()?;
        }
        if features & VHOST_USER_F_PROTOCOL_FEATURES == 0 {
            for i in 0..self.vrings.len() {
                if self.vrings[i].kick.is_some() {
                    self.vrings[i].enabled = true;
                    self.start_if_ready(i);
                }
            }
        }
        Ok(())
    }

    fn set_mem_table(
        &mut self,
        ctx: &[VhostUserMemoryRegion],
        files: Vec<File>,
        _postcopy_listening: Option<bool>,
    ) -> VhostResult<Option<Vec<VhostUserMemoryRegionBase>>> {
        if ctx.len() > MAX_MEM_SLOTS {
            return Err(VhostError::InvalidParam);
        }
        let mut regions = Vec::with_capacity(ctx.len());
        for (i, (r, file)) in ctx.iter().zip(files).enumerate() {
            regions.push(map_region(r, file, i, self.conn)?);
        }
        let old = std::mem::replace(&mut self.regions, regions);
        if let Err(e) = self.rebuild_memory() {
            self.regions = old;
            return Err(e);
        }
        for i in 0..self.vrings.len() {
            self.start_if_ready(i);
        }
        Ok(None)
    }

    fn set_vring_num(&mut self, index: u32, num: u32) -> VhostResult<()> {
        let max = u32::from(self.device.max_queue_size());
        if num == 0 || num > max || !num.is_power_of_two() {
            return Err(VhostError::InvalidParam);
        }
        self.vring(index)?.size = num as u16;
        Ok(())
    }

    fn set_vring_addr(
        &mut self,
        index: u32,
        _flags: VhostUserVringAddrFlags,
        descriptor: u64,
        used: u64,
        available: u64,
        _log: u64,
    ) -> VhostResult<()> {
        self.vring(index)?.addr = Some((descriptor, available, used));
        Ok(())
    }

    fn set_vring_base(&mut self, index: u32, base: u32) -> VhostResult<()> {
        let base = u16::try_from(base).map_err(|_| VhostError::InvalidParam)?;
        let v = self.vring(index)?;
        v.next_avail = base;
        v.next_used = base;
        Ok(())
    }

    fn get_vring_base(&mut self, index: u32) -> VhostResult<VhostUserVringState> {
        self.vring(index)?;
        self.stop(index as usize);
        let v = self.vring(index)?;
        v.kick = None;
        v.enabled = false;
        Ok(VhostUserVringState::new(index, u32::from(v.next_avail)))
    }

    fn set_vring_kick(&mut self, index: u8, fd: Option<File>) -> VhostResult<()> {
        let protocol = self.acked_features & VHOST_USER_F_PROTOCOL_FEATURES != 0;
        self.vring(u32::from(index))?;
        if let Some(f) = &fd {
            // The queue worker polls and reads this fd: anything but an
            // eventfd (a pipe, a file) would read as "always kicked" or
            // block, so the front end's message is refused.
            if !is_eventfd(f) {
                tracing::warn!(
                    queue = index,
                    "SET_VRING_KICK with an fd that is not an eventfd"
                );
                return Err(VhostError::InvalidParam);
            }
        }
        self.stop(usize::from(index));
        let v = self.vring(u32::from(index))?;
        v.kick = fd;
        if !protocol {
            v.enabled = true;
        }
        self.start_if_ready(usize::from(index));
        Ok(())
    }

    fn set_vring_call(&mut self, index: u8, fd: Option<File>) -> VhostResult<()> {
        self.vring(u32::from(index))?.call.set(fd);
        Ok(())
    }

    fn set_vring_err(&mut self, index: u8, _fd: Option<File>) -> VhostResult<()> {
        self.vring(u32::from(index))?;
        Ok(())
    }

    fn get_protocol_features(&mut self) -> VhostResult<VhostUserProtocolFeatures> {
        Ok(VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::CONFIG
            | VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::BACKEND_REQ
            | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
            | VhostUserProtocolFeatures::INFLIGHT_SHMFD)
    }

    fn set_protocol_features(&mut self, features: u64) -> VhostResult<()> {
        let offered = self.get_protocol_features()?.bits();
        if features & !offered != 0 {
            return Err(VhostError::InvalidParam);
        }
        tracing::debug!("protocol features acked: {features:#x}");
        self.acked_protocol = features;
        Ok(())
    }

    fn get_queue_num(&mut self) -> VhostResult<u64> {
        Ok(self.device.num_queues() as u64)
    }

    fn set_vring_enable(&mut self, index: u32, enable: bool) -> VhostResult<()> {
        self.vring(index)?;
        if enable {
            self.vring(index)?.enabled = true;
            self.start_if_ready(index as usize);
        } else {
            self.stop(index as usize);
            self.vring(index)?.enabled = false;
        }
        Ok(())
    }

    fn get_config(
        &mut self,
        offset: u32,
        size: u32,
        _flags: VhostUserConfigFlags,
    ) -> VhostResult<Vec<u8>> {
        if offset.checked_add(size).is_none() {
            return Err(VhostError::InvalidParam);
        }
        Ok(self.device.read_config(offset, size))
    }

    fn set_config(
        &mut self,
        _offset: u32,
        _buf: &[u8],
        _flags: VhostUserConfigFlags,
    ) -> VhostResult<()> {
        Err(invalid("the configuration space is read-only"))
    }

    fn set_gpu_socket(&mut self, _gpu_backend: GpuBackend) -> VhostResult<()> {
        Err(invalid("not a GPU"))
    }

    fn get_shared_object(&mut self, _uuid: VhostUserSharedMsg) -> VhostResult<File> {
        Err(invalid("no shared objects"))
    }

    fn get_inflight_fd(
        &mut self,
        inflight: &VhostUserInflight,
    ) -> VhostResult<(VhostUserInflight, File)> {
        let (max_queues, max_size) = self.inflight_limits();
        let (region, file, reply) = InflightRegion::create(
            inflight.num_queues,
            inflight.queue_size,
            max_queues,
            max_size,
        )
        .map_err(|e| {
            tracing::warn!("GET_INFLIGHT_FD refused: {e}");
            VhostError::InvalidParam
        })?;
        // Tracking starts now (a front end may never send the fd back).
        self.install_inflight(region);
        Ok((reply, file))
    }

    fn set_inflight_fd(&mut self, inflight: &VhostUserInflight, file: File) -> VhostResult<()> {
        let (max_queues, max_size) = self.inflight_limits();
        let region = InflightRegion::open(inflight, file, max_queues, max_size).map_err(|e| {
            tracing::warn!("SET_INFLIGHT_FD refused: {e}");
            VhostError::InvalidParam
        })?;
        self.install_inflight(region);
        Ok(())
    }

    fn get_max_mem_slots(&mut self) -> VhostResult<u64> {
        Ok(MAX_MEM_SLOTS as u64)
    }

    fn add_mem_region(
        &mut self,
        region: &VhostUserSingleMemoryRegion,
        fd: File,
        _postcopy_listening: Option<bool>,
    ) -> VhostResult<Option<VhostUserMemoryRegionBase>> {
        if self.regions.len() >= MAX_MEM_SLOTS {
            return Err(invalid("all memory slots in use"));
        }
        let new = map_region(region, fd, self.regions.len(), self.conn)?;
        self.regions.push(new);
        if let Err(e) = self.rebuild_memory() {
            // Overlapping or otherwise unusable: the table stays as it was.
            self.regions.pop();
            return Err(e);
        }
        for i in 0..self.vrings.len() {
            self.start_if_ready(i);
        }
        Ok(None)
    }

    fn remove_mem_region(&mut self, region: &VhostUserSingleMemoryRegion) -> VhostResult<()> {
        let at = self
            .regions
            .iter()
            .position(|r| r.guest_phys == region.guest_phys_addr && r.size == region.memory_size)
            .ok_or_else(|| invalid("no such memory region"))?;
        let old = self.regions.remove(at);
        if let Err(e) = self.rebuild_memory() {
            self.regions.insert(at, old);
            return Err(e);
        }
        Ok(())
    }

    fn set_device_state_fd(
        &mut self,
        _direction: VhostTransferStateDirection,
        _phase: VhostTransferStatePhase,
        _fd: File,
    ) -> VhostResult<Option<File>> {
        Err(invalid("no migration"))
    }

    fn check_device_state(&mut self) -> VhostResult<()> {
        Err(invalid("no migration"))
    }

    fn get_shmem_config(&mut self) -> VhostResult<VhostUserShMemConfig> {
        Err(invalid("no shared memory regions"))
    }

    fn set_log_base(&mut self, _log: &VhostUserLog, _file: File) -> VhostResult<()> {
        Err(invalid("no dirty logging"))
    }
}

impl<D: VirtioDevice> Drop for Handler<D> {
    fn drop(&mut self) {
        self.stop_all();
    }
}

/// Whether `f` is an eventfd (`/proc/self/fd/N` names `anon_inode:[eventfd]`).
fn is_eventfd(f: &File) -> bool {
    use std::os::fd::AsRawFd;
    std::fs::read_link(format!("/proc/self/fd/{}", f.as_raw_fd()))
        .is_ok_and(|p| p.as_os_str() == "anon_inode:[eventfd]")
}

#[cfg(test)]
mod tests;
