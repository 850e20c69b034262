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
//!   shared regions (Buffer fds) ──SET_MEM_TABLE──► back end mmaps them
//!   Iommu ops ── IotlbRecord ──IOTLB_MSG──► back end's IOTLB
//! ```
//!
//! Addresses: descriptor addresses are *device addresses*. Without
//! `ACCESS_PLATFORM` they are the regions' "guest physical" addresses; the
//! vring addresses of `SET_VRING_ADDR` are front-end user addresses by the
//! vhost-user spec, so they are translated through the region table here.
//! With `ACCESS_PLATFORM` every address (vring ones included) is an IOVA
//! that the back end translates through the IOTLB entries sent to it.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use iopath_heap::Buffer;
use vhost::vhost_user::message::{VhostUserConfigFlags, VhostUserHeaderFlag};
use vhost::vhost_user::{Frontend, VhostUserFrontend as _, VhostUserProtocolFeatures};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// `VHOST_USER_F_PROTOCOL_FEATURES`: the back end speaks protocol features.
pub const VHOST_USER_F_PROTOCOL_FEATURES: u64 = 1 << 30;
/// `VIRTIO_F_ACCESS_PLATFORM` (a.k.a. `IOMMU_PLATFORM`), feature bit 33.
pub const VIRTIO_F_ACCESS_PLATFORM: u64 = 1 << 33;

/// `VHOST_USER_IOTLB_MSG` on the front-end channel.
const REQ_IOTLB_MSG: u32 = 22;
/// `VHOST_USER_BACKEND_IOTLB_MSG` on the back-end channel.
const BACKEND_REQ_IOTLB_MSG: u32 = 1;
/// `VHOST_USER_BACKEND_CONFIG_CHANGE_MSG` on the back-end channel.
const BACKEND_REQ_CONFIG_CHANGE: u32 = 2;
/// Header: request u32, flags u32, size u32.
const HDR_LEN: usize = 12;
/// `struct vhost_iotlb_msg`: iova, size, uaddr (u64 each), perm u8, type u8,
/// padded to 8 bytes.
const IOTLB_MSG_LEN: usize = 32;
/// Version 1 in the header flags.
const HDR_VERSION: u32 = 0x1;
/// Largest region count `SET_MEM_TABLE` carries for every back end (the
/// spec's baseline; libvhost-user refuses more). Further regions go through
/// `ADD_MEM_REG` when `CONFIGURE_MEM_SLOTS` is negotiated.
const MEM_TABLE_BASELINE: usize = 8;

/// Errors of the vhost-user front end.
#[derive(Debug, thiserror::Error)]
pub enum VhostUserError {
    /// The socket could not be connected.
    #[error("Cannot connect to vhost-user socket {path}")]
    Connect {
        /// Socket path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A vhost-user request failed or the back end refused it.
    #[error("vhost-user {request} failed")]
    Request {
        /// Request name.
        request: &'static str,
        /// Cause.
        #[source]
        source: vhost::Error,
    },
    /// Socket or eventfd I/O failed.
    #[error("{op} failed")]
    Io {
        /// What was being done.
        op: &'static str,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The back end lacks something the driver needs.
    #[error("Back end does not support {what}")]
    Unsupported {
        /// The missing feature.
        what: &'static str,
    },
    /// The back end answered with a malformed or negative reply.
    #[error("Bad reply from the back end to {request}: {why}")]
    BadReply {
        /// Request name.
        request: &'static str,
        /// What was wrong.
        why: &'static str,
    },
    /// A device address lies in no shared region.
    #[error("Device address {addr:#x}+{len:#x} is not inside any shared region")]
    NotShared {
        /// Device address.
        addr: u64,
        /// Length.
        len: u64,
    },
    /// Shared regions overlap in device address space or are empty.
    #[error("Shared region at {addr:#x}+{len:#x} overlaps another or is empty")]
    BadRegion {
        /// Device address.
        addr: u64,
        /// Length.
        len: u64,
    },
    /// More regions than the back end accepts.
    #[error("Too many shared regions: {count} (back end accepts {max})")]
    TooManyRegions {
        /// Regions requested.
        count: usize,
        /// Back end's limit.
        max: usize,
    },
    /// A queue index past the back end's queue count.
    #[error("Queue {index} out of range (back end has {count})")]
    BadQueue {
        /// Index asked for.
        index: usize,
        /// Queues the back end has.
        count: usize,
    },
    /// A queue was used before [`VhostUser::setup_queue`].
    #[error("Queue {index} is not set up")]
    QueueNotReady {
        /// Queue index.
        index: usize,
    },
}

/// Result of the vhost-user front end.
pub type Result<T> = std::result::Result<T, VhostUserError>;

fn req(request: &'static str) -> impl FnOnce(vhost::Error) -> VhostUserError {
    move |source| VhostUserError::Request { request, source }
}

/// Memory shared with the back end: a whole heap [`Buffer`] (its fd is sent
/// to the back end) and the device address where the device sees its first
/// byte.
#[derive(Debug, Clone)]
pub struct SharedRegion {
    /// The buffer whose fd the back end maps.
    pub buffer: Buffer,
    /// Device ("guest physical") address of the buffer's first byte.
    pub device_addr: u64,
}

impl SharedRegion {
    fn len(&self) -> u64 {
        self.buffer.len() as u64
    }

    fn info(&self) -> VhostUserMemoryRegionInfo {
        VhostUserMemoryRegionInfo {
            guest_phys_addr: self.device_addr,
            memory_size: self.len(),
            userspace_addr: self.buffer.as_ptr() as u64,
            mmap_offset: 0,
            mmap_handle: self.buffer.fd().as_raw_fd(),
        }
    }

    fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= self.device_addr
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= self.device_addr.saturating_add(self.len()))
    }
}

