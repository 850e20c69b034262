//! Requests of the endpoint service on the control socket, laid out as the
//! Linux uAPI structs they mirror (`include/uapi/linux/rpmsg.h`), after the
//! common eight-byte header `"IOPR" ver u16 op u16`:
//!
//! | op | request | answer (after header and `status i32`) |
//! |---|---|---|
//! | `CREATE_EPT` 2 | `rpmsg_endpoint_info {name[32], src, dst}` | the info (src filled in), node path `[108]` |
//! | `CREATE_EPT_FD` 3 | `rpmsg_endpoint_fd_info {name[32], src, dst, flags, fd}` | the info; the fd rides along as `SCM_RIGHTS` |
//! | `STATS` 4 | nothing | [`ServiceStats`] |
//!
//! A legacy node greets each connection with header `OPEN` 5 and a status
//! (0, or `-EBUSY` while another connection has it open).

use std::mem::{offset_of, size_of};

use vm_memory::ByteValued;

use super::uapi::{
    RpmsgEndpointFdInfo, RpmsgEndpointInfo, EPT_FD_FLAGS, EPT_FD_INFO_LEN, EPT_INFO_LEN,
};
use super::CtrlError;
use crate::wire::{check_name, ADDR_ANY, NAME_SIZE};

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

pub(crate) fn header(op: u16) -> [u8; 8] {
    let mut h = [0u8; 8];
    h[..4].copy_from_slice(&MAGIC);
    h[4..6].copy_from_slice(&VERSION.to_le_bytes());
    h[6..8].copy_from_slice(&op.to_le_bytes());
    h
}

pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Create an endpoint with a node to open (`RPMSG_CREATE_EPT_IOCTL`).
pub const OP_CREATE_EPT: u16 = 2;
/// Create an endpoint returned as an fd (`RPMSG_CREATE_EPT_FD_IOCTL`).
pub const OP_CREATE_EPT_FD: u16 = 3;
/// Ask for the service's counters.
pub const OP_STATS: u16 = 4;
/// A legacy node's greeting to a connection that opened it.
pub const OP_OPEN: u16 = 5;

/// Room for a node path in a CREATE_EPT answer (`sizeof(sun_path)`).
pub const PATH_LEN: usize = 108;
/// Size of a CREATE_EPT answer.
pub const CREATE_EPT_REPLY_LEN: usize = 12 + EPT_INFO_LEN + PATH_LEN;
/// Size of a CREATE_EPT_FD answer.
pub const CREATE_EPT_FD_REPLY_LEN: usize = 12 + EPT_FD_INFO_LEN;
/// Size of a STATS answer.
pub const STATS_REPLY_LEN: usize = 12 + 4 * 4 + 6 * 8;
/// Size of a node greeting.
pub const OPEN_REPLY_LEN: usize = 12;

/// `O_RDONLY`, for CREATE_EPT_FD flags.
pub const O_RDONLY: u32 = libc::O_RDONLY as u32;
/// `O_WRONLY`.
pub const O_WRONLY: u32 = libc::O_WRONLY as u32;
/// `O_RDWR`.
pub const O_RDWR: u32 = libc::O_RDWR as u32;
/// `O_NONBLOCK`.
pub const O_NONBLOCK: u32 = libc::O_NONBLOCK as u32;
/// `O_CLOEXEC`.
pub const O_CLOEXEC: u32 = libc::O_CLOEXEC as u32;

/// `struct rpmsg_endpoint_info`, with `flags` of the fd variant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EptInfo {
    /// Endpoint name (at most 31 bytes).
    pub name: String,
    /// Local address, or [`ADDR_ANY`] for the next free one from 1024.
    pub src: u32,
    /// Peer address, or [`ADDR_ANY`] to bind to the channel of the same
    /// name (or to the first sender).
    pub dst: u32,
}

