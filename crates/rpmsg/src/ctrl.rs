//! The bus owner's control socket: a `SOCK_SEQPACKET` unix socket through
//! which local clients reach endpoints on the bus.
//!
//! Every request starts with `"IOPR" ver u16 op u16` (little-endian); every
//! answer with the same eight bytes, then `status i32` (0 or a negative
//! errno) and request-specific fields. Version 1 knows these requests:
//!
//! - `ATTACH` (op 1): `name[32] src u32 dst u32 timeout_ms u32`. The owner
//!   waits up to `timeout_ms` for the peer to announce `name` (unless `dst`
//!   is given), creates an announced endpoint bound to it and answers
//!   `src u32 dst u32`. From then on the connection *is* the endpoint: one
//!   packet per message each way (at most 496 bytes), end of file when the
//!   peer destroys the service or the link goes down; closing the
//!   connection destroys the endpoint (name-service DESTROY).
//!
//! - The endpoint service's requests (`CREATE_EPT`, `CREATE_EPT_FD`,
//!   `STATS`; see [`proto`]), any number per connection, in order; the
//!   client side is [`CtrlClient`] and [`EptFd`].
//!
//! Unknown ops are answered with `-EOPNOTSUPP` and the connection closed;
//! so is anything that is not a request at all (one log line each). The
//! owner keeps serving every other client.

mod client;
pub mod proto;

pub use client::{CtrlClient, EptFd};
pub use proto::{EptInfo, ServiceStats};

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustix::net::{
    AddressFamily, RecvFlags, SendFlags, Shutdown, SocketAddrUnix, SocketFlags, SocketType,
};
use thiserror::Error;
use tracing::{debug, info, warn};

use crate::bus::{Bus, EndpointOptions, Event};
use crate::service::{errno_of, EptService};
use crate::wire::{check_name, ADDR_ANY, MAX_PAYLOAD, NAME_SIZE};

/// Request and answer magic.
pub const MAGIC: [u8; 4] = *b"IOPR";
/// Protocol version.
pub const VERSION: u16 = 1;
/// Attach the connection to an endpoint bound to a named channel.
pub const OP_ATTACH: u16 = 1;
/// Size of an ATTACH request.
pub const ATTACH_LEN: usize = 8 + NAME_SIZE + 12;
/// Size of an ATTACH answer.
pub const ATTACH_REPLY_LEN: usize = 8 + 4 + 8;

