//! The control channel of the front end: the `vhost` crate's `Frontend`
//! and a second handle on the same socket for what it cannot send
//! (`IOTLB_MSG`), and the socket I/O helpers.

use std::io::{IoSlice, IoSliceMut};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use iopath_dma::{IotlbRecord, IotlbSink};
use iopath_sys::{lock, wait, wait_timeout};
use vhost::vhost_user::Frontend;

use super::{Result, VhostUserError};
use crate::device::IotlbMsg;
use crate::vhost_wire::{self, Header, FRONTEND_IOTLB_MSG};

/// How long a reply is awaited before the front end says, once per
/// connection, that it is still waiting (the back end may be serving
/// another front end: vhost-user back ends serve one at a time).
const NOTICE_AFTER: Duration = Duration::from_secs(1);

/// The control channel: the rust-vmm front end and a second handle on the
/// same socket for the requests it cannot send (`IOTLB_MSG`). Both are used
/// only with the mutex held, so replies never interleave; every request
/// that waits for the back end runs under the [`Watchdog`].
pub(super) struct Control {
    pub(super) fe: Frontend,
    pub(super) raw: UnixStream,
    pub(super) reply_ack: bool,
    /// `ACCESS_PLATFORM` was acknowledged.
    pub(super) iotlb: bool,
    pub(super) watchdog: Watchdog,
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Control")
            .field("socket", &self.raw)
            .field("reply_ack", &self.reply_ack)
            .field("iotlb", &self.iotlb)
            .field("watchdog", &self.watchdog)
            .finish()
    }
}

/// Bounds every wait for the back end: a request that gets no answer within
/// the reply timeout shuts the socket down (which ends the wait inside the
/// `vhost` crate, whose reads retry forever on a socket timeout) and fails
/// with [`VhostUserError::Timeout`] naming it. The connection is then
/// unusable: a late reply could not be told from the next one's.
#[derive(Debug)]
pub(super) struct Watchdog {
    shared: Arc<WatchShared>,
    thread: Option<JoinHandle<()>>,
}

#[derive(Debug)]
struct WatchShared {
    state: Mutex<WatchState>,
    wake: Condvar,
    /// A handle on the main socket, shut down when a reply times out.
    sock: UnixStream,
    path: PathBuf,
    timeout: Duration,
}

#[derive(Debug, Default)]
struct WatchState {
    /// The request being waited for, and since when.
    armed: Option<(&'static str, Instant)>,
    /// The request that timed out, until its caller takes it.
    fired: Option<&'static str>,
    /// The "still waiting" notice was given on this connection.
    noticed: bool,
    /// The watchdog waits with no deadline: arming must wake it. (While
    /// it waits with one, it rereads the state when that passes, so the
    /// data path's `IOTLB_MSG`s do not wake it each time.)
    idle: bool,
    quit: bool,
}

impl Watchdog {
    /// Watches the socket `sock` (a handle on the connection to `path`).
    pub(super) fn spawn(sock: UnixStream, path: &Path, timeout: Duration) -> Result<Self> {
        let shared = Arc::new(WatchShared {
            state: Mutex::new(WatchState::default()),
            wake: Condvar::new(),
            sock,
            path: path.to_path_buf(),
            timeout,
        });
        let s = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("vhost-user-watchdog".into())
            .spawn(move || watch(&s))
            .map_err(|source| VhostUserError::Io {
                op: "spawn of the reply watchdog",
                source,
            })?;
        Ok(Self {
            shared,
            thread: Some(thread),
        })
    }