/// Where a split virtqueue's three parts live, as device addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueLayout {
    /// Ring size (descriptors), a power of two.
    pub size: u16,
    /// Descriptor table.
    pub desc: u64,
    /// Available (driver) ring.
    pub avail: u64,
    /// Used (device) ring.
    pub used: u64,
}

/// Permission of an IOTLB entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IotlbPerm {
    /// Device may read (driver → device).
    Read,
    /// Device may write (device → driver).
    Write,
    /// Both.
    ReadWrite,
}

impl IotlbPerm {
    /// `VHOST_ACCESS_RO` 1, `WO` 2, `RW` 3.
    fn wire(self) -> u8 {
        match self {
            IotlbPerm::Read => 1,
            IotlbPerm::Write => 2,
            IotlbPerm::ReadWrite => 3,
        }
    }
}

/// Protocol features the driver uses when the back end offers them.
fn wanted_protocol_features() -> VhostUserProtocolFeatures {
    VhostUserProtocolFeatures::MQ
        | VhostUserProtocolFeatures::REPLY_ACK
        | VhostUserProtocolFeatures::CONFIG
        | VhostUserProtocolFeatures::BACKEND_REQ
        | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
}

/// The kick and call eventfds of one queue.
#[derive(Debug)]
struct QueueEvents {
    kick: EventFd,
    call: EventFd,
}

/// The control channel: the rust-vmm front end and a second handle on the
/// same socket for the requests it cannot send (`IOTLB_MSG`). Both are used
/// only with the mutex held, so replies never interleave.
struct Control {
    fe: Frontend,
    raw: UnixStream,
    reply_ack: bool,
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Control")
            .field("socket", &self.raw)
            .field("reply_ack", &self.reply_ack)
            .finish()
    }
}

/// A connected vhost-user front end (the driver's end of the socket).
///
/// Setup order, as the vhost-user spec wants it: [`connect`], [`negotiate`],
/// [`set_regions`], [`setup_queue`] per queue; then [`notify`]/[`wait`] on
/// the data path. [`read_config`] works any time after connect.
///
/// [`connect`]: VhostUser::connect
/// [`negotiate`]: VhostUser::negotiate
/// [`set_regions`]: VhostUser::set_regions
/// [`setup_queue`]: VhostUser::setup_queue
/// [`notify`]: VhostUser::notify
/// [`wait`]: VhostUser::wait
/// [`read_config`]: VhostUser::read_config
#[derive(Debug)]
pub struct VhostUser {
    ctl: Mutex<Control>,
    path: PathBuf,
    device_features: u64,
    acked_features: u64,
    protocol: VhostUserProtocolFeatures,
    max_queues: usize,
    regions: Vec<SharedRegion>,
    queues: Vec<Option<QueueEvents>>,
    backend_chan: Option<BackendChannel>,
}