impl EptInfo {
    /// An endpoint named `name` at any address, bound by name.
    pub fn new(name: &str) -> Self {
        EptInfo {
            name: name.to_owned(),
            src: ADDR_ANY,
            dst: ADDR_ANY,
        }
    }

    /// The uAPI struct of this info as the wire carries it (numbers
    /// little-endian); `None` if the name has more than 32 bytes (32 bytes
    /// go out unterminated, for the service to refuse).
    fn to_wire(&self) -> Option<RpmsgEndpointInfo> {
        let n = self.name.as_bytes();
        let mut w = RpmsgEndpointInfo {
            src: self.src.to_le(),
            dst: self.dst.to_le(),
            ..Default::default()
        };
        w.name.get_mut(..n.len())?.copy_from_slice(n);
        Some(w)
    }

    /// Writes `{name[32], src, dst}`; `None` if the name has more than 32
    /// bytes.
    fn put(&self, b: &mut [u8]) -> Option<()> {
        b[..EPT_INFO_LEN].copy_from_slice(self.to_wire()?.as_slice());
        Some(())
    }

    /// The info in a wire struct; the error is an errno.
    fn from_wire(w: &RpmsgEndpointInfo) -> Result<Self, i32> {
        let nul = w.name.iter().position(|&c| c == 0).ok_or(libc::EINVAL)?;
        let name = std::str::from_utf8(&w.name[..nul]).map_err(|_| libc::EINVAL)?;
        Ok(EptInfo {
            name: name.to_owned(),
            src: u32::from_le(w.src),
            dst: u32::from_le(w.dst),
        })
    }

    /// Reads `{name[32], src, dst}`; the error is an errno.
    fn get(b: &[u8]) -> Result<Self, i32> {
        Self::from_wire(&read_struct(b).ok_or(libc::EINVAL)?)
    }
}

/// The `T` at the start of `b`, at any alignment; `None` if `b` is
/// shorter than a `T`.
fn read_struct<T: ByteValued + Default>(b: &[u8]) -> Option<T> {
    let mut v = T::default();
    v.as_mut_slice().copy_from_slice(b.get(..size_of::<T>())?);
    Some(v)
}

/// A parsed service request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Legacy creation.
    CreateEpt(EptInfo),
    /// fd creation with open flags.
    CreateEptFd(EptInfo, u32),
    /// Counters.
    Stats,
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    /// The errno answered.
    pub errno: i32,
    /// Not a request at all: the service closes the connection.
    pub garbage: bool,
}

/// Checks the magic and version and returns the op; the error is an errno.
pub fn parse_header(b: &[u8]) -> Result<u16, i32> {
    if b.len() < 8 || b[..4] != MAGIC {
        return Err(libc::EPROTO);
    }
    if u16::from_le_bytes([b[4], b[5]]) != VERSION {
        return Err(libc::EPROTONOSUPPORT);
    }
    Ok(u16::from_le_bytes([b[6], b[7]]))
}

/// The longest request [`RequestRef::encode_into`] writes.
pub(crate) const MAX_REQUEST_LEN: usize = 8 + EPT_FD_INFO_LEN;

/// A [`Request`] that borrows its info, so a client encodes it without
/// cloning the name.
#[derive(Debug, Clone, Copy)]
pub(crate) enum RequestRef<'a> {
    CreateEpt(&'a EptInfo),
    CreateEptFd(&'a EptInfo, u32),
    Stats,
}

impl RequestRef<'_> {
    /// Writes the request into `b` (no allocation); returns its length,
    /// `None` if the name has more than 32 bytes.
    pub(crate) fn encode_into(self, b: &mut [u8; MAX_REQUEST_LEN]) -> Option<usize> {
        match self {
            RequestRef::Stats => {
                b[..8].copy_from_slice(&header(OP_STATS));
                Some(8)
            }
            RequestRef::CreateEpt(info) => {
                b[..8].copy_from_slice(&header(OP_CREATE_EPT));
                info.put(&mut b[8..])?;
                Some(8 + EPT_INFO_LEN)
            }
            RequestRef::CreateEptFd(info, flags) => {
                b[..8].copy_from_slice(&header(OP_CREATE_EPT_FD));
                let w = RpmsgEndpointFdInfo::new(info.to_wire()?, flags.to_le(), (-1i32).to_le());
                b[8..].copy_from_slice(w.as_slice());
                Some(MAX_REQUEST_LEN)
            }
        }
    }
}

