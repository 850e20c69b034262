//! The device half of the loopback: the device model trait, the echo
//! device, and the thread that serves the queues with `virtio-queue`.

use std::ops::Deref;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::Ordering;

use iopath_sys::lock;
use rustix::event::{poll, PollFd, PollFlags};
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestMemory, Permissions};

use super::{DevMem, Shared};
use crate::features::{status, VIRTIO_F_ACCESS_PLATFORM};
use crate::{Error, Result};

/// An eventfd(2) used as a kick or call line.
#[derive(Debug)]
pub(super) struct EventFd(OwnedFd);

impl EventFd {
    pub(super) fn new() -> Result<Self> {
        rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::NONBLOCK | rustix::event::EventfdFlags::CLOEXEC,
        )
        .map(EventFd)
        .map_err(|e| Error::sys("eventfd", e))
    }

    pub(super) fn try_clone(&self) -> Result<Self> {
        self.0
            .try_clone()
            .map(EventFd)
            .map_err(|e| Error::sys("dup(eventfd)", e))
    }

    /// Adds 1 to the counter.
    pub(super) fn write(&self, v: u64) -> std::io::Result<()> {
        rustix::io::write(&self.0, &v.to_ne_bytes())?;
        Ok(())
    }

    /// Reads and clears the counter (`WouldBlock` when zero).
    pub(super) fn read(&self) -> std::io::Result<u64> {
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
pub(super) const MAX_REQUEST: usize = 64 << 20;

/// The device behind a [`Loopback`](super::Loopback) transport: gets each request's readable
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

pub(super) fn device_thread(shared: &Shared, kicks: &[EventFd], calls: &[EventFd], stop: &EventFd) {
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

pub(super) fn serve_queue(shared: &Shared, qi: u16, call: &EventFd) {
    let mut guard = lock(&shared.state);
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
pub(super) fn run_queue<M: GuestMemory>(
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
pub(super) fn serve_chain<M>(
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