impl VhostUser {
    /// Connects to the back end listening on `path` (retrying for up to
    /// `timeout` while the socket does not exist yet or refuses), takes
    /// ownership (`SET_OWNER`), reads the device features and negotiates the
    /// protocol features (MQ, REPLY_ACK, CONFIG, BACKEND_REQ,
    /// CONFIGURE_MEM_SLOTS when offered).
    ///
    /// # Errors
    /// [`VhostUserError::Connect`] if nobody listens within `timeout`,
    /// [`VhostUserError::Request`] if a request fails.
    pub fn connect(path: impl AsRef<Path>, timeout: Duration) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let deadline = Instant::now() + timeout;
        let sock = loop {
            match UnixStream::connect(&path) {
                Ok(s) => break s,
                Err(e)
                    if Instant::now() < deadline
                        && matches!(
                            e.kind(),
                            std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
                        ) =>
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(source) => return Err(VhostUserError::Connect { path, source }),
            }
        };
        let raw = sock.try_clone().map_err(|source| VhostUserError::Io {
            op: "dup of the vhost-user socket",
            source,
        })?;
        // max_queue_num starts at 1 and is raised by GET_QUEUE_NUM under MQ.
        let mut fe = Frontend::from_stream(sock, 1);
        fe.set_owner().map_err(req("SET_OWNER"))?;
        let device_features = fe.get_features().map_err(req("GET_FEATURES"))?;
        let mut protocol = VhostUserProtocolFeatures::empty();
        let mut max_queues = 1;
        if device_features & VHOST_USER_F_PROTOCOL_FEATURES != 0 {
            let offered = fe
                .get_protocol_features()
                .map_err(req("GET_PROTOCOL_FEATURES"))?;
            protocol = offered & wanted_protocol_features();
            fe.set_protocol_features(protocol)
                .map_err(req("SET_PROTOCOL_FEATURES"))?;
            if protocol.contains(VhostUserProtocolFeatures::MQ) {
                let n = fe.get_queue_num().map_err(req("GET_QUEUE_NUM"))?;
                max_queues = usize::try_from(n).unwrap_or(1).max(1);
            }
        }
        let reply_ack = protocol.contains(VhostUserProtocolFeatures::REPLY_ACK);
        if reply_ack {
            // Every later request asks for an acknowledgement, so a refusal
            // shows up at the request that caused it.
            fe.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
        }
        let mut this = VhostUser {
            ctl: Mutex::new(Control { fe, raw, reply_ack }),
            path,
            device_features,
            acked_features: 0,
            protocol,
            max_queues,
            regions: Vec::new(),
            queues: (0..max_queues).map(|_| None).collect(),
            backend_chan: None,
        };
        if protocol.contains(VhostUserProtocolFeatures::BACKEND_REQ) {
            this.backend_chan = Some(this.open_backend_channel()?);
        }
        Ok(this)
    }

    fn ctl(&self) -> MutexGuard<'_, Control> {
        // A poisoned lock only means another thread panicked mid-request;
        // the socket state is then unknown but using it yields errors, not UB.
        self.ctl.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn open_backend_channel(&mut self) -> Result<BackendChannel> {
        let (ours, theirs) = UnixStream::pair().map_err(|source| VhostUserError::Io {
            op: "socketpair for the back-end channel",
            source,
        })?;
        self.ctl()
            .fe
            .set_backend_request_fd(&theirs)
            .map_err(req("SET_BACKEND_REQ_FD"))?;
        drop(theirs);
        BackendChannel::spawn(ours)
    }

    /// Socket path this front end is connected to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Virtio features the device offers (bit 30 is vhost-user's own).
    pub fn device_features(&self) -> u64 {
        self.device_features
    }

    /// Features acknowledged by [`VhostUser::negotiate`].
    pub fn acked_features(&self) -> u64 {
        self.acked_features
    }

    /// Negotiated vhost-user protocol features.
    pub fn protocol_features(&self) -> VhostUserProtocolFeatures {
        self.protocol
    }

    /// Queues the back end provides (1 without `MQ`).
    pub fn max_queues(&self) -> usize {
        self.max_queues
    }

    /// Whether `ACCESS_PLATFORM` was negotiated: every address the device
    /// sees is then an IOVA translated through the IOTLB.
    pub fn iotlb(&self) -> bool {
        self.acked_features & VIRTIO_F_ACCESS_PLATFORM != 0
    }

    /// Acknowledges `driver_features & device_features` (`SET_FEATURES`) and
    /// returns them. `VHOST_USER_F_PROTOCOL_FEATURES` is kept when offered.
    ///
    /// # Errors
    /// [`VhostUserError::Unsupported`] if `ACCESS_PLATFORM` is negotiated
    /// but the back end lacks REPLY_ACK or BACKEND_REQ (the vhost-user spec
    /// requires both for IOTLB), [`VhostUserError::Request`] on failure.
    pub fn negotiate(&mut self, driver_features: u64) -> Result<u64> {
        let acked = (driver_features & self.device_features)
            | (self.device_features & VHOST_USER_F_PROTOCOL_FEATURES);
        if acked & VIRTIO_F_ACCESS_PLATFORM != 0
            && !self.protocol.contains(
                VhostUserProtocolFeatures::REPLY_ACK | VhostUserProtocolFeatures::BACKEND_REQ,
            )
        {
            return Err(VhostUserError::Unsupported {
                what: "IOTLB (ACCESS_PLATFORM needs REPLY_ACK and BACKEND_REQ)",
            });
        }
        self.ctl()
            .fe
            .set_features(acked)
            .map_err(req("SET_FEATURES"))?;
        self.acked_features = acked;
        Ok(acked & !VHOST_USER_F_PROTOCOL_FEATURES)
    }

    /// Reads `buf.len()` bytes of the device configuration space at
    /// `offset` (`GET_CONFIG`).
    ///
    /// # Errors
    /// [`VhostUserError::Unsupported`] without the CONFIG protocol feature,
    /// [`VhostUserError::Request`] if the back end refuses.
    pub fn read_config(&self, offset: u32, buf: &mut [u8]) -> Result<()> {
        if !self.protocol.contains(VhostUserProtocolFeatures::CONFIG) {
            return Err(VhostUserError::Unsupported {
                what: "config space (CONFIG protocol feature)",
            });
        }
        let size = u32::try_from(buf.len()).map_err(|_| VhostUserError::BadReply {
            request: "GET_CONFIG",
            why: "size too large",
        })?;
        let zeros = vec![0u8; buf.len()];
        let (_, payload) = self
            .ctl()
            .fe
            .get_config(offset, size, VhostUserConfigFlags::empty(), &zeros)
            .map_err(req("GET_CONFIG"))?;
        if payload.len() != buf.len() {
            return Err(VhostUserError::BadReply {
                request: "GET_CONFIG",
                why: "wrong payload size",
            });
        }
        buf.copy_from_slice(&payload);
        Ok(())
    }

    /// Shares `regions` with the back end, replacing any earlier table: the
    /// first eight in one `SET_MEM_TABLE`, the rest with `ADD_MEM_REG`.
    ///
    /// # Errors
    /// [`VhostUserError::BadRegion`] for overlapping regions,
    /// [`VhostUserError::TooManyRegions`] past eight regions without
    /// `CONFIGURE_MEM_SLOTS` (or past the back end's slots),
    /// [`VhostUserError::Request`] if the back end refuses.
    pub fn set_regions(&mut self, regions: &[SharedRegion]) -> Result<()> {
        check_disjoint(regions)?;
        let mem_slots = self
            .protocol
            .contains(VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS);
        let mut ctl = self.ctl.lock().unwrap_or_else(|p| p.into_inner());
        let max = if mem_slots {
            let n = ctl
                .fe
                .get_max_mem_slots()
                .map_err(req("GET_MAX_MEM_SLOTS"))?;
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
        let infos: Vec<_> = regions.iter().map(SharedRegion::info).collect();
        let first = infos.len().min(MEM_TABLE_BASELINE);
        ctl.fe
            .set_mem_table(&infos[..first])
            .map_err(req("SET_MEM_TABLE"))?;
        for info in &infos[first..] {
            ctl.fe.add_mem_region(info).map_err(req("ADD_MEM_REG"))?;
        }
        drop(ctl);
        self.regions = regions.to_vec();
        Ok(())
    }

    /// Adds one region to the table (`ADD_MEM_REG`).
    ///
    /// # Errors
    /// [`VhostUserError::Unsupported`] without `CONFIGURE_MEM_SLOTS`,
    /// [`VhostUserError::BadRegion`] if it overlaps a shared region,
    /// [`VhostUserError::Request`] if the back end refuses.
    pub fn add_region(&mut self, region: SharedRegion) -> Result<()> {
        if !self
            .protocol
            .contains(VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS)
        {
            return Err(VhostUserError::Unsupported {
                what: "adding memory regions (CONFIGURE_MEM_SLOTS)",
            });
        }
        let mut all = self.regions.clone();
        all.push(region.clone());
        check_disjoint(&all)?;
        self.ctl()
            .fe
            .add_mem_region(&region.info())
            .map_err(req("ADD_MEM_REG"))?;
        self.regions.push(region);
        Ok(())
    }

    /// The regions shared with the back end.
    pub fn regions(&self) -> &[SharedRegion] {
        &self.regions
    }

    /// Translates a device address range to this process's user address
    /// (what `SET_VRING_ADDR` and IOTLB updates carry).
    ///
    /// # Errors
    /// [`VhostUserError::NotShared`] if the range is not inside one region.
    pub fn user_addr(&self, device_addr: u64, len: u64) -> Result<u64> {
        self.regions
            .iter()
            .find(|r| r.contains(device_addr, len))
            .map(|r| r.buffer.as_ptr() as u64 + (device_addr - r.device_addr))
            .ok_or(VhostUserError::NotShared {
                addr: device_addr,
                len,
            })
    }

    /// Sets up and enables queue `index`: `SET_VRING_NUM`, `SET_VRING_BASE`
    /// 0, `SET_VRING_ADDR`, `SET_VRING_KICK`, `SET_VRING_CALL`,
    /// `SET_VRING_ENABLE`. The ring must be in shared memory (or, with
    /// IOTLB, mapped through it: its IOVAs are sent as they are).
    ///
    /// # Errors
    /// [`VhostUserError::BadQueue`], [`VhostUserError::NotShared`] for ring
    /// parts outside the shared regions, [`VhostUserError::Request`].
    pub fn setup_queue(&mut self, index: usize, layout: QueueLayout) -> Result<()> {
        if index >= self.max_queues {
            return Err(VhostUserError::BadQueue {
                index,
                count: self.max_queues,
            });
        }
        let n = u64::from(layout.size);
        // Split ring sizes (virtio 1.x, 2.7): 16 per descriptor; avail and
        // used have flags+idx (+ the event word) around their entries.
        let (desc, avail, used) = if self.iotlb() {
            (layout.desc, layout.avail, layout.used)
        } else {
            (
                self.user_addr(layout.desc, 16 * n)?,
                self.user_addr(layout.avail, 6 + 2 * n)?,
                self.user_addr(layout.used, 6 + 8 * n)?,
            )
        };
        let kick = EventFd::new(0).map_err(|source| VhostUserError::Io {
            op: "eventfd (kick)",
            source,
        })?;
        let call = EventFd::new(EFD_NONBLOCK).map_err(|source| VhostUserError::Io {
            op: "eventfd (call)",
            source,
        })?;
        let cfg = VringConfigData {
            queue_max_size: layout.size,
            queue_size: layout.size,
            flags: 0,
            desc_table_addr: desc,
            used_ring_addr: used,
            avail_ring_addr: avail,
            log_addr: None,
        };
        let has_protocol = self.acked_features & VHOST_USER_F_PROTOCOL_FEATURES != 0;
        let mut ctl = self.ctl.lock().unwrap_or_else(|p| p.into_inner());
        ctl.fe
            .set_vring_num(index, layout.size)
            .map_err(req("SET_VRING_NUM"))?;
        ctl.fe
            .set_vring_base(index, 0)
            .map_err(req("SET_VRING_BASE"))?;
        ctl.fe
            .set_vring_addr(index, &cfg)
            .map_err(req("SET_VRING_ADDR"))?;
        ctl.fe
            .set_vring_call(index, &call)
            .map_err(req("SET_VRING_CALL"))?;
        ctl.fe
            .set_vring_kick(index, &kick)
            .map_err(req("SET_VRING_KICK"))?;
        if has_protocol {
            ctl.fe
                .set_vring_enable(index, true)
                .map_err(req("SET_VRING_ENABLE"))?;
        }
        drop(ctl);
        self.queues[index] = Some(QueueEvents { kick, call });
        Ok(())
    }

    fn events(&self, index: usize) -> Result<&QueueEvents> {
        self.queues
            .get(index)
            .and_then(Option::as_ref)
            .ok_or(VhostUserError::QueueNotReady { index })
    }

    /// Kicks queue `index`: tells the back end new buffers are available.
    ///
    /// # Errors
    /// [`VhostUserError::QueueNotReady`], [`VhostUserError::Io`].
    pub fn notify(&self, index: usize) -> Result<()> {
        self.events(index)?
            .kick
            .write(1)
            .map_err(|source| VhostUserError::Io {
                op: "eventfd write (kick)",
                source,
            })
    }

    /// Waits until the back end signals queue `index` (used buffers) or
    /// `timeout` passes; returns whether it signalled. The signal count is
    /// consumed.
    ///
    /// # Errors
    /// [`VhostUserError::QueueNotReady`], [`VhostUserError::Io`].
    pub fn wait(&self, index: usize, timeout: Option<Duration>) -> Result<bool> {
        let call = &self.events(index)?.call;
        if call.read().is_ok() {
            return Ok(true);
        }
        // SAFETY: the eventfd is owned by `self.queues` and outlives this
        // borrow, which ends with the function.
        let fd = unsafe { BorrowedFd::borrow_raw(call.as_raw_fd()) };
        let mut fds = [rustix::event::PollFd::from_borrowed_fd(
            fd,
            rustix::event::PollFlags::IN,
        )];
        let ts = timeout.map(|t| rustix::event::Timespec {
            tv_sec: t.as_secs().try_into().unwrap_or(i64::MAX),
            tv_nsec: t.subsec_nanos().into(),
        });
        loop {
            match rustix::event::poll(&mut fds, ts.as_ref()) {
                Ok(0) => return Ok(false),
                Ok(_) => return Ok(call.read().is_ok()),
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => {
                    return Err(VhostUserError::Io {
                        op: "poll (call eventfd)",
                        source: e.into(),
                    })
                }
            }
        }
    }

    /// The call eventfd of queue `index`, for callers that multiplex several
    /// queues in one `poll`.
    ///
    /// # Errors
    /// [`VhostUserError::QueueNotReady`].
    pub fn call_fd(&self, index: usize) -> Result<&EventFd> {
        Ok(&self.events(index)?.call)
    }

    /// Sends an IOTLB update: the device may access `iova..iova+size` with
    /// `perm`, backed by this process's memory at `uaddr` (inside a shared
    /// region).
    ///
    /// # Errors
    /// [`VhostUserError::Unsupported`] without `ACCESS_PLATFORM`,
    /// [`VhostUserError::Io`], [`VhostUserError::BadReply`] if refused.
    pub fn iotlb_update(&self, iova: u64, size: u64, uaddr: u64, perm: IotlbPerm) -> Result<()> {
        self.send_iotlb(iova, size, uaddr, perm.wire(), 2)
    }

    /// Sends an IOTLB invalidation of `iova..iova+size`.
    ///
    /// # Errors
    /// As [`VhostUser::iotlb_update`].
    pub fn iotlb_invalidate(&self, iova: u64, size: u64) -> Result<()> {
        self.send_iotlb(iova, size, 0, 0, 3)
    }

    // Hand-written: the vhost crate's Frontend has no IOTLB_MSG request.
    fn send_iotlb(&self, iova: u64, size: u64, uaddr: u64, perm: u8, kind: u8) -> Result<()> {
        if !self.iotlb() {
            return Err(VhostUserError::Unsupported {
                what: "IOTLB messages without ACCESS_PLATFORM",
            });
        }
        let ctl = self.ctl();
        let mut flags = HDR_VERSION;
        if ctl.reply_ack {
            flags |= VhostUserHeaderFlag::NEED_REPLY.bits();
        }
        let mut msg = [0u8; HDR_LEN + IOTLB_MSG_LEN];
        msg[0..4].copy_from_slice(&REQ_IOTLB_MSG.to_le_bytes());
        msg[4..8].copy_from_slice(&flags.to_le_bytes());
        msg[8..12].copy_from_slice(&(IOTLB_MSG_LEN as u32).to_le_bytes());
        let body = &mut msg[HDR_LEN..];
        body[0..8].copy_from_slice(&iova.to_le_bytes());
        body[8..16].copy_from_slice(&size.to_le_bytes());
        body[16..24].copy_from_slice(&uaddr.to_le_bytes());
        body[24] = perm;
        body[25] = kind;
        write_all(&ctl.raw, &msg, "IOTLB_MSG send")?;
        if ctl.reply_ack {
            let mut reply = [0u8; HDR_LEN + 8];
            read_exact(&ctl.raw, &mut reply, "IOTLB_MSG reply")?;
            let code = u32::from_le_bytes(reply[0..4].try_into().expect("4 bytes"));
            let rflags = u32::from_le_bytes(reply[4..8].try_into().expect("4 bytes"));
            let rsize = u32::from_le_bytes(reply[8..12].try_into().expect("4 bytes"));
            if code != REQ_IOTLB_MSG
                || rflags & VhostUserHeaderFlag::REPLY.bits() == 0
                || rsize != 8
            {
                return Err(VhostUserError::BadReply {
                    request: "IOTLB_MSG",
                    why: "not a reply to IOTLB_MSG",
                });
            }
            if u64::from_le_bytes(reply[12..20].try_into().expect("8 bytes")) != 0 {
                return Err(VhostUserError::BadReply {
                    request: "IOTLB_MSG",
                    why: "back end refused the entry",
                });
            }
        }
        Ok(())
    }
}

