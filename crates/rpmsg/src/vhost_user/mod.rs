//! The remote over vhost-user: a virtio-rpmsg device (ID 7) whose rings
//! and buffers are in a vhost-user front end's memory, served by
//! `iopath-virtio`'s device side (the server `iopath blk serve` uses).
//! Linux's `virtio_rpmsg_bus` (e.g. in User-Mode Linux, whose
//! `virtio_uml` is a vhost-user front end) is then the host.
//!
//! ```text
//!  VhostUserServer ── run_queue(vq0), run_queue(vq1) ──► RpmsgDevice
//!     (one worker thread per queue: each leaves its QueueContext here
//!      and waits until the session gives it back)
//!  RpmsgDevice::wait_driver ── both queues, then the driver's first kick
//!     ──► VhostUserLink (Link) + VhostUserNotifier (Notifier)
//!     ──► Bus::start ──► RemoteChannels, as over shared memory
//!  a queue stopped (reset, front end gone) ──► link down ──► the session
//!     ends, the contexts go back to their workers, the next driver comes
//! ```
//!
//! Buffer sizes ([`RpmsgDevice::with_buf_sizes`]) are offered only when
//! asked: the convention's feature bit joins the device features and its
//! config is the device's config space (`VHOST_USER_GET_CONFIG`, protocol
//! feature `CONFIG`), each read answered with exactly the window asked
//! (Linux's `virtio_uml` reads one field at a time, from offset 0 to the
//! field's end). The buffers then follow what the driver acked: the bit
//! not acked, 512 bytes both ways. Without an offer the device is the one
//! of before: no bit 1, an empty config space.
//!
//! Without a status byte (vhost-user has none for Linux's front end), the
//! driver is ready at its first kick: Linux's bus posts its receive
//! buffers, sets DRIVER_OK and only then kicks vq0, and it registers its
//! name service before that, so an announcement sent earlier could be
//! lost.

mod link;
mod notifier;

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use iopath_virtio::device::{
    QueueContext, VirtioDevice, VIRTIO_F_ACCESS_PLATFORM, VIRTIO_F_VERSION_1,
    VIRTIO_RING_F_EVENT_IDX,
};
use virtio_queue::Queue;

pub use link::VhostUserLink;
pub use notifier::VhostUserNotifier;

use crate::bufsz::{BufSizeError, BufSizes, Convention};
use crate::notify::NotifyError;
use crate::wire::VIRTIO_RPMSG_F_NS;

/// Binds the vhost-user socket at `path` with mode 0600 whatever the
/// umask (whoever can connect drives the device and reads every message),
/// replacing a stale socket nobody listens on.
///
/// # Errors
/// [`NotifyError::InUse`] if another server listens there,
/// [`NotifyError::NotSocket`] for another kind of file,
/// [`NotifyError::Io`] if the socket cannot be bound.
pub fn bind(path: &std::path::Path) -> Result<std::os::unix::net::UnixListener, NotifyError> {
    // Private from the start, whatever the umask: see bind_listener.
    let fd = iopath_sys::unix_socket::listen(
        path,
        rustix::net::SocketType::STREAM,
        iopath_sys::unix_socket::PRIVATE_MODE,
        16,
    )?;
    Ok(std::os::unix::net::UnixListener::from(fd))
}

/// The virtio device ID of rpmsg.
pub const VIRTIO_ID_RPMSG: u32 = 7;
/// Entries per ring accepted (Linux's `virtio_uml` asks for 256).
pub const MAX_QUEUE_SIZE: u16 = 1024;
/// How often a worker whose queue waits for its partner looks at its stop
/// request.
const STOP_POLL: Duration = Duration::from_millis(20);

/// Where a queue's context is.
#[derive(Debug, Default)]
enum Slot {
    /// No worker runs the queue.
    #[default]
    Empty,
    /// Its worker left it for the next session.
    Waiting(QueueContext),
    /// A session uses it.
    Taken,
    /// The session ended; its worker takes it back.
    Returned(QueueContext),
}

/// Both queues' contexts, passed between their workers and the session.
#[derive(Debug, Default)]
pub(crate) struct Slots {
    slots: Mutex<[Slot; 2]>,
    cond: Condvar,
}

impl Slots {
    fn lock(&self) -> MutexGuard<'_, [Slot; 2]> {
        iopath_sys::lock(&self.slots)
    }

    /// Gives the contexts a session used back to their workers.
    pub(crate) fn give_back(&self, ctxs: [QueueContext; 2]) {
        let mut s = self.lock();
        for (slot, ctx) in s.iter_mut().zip(ctxs) {
            *slot = Slot::Returned(ctx);
        }
        drop(s);
        self.cond.notify_all();
    }
}