impl Request {
    /// The same request, borrowing its info.
    pub(crate) fn as_ref(&self) -> RequestRef<'_> {
        match self {
            Request::CreateEpt(info) => RequestRef::CreateEpt(info),
            Request::CreateEptFd(info, flags) => RequestRef::CreateEptFd(info, *flags),
            Request::Stats => RequestRef::Stats,
        }
    }

    /// Encodes the request; `None` if the name has more than 32 bytes.
    pub fn encode(&self) -> Option<Vec<u8>> {
        let mut b = [0u8; MAX_REQUEST_LEN];
        let n = self.as_ref().encode_into(&mut b)?;
        Some(b[..n].to_vec())
    }

    /// Parses a request packet.
    ///
    /// # Errors
    /// A [`Refusal`]: the errno to answer with, and whether the packet is
    /// garbage (bad magic, version, op or length: the connection is closed)
    /// rather than a well-formed request with a bad argument.
    pub fn parse(b: &[u8]) -> Result<Self, Refusal> {
        let garbage = |errno| Refusal {
            errno,
            garbage: true,
        };
        let invalid = |errno| Refusal {
            errno,
            garbage: false,
        };
        let op = parse_header(b).map_err(garbage)?;
        let body = &b[8..];
        match op {
            OP_CREATE_EPT if body.len() == EPT_INFO_LEN => {
                Ok(Request::CreateEpt(EptInfo::get(body).map_err(invalid)?))
            }
            OP_CREATE_EPT_FD if body.len() == EPT_FD_INFO_LEN => {
                let w: RpmsgEndpointFdInfo =
                    read_struct(body).ok_or_else(|| invalid(libc::EINVAL))?;
                let info = EptInfo::from_wire(&w.info()).map_err(invalid)?;
                let flags = u32::from_le(w.flags);
                if flags & !EPT_FD_FLAGS != 0 {
                    return Err(invalid(libc::EINVAL));
                }
                Ok(Request::CreateEptFd(info, flags))
            }
            OP_STATS if body.is_empty() => Ok(Request::Stats),
            OP_CREATE_EPT | OP_CREATE_EPT_FD | OP_STATS => Err(garbage(libc::EINVAL)),
            _ => Err(garbage(libc::EOPNOTSUPP)),
        }
    }
}

/// The common answer prefix: header and status.
pub fn reply_head(op: u16, status: i32, len: usize) -> Vec<u8> {
    let mut b = Vec::with_capacity(len);
    b.extend_from_slice(&header(op));
    b.extend_from_slice(&status.to_le_bytes());
    b.resize(len, 0);
    b
}

/// A CREATE_EPT answer.
pub fn create_ept_reply(status: i32, info: &EptInfo, path: &[u8]) -> Vec<u8> {
    let mut b = reply_head(OP_CREATE_EPT, status, CREATE_EPT_REPLY_LEN);
    if status == 0 {
        let _ = info.put(&mut b[12..]);
        let n = path.len().min(PATH_LEN - 1);
        b[12 + EPT_INFO_LEN..12 + EPT_INFO_LEN + n].copy_from_slice(&path[..n]);
    }
    b
}

/// A CREATE_EPT_FD answer (on the stack: one is sent per endpoint made).
pub fn create_ept_fd_reply(
    status: i32,
    info: &EptInfo,
    flags: u32,
) -> [u8; CREATE_EPT_FD_REPLY_LEN] {
    let mut b = [0u8; CREATE_EPT_FD_REPLY_LEN];
    b[..8].copy_from_slice(&header(OP_CREATE_EPT_FD));
    b[8..12].copy_from_slice(&status.to_le_bytes());
    if status == 0 {
        // (A name too long for the struct goes out as zeros.)
        let info = info.to_wire().unwrap_or_default();
        let w = RpmsgEndpointFdInfo::new(info, flags.to_le(), (-1i32).to_le());
        b[12..].copy_from_slice(w.as_slice());
    }
    b
}