impl Drop for VhostUser {
    fn drop(&mut self) {
        // Closing the main socket tells the back end the driver is gone; it
        // also closes its end of the back-end channel, which ends our thread.
        let _ = rustix::net::shutdown(&self.ctl().raw, rustix::net::Shutdown::Both);
        if let Some(chan) = self.backend_chan.take() {
            chan.stop();
        }
    }
}

fn check_disjoint(regions: &[SharedRegion]) -> Result<()> {
    let mut sorted: Vec<_> = regions.iter().collect();
    sorted.sort_by_key(|r| r.device_addr);
    let mut end = 0u64;
    for (i, r) in sorted.iter().enumerate() {
        match r.device_addr.checked_add(r.len()) {
            Some(r_end) if r.len() != 0 && (i == 0 || r.device_addr >= end) => end = r_end,
            _ => {
                return Err(VhostUserError::BadRegion {
                    addr: r.device_addr,
                    len: r.len(),
                })
            }
        }
    }
    Ok(())
}

fn write_all(sock: &UnixStream, mut buf: &[u8], op: &'static str) -> Result<()> {
    while !buf.is_empty() {
        match rustix::net::sendmsg(
            sock,
            &[IoSlice::new(buf)],
            &mut rustix::net::SendAncillaryBuffer::default(),
            rustix::net::SendFlags::NOSIGNAL,
        ) {
            Ok(n) => buf = &buf[n..],
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => {
                return Err(VhostUserError::Io {
                    op,
                    source: e.into(),
                })
            }
        }
    }
    Ok(())
}

