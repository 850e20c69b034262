//! In-process loopback transport: the device runs in a second thread on
//! rust-vmm's `virtio-queue`, over a `vm-memory` view built from the same
//! fds a vhost-user back end would get.
//!
//! The device side never touches the driver's `Buffer` objects: it maps the
//! shared regions' fds itself (at their guest addresses, or at the driver's
//! user addresses when an IOTLB translates IOVAs to user addresses, as in
//! vhost-user), so a wrong region list or a wrong address shows up as a
//! failed request, not as luck.

use std::fmt;
use std::fs::File;
use std::ops::Deref;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use iopath_dma::{IotlbRecord, IotlbSink, Perm, SharedRegion};
use rustix::event::{poll, PollFd, PollFlags, Timespec};
use virtio_queue::{Queue, QueueT};
use vm_memory::iommu::{Iommu, IotlbIterator, IovaRange};
use vm_memory::{
    Bytes, FileOffset, GuestAddress, GuestMemory, GuestMemoryMmap, GuestRegionMmap, IommuMemory,
    Iotlb, Permissions,
};

use super::{QueueConfig, Transport};
use crate::features::{status, VIRTIO_F_ACCESS_PLATFORM};
use crate::{Error, Result};

/// An eventfd(2) used as a kick or call line.
#[derive(Debug)]
struct EventFd(OwnedFd);

impl EventFd {
    fn new() -> Result<Self> {
        rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::NONBLOCK | rustix::event::EventfdFlags::CLOEXEC,
        )
        .map(EventFd)
        .map_err(|e| Error::sys("eventfd", e))
    }

    fn try_clone(&self) -> Result<Self> {
        self.0
            .try_clone()
            .map(EventFd)
            .map_err(|e| Error::sys("dup(eventfd)", e))
    }

    /// Adds 1 to the counter.
    fn write(&self, v: u64) -> std::io::Result<()> {
        rustix::io::write(&self.0, &v.to_ne_bytes())?;
        Ok(())
    }

    /// Reads and clears the counter (`WouldBlock` when zero).
    fn read(&self) -> std::io::Result<u64> {
        let mut b = [0u8; 8];
        rustix::io::read(&self.0, &mut b)?;
        Ok(u64::from_ne_bytes(b))
    }
}

impl AsFd for EventFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// Largest request (readable or writable bytes) the loopback device handles.
const MAX_REQUEST: usize = 64 << 20;

/// The device behind a [`Loopback`] transport: gets each request's readable
/// bytes and fills its writable ones.
pub trait LoopbackDevice: Send + 'static {
    /// Virtio device id.
    fn device_id(&self) -> u32;
    /// Device feature bits.
    fn features(&self) -> u64;
    /// Number of queues.
    fn num_queues(&self) -> u16;
    /// Largest queue size.
    fn queue_max_size(&self) -> u16 {
        256
    }
    /// Initial config space.
    fn config(&self) -> Vec<u8> {
        Vec::new()
    }
    /// Handles one request on `queue`: `request` is the gathered readable
    /// bytes, `response` the writable space; returns bytes written.
    fn handle(&mut self, queue: u16, request: &[u8], response: &mut [u8]) -> usize;
}

/// A device that copies each request's readable bytes into its writable
/// ones (as many as fit). Offers `VERSION_1`, `EVENT_IDX`, `INDIRECT_DESC`
/// and `ACCESS_PLATFORM`.
#[derive(Debug, Clone)]
pub struct Echo {
    /// Number of queues.
    pub queues: u16,
    /// Feature bits to offer.
    pub features: u64,
}

impl Default for Echo {
    fn default() -> Self {
        Echo {
            queues: 1,
            features: crate::features::VIRTIO_F_VERSION_1
                | crate::features::VIRTIO_F_EVENT_IDX
                | crate::features::VIRTIO_F_INDIRECT_DESC
                | VIRTIO_F_ACCESS_PLATFORM,
        }
    }
}

impl LoopbackDevice for Echo {
    fn device_id(&self) -> u32 {
        // Not a registered virtio id: a test device.
        0xffff
    }
    fn features(&self) -> u64 {
        self.features
    }
    fn num_queues(&self) -> u16 {
        self.queues
    }
    fn handle(&mut self, _queue: u16, request: &[u8], response: &mut [u8]) -> usize {
        let n = request.len().min(response.len());
        response[..n].copy_from_slice(&request[..n]);
        n
    }
}