/// A virtio-rpmsg device for [`iopath_virtio::device::VhostUserServer`];
/// [`RpmsgDevice::wait_driver`] hands each driver's link to the caller.
#[derive(Debug, Clone, Default)]
pub struct RpmsgDevice {
    slots: Arc<Slots>,
    access_platform: bool,
    /// Buffer sizes offered, and how.
    buf_sizes: Option<(Convention, BufSizes)>,
}

/// Why no driver came.
#[derive(Debug, thiserror::Error)]
pub enum WaitDriverError {
    /// None within the time allowed.
    #[error("No driver started the device within {secs} s")]
    Timeout {
        /// Seconds waited.
        secs: u64,
    },
    /// Waiting on the queue fds failed.
    #[error("Waiting for the driver failed")]
    Poll(#[source] std::io::Error),
}

impl RpmsgDevice {
    /// A device with no driver yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The same device offering `VIRTIO_F_ACCESS_PLATFORM`: negotiated,
    /// every ring and buffer address is an IOVA the front end maps with
    /// `IOTLB_MSG`s, checked by the device side at each access. Off by
    /// default: Linux's `virtio_uml` accepts the bit without running an
    /// IOMMU, and its driver would then fail.
    #[must_use]
    pub fn with_access_platform(self, on: bool) -> Self {
        Self {
            access_platform: on,
            ..self
        }
    }

    /// The same device offering buffers of `sizes` under `convention`:
    /// its feature bit in the device features and its config in the
    /// config space ([`Convention::Fixed`]: neither; the sizes are used as
    /// given and the driver must be set alike).
    ///
    /// # Errors
    /// [`BufSizeError::Size`] for sizes iopath does not offer
    /// ([`BufSizes::check_offer`]).
    pub fn with_buf_sizes(
        self,
        convention: Convention,
        sizes: BufSizes,
    ) -> Result<Self, BufSizeError> {
        sizes.check_offer()?;
        Ok(Self {
            buf_sizes: Some((convention, sizes)),
            ..self
        })
    }

    /// The config space: the offered sizes in the convention's layout;
    /// empty without an offer.
    fn config(&self) -> Vec<u8> {
        self.buf_sizes
            .map_or_else(Vec::new, |(c, sizes)| c.config(sizes))
    }

    /// The feature bit of the offer, if it has one.
    fn bufsz_bit(&self) -> Option<u32> {
        self.buf_sizes.and_then(|(c, _)| c.bit())
    }

    /// The sizes that apply once the driver acked `acked`: the offer's
    /// when its bit was acked (or under [`Convention::Fixed`]), 512 bytes
    /// both ways otherwise.
    fn negotiated(&self, acked: u64) -> Negotiated {
        match self.buf_sizes {
            Some((Convention::Fixed, sizes)) => Negotiated { sizes, fixed: true },
            Some((c, sizes)) if c.bit().is_some_and(|b| acked & (1 << b) != 0) => Negotiated {
                sizes,
                fixed: false,
            },
            _ => Negotiated {
                sizes: BufSizes::DEFAULT,
                fixed: false,
            },
        }
    }

    /// Waits until a driver has started both queues and kicked one (at
    /// most `timeout`), and returns the link and notifier a [`crate::Bus`]
    /// runs on. A driver that stops a queue before its kick is passed
    /// over.
    ///
    /// # Errors
    /// [`WaitDriverError`].
    pub fn wait_driver(
        &self,
        timeout: Option<Duration>,
    ) -> Result<(VhostUserLink, VhostUserNotifier), WaitDriverError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let timed_out = || WaitDriverError::Timeout {
            secs: timeout.map_or(0, |t| t.as_secs()),
        };
        loop {
            let ctxs = {
                let mut s = self.slots.lock();
                loop {
                    if let [Slot::Waiting(_), Slot::Waiting(_)] = &*s {
                        let take = |slot: &mut Slot| match std::mem::replace(slot, Slot::Taken) {
                            Slot::Waiting(c) => c,
                            _ => unreachable!("checked to be waiting"),
                        };
                        let (a, b) = s.split_at_mut(1);
                        break [take(&mut a[0]), take(&mut b[0])];
                    }
                    let wait = match deadline {
                        Some(d) => d
                            .checked_duration_since(Instant::now())
                            .ok_or_else(timed_out)?,
                        None => Duration::from_secs(1),
                    };
                    s = iopath_sys::wait_timeout(&self.slots.cond, s, wait).0;
                }
            };
            match first_kick(&ctxs, deadline) {
                Ok(true) => {
                    let notifier = VhostUserNotifier::new(&ctxs).map_err(WaitDriverError::Poll)?;
                    let pending = notifier.pending();
                    let sizes = self.negotiated(ctxs[0].acked_features());
                    return Ok((
                        VhostUserLink::new(ctxs, Arc::clone(&self.slots), pending, sizes),
                        notifier,
                    ));
                }
                Ok(false) => self.slots.give_back(ctxs),
                Err(e) => {
                    self.slots.give_back(ctxs);
                    return Err(match e {
                        WaitDriverError::Timeout { .. } => timed_out(),
                        e => e,
                    });
                }
            }
        }
    }
}