fn read_exact(sock: &UnixStream, buf: &mut [u8], op: &'static str) -> Result<()> {
    let mut got = 0;
    while got < buf.len() {
        match rustix::net::recvmsg(
            sock,
            &mut [IoSliceMut::new(&mut buf[got..])],
            &mut rustix::net::RecvAncillaryBuffer::default(),
            rustix::net::RecvFlags::empty(),
        ) {
            Ok(r) if r.bytes == 0 => {
                return Err(VhostUserError::Io {
                    op,
                    source: std::io::ErrorKind::UnexpectedEof.into(),
                })
            }
            Ok(r) => got += r.bytes,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => {
                return Err(VhostUserError::Io {
                    op,
                    source: e.into(),
                })
            }
        }
    }
    Ok(())
}

/// The back-end request channel (`SET_BACKEND_REQ_FD`), served by a thread.
///
/// iopath's IOMMU ops send every IOTLB entry before the device can need it,
/// so a miss means the device touched an address the driver never mapped:
/// it is logged and left unresolved (the back end fails that request).
/// Config-change notices are logged. Replies, when asked for, say "not
/// handled" (non-zero) for misses and "ok" for the rest.
#[derive(Debug)]
struct BackendChannel {
    sock: Arc<UnixStream>,
    thread: Option<JoinHandle<()>>,
}