/// Control-socket failures.
#[derive(Debug, Error)]
pub enum CtrlError {
    /// A socket call failed.
    #[error("{op} failed")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The owner refused the request.
    #[error("Request refused: {}", std::io::Error::from_raw_os_error(*errno))]
    Refused {
        /// The errno.
        errno: i32,
    },
    /// The other side spoke something else.
    #[error("Protocol error: {0}")]
    Protocol(&'static str),
    /// A bad name.
    #[error("Bad name")]
    Name(#[from] crate::wire::WireError),
}

fn sys(op: &'static str) -> impl FnOnce(rustix::io::Errno) -> CtrlError {
    move |e| CtrlError::Io {
        op,
        source: e.into(),
    }
}

fn header(op: u16) -> [u8; 8] {
    let mut h = [0u8; 8];
    h[..4].copy_from_slice(&MAGIC);
    h[4..6].copy_from_slice(&VERSION.to_le_bytes());
    h[6..8].copy_from_slice(&op.to_le_bytes());
    h
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// A parsed ATTACH request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachRequest {
    /// Channel name.
    pub name: String,
    /// Local address wanted (or any).
    pub src: u32,
    /// Peer address (or any: wait for the announcement).
    pub dst: u32,
    /// How long to wait for the announcement.
    pub timeout_ms: u32,
}

impl AttachRequest {
    /// Encodes the request.
    ///
    /// # Errors
    /// [`CtrlError::Name`].
    pub fn encode(&self) -> Result<[u8; ATTACH_LEN], CtrlError> {
        check_name(&self.name)?;
        let mut b = [0u8; ATTACH_LEN];
        b[..8].copy_from_slice(&header(OP_ATTACH));
        b[8..8 + self.name.len()].copy_from_slice(self.name.as_bytes());
        b[40..44].copy_from_slice(&self.src.to_le_bytes());
        b[44..48].copy_from_slice(&self.dst.to_le_bytes());
        b[48..52].copy_from_slice(&self.timeout_ms.to_le_bytes());
        Ok(b)
    }

    /// Parses a request packet; the error is the errno to answer with.
    pub fn parse(b: &[u8]) -> Result<Self, i32> {
        if b.len() < 8 || b[..4] != MAGIC {
            return Err(libc::EPROTO);
        }
        if u16::from_le_bytes([b[4], b[5]]) != VERSION {
            return Err(libc::EPROTONOSUPPORT);
        }
        if u16::from_le_bytes([b[6], b[7]]) != OP_ATTACH {
            return Err(libc::EOPNOTSUPP);
        }
        if b.len() != ATTACH_LEN {
            return Err(libc::EINVAL);
        }
        let raw = &b[8..40];
        let nul = raw.iter().position(|&c| c == 0).ok_or(libc::EINVAL)?;
        let name = std::str::from_utf8(&raw[..nul]).map_err(|_| libc::EINVAL)?;
        if name.is_empty() {
            return Err(libc::EINVAL);
        }
        Ok(AttachRequest {
            name: name.to_owned(),
            src: u32_at(b, 40),
            dst: u32_at(b, 44),
            timeout_ms: u32_at(b, 48),
        })
    }
}

fn reply(status: i32, src: u32, dst: u32) -> [u8; ATTACH_REPLY_LEN] {
    let mut b = [0u8; ATTACH_REPLY_LEN];
    b[..8].copy_from_slice(&header(OP_ATTACH));
    b[8..12].copy_from_slice(&status.to_le_bytes());
    b[12..16].copy_from_slice(&src.to_le_bytes());
    b[16..20].copy_from_slice(&dst.to_le_bytes());
    b
}

fn seqpacket() -> Result<OwnedFd, CtrlError> {
    rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .map_err(sys("socket"))
}

/// How the control socket is set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CtrlOptions {
    /// Mode of the socket (and of the legacy nodes); 0600 by default.
    pub mode: u32,
    /// Where legacy nodes go; `None`: the socket path with `.d` appended.
    pub rundir: Option<PathBuf>,
}

impl Default for CtrlOptions {
    fn default() -> Self {
        CtrlOptions {
            mode: 0o600,
            rundir: None,
        }
    }
}

/// The control socket server of a bus owner, with its endpoint service.
#[derive(Debug)]
pub struct CtrlServer {
    path: PathBuf,
    svc: EptService,
}

impl CtrlServer {
    /// Binds `path` (replacing a stale socket; mode 0600) and serves clients
    /// of `bus` on background threads.
    ///
    /// # Errors
    /// [`CtrlError::Io`] if the socket cannot be bound.
    pub fn start(bus: Bus, path: &Path) -> Result<Self, CtrlError> {
        Self::start_with(bus, path, &CtrlOptions::default())
    }