/// Sets the addresses of a successful CREATE_EPT_FD answer (written
/// before the endpoint existed, while its name was still at hand).
pub(crate) fn set_ept_fd_reply_addrs(b: &mut [u8; CREATE_EPT_FD_REPLY_LEN], src: u32, dst: u32) {
    let src_at = 12 + offset_of!(RpmsgEndpointFdInfo, src);
    let dst_at = 12 + offset_of!(RpmsgEndpointFdInfo, dst);
    b[src_at..src_at + 4].copy_from_slice(&src.to_le_bytes());
    b[dst_at..dst_at + 4].copy_from_slice(&dst.to_le_bytes());
}

/// Checks an answer's header and op, returns its status and body.
///
/// # Errors
/// A description of what is wrong.
pub fn parse_reply(b: &[u8], op: u16, len: usize) -> Result<(i32, &[u8]), &'static str> {
    if b.len() < 12 || parse_header(b) != Ok(op) {
        return Err("unexpected answer from the endpoint service");
    }
    let status = i32::from_le_bytes([b[8], b[9], b[10], b[11]]);
    // A refusal may come as the bare header and status.
    if b.len() != len && !(status < 0 && b.len() == 12) {
        return Err("answer of the wrong length from the endpoint service");
    }
    Ok((status, &b[12..]))
}

/// Parses the body of a successful CREATE_EPT answer.
///
/// # Errors
/// A description of what is wrong.
pub fn parse_create_ept_body(body: &[u8]) -> Result<(EptInfo, String), &'static str> {
    let info = EptInfo::get(body).map_err(|_| "bad endpoint info in answer")?;
    let p = &body[EPT_INFO_LEN..];
    let n = p
        .iter()
        .position(|&c| c == 0)
        .ok_or("node path not terminated")?;
    let path = std::str::from_utf8(&p[..n]).map_err(|_| "node path not UTF-8")?;
    Ok((info, path.to_owned()))
}

/// Parses the body of a successful CREATE_EPT_FD answer.
///
/// # Errors
/// A description of what is wrong.
pub fn parse_create_ept_fd_body(body: &[u8]) -> Result<EptInfo, &'static str> {
    EptInfo::get(body).map_err(|_| "bad endpoint info in answer")
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

/// An ATTACH answer: `status` (0 or a negative errno) and the endpoint's
/// addresses.
pub fn attach_reply(status: i32, src: u32, dst: u32) -> [u8; ATTACH_REPLY_LEN] {
    let mut b = [0u8; ATTACH_REPLY_LEN];
    b[..8].copy_from_slice(&header(OP_ATTACH));
    b[8..12].copy_from_slice(&status.to_le_bytes());
    b[12..16].copy_from_slice(&src.to_le_bytes());
    b[16..20].copy_from_slice(&dst.to_le_bytes());
    b
}

/// What the endpoint service holds and has done (the STATS answer).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServiceStats {
    /// Live endpoints handed out as fds.
    pub fd_endpoints: u32,
    /// Live legacy endpoints (each with a node).
    pub legacy_endpoints: u32,
    /// Legacy nodes open right now.
    pub open_nodes: u32,
    /// Control connections right now.
    pub clients: u32,
    /// Endpoints created since start.
    pub created: u64,
    /// Endpoints destroyed since start.
    pub destroyed: u64,
    /// Control connections closed for a malformed request.
    pub bad_clients: u64,
    /// Messages written to an endpoint with more than 496 bytes (each
    /// ended its endpoint).
    pub oversize: u64,
    /// Messages from the remote dropped because the endpoint's socket was
    /// full, or sent to an endpoint with no peer address.
    pub dropped: u64,
    /// Messages carried between endpoint sockets and the bus.
    pub msgs: u64,
}

