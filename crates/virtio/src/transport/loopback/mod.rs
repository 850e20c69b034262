//! In-process loopback transport: the device runs in a second thread on
//! rust-vmm's `virtio-queue`, over a `vm-memory` view built from the same
//! fds a vhost-user back end would get.
//!
//! The device side never touches the driver's `Buffer` objects: it maps the
//! shared regions' fds itself (at their guest addresses, or at the driver's
//! user addresses when an IOTLB translates IOVAs to user addresses, as in
//! vhost-user), so a wrong region list or a wrong address shows up as a
//! failed request, not as luck.
//!
//! A product transport, not a test fake: it is how a program runs a virtio
//! device model in its own process behind the same driver API ([`Transport`])
//! and the same DMA ops (direct, IOMMU with an enforced IOTLB, bounce) as a
//! device in another process, with no socket and no second process; the
//! crate's example and its queue benchmarks use it, and it is the reference
//! any other transport's behaviour is compared with. Its device models
//! implement [`LoopbackDevice`]; [`Echo`] is the one shipped.
//!
//! ```text
//!  driver ── Transport (status, features, queues, IOTLB records) ──► Loopback
//!     kick eventfd ──► device thread: virtio-queue over its own mappings
//!     call eventfd ◄── LoopbackDevice::handle(request, response)
//! ```

mod device;
mod iotlb;

use std::fmt;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use iopath_dma::{IotlbSink, SharedRegion};
use iopath_sys::lock;
use rustix::event::{poll, PollFd, PollFlags, Timespec};
use virtio_queue::{Queue, QueueT};
use vm_memory::{FileOffset, GuestAddress, GuestMemoryMmap, GuestRegionMmap, IommuMemory};

use super::{QueueConfig, Transport};
use crate::features::status;
use crate::{Error, Result};

use device::{device_thread, EventFd};
pub use device::{Echo, LoopbackDevice};
use iotlb::{LoopIotlb, SharedIommu, Sink};

enum DevMem {
    Plain(GuestMemoryMmap),
    Iommu(IommuMemory<GuestMemoryMmap, SharedIommu>),
}

struct DevState {
    status: u8,
    driver_features: u64,
    config: Vec<u8>,
    queues: Vec<Queue>,
    regions: Vec<SharedRegion>,
    mem: Option<DevMem>,
    device: Box<dyn LoopbackDevice>,
}

struct Shared {
    state: Mutex<DevState>,
    iotlb: Arc<LoopIotlb>,
    iotlb_enabled: Arc<AtomicBool>,
    device_errors: AtomicU64,
    requests: AtomicU64,
}

/// In-process loopback transport with a device thread.
pub struct Loopback {
    shared: Arc<Shared>,
    device_id: u32,
    device_features: u64,
    max_size: u16,
    kicks: Vec<EventFd>,
    calls: Arc<Vec<EventFd>>,
    stop: EventFd,
    sink: Arc<Sink>,
    thread: Option<JoinHandle<()>>,
}

impl fmt::Debug for Loopback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Loopback")
            .field("device_id", &self.device_id)
            .field("queues", &self.kicks.len())
            .field("requests", &self.requests())
            .field("device_errors", &self.device_errors())
            .finish()
    }
}

impl Loopback {
    /// Starts the device thread for `device`.
    ///
    /// # Errors
    /// [`Error::Sys`] if eventfds or the thread cannot be created.
    pub fn new(device: impl LoopbackDevice) -> Result<Self> {
        let nq = device.num_queues();
        let max_size = device.queue_max_size();
        let mk = EventFd::new;
        let kicks = (0..nq).map(|_| mk()).collect::<Result<Vec<_>>>()?;
        let calls = Arc::new((0..nq).map(|_| mk()).collect::<Result<Vec<_>>>()?);
        let stop = mk()?;
        let queues = (0..nq)
            .map(|_| {
                Queue::new(max_size)
                    .map_err(|e| Error::sys("virtio-queue", std::io::Error::other(e.to_string())))
            })
            .collect::<Result<Vec<_>>>()?;
        let iotlb = Arc::new(LoopIotlb::default());
        let iotlb_enabled = Arc::new(AtomicBool::new(false));
        let shared = Arc::new(Shared {
            state: Mutex::new(DevState {
                status: 0,
                driver_features: 0,
                config: device.config(),
                queues,
                regions: Vec::new(),
                mem: None,
                device: Box::new(device),
            }),
            iotlb: iotlb.clone(),
            iotlb_enabled: iotlb_enabled.clone(),
            device_errors: AtomicU64::new(0),
            requests: AtomicU64::new(0),
        });
        let (device_id, device_features) = {
            let st = lock(&shared.state);
            (st.device.device_id(), st.device.features())
        };
        let sink = Arc::new(Sink {
            iotlb,
            enabled: iotlb_enabled,
            records: AtomicU64::new(0),
        });
        let kick_fds = kicks
            .iter()
            .map(|k| k.try_clone())
            .collect::<Result<Vec<_>>>()?;
        let stop_fd = stop.try_clone()?;
        let thread_shared = shared.clone();
        let thread_calls = calls.clone();
        let thread = std::thread::Builder::new()
            .name("iopath-loopback".into())
            .spawn(move || device_thread(&thread_shared, &kick_fds, &thread_calls, &stop_fd))
            .map_err(|e| Error::sys("spawn(loopback device)", e))?;
        Ok(Loopback {
            shared,
            device_id,
            device_features,
            max_size,
            kicks,
            calls,
            stop,
            sink,
            thread: Some(thread),
        })
    }