    /// Runs `f`, which waits for the back end's answer to `request`, under
    /// the reply timeout.
    pub(super) fn watched<T>(
        &self,
        request: &'static str,
        f: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        let idle = {
            let mut st = lock(&self.shared.state);
            st.armed = Some((request, Instant::now()));
            st.fired = None;
            st.idle
        };
        if idle {
            self.shared.wake.notify_all();
        }
        let res = f();
        let fired = {
            let mut st = lock(&self.shared.state);
            st.armed = None;
            st.fired.take()
        };
        match (res, fired) {
            (Err(_), Some(request)) => Err(VhostUserError::Timeout {
                request,
                path: self.shared.path.clone(),
                after: self.shared.timeout,
            }),
            (res, _) => res,
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        lock(&self.shared.state).quit = true;
        self.shared.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn watch(w: &WatchShared) {
    let mut st = lock(&w.state);
    loop {
        if st.quit {
            return;
        }
        let Some((request, since)) = st.armed else {
            st.idle = true;
            st = wait(&w.wake, st);
            st.idle = false;
            continue;
        };
        let waited = since.elapsed();
        if waited >= w.timeout {
            st.armed = None;
            st.fired = Some(request);
            tracing::debug!(
                "vhost-user back end at {} did not answer {request} within {:?}: giving up",
                w.path.display(),
                w.timeout
            );
            let _ = rustix::net::shutdown(&w.sock, rustix::net::Shutdown::Both);
            continue;
        }
        let notice = !st.noticed && w.timeout > NOTICE_AFTER;
        if notice && waited >= NOTICE_AFTER {
            st.noticed = true;
            tracing::warn!(
                "waiting for the vhost-user back end at {} to answer {request} (it may be \
                 serving another front end; giving up after {:?})",
                w.path.display(),
                w.timeout
            );
            continue;
        }
        let next = if notice { NOTICE_AFTER } else { w.timeout };
        let (g, _) = wait_timeout(&w.wake, st, next.saturating_sub(waited));
        st = g;
    }
}

impl Control {
    /// Sends `request` through the `vhost` crate's front end (`f`) and
    /// waits for its answer, at most the reply timeout.
    pub(super) fn call<T, E: Into<vhost::Error>>(
        &mut self,
        request: &'static str,
        f: impl FnOnce(&mut Frontend) -> std::result::Result<T, E>,
    ) -> Result<T> {
        let fe = &mut self.fe;
        self.watchdog.watched(request, || {
            f(fe).map_err(|e| VhostUserError::Request {
                request,
                source: e.into(),
            })
        })
    }

    // Hand-written: the vhost crate's Frontend has no IOTLB_MSG request.
    pub(super) fn send_iotlb(&self, iotlb: &IotlbMsg) -> Result<()> {
        self.watchdog
            .watched("IOTLB_MSG", || self.send_iotlb_unwatched(iotlb))
    }

    fn send_iotlb_unwatched(&self, iotlb: &IotlbMsg) -> Result<()> {
        if !self.iotlb {
            return Err(VhostUserError::Unsupported {
                what: "IOTLB messages without ACCESS_PLATFORM",
            });
        }
        let payload = iotlb.to_wire();
        let header = Header::request(FRONTEND_IOTLB_MSG, payload.len(), self.reply_ack);
        write_all(
            &self.raw,
            &vhost_wire::message(header, &payload),
            "IOTLB_MSG send",
        )?;
        if self.reply_ack {
            let mut reply = [0u8; vhost_wire::U64_REPLY_SIZE];
            read_exact(&self.raw, &mut reply, "IOTLB_MSG reply")?;
            let status = vhost_wire::parse_u64_reply(FRONTEND_IOTLB_MSG, &reply).map_err(|_| {
                VhostUserError::BadReply {
                    request: "IOTLB_MSG",
                    why: "not a reply to IOTLB_MSG",
                }
            })?;
            if status != 0 {
                return Err(VhostUserError::BadReply {
                    request: "IOTLB_MSG",
                    why: "back end refused the entry",
                });
            }
        }
        Ok(())
    }
}

/// Forwards the IOMMU ops' IOTLB records to the back end as `IOTLB_MSG`.
/// With REPLY_ACK, `send` returns only once the back end acknowledged the
/// record, so an invalidated range is out of the device's reach by then.
#[derive(Debug, Clone)]
pub struct VhostUserIotlb {
    pub(super) ctl: Arc<Mutex<Control>>,
}

impl IotlbSink for VhostUserIotlb {
    fn send(&self, record: IotlbRecord) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let ctl = lock(&self.ctl);
        let msg = match record {
            IotlbRecord::Update {
                iova,
                size,
                uaddr,
                perm,
            } => IotlbMsg::Update {
                iova,
                size,
                uaddr,
                perm,
            },
            IotlbRecord::Invalidate { iova, size } => IotlbMsg::Invalidate { iova, size },
        };
        ctl.send_iotlb(&msg)?;
        Ok(())
    }
}

pub(super) fn write_all(sock: &UnixStream, mut buf: &[u8], op: &'static str) -> Result<()> {
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

pub(super) fn read_exact(sock: &UnixStream, buf: &mut [u8], op: &'static str) -> Result<()> {
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