impl BackendChannel {
    fn spawn(sock: UnixStream) -> Result<Self> {
        let sock = Arc::new(sock);
        let s = Arc::clone(&sock);
        let thread = std::thread::Builder::new()
            .name("vhost-user-backend-req".into())
            .spawn(move || serve_backend_channel(&s))
            .map_err(|source| VhostUserError::Io {
                op: "spawn of the back-end channel thread",
                source,
            })?;
        Ok(BackendChannel {
            sock,
            thread: Some(thread),
        })
    }

    fn stop(mut self) {
        let _ = rustix::net::shutdown(self.sock.as_fd(), rustix::net::Shutdown::Both);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve_backend_channel(sock: &UnixStream) {
    loop {
        let mut hdr = [0u8; HDR_LEN];
        if read_exact(sock, &mut hdr, "back-end channel read").is_err() {
            return;
        }
        let code = u32::from_le_bytes(hdr[0..4].try_into().expect("4 bytes"));
        let flags = u32::from_le_bytes(hdr[4..8].try_into().expect("4 bytes"));
        let size = u32::from_le_bytes(hdr[8..12].try_into().expect("4 bytes")) as usize;
        // The spec bounds a message body at 4 KiB-ish; refuse anything huge
        // rather than allocate what a hostile peer asks for.
        if size > 4096 {
            tracing::warn!(size, "back-end channel: oversized message, closing");
            return;
        }
        let mut body = vec![0u8; size];
        if read_exact(sock, &mut body, "back-end channel read").is_err() {
            return;
        }
        // Any fds the back end attached were received into the default
        // (empty) ancillary buffer and thus closed by the kernel.
        let handled = match code {
            BACKEND_REQ_IOTLB_MSG if size >= 26 => {
                let iova = u64::from_le_bytes(body[0..8].try_into().expect("8 bytes"));
                let perm = body[24];
                let kind = body[25];
                tracing::warn!(
                    iova = format_args!("{iova:#x}"),
                    perm,
                    kind,
                    "back end reports an IOTLB miss/access failure for an address never mapped"
                );
                false
            }
            BACKEND_REQ_CONFIG_CHANGE => {
                tracing::info!("back end reports a config change");
                true
            }
            other => {
                tracing::warn!(code = other, "back-end channel: unhandled request");
                false
            }
        };
        if flags & VhostUserHeaderFlag::NEED_REPLY.bits() != 0 {
            let mut reply = [0u8; HDR_LEN + 8];
            reply[0..4].copy_from_slice(&code.to_le_bytes());
            reply[4..8]
                .copy_from_slice(&(HDR_VERSION | VhostUserHeaderFlag::REPLY.bits()).to_le_bytes());
            reply[8..12].copy_from_slice(&8u32.to_le_bytes());
            reply[12..20].copy_from_slice(&u64::from(!handled).to_le_bytes());
            if write_all(sock, &reply, "back-end channel reply").is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iopath_heap::{Heap, HugePages, MemfdHeap};

    fn region(len: usize, addr: u64) -> SharedRegion {
        SharedRegion {
            buffer: MemfdHeap::new(HugePages::None).alloc(len).unwrap(),
            device_addr: addr,
        }
    }

    #[test]
    fn overlapping_regions_are_refused() {
        let a = region(4096, 0x1000);
        let b = region(8192, 0x1800);
        assert!(matches!(
            check_disjoint(&[a.clone(), b]),
            Err(VhostUserError::BadRegion { addr: 0x1800, .. })
        ));
        let c = region(4096, 0x2000);
        check_disjoint(&[c, a]).unwrap();
    }

    #[test]
    fn wrapping_region_is_refused() {
        let a = region(8192, u64::MAX - 4095);
        assert!(matches!(
            check_disjoint(&[a]),
            Err(VhostUserError::BadRegion { .. })
        ));
    }

    #[test]
    fn connect_to_nothing_fails_with_path() {
        let dir = std::env::temp_dir().join(format!("iopath-vu-none-{}", std::process::id()));
        let err = VhostUser::connect(&dir, Duration::from_millis(50)).unwrap_err();
        match err {
            VhostUserError::Connect { path, source } => {
                assert_eq!(path, dir);
                assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}