/// The loopback's IOMMU: an IOTLB filled only by the driver's records;
/// misses are refused, never resolved.
#[derive(Debug, Default)]
struct LoopIotlb {
    tlb: RwLock<Iotlb>,
}

impl LoopIotlb {
    fn read(&self) -> RwLockReadGuard<'_, Iotlb> {
        self.tlb.read().unwrap_or_else(|e| e.into_inner())
    }

    fn clear(&self) {
        self.tlb
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .invalidate_all();
    }
}

/// [`Iommu`] over a shared [`LoopIotlb`] (IommuMemory owns its IOMMU; the
/// sink must reach the same table).
#[derive(Debug, Clone)]
struct SharedIommu(Arc<LoopIotlb>);

impl Iommu for SharedIommu {
    type IotlbGuard<'a> = RwLockReadGuard<'a, Iotlb>;

    fn translate(
        &self,
        iova: GuestAddress,
        length: usize,
        access: Permissions,
    ) -> std::result::Result<IotlbIterator<Self::IotlbGuard<'_>>, vm_memory::iommu::Error> {
        // The device's addresses are untrusted: reject wrapping ranges before
        // the IOTLB does arithmetic on them.
        if iova.0.checked_add(length as u64).is_none() {
            return Err(vm_memory::iommu::Error::CannotResolve {
                iova_range: IovaRange { base: iova, length },
                reason: "range wraps the address space".into(),
            });
        }
        Iotlb::lookup(self.0.read(), iova, length, access).map_err(|fails| {
            vm_memory::iommu::Error::CannotResolve {
                iova_range: IovaRange { base: iova, length },
                reason: format!(
                    "{} unmapped, {} without permission",
                    fails.misses.len(),
                    fails.access_fails.len()
                ),
            }
        })
    }
}

/// The sink the driver's IOMMU ops send records to.
#[derive(Debug)]
struct Sink {
    iotlb: Arc<LoopIotlb>,
    enabled: Arc<AtomicBool>,
    records: AtomicU64,
}

impl IotlbSink for Sink {
    fn send(
        &self,
        record: IotlbRecord,
    ) -> std::result::Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let mut tlb = self.iotlb.tlb.write().unwrap_or_else(|e| e.into_inner());
        match record {
            IotlbRecord::Update {
                iova,
                size,
                uaddr,
                perm,
            } => {
                let perm = match perm {
                    Perm::Read => Permissions::Read,
                    Perm::Write => Permissions::Write,
                    Perm::ReadWrite => Permissions::ReadWrite,
                };
                let size = usize::try_from(size)?;
                if iova.checked_add(size as u64).is_none() {
                    return Err("IOTLB update wraps the address space".into());
                }
                tlb.set_mapping(GuestAddress(iova), GuestAddress(uaddr), size, perm)?;
            }
            IotlbRecord::Invalidate { iova, size } => {
                if iova.checked_add(size).is_none() {
                    return Err("IOTLB invalidate wraps the address space".into());
                }
                tlb.invalidate_mapping(GuestAddress(iova), usize::try_from(size)?);
            }
        }
        self.enabled.store(true, Ordering::Release);
        self.records.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

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

impl Shared {
    fn state(&self) -> MutexGuard<'_, DevState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
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
            let st = shared.state();
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
        self.shared.state().driver_features = features;
        Ok(())
    }

    fn status(&self) -> Result<u8> {
        Ok(self.shared.state().status)
    }

    fn set_status(&self, new: u8) -> Result<()> {
        let mut st = self.shared.state();
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
        let st = self.shared.state();
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
        let mut st = self.shared.state();
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
        let mut st = self.shared.state();
        st.regions = regions.to_vec();
        let on = self.shared.iotlb_enabled.load(Ordering::Acquire);
        st.rebuild_memory(&self.shared.iotlb, on)
    }

    fn iotlb_sink(&self) -> Option<Arc<dyn IotlbSink>> {
        // Handing out the sink switches the device to IOVA translation (as a
        // vhost-user back end does once IOTLB messages flow).
        if !self.shared.iotlb_enabled.swap(true, Ordering::AcqRel) {
            let mut st = self.shared.state();
            if let Err(e) = st.rebuild_memory(&self.shared.iotlb, true) {
                tracing::warn!(error = %e, "loopback: remapping regions for IOTLB mode failed");
            }
        }
        Some(self.sink.clone())
    }

