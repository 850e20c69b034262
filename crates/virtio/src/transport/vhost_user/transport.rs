//! What a driver calls: the [`Transport`] methods of [`VhostUser`].

use super::*;

impl Transport for VhostUser {
    fn device_id(&self) -> u32 {
        self.device_id
    }

    fn num_queues(&self) -> u16 {
        self.events.len() as u16
    }

    fn queue_max_size(&self, index: u16) -> crate::Result<u16> {
        self.check_queue(index)?;
        Ok(self.queue_max_size)
    }

    fn device_features(&self) -> crate::Result<u64> {
        Ok(self.device_features & !VHOST_USER_F_PROTOCOL_FEATURES)
    }

    fn set_driver_features(&self, features: u64) -> crate::Result<()> {
        let acked = (features & self.device_features)
            | (self.device_features & VHOST_USER_F_PROTOCOL_FEATURES);
        let wants_iotlb = acked & VIRTIO_F_ACCESS_PLATFORM != 0;
        if wants_iotlb
            && !self.protocol.contains(
                VhostUserProtocolFeatures::REPLY_ACK | VhostUserProtocolFeatures::BACKEND_REQ,
            )
        {
            return Err(VhostUserError::Unsupported {
                what: "IOTLB (ACCESS_PLATFORM needs REPLY_ACK and BACKEND_REQ)",
            }
            .into());
        }
        let mut st = lock(&self.state);
        let mut ctl = lock(&self.ctl);
        ctl.call("SET_FEATURES", |fe| fe.set_features(acked))?;
        ctl.iotlb = wants_iotlb;
        st.acked = acked;
        Ok(())
    }

    fn status(&self) -> crate::Result<u8> {
        Ok(lock(&self.state).status)
    }

    fn set_status(&self, new: u8) -> crate::Result<()> {
        let mut st = lock(&self.state);
        if new == 0 {
            self.reset(&mut st)?;
        } else if new & status::DRIVER_OK != 0 && st.status & status::DRIVER_OK == 0 {
            let configs: Vec<_> = st.configs.iter().copied().enumerate().collect();
            for (i, cfg) in configs {
                if let Some(cfg) = cfg {
                    self.start_queue(&st, i as u16, &cfg)?;
                }
            }
        }
        st.status = new;
        Ok(())
    }

    fn read_config(&self, offset: u32, data: &mut [u8]) -> crate::Result<()> {
        if !self.protocol.contains(VhostUserProtocolFeatures::CONFIG) {
            return Err(VhostUserError::Unsupported {
                what: "config space (CONFIG protocol feature)",
            }
            .into());
        }
        // Always read from offset 0: qemu-storage-daemon (10.0) ignores the
        // offset of GET_CONFIG and copies from the start of its config.
        let total = usize::try_from(offset)
            .ok()
            .and_then(|o| o.checked_add(data.len()))
            .and_then(|t| u32::try_from(t).ok().map(|t32| (t, t32)))
            .ok_or(VhostUserError::BadReply {
                request: "GET_CONFIG",
                why: "range too large",
            })?;
        let zeros = vec![0u8; total.0];
        let (_, payload) = lock(&self.ctl).call("GET_CONFIG", |fe| {
            fe.get_config(0, total.1, VhostUserConfigFlags::empty(), &zeros)
        })?;
        if payload.len() != total.0 {
            return Err(VhostUserError::BadReply {
                request: "GET_CONFIG",
                why: "wrong payload size",
            }
            .into());
        }
        data.copy_from_slice(&payload[offset as usize..]);
        Ok(())
    }

    fn write_config(&self, offset: u32, data: &[u8]) -> crate::Result<()> {
        lock(&self.ctl).call("SET_CONFIG", |fe| {
            fe.set_config(offset, VhostUserConfigFlags::WRITABLE, data)
        })?;
        Ok(())
    }

    fn set_memory(&self, regions: &[SharedRegion]) -> crate::Result<()> {
        let mut st = lock(&self.state);
        self.share(&mut st, regions)?;
        Ok(())
    }

    fn iotlb_sink(&self) -> Option<Arc<dyn IotlbSink>> {
        lock(&self.ctl).iotlb.then(|| {
            Arc::new(VhostUserIotlb {
                ctl: Arc::clone(&self.ctl),
            }) as Arc<dyn IotlbSink>
        })
    }

    fn setup_queue(&self, index: u16, config: &QueueConfig) -> crate::Result<()> {
        self.check_queue(index)?;
        if config.size == 0 || !config.size.is_power_of_two() || config.size > self.queue_max_size {
            return Err(crate::Error::BadQueueSize {
                size: config.size,
                max: self.queue_max_size,
            });
        }
        let mut st = lock(&self.state);
        st.configs[usize::from(index)] = Some(*config);
        if st.status & status::DRIVER_OK != 0 {
            self.start_queue(&st, index, config)?;
        }
        Ok(())
    }

    fn notify(&self, index: u16) -> crate::Result<()> {
        let ev = self.check_queue(index)?;
        if !ev.running.load(Ordering::Acquire) {
            return Err(VhostUserError::QueueNotReady { index }.into());
        }
        ev.kick.write(1).map_err(|source| VhostUserError::Io {
            op: "eventfd write (kick)",
            source,
        })?;
        Ok(())
    }

    fn wait_interrupt(&self, index: u16, timeout: Option<Duration>) -> crate::Result<bool> {
        let call = &self.check_queue(index)?.call;
        self.sleepers.sleep(usize::from(index), call, timeout, true)
    }

    fn wait_interrupt_pending(&self, index: u16, timeout: Option<Duration>) -> crate::Result<bool> {
        let call = &self.check_queue(index)?.call;
        self.sleepers
            .sleep(usize::from(index), call, timeout, false)
    }

    fn take_interrupt(&self, index: u16) -> crate::Result<bool> {
        // The call eventfd is non-blocking: a read takes the count or fails
        // with EAGAIN.
        Ok(self.check_queue(index)?.call.read().is_ok())
    }

    fn interrupt_fd(&self, index: u16) -> Option<BorrowedFd<'_>> {
        let ev = self.events.get(usize::from(index))?;
        // SAFETY: the eventfd is owned by `self.events` and lives as long as
        // `self`, which bounds the returned borrow.
        Some(unsafe { BorrowedFd::borrow_raw(ev.call.as_raw_fd()) })
    }

    fn peer(&self) -> Option<rustix::process::Pid> {
        rustix::net::sockopt::socket_peercred(&self.peer_sock)
            .ok()
            .map(|c| c.pid)
    }
}