    /// As [`CtrlServer::start`], with a socket mode and runtime directory.
    ///
    /// # Errors
    /// [`CtrlError::Io`] if the socket or the directory cannot be made.
    pub fn start_with(bus: Bus, path: &Path, opts: &CtrlOptions) -> Result<Self, CtrlError> {
        let rundir = opts.rundir.clone().unwrap_or_else(|| {
            let mut p = path.as_os_str().to_owned();
            p.push(".d");
            PathBuf::from(p)
        });
        let svc = EptService::start(bus.clone(), &rundir, opts.mode)?;
        let fd = seqpacket()?;
        let _ = std::fs::remove_file(path);
        let addr = SocketAddrUnix::new(path).map_err(sys("socket path"))?;
        rustix::net::bind(&fd, &addr).map_err(sys("bind"))?;
        rustix::fs::chmod(path, rustix::fs::Mode::from_raw_mode(opts.mode))
            .map_err(sys("chmod"))?;
        rustix::net::listen(&fd, 64).map_err(sys("listen"))?;
        let svc2 = svc.clone();
        std::thread::Builder::new()
            .name("rpmsg-ctrl".into())
            .spawn(move || {
                let mut conn = 0u64;
                loop {
                    match rustix::net::accept_with(&fd, SocketFlags::CLOEXEC) {
                        Ok(c) => {
                            conn += 1;
                            let peer = who(&c);
                            info!(target: "iopath_rpmsg", "control client {conn} connected: {peer}");
                            // From here on the service's event loop reads
                            // the connection's requests.
                            if let Err(e) = svc2.add_client(conn, c, peer) {
                                warn!(target: "iopath_rpmsg", "control client {conn} dropped: {e}");
                            }
                        }
                        Err(rustix::io::Errno::INTR) => {}
                        Err(e) => {
                            warn!(target: "iopath_rpmsg", "control socket accept failed: {e}");
                            std::thread::sleep(Duration::from_millis(10));
                        }
                    }
                }
            })
            .map_err(|source| CtrlError::Io {
                op: "spawn",
                source,
            })?;
        Ok(CtrlServer {
            path: path.to_owned(),
            svc,
        })
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The runtime directory of legacy nodes.
    pub fn rundir(&self) -> &Path {
        self.svc.rundir()
    }

    /// The endpoint service's counters.
    pub fn stats(&self) -> ServiceStats {
        self.svc.stats()
    }
}

/// One line naming a peer, from its `SO_PEERCRED`.
fn who(c: &OwnedFd) -> String {
    match rustix::net::sockopt::socket_peercred(c) {
        Ok(u) => format!(
            "pid {} uid {} gid {}",
            u.pid.as_raw_nonzero(),
            u.uid.as_raw(),
            u.gid.as_raw()
        ),
        Err(e) => format!("(credentials unknown: {e})"),
    }
}

/// What became of a control connection after one of its packets.
pub(crate) enum Next {
    /// Served; read on.
    Keep,
    /// Not a request at all (answered with the errno): close it.
    Garbage(i32),
    /// ATTACH: the connection now belongs to its endpoint's own thread.
    Attached,
}

/// Serves one packet of control connection `conn` (socket `c`, peer
/// `peer`); called by the service's event loop.
pub(crate) fn on_packet(
    svc: &EptService,
    conn: u64,
    c: &Arc<OwnedFd>,
    peer: &str,
    packet: &[u8],
) -> Next {
    if proto::parse_header(packet) == Ok(OP_ATTACH) {
        // ATTACH waits for an announcement and then carries the endpoint's
        // traffic for as long as the connection lives: its own thread.
        let (bus, c, packet, peer) = (
            svc.bus().clone(),
            Arc::clone(c),
            packet.to_vec(),
            peer.to_owned(),
        );
        let answer_to = Arc::clone(&c);
        let spawned = std::thread::Builder::new()
            .name("rpmsg-attach".into())
            .spawn(move || attach(bus, c, &packet, &peer));
        if let Err(e) = spawned {
            warn!(target: "iopath_rpmsg", "control client {conn}: no thread for ATTACH: {e}");
            let _ = rustix::net::send(
                &*answer_to,
                &reply(-libc::EAGAIN, 0, 0),
                SendFlags::NOSIGNAL | SendFlags::DONTWAIT,
            );
        }
        return Next::Attached;
    }
    match proto::Request::parse(packet) {
        Ok(req) => {
            svc.handle(conn, c, req);
            Next::Keep
        }
        Err(r) => {
            let op = proto::parse_header(packet).unwrap_or(0);
            answer(c, &proto::reply_head(op, -r.errno, 12));
            if r.garbage {
                Next::Garbage(r.errno)
            } else {
                Next::Keep
            }
        }
    }
}

/// Sends an answer without ever waiting, so a client cannot stall the
/// event loop every client shares. One that does not read its answers
/// (its queue full) is disconnected rather than silently skipped, which
/// would leave it waiting for an answer that never comes: it reads the
/// answers queued so far, then end of file, and the loop frees what it held.
pub(crate) fn answer(c: &OwnedFd, bytes: &[u8]) {
    if let Err(e) = rustix::net::send(c, bytes, SendFlags::NOSIGNAL | SendFlags::DONTWAIT) {
        not_answered(c, e);
    }
}

/// An answer could not be sent on `c`: hang the connection up.
pub(crate) fn not_answered(c: &OwnedFd, e: rustix::io::Errno) {
    if e == rustix::io::Errno::AGAIN {
        warn!(target: "iopath_rpmsg", "control client does not read its answers: disconnected");
    } else {
        debug!(target: "iopath_rpmsg", "control answer not sent: {e}");
    }
    let _ = rustix::net::shutdown(c, Shutdown::Both);
}

/// One log line for a control connection that went away.
pub(crate) fn log_gone(conn: u64, peer: &str, garbage: Option<(usize, i32)>, freed: usize) {
    match garbage {
        Some((n, errno)) => warn!(
            target: "iopath_rpmsg",
            "control client {conn} ({peer}): malformed request ({n} bytes, {}); connection closed, {freed} legacy endpoints freed",
            std::io::Error::from_raw_os_error(errno)
        ),
        None => info!(
            target: "iopath_rpmsg",
            "control client {conn} ({peer}) gone; {freed} legacy endpoints freed"
        ),
    }
}

/// ATTACH: the connection becomes the endpoint.
fn attach(bus: Bus, c: Arc<OwnedFd>, packet: &[u8], cred: &str) {
    let n = packet.len();
    let mut buf = vec![0u8; 4096];
    let req = match AttachRequest::parse(packet) {
        Ok(r) => r,
        Err(errno) => {
            warn!(target: "iopath_rpmsg", "control client ({cred}): refused request ({} bytes), errno {errno}", n);
            let _ = rustix::net::send(&c, &reply(-errno, 0, 0), SendFlags::NOSIGNAL);
            return;
        }
    };
    let dst = if req.dst != ADDR_ANY {
        Ok(req.dst)
    } else {
        bus.wait_channel(&req.name, Duration::from_millis(u64::from(req.timeout_ms)))
            .map(|ch| ch.addr)
    };
    let ep = dst.and_then(|dst| {
        let w = Arc::clone(&c);
        bus.create_with_callback(
            EndpointOptions::new(&req.name).src(req.src).dst(dst),
            move |_, ev| match ev {
                Event::Message(m) => {
                    if let Err(e) = rustix::net::send(
                        &*w,
                        &m.data,
                        SendFlags::NOSIGNAL | SendFlags::DONTWAIT,
                    ) {
                        warn!(target: "iopath_rpmsg", "control client: message from {} dropped: {e}", m.src);
                    }
                }
                Event::Unbound { .. } | Event::LinkDown(_) => {
                    let _ = rustix::net::shutdown(&*w, Shutdown::Both);
                }
            },
        )
    });
    let ep = match ep {
        Ok(ep) => ep,
        Err(e) => {
            warn!(target: "iopath_rpmsg", "control client ({cred}): attach to {:?} failed: {e}", req.name);
            let _ = rustix::net::send(&*c, &reply(-errno_of(&e), 0, 0), SendFlags::NOSIGNAL);
            return;
        }
    };
    info!(target: "iopath_rpmsg", "control client ({cred}): endpoint {} -> {} ({:?})", ep.addr(), ep.dst(), req.name);
    if rustix::net::send(&*c, &reply(0, ep.addr(), ep.dst()), SendFlags::NOSIGNAL).is_err() {
        return;
    }
    loop {
        let (n, full) = match rustix::net::recv(&*c, &mut buf[..], RecvFlags::TRUNC) {
            Ok(x) => x,
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => break,
        };
        if full == 0 {
            break; // the client closed: dropping `ep` destroys the endpoint
        }
        if full > MAX_PAYLOAD {
            warn!(target: "iopath_rpmsg", "control client: {full}-byte message refused (max {MAX_PAYLOAD})");
            break;
        }
        if let Err(e) = ep.send(&buf[..n]) {
            warn!(target: "iopath_rpmsg", "control client: send failed: {e}");
            let _ = rustix::net::shutdown(&*c, Shutdown::Both);
            break;
        }
    }
}

/// A client's endpoint on the owner's bus, reached through the control
/// socket: one packet per message.
#[derive(Debug)]
pub struct CtrlEndpoint {
    fd: OwnedFd,
    src: u32,
    dst: u32,
}

impl CtrlEndpoint {
    /// Connects to the owner at `path` and attaches to channel `name`
    /// (waiting up to `timeout` for the peer to announce it).
    ///
    /// # Errors
    /// [`CtrlError::Io`], [`CtrlError::Refused`] with the owner's errno,
    /// [`CtrlError::Protocol`].
    pub fn attach(path: &Path, name: &str, timeout: Duration) -> Result<Self, CtrlError> {
        let fd = seqpacket()?;
        let addr = SocketAddrUnix::new(path).map_err(sys("socket path"))?;
        rustix::net::connect(&fd, &addr).map_err(sys("connect"))?;
        let req = AttachRequest {
            name: name.to_owned(),
            src: ADDR_ANY,
            dst: ADDR_ANY,
            timeout_ms: timeout.as_millis().min(u128::from(u32::MAX)) as u32,
        };
        rustix::net::send(&fd, &req.encode()?, SendFlags::NOSIGNAL).map_err(sys("send"))?;
        let mut b = [0u8; 64];
        let (n, _) = rustix::net::recv(&fd, &mut b[..], RecvFlags::empty()).map_err(sys("recv"))?;
        if n != ATTACH_REPLY_LEN || b[..8] != header(OP_ATTACH) {
            return Err(CtrlError::Protocol("unexpected answer to ATTACH"));
        }
        let status = i32::from_le_bytes([b[8], b[9], b[10], b[11]]);
        if status != 0 {
            return Err(CtrlError::Refused { errno: -status });
        }
        Ok(CtrlEndpoint {
            fd,
            src: u32_at(&b, 12),
            dst: u32_at(&b, 16),
        })
    }