    fn setup_queue(&self, index: u16, config: &QueueConfig) -> Result<()> {
        self.check_queue(index)?;
        let mut st = self.shared.state();
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

fn device_thread(shared: &Shared, kicks: &[EventFd], calls: &[EventFd], stop: &EventFd) {
    loop {
        let mut fds: Vec<PollFd<'_>> = kicks
            .iter()
            .chain(std::iter::once(stop))
            .map(|e| PollFd::new(e, PollFlags::IN))
            .collect();
        match poll(&mut fds, None) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => {
                tracing::error!(error = %e, "loopback device: poll failed");
                return;
            }
        }
        let ready: Vec<bool> = fds
            .iter()
            .map(|f| f.revents().contains(PollFlags::IN))
            .collect();
        drop(fds);
        if ready[kicks.len()] {
            return;
        }
        for (q, kick) in kicks.iter().enumerate() {
            if ready[q] {
                let _ = kick.read();
                serve_queue(shared, q as u16, &calls[q]);
            }
        }
    }
}

fn serve_queue(shared: &Shared, qi: u16, call: &EventFd) {
    let mut guard = shared.state();
    let st = &mut *guard;
    if st.status & status::DRIVER_OK == 0 {
        return;
    }
    let queue = &mut st.queues[qi as usize];
    if !queue.ready() {
        return;
    }
    let dev = &mut *st.device;
    let res = match &st.mem {
        None => return,
        Some(DevMem::Plain(m)) => run_queue(m, queue, dev, qi, shared),
        Some(DevMem::Iommu(m)) => run_queue(m, queue, dev, qi, shared),
    };
    match res {
        Ok(true) => {
            if let Err(e) = call.write(1) {
                tracing::error!(error = %e, "loopback device: call eventfd");
            }
        }
        Ok(false) => {}
        Err(e) => {
            tracing::warn!(queue = qi, error = %e, "loopback device: queue error");
            shared.device_errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Serves every available request; returns whether the driver must be
/// interrupted.
fn run_queue<M: GuestMemory>(
    mem: &M,
    queue: &mut Queue,
    dev: &mut dyn LoopbackDevice,
    qi: u16,
    shared: &Shared,
) -> std::result::Result<bool, virtio_queue::Error> {
    let mut interrupt = false;
    loop {
        queue.disable_notification(mem)?;
        while let Some(chain) = queue.pop_descriptor_chain(mem) {
            let head = chain.head_index();
            let written = match serve_chain(chain, dev, qi) {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!(queue = qi, error = %e, "loopback device: bad request");
                    shared.device_errors.fetch_add(1, Ordering::Relaxed);
                    0
                }
            };
            queue.add_used(mem, head, written)?;
            shared.requests.fetch_add(1, Ordering::Relaxed);
        }
        interrupt |= queue.needs_notification(mem)?;
        if !queue.enable_notification(mem)? {
            break;
        }
    }
    Ok(interrupt)
}

/// Gathers a chain's readable bytes, runs the device, scatters the response.
fn serve_chain<M>(
    chain: virtio_queue::DescriptorChain<M>,
    dev: &mut dyn LoopbackDevice,
    qi: u16,
) -> std::result::Result<u32, String>
where
    M: Deref + Clone,
    M::Target: GuestMemory,
{
    let mem = chain.memory();
    let mut request = Vec::new();
    let mut writable = Vec::new();
    let mut wlen = 0usize;
    for desc in chain.clone() {
        let len = desc.len() as usize;
        if desc.is_write_only() {
            wlen += len;
            writable.push((desc.addr(), len));
        } else {
            let at = request.len();
            if at + len > MAX_REQUEST {
                return Err(format!("request larger than {MAX_REQUEST} bytes"));
            }
            request.resize(at + len, 0);
            mem.read_slice(&mut request[at..], desc.addr())
                .map_err(|e| format!("read {:#x}+{len}: {e}", desc.addr().0))?;
        }
        if wlen > MAX_REQUEST {
            return Err(format!("response larger than {MAX_REQUEST} bytes"));
        }
    }
    // Check the writable ranges before the device runs, so a bad address
    // fails the whole request.
    for &(addr, len) in &writable {
        if !mem.check_range(addr, len, Permissions::Write) {
            return Err(format!("cannot write {:#x}+{len}", addr.0));
        }
    }
    let mut response = vec![0u8; wlen];
    let n = dev.handle(qi, &request, &mut response).min(wlen);
    let mut done = 0;
    for (addr, len) in writable {
        if done == n {
            break;
        }
        let part = len.min(n - done);
        mem.write_slice(&response[done..done + part], addr)
            .map_err(|e| format!("write {:#x}+{part}: {e}", addr.0))?;
        done += part;
    }
    Ok(n as u32)
}