/// The buffer sizes a session uses.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Negotiated {
    /// Each direction's size.
    pub(crate) sizes: BufSizes,
    /// Given, not negotiated ([`Convention::Fixed`]): the driver's
    /// buffers may say otherwise, and a mismatch is reported.
    pub(crate) fixed: bool,
}

/// Waits for a kick on either queue (true) or a stop request (false).
fn first_kick(
    ctxs: &[QueueContext; 2],
    deadline: Option<Instant>,
) -> Result<bool, WaitDriverError> {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    loop {
        let mut fds = [
            PollFd::from_borrowed_fd(ctxs[0].stop_fd(), PollFlags::IN),
            PollFd::from_borrowed_fd(ctxs[1].stop_fd(), PollFlags::IN),
            PollFd::from_borrowed_fd(ctxs[0].kick_fd(), PollFlags::IN),
            PollFd::from_borrowed_fd(ctxs[1].kick_fd(), PollFlags::IN),
        ];
        let left = match deadline {
            Some(d) => d
                .checked_duration_since(Instant::now())
                .ok_or(WaitDriverError::Timeout { secs: 0 })?,
            None => Duration::from_secs(1),
        };
        let ts = Timespec {
            tv_sec: left.as_secs() as i64,
            tv_nsec: i64::from(left.subsec_nanos()),
        };
        match poll(&mut fds, Some(&ts)) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(WaitDriverError::Poll(e.into())),
        }
        let ready: Vec<bool> = fds.iter().map(|f| !f.revents().is_empty()).collect();
        if ready[0] || ready[1] {
            return Ok(false);
        }
        if ready[2] || ready[3] {
            return Ok(true);
        }
    }
}

impl VirtioDevice for RpmsgDevice {
    fn features(&self) -> u64 {
        let mut f = VIRTIO_F_VERSION_1 | VIRTIO_RING_F_EVENT_IDX | (1 << VIRTIO_RPMSG_F_NS);
        if let Some(bit) = self.bufsz_bit() {
            f |= 1 << bit;
        }
        if self.access_platform {
            f | VIRTIO_F_ACCESS_PLATFORM
        } else {
            f
        }
    }

    fn num_queues(&self) -> usize {
        2
    }

    fn max_queue_size(&self) -> u16 {
        MAX_QUEUE_SIZE
    }

    /// Exactly the window asked, zeros past the config (empty without an
    /// offer): `virtio_uml` refuses a reply of any other length.
    fn read_config(&self, offset: u32, len: u32) -> Vec<u8> {
        let config = self.config();
        let start = (offset as usize).min(config.len());
        let mut window = config[start..].to_vec();
        window.resize(len as usize, 0);
        window
    }

    /// Leaves the queue to the session and waits until it is stopped and
    /// not in use.
    fn run_queue(&self, ctx: QueueContext) -> Queue {
        let i = ctx.index();
        let slots = &self.slots;
        let mut s = slots.lock();
        s[i] = Slot::Waiting(ctx);
        slots.cond.notify_all();
        loop {
            match std::mem::take(&mut s[i]) {
                Slot::Waiting(ctx) | Slot::Returned(ctx) if ctx.stop_requested() => {
                    drop(s);
                    slots.cond.notify_all();
                    return ctx.into_queue();
                }
                Slot::Waiting(ctx) => s[i] = Slot::Waiting(ctx),
                Slot::Returned(ctx) => {
                    // Not stopped: the partner was. Wait for the next session.
                    s[i] = Slot::Waiting(ctx);
                    slots.cond.notify_all();
                }
                other => s[i] = other,
            }
            s = iopath_sys::wait_timeout(&slots.cond, s, STOP_POLL).0;
        }
    }
}
