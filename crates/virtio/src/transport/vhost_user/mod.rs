//! vhost-user front end: drive a virtio device that lives in another process.
//!
//! The control plane is the `vhost` crate's [`Frontend`] (rust-vmm): feature
//! and protocol-feature negotiation, `SET_MEM_TABLE`/`ADD_MEM_REG` with the
//! fds of the shared regions, per-queue `SET_VRING_*`, `GET_CONFIG`. Two
//! pieces the crate does not offer are written here: sending `IOTLB_MSG`
//! (22) requests on the main socket, and serving the back-end request
//! channel (IOTLB misses, config-change notices).
//!
//! ```text
//!   driver ── notify(q) ──► kick eventfd ──► back end
//!   driver ◄─ wait(q)  ◄── call eventfd ◄── back end
//!   DmaOps::regions() (Buffer fds) ──SET_MEM_TABLE──► back end mmaps them
//!   Iommu ops ── IotlbRecord ──IOTLB_MSG──► back end's IOTLB
//! ```
//!
//! Addresses: descriptor addresses are *device addresses*. Without
//! `ACCESS_PLATFORM` they are the regions' "guest physical" addresses; the
//! vring addresses of `SET_VRING_ADDR` are front-end user addresses by the
//! vhost-user spec, so they are translated through the region table here.
//! With `ACCESS_PLATFORM` every address (vring ones included) is an IOVA
//! that the back end translates through the IOTLB entries sent to it.
//!
//! Queues are handed to the back end (`SET_VRING_*`) when the driver sets
//! `DRIVER_OK`, so the memory table and the IOTLB are complete by then
//! whatever order the driver called [`Transport::setup_queue`] and
//! [`Transport::set_memory`] in.

mod backend_channel;
mod control;
mod error;
mod regions;
mod sleep;
mod transport;

use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use iopath_dma::{IotlbSink, SharedRegion};
use iopath_sys::{lock, unix_socket};
use rustix::net::SocketType;
use vhost::vhost_user::message::{VhostUserConfigFlags, VhostUserHeaderFlag};
use vhost::vhost_user::{Frontend, VhostUserFrontend as _, VhostUserProtocolFeatures};
use vhost::{VhostBackend, VringConfigData};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::{QueueConfig, Transport};
use crate::features::{status, VHOST_USER_F_PROTOCOL_FEATURES, VIRTIO_F_ACCESS_PLATFORM};
use backend_channel::BackendChannel;
pub use control::VhostUserIotlb;
use control::{Control, Watchdog};
pub use error::{Result, VhostUserError};
use regions::{check_disjoint, region_info, user_addr};

/// Largest region count `SET_MEM_TABLE` carries for every back end (the
/// spec's baseline; libvhost-user refuses more). Further regions go through
/// `ADD_MEM_REG` when `CONFIGURE_MEM_SLOTS` is negotiated.
const MEM_TABLE_BASELINE: usize = 8;
/// How long the front end waits for any reply by default
/// ([`Timeouts::reply`]).
pub const DEFAULT_REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// How long [`VhostUser::connect_with`] waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// For the socket to exist and accept (default 0: one attempt).
    pub connect: Duration,
    /// For the back end's answer to each request, the life of the
    /// connection long ([`DEFAULT_REPLY_TIMEOUT`]). A request left
    /// unanswered fails with [`VhostUserError::Timeout`] and the connection
    /// is shut down; after a second without an answer the front end logs,
    /// once per connection, that it is waiting (a back end serves one front
    /// end at a time, so it may be busy with another).
    pub reply: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            connect: Duration::ZERO,
            reply: DEFAULT_REPLY_TIMEOUT,
        }
    }
}

/// Queue size assumed when the back end does not say (vhost-user has no
/// message for it): libvhost-user's and QEMU's `VIRTQUEUE_MAX_SIZE`.
pub const DEFAULT_QUEUE_MAX_SIZE: u16 = 1024;

/// Protocol features the driver uses when the back end offers them.
fn wanted_protocol_features() -> VhostUserProtocolFeatures {
    VhostUserProtocolFeatures::MQ
        | VhostUserProtocolFeatures::REPLY_ACK
        | VhostUserProtocolFeatures::CONFIG
        | VhostUserProtocolFeatures::BACKEND_REQ
        | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
}