impl ServiceStats {
    /// Live endpoints of both kinds.
    pub fn endpoints(&self) -> u32 {
        self.fd_endpoints + self.legacy_endpoints
    }

    /// The STATS answer.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = reply_head(OP_STATS, 0, 12);
        for v in [
            self.fd_endpoints,
            self.legacy_endpoints,
            self.open_nodes,
            self.clients,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        for v in [
            self.created,
            self.destroyed,
            self.bad_clients,
            self.oversize,
            self.dropped,
            self.msgs,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b
    }

    /// Parses the body of a STATS answer (after the status); `None` if it
    /// is too short.
    pub fn parse(body: &[u8]) -> Option<Self> {
        if body.len() < STATS_REPLY_LEN - 12 {
            return None;
        }
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&body[16 + 8 * i..24 + 8 * i]);
            u64::from_le_bytes(a)
        };
        Some(ServiceStats {
            fd_endpoints: u32_at(body, 0),
            legacy_endpoints: u32_at(body, 4),
            open_nodes: u32_at(body, 8),
            clients: u32_at(body, 12),
            created: u64_at(0),
            destroyed: u64_at(1),
            bad_clients: u64_at(2),
            oversize: u64_at(3),
            dropped: u64_at(4),
            msgs: u64_at(5),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_whose_addresses_come_later_parses_as_one_made_whole() {
        let asked = EptInfo::new("bench");
        let flags = (libc::O_RDWR | libc::O_CLOEXEC) as u32;
        let mut b = create_ept_fd_reply(0, &asked, flags);
        set_ept_fd_reply_addrs(&mut b, 1031, 0x400);
        let made = EptInfo {
            src: 1031,
            dst: 0x400,
            ..asked
        };
        assert_eq!(b, create_ept_fd_reply(0, &made, flags));
        let (st, body) = parse_reply(&b, OP_CREATE_EPT_FD, CREATE_EPT_FD_REPLY_LEN).unwrap();
        assert_eq!(st, 0);
        assert_eq!(parse_create_ept_fd_body(body), Ok(made));
    }

    #[test]
    fn requests_round_trip() {
        let info = EptInfo {
            name: "echo".into(),
            src: 1030,
            dst: ADDR_ANY,
        };
        for r in [
            Request::CreateEpt(info.clone()),
            Request::CreateEptFd(info.clone(), (libc::O_RDWR | libc::O_CLOEXEC) as u32),
            Request::Stats,
        ] {
            let b = r.encode().unwrap();
            assert_eq!(Request::parse(&b), Ok(r));
        }
        assert_eq!(
            Request::CreateEpt(info.clone()).encode().unwrap().len(),
            8 + 40
        );
        assert_eq!(
            Request::CreateEptFd(info.clone(), 0)
                .encode()
                .unwrap()
                .len(),
            8 + 48
        );
    }

    #[test]
    fn a_create_ept_fd_request_is_the_uapi_struct_little_endian() {
        let info = EptInfo {
            name: "echo".into(),
            src: 1030,
            dst: ADDR_ANY,
        };
        let b = Request::CreateEptFd(info, 2).encode().unwrap();
        let mut want = header(OP_CREATE_EPT_FD).to_vec();
        want.extend_from_slice(b"echo");
        want.extend_from_slice(&[0; 28]);
        for v in [1030u32, ADDR_ANY, 2, u32::MAX] {
            want.extend_from_slice(&v.to_le_bytes());
        }
        assert_eq!(b, want);
    }

    #[test]
    fn refusals() {
        let info = EptInfo::new("x");
        // A flag outside O_ACCMODE | O_NONBLOCK | O_CLOEXEC.
        let b = Request::CreateEptFd(info.clone(), libc::O_APPEND as u32)
            .encode()
            .unwrap();
        assert_eq!(
            Request::parse(&b).unwrap_err(),
            Refusal {
                errno: libc::EINVAL,
                garbage: false
            }
        );
        // 32 name bytes: no room for the NUL.
        let long = EptInfo::new(&"n".repeat(32));
        let b = Request::CreateEpt(long).encode().unwrap();
        assert_eq!(
            Request::parse(&b).unwrap_err(),
            Refusal {
                errno: libc::EINVAL,
                garbage: false
            }
        );
        assert!(Request::CreateEpt(EptInfo::new(&"n".repeat(33)))
            .encode()
            .is_none());
        // Wrong length, unknown op, garbage.
        let b = Request::CreateEpt(info).encode().unwrap();
        let g = |errno| Refusal {
            errno,
            garbage: true,
        };
        assert_eq!(Request::parse(&b[..20]).unwrap_err(), g(libc::EINVAL));
        let mut v = b.clone();
        v[6] = 77;
        assert_eq!(Request::parse(&v).unwrap_err(), g(libc::EOPNOTSUPP));
        assert_eq!(
            Request::parse(b"garbage!garbage").unwrap_err(),
            g(libc::EPROTO)
        );
    }

    proptest::proptest! {
        /// Any packet a client may send parses to a request or a refusal,
        /// never a panic; what parses encodes back to the same bytes.
        #[test]
        fn any_packet(b in proptest::collection::vec(proptest::num::u8::ANY, 0..80)) {
            if let Ok(r) = Request::parse(&b) {
                let again = r.encode().unwrap();
                proptest::prop_assert_eq!(Request::parse(&again), Ok(r));
            }
        }

        /// Well-formed headers with arbitrary bodies: same, and only the
        /// three ops are accepted.
        #[test]
        fn any_body(op in 0u16..8, body in proptest::collection::vec(proptest::num::u8::ANY, 0..60)) {
            let mut b = header(op).to_vec();
            b.extend_from_slice(&body);
            match Request::parse(&b) {
                Ok(r) => {
                    proptest::prop_assert!([OP_CREATE_EPT, OP_CREATE_EPT_FD, OP_STATS].contains(&op));
                    proptest::prop_assert_eq!(Request::parse(&r.encode().unwrap()), Ok(r));
                }
                Err(e) => proptest::prop_assert!(e.errno > 0),
            }
        }

        /// Answers: any bytes are an error or a status with a body, never
        /// a panic; so is any body given to the body parsers.
        #[test]
        fn any_answer(b in proptest::collection::vec(proptest::num::u8::ANY, 0..200)) {
            let _ = parse_create_ept_body(&b);
            let _ = parse_create_ept_fd_body(&b);
            let _ = ServiceStats::parse(&b);
            for (op, len) in [
                (OP_CREATE_EPT, CREATE_EPT_REPLY_LEN),
                (OP_CREATE_EPT_FD, CREATE_EPT_FD_REPLY_LEN),
                (OP_STATS, STATS_REPLY_LEN),
            ] {
                if let Ok((0, body)) = parse_reply(&b, op, len) {
                    let _ = parse_create_ept_body(body);
                    let _ = parse_create_ept_fd_body(body);
                    if op == OP_STATS {
                        let _ = ServiceStats::parse(body);
                    }
                }
            }
        }
    }

    #[test]
    fn stats_round_trip() {
        let s = ServiceStats {
            fd_endpoints: 1,
            legacy_endpoints: 2,
            open_nodes: 3,
            clients: 4,
            created: 5,
            destroyed: 6,
            bad_clients: 7,
            oversize: 8,
            dropped: 9,
            msgs: 10,
        };
        let b = s.encode();
        let (st, body) = parse_reply(&b, OP_STATS, STATS_REPLY_LEN).unwrap();
        assert_eq!(st, 0);
        assert_eq!(ServiceStats::parse(body), Some(s));
        assert_eq!(ServiceStats::parse(&body[..10]), None);
    }

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