    /// Requests the device completed.
    pub fn requests(&self) -> u64 {
        self.shared.requests.load(Ordering::Relaxed)
    }

    /// Requests the device failed because it could not reach their memory
    /// (an address outside the shared regions, an IOVA not mapped or mapped
    /// without the needed permission): completed with length 0.
    pub fn device_errors(&self) -> u64 {
        self.shared.device_errors.load(Ordering::Relaxed)
    }

    /// IOTLB records received.
    pub fn iotlb_records(&self) -> u64 {
        self.sink.records.load(Ordering::Relaxed)
    }

    fn check_queue(&self, index: u16) -> Result<()> {
        if (index as usize) < self.kicks.len() {
            Ok(())
        } else {
            Err(Error::NoSuchQueue {
                index,
                count: self.kicks.len() as u16,
            })
        }
    }
}

impl Drop for Loopback {
    fn drop(&mut self) {
        let _ = self.stop.write(1);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Maps every region's fd, at its guest address or (IOTLB mode) at the
/// driver's user address.
fn build_memory(regions: &[SharedRegion], at_uaddr: bool) -> Result<GuestMemoryMmap> {
    let mut list = Vec::with_capacity(regions.len());
    for r in regions {
        let base = if at_uaddr { r.uaddr() } else { r.gpa };
        let map_err = |e: &dyn std::fmt::Display| Error::MapRegion {
            gpa: base,
            len: r.len(),
            source: std::io::Error::other(e.to_string()),
        };
        let fd = r
            .buffer
            .fd()
            .try_clone_to_owned()
            .map_err(|e| Error::sys("dup(region fd)", e))?;
        let region = GuestRegionMmap::from_range(
            GuestAddress(base),
            r.len(),
            Some(FileOffset::new(File::from(fd), 0)),
        )
        .map_err(|e| map_err(&e))?;
        list.push(region);
    }
    list.sort_by_key(vm_memory::GuestMemoryRegion::start_addr);
    GuestMemoryMmap::from_regions(list).map_err(|e| Error::MapRegion {
        gpa: 0,
        len: 0,
        source: std::io::Error::other(e.to_string()),
    })
}

impl DevState {
    fn rebuild_memory(&mut self, iotlb: &Arc<LoopIotlb>, iotlb_on: bool) -> Result<()> {
        if self.regions.is_empty() {
            self.mem = None;
            return Ok(());
        }
        let backend = build_memory(&self.regions, iotlb_on)?;
        self.mem = Some(if iotlb_on {
            DevMem::Iommu(IommuMemory::new(
                backend,
                SharedIommu(iotlb.clone()),
                true,
                (),
            ))
        } else {
            DevMem::Plain(backend)
        });
        Ok(())
    }

    fn reset(&mut self, iotlb: &LoopIotlb, enabled: &AtomicBool) {
        self.status = 0;
        self.driver_features = 0;
        for q in &mut self.queues {
            q.reset();
        }
        iotlb.clear();
        enabled.store(false, Ordering::Release);
    }
}

impl Transport for Loopback {
    fn device_id(&self) -> u32 {
        self.device_id
    }

    fn num_queues(&self) -> u16 {
        self.kicks.len() as u16
    }

    fn queue_max_size(&self, index: u16) -> Result<u16> {
        self.check_queue(index)?;
        Ok(self.max_size)
    }

    fn device_features(&self) -> Result<u64> {
        Ok(self.device_features)
    }

    fn set_driver_features(&self, features: u64) -> Result<()> {
        lock(&self.shared.state).driver_features = features;
        Ok(())
    }

    fn status(&self) -> Result<u8> {
        Ok(lock(&self.shared.state).status)
    }

    fn set_status(&self, new: u8) -> Result<()> {
        let mut st = lock(&self.shared.state);
        if new == 0 {
            st.reset(&self.shared.iotlb, &self.shared.iotlb_enabled);
            return Ok(());
        }
        let mut new = new;
        // §2.2.2: the device refuses features it did not offer by leaving
        // FEATURES_OK clear.
        if new & status::FEATURES_OK != 0 && st.driver_features & !self.device_features != 0 {
            new &= !status::FEATURES_OK;
        }
        st.status = new;
        Ok(())
    }

    fn read_config(&self, offset: u32, data: &mut [u8]) -> Result<()> {
        let st = lock(&self.shared.state);
        let start = offset as usize;
        let src = start
            .checked_add(data.len())
            .and_then(|end| st.config.get(start..end))
            .ok_or(Error::Sys {
                op: "read config",
                source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
            })?;
        data.copy_from_slice(src);
        Ok(())
    }

    fn write_config(&self, offset: u32, data: &[u8]) -> Result<()> {
        let mut st = lock(&self.shared.state);
        let start = offset as usize;
        let dst = start
            .checked_add(data.len())
            .and_then(|end| st.config.get_mut(start..end))
            .ok_or(Error::Sys {
                op: "write config",
                source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
            })?;
        dst.copy_from_slice(data);
        Ok(())
    }

    fn set_memory(&self, regions: &[SharedRegion]) -> Result<()> {
        let mut st = lock(&self.shared.state);
        st.regions = regions.to_vec();
        let on = self.shared.iotlb_enabled.load(Ordering::Acquire);
        st.rebuild_memory(&self.shared.iotlb, on)
    }

    fn iotlb_sink(&self) -> Option<Arc<dyn IotlbSink>> {
        // Handing out the sink switches the device to IOVA translation (as a
        // vhost-user back end does once IOTLB messages flow).
        if !self.shared.iotlb_enabled.swap(true, Ordering::AcqRel) {
            let mut st = lock(&self.shared.state);
            if let Err(e) = st.rebuild_memory(&self.shared.iotlb, true) {
                tracing::warn!(error = %e, "loopback: remapping regions for IOTLB mode failed");
            }
        }
        Some(self.sink.clone())
    }

    fn setup_queue(&self, index: u16, config: &QueueConfig) -> Result<()> {
        self.check_queue(index)?;
        let mut st = lock(&self.shared.state);
        let q = &mut st.queues[index as usize];
        let bad = |_| Error::BadQueueSize {
            size: config.size,
            max: self.max_size,
        };
        q.try_set_size(config.size).map_err(bad)?;
        q.try_set_desc_table_address(GuestAddress(config.desc))
            .map_err(bad)?;
        q.try_set_avail_ring_address(GuestAddress(config.avail))
            .map_err(bad)?;
        q.try_set_used_ring_address(GuestAddress(config.used))
            .map_err(bad)?;
        q.set_event_idx(config.event_idx);
        q.set_ready(true);
        Ok(())
    }

    fn notify(&self, index: u16) -> Result<()> {
        self.check_queue(index)?;
        self.kicks[index as usize]
            .write(1)
            .map_err(|e| Error::sys("write(kick eventfd)", e))
    }

    fn wait_interrupt(&self, index: u16, timeout: Option<Duration>) -> Result<bool> {
        self.check_queue(index)?;
        if self.thread.as_ref().is_none_or(|t| t.is_finished()) {
            return Err(Error::Closed);
        }
        let call = &self.calls[index as usize];
        let ts = timeout.map(|d| Timespec {
            tv_sec: d.as_secs() as i64,
            tv_nsec: d.subsec_nanos() as _,
        });
        let mut fds = [PollFd::new(call, PollFlags::IN)];
        let n = loop {
            match poll(&mut fds, ts.as_ref()) {
                Ok(n) => break n,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(Error::sys("poll(call eventfd)", e)),
            }
        };
        if n == 0 {
            return Ok(false);
        }
        match call.read() {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(false),
            Err(e) => Err(Error::sys("read(call eventfd)", e)),
        }
    }

    fn interrupt_fd(&self, index: u16) -> Option<BorrowedFd<'_>> {
        self.calls.get(index as usize).map(|c| c.as_fd())
    }
}