/// The kick and call eventfds of one queue (made at connect, for every
/// queue the back end has, so the data path needs no lock).
#[derive(Debug)]
struct QueueEvents {
    kick: EventFd,
    call: EventFd,
    running: AtomicBool,
}

/// Mutable state behind the transport's `&self` methods.
#[derive(Debug, Default)]
struct State {
    acked: u64,
    status: u8,
    regions: Vec<SharedRegion>,
    /// Queue configurations given by the driver, sent at DRIVER_OK.
    configs: Vec<Option<QueueConfig>>,
}

/// A connected vhost-user front end: a [`Transport`] to a virtio device in
/// another process.
///
/// vhost-user does not carry the device type, so the caller says what it
/// expects ([`VhostUser::connect`]'s `device_id`). Device status lives here:
/// vhost-user has no status register unless `STATUS` is negotiated, and
/// iopath does not need it (queues start at `DRIVER_OK`).
#[derive(Debug)]
pub struct VhostUser {
    ctl: Arc<Mutex<Control>>,
    path: PathBuf,
    device_id: u32,
    device_features: u64,
    protocol: VhostUserProtocolFeatures,
    queue_max_size: u16,
    events: Vec<QueueEvents>,
    /// Wakes a waiter on a call eventfd at its deadline or when the back
    /// end hangs up (so it is noticed at once instead of at a timeout).
    sleepers: sleep::SleepWatch,
    /// The main socket again, for the peer's credentials.
    peer_sock: UnixStream,
    state: Mutex<State>,
    backend_chan: Mutex<Option<BackendChannel>>,
}

impl VhostUser {
    /// Connects to the back end listening on `path` (retrying for up to
    /// `timeout` while the socket does not exist yet or refuses), takes
    /// ownership (`SET_OWNER`), reads the device features and negotiates the
    /// protocol features (MQ, REPLY_ACK, CONFIG, BACKEND_REQ,
    /// CONFIGURE_MEM_SLOTS when offered). `device_id` is the virtio device
    /// type the caller expects behind the socket (2 for block).
    ///
    /// # Errors
    /// [`VhostUserError::Connect`] if nobody listens within `timeout`,
    /// [`VhostUserError::Request`] if a request fails,
    /// [`VhostUserError::Io`] if eventfds cannot be made.
    pub fn connect(path: impl AsRef<Path>, device_id: u32, timeout: Duration) -> Result<Self> {
        Self::connect_with(
            path,
            device_id,
            Timeouts {
                connect: timeout,
                ..Timeouts::default()
            },
        )
    }

