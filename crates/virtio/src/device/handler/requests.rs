//! The vhost-user requests one front end sends, each applied to the
//! [`Handler`]'s state (the `vhost` crate decodes them and calls these).

use std::fs::File;

use vhost::vhost_user::message::{
    VhostTransferStateDirection, VhostTransferStatePhase, VhostUserConfigFlags, VhostUserInflight,
    VhostUserLog, VhostUserMemoryRegion, VhostUserProtocolFeatures, VhostUserShMemConfig,
    VhostUserSharedMsg, VhostUserSingleMemoryRegion, VhostUserVringAddrFlags, VhostUserVringState,
};
use vhost::vhost_user::{GpuBackend, Result as VhostResult, VhostUserBackendReqHandlerMut};

use super::*;

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
        Ok(self.offered)
    }

    fn set_features(&mut self, features: u64) -> VhostResult<()> {
        if features & !self.offered != 0 {
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

/// Whether `f` is an eventfd (`/proc/self/fd/N` names `anon_inode:[eventfd]`).
fn is_eventfd(f: &File) -> bool {
    use std::os::fd::AsRawFd;
    std::fs::read_link(format!("/proc/self/fd/{}", f.as_raw_fd()))
        .is_ok_and(|p| p.as_os_str() == "anon_inode:[eventfd]")
}