    /// Our address on the bus.
    pub fn src(&self) -> u32 {
        self.src
    }

    /// The peer's address.
    pub fn dst(&self) -> u32 {
        self.dst
    }

    /// The connection (a `SOCK_SEQPACKET` fd).
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Sends one message.
    ///
    /// # Errors
    /// [`CtrlError::Io`] (`EPIPE` once the endpoint is gone).
    pub fn send(&self, data: &[u8]) -> Result<(), CtrlError> {
        rustix::net::send(&self.fd, data, SendFlags::NOSIGNAL).map_err(sys("send"))?;
        Ok(())
    }

    /// Receives one message into `buf`, waiting up to `timeout`; `Ok(None)`
    /// on timeout, `Ok(Some(0))` at end of file (the service is gone).
    ///
    /// # Errors
    /// [`CtrlError::Io`].
    pub fn recv(&self, buf: &mut [u8], timeout: Duration) -> Result<Option<usize>, CtrlError> {
        use rustix::event::{poll, PollFd, PollFlags, Timespec};
        let mut p = [PollFd::new(&self.fd, PollFlags::IN)];
        let ts = Timespec {
            tv_sec: timeout.as_secs() as i64,
            tv_nsec: i64::from(timeout.subsec_nanos()),
        };
        loop {
            match poll(&mut p, Some(&ts)) {
                Ok(0) => return Ok(None),
                Ok(_) => break,
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(sys("poll")(e)),
            }
        }
        let (n, _) = rustix::net::recv(&self.fd, buf, RecvFlags::empty()).map_err(sys("recv"))?;
        Ok(Some(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attach_request_round_trip_and_refusals() {
        let r = AttachRequest {
            name: "echo".into(),
            src: ADDR_ANY,
            dst: 1024,
            timeout_ms: 500,
        };
        let b = r.encode().unwrap();
        assert_eq!(AttachRequest::parse(&b), Ok(r));
        assert_eq!(AttachRequest::parse(b"junk"), Err(libc::EPROTO));
        let mut v = b;
        v[6] = 9;
        assert_eq!(AttachRequest::parse(&v), Err(libc::EOPNOTSUPP));
        let mut v = b;
        v[4] = 2;
        assert_eq!(AttachRequest::parse(&v), Err(libc::EPROTONOSUPPORT));
        let mut v = b;
        v[8..40].fill(b'x');
        assert_eq!(AttachRequest::parse(&v), Err(libc::EINVAL));
        assert_eq!(AttachRequest::parse(&b[..20]), Err(libc::EINVAL));
    }
}