    /// As [`connect`](Self::connect), with both timeouts given.
    ///
    /// # Errors
    /// As [`connect`](Self::connect).
    pub fn connect_with(
        path: impl AsRef<Path>,
        device_id: u32,
        timeouts: Timeouts,
    ) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let deadline = Instant::now() + timeouts.connect;
        let sock = match unix_socket::connect_until(&path, SocketType::STREAM, deadline) {
            Ok(fd) => UnixStream::from(fd),
            Err(source) => return Err(VhostUserError::Connect { path, source }),
        };
        let raw = sock.try_clone().map_err(|source| VhostUserError::Io {
            op: "dup of the vhost-user socket",
            source,
        })?;
        let peer_sock = sock.try_clone().map_err(|source| VhostUserError::Io {
            op: "dup of the vhost-user socket",
            source,
        })?;
        let watched = sock.try_clone().map_err(|source| VhostUserError::Io {
            op: "dup of the vhost-user socket",
            source,
        })?;
        // max_queue_num starts at 1 and is raised by GET_QUEUE_NUM under MQ.
        let mut ctl = Control {
            fe: Frontend::from_stream(sock, 1),
            raw,
            reply_ack: false,
            iotlb: false,
            watchdog: Watchdog::spawn(watched, &path, timeouts.reply)?,
        };
        ctl.call("SET_OWNER", |fe| fe.set_owner())?;
        let device_features = ctl.call("GET_FEATURES", |fe| fe.get_features())?;
        let mut protocol = VhostUserProtocolFeatures::empty();
        let mut queues: u16 = 1;
        if device_features & VHOST_USER_F_PROTOCOL_FEATURES != 0 {
            let offered = ctl.call("GET_PROTOCOL_FEATURES", |fe| fe.get_protocol_features())?;
            protocol = offered & wanted_protocol_features();
            ctl.call("SET_PROTOCOL_FEATURES", |fe| {
                fe.set_protocol_features(protocol)
            })?;
            if protocol.contains(VhostUserProtocolFeatures::MQ) {
                let n = ctl.call("GET_QUEUE_NUM", |fe| fe.get_queue_num())?;
                queues = u16::try_from(n).unwrap_or(u16::MAX).max(1);
            }
        }
        let reply_ack = protocol.contains(VhostUserProtocolFeatures::REPLY_ACK);
        if reply_ack {
            // Every later request asks for an acknowledgement, so a refusal
            // shows up at the request that caused it.
            ctl.fe.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
        }
        ctl.reply_ack = reply_ack;
        let io = |op| move |source| VhostUserError::Io { op, source };
        let events = (0..queues)
            .map(|_| {
                Ok(QueueEvents {
                    kick: EventFd::new(0).map_err(io("eventfd (kick)"))?,
                    call: EventFd::new(EFD_NONBLOCK).map_err(io("eventfd (call)"))?,
                    running: AtomicBool::new(false),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let watched = peer_sock
            .try_clone()
            .map_err(io("dup of the vhost-user socket"))?;
        let calls: Vec<&EventFd> = events.iter().map(|e| &e.call).collect();
        let sleepers = sleep::SleepWatch::spawn(watched, &calls)?;
        let this = VhostUser {
            ctl: Arc::new(Mutex::new(ctl)),
            path,
            device_id,
            device_features,
            protocol,
            queue_max_size: DEFAULT_QUEUE_MAX_SIZE,
            events,
            sleepers,
            peer_sock,
            state: Mutex::new(State {
                configs: vec![None; usize::from(queues)],
                ..State::default()
            }),
            backend_chan: Mutex::new(None),
        };
        if protocol.contains(VhostUserProtocolFeatures::BACKEND_REQ) {
            let chan = this.open_backend_channel()?;
            *lock(&this.backend_chan) = Some(chan);
        }
        Ok(this)
    }

    fn open_backend_channel(&self) -> Result<BackendChannel> {
        let (ours, theirs) = UnixStream::pair().map_err(|source| VhostUserError::Io {
            op: "socketpair for the back-end channel",
            source,
        })?;
        lock(&self.ctl).call("SET_BACKEND_REQ_FD", |fe| {
            fe.set_backend_request_fd(&theirs)
        })?;
        drop(theirs);
        BackendChannel::spawn(ours)
    }

    /// Socket path this front end is connected to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Virtio features the device offers, vhost-user's own bit 30 included.
    pub fn raw_device_features(&self) -> u64 {
        self.device_features
    }

    /// Negotiated vhost-user protocol features.
    pub fn protocol_features(&self) -> VhostUserProtocolFeatures {
        self.protocol
    }

    /// Overrides the queue size reported by [`Transport::queue_max_size`]
    /// (vhost-user cannot ask the back end).
    pub fn set_queue_max_size(&mut self, size: u16) {
        self.queue_max_size = size;
    }

    /// Translates a device address range to this process's user address
    /// (what `SET_VRING_ADDR` carries without an IOTLB).
    ///
    /// # Errors
    /// [`VhostUserError::NotShared`] if the range is not inside one region.
    pub fn user_addr(&self, device_addr: u64, len: u64) -> Result<u64> {
        user_addr(&lock(&self.state).regions, device_addr, len)
    }

    fn check_queue(&self, index: u16) -> Result<&QueueEvents> {
        self.events
            .get(usize::from(index))
            .ok_or(VhostUserError::BadQueue {
                index,
                count: self.events.len() as u16,
            })
    }

    /// Shares `regions`, replacing any earlier table: the first eight in one
    /// `SET_MEM_TABLE`, the rest with `ADD_MEM_REG`.
    fn share(&self, st: &mut State, regions: &[SharedRegion]) -> Result<()> {
        check_disjoint(regions)?;
        let mem_slots = self
            .protocol
            .contains(VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS);
        let mut ctl = lock(&self.ctl);
        let max = if mem_slots {
            let n = ctl.call("GET_MAX_MEM_SLOTS", |fe| fe.get_max_mem_slots())?;
            usize::try_from(n).unwrap_or(usize::MAX)
        } else {
            MEM_TABLE_BASELINE
        };
        if regions.len() > max || regions.is_empty() {
            return Err(VhostUserError::TooManyRegions {
                count: regions.len(),
                max,
            });
        }
        let infos: Vec<_> = regions.iter().map(region_info).collect();
        let first = infos.len().min(MEM_TABLE_BASELINE);
        ctl.call("SET_MEM_TABLE", |fe| fe.set_mem_table(&infos[..first]))?;
        for info in &infos[first..] {
            ctl.call("ADD_MEM_REG", |fe| fe.add_mem_region(info))?;
        }
        st.regions = regions.to_vec();
        Ok(())
    }

    /// Hands queue `index` to the back end and enables it.
    fn start_queue(&self, st: &State, index: u16, cfg: &QueueConfig) -> Result<()> {
        let ev = self.check_queue(index)?;
        let n = u64::from(cfg.size);
        let iotlb = st.acked & VIRTIO_F_ACCESS_PLATFORM != 0;
        // Split ring sizes (virtio 1.x §2.7): 16 bytes per descriptor; avail
        // and used have flags, idx and the event word around their entries.
        let (desc, avail, used) = if iotlb {
            (cfg.desc, cfg.avail, cfg.used)
        } else {
            (
                user_addr(&st.regions, cfg.desc, 16 * n)?,
                user_addr(&st.regions, cfg.avail, 6 + 2 * n)?,
                user_addr(&st.regions, cfg.used, 6 + 8 * n)?,
            )
        };
        let vring = VringConfigData {
            queue_max_size: self.queue_max_size,
            queue_size: cfg.size,
            flags: 0,
            desc_table_addr: desc,
            used_ring_addr: used,
            avail_ring_addr: avail,
            log_addr: None,
        };
        let i = usize::from(index);
        let mut ctl = lock(&self.ctl);
        ctl.call("SET_VRING_NUM", |fe| fe.set_vring_num(i, cfg.size))?;
        ctl.call("SET_VRING_BASE", |fe| fe.set_vring_base(i, 0))?;
        ctl.call("SET_VRING_ADDR", |fe| fe.set_vring_addr(i, &vring))?;
        ctl.call("SET_VRING_CALL", |fe| fe.set_vring_call(i, &ev.call))?;
        ctl.call("SET_VRING_KICK", |fe| fe.set_vring_kick(i, &ev.kick))?;
        if st.acked & VHOST_USER_F_PROTOCOL_FEATURES != 0 {
            ctl.call("SET_VRING_ENABLE", |fe| fe.set_vring_enable(i, true))?;
        }
        ev.running.store(true, Ordering::Release);
        Ok(())
    }

    /// Stops every running queue (`GET_VRING_BASE` stops a ring in
    /// vhost-user) and forgets the queue setup: a device reset.
    fn reset(&self, st: &mut State) -> Result<()> {
        for (i, ev) in self.events.iter().enumerate() {
            if ev.running.swap(false, Ordering::AcqRel) {
                lock(&self.ctl).call("GET_VRING_BASE", |fe| fe.get_vring_base(i))?;
            }
        }
        st.configs.iter_mut().for_each(|c| *c = None);
        Ok(())
    }
}

impl Drop for VhostUser {
    fn drop(&mut self) {
        // Closing the main socket tells the back end the driver is gone; it
        // also closes its end of the back-end channel, which ends our thread.
        let _ = rustix::net::shutdown(&lock(&self.ctl).raw, rustix::net::Shutdown::Both);
        if let Some(chan) = lock(&self.backend_chan).take() {
            chan.stop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_to_nothing_fails_with_path() {
        let dir = std::env::temp_dir().join(format!("iopath-vu-none-{}", std::process::id()));
        let err = VhostUser::connect(&dir, 2, Duration::from_millis(50)).unwrap_err();
        match err {
            VhostUserError::Connect { path, source } => {
                assert_eq!(path, dir);
                assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}
