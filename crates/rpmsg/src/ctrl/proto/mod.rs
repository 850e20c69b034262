//! Requests of the endpoint service on the control socket, laid out as the
//! Linux uAPI structs they mirror (`include/uapi/linux/rpmsg.h`), after the
//! common eight-byte header `"IOPR" ver u16 op u16`:
//!
//! | op | request | answer (after header and `status i32`) |
//! |---|---|---|
//! | `CREATE_EPT` 2 | `rpmsg_endpoint_info {name[32], src, dst}` | the info (src filled in), node path `[108]` |
//! | `CREATE_EPT_FD` 3 | `rpmsg_endpoint_fd_info {name[32], src, dst, flags, fd}` | the info, then the largest payload (`u32`); the fd rides along as `SCM_RIGHTS` |
//! | `STATS` 4 | nothing | [`ServiceStats`] |
//!
//! A legacy node greets each connection with header `OPEN` 5, a status
//! (0, or `-EBUSY` while another connection has it open) and the largest
//! payload (`u32`: the negotiated buffer size towards the peer less the
//! header).

use std::mem::{offset_of, size_of};

use vm_memory::ByteValued;

use super::uapi::{
    RpmsgEndpointFdInfo, RpmsgEndpointInfo, EPT_FD_FLAGS, EPT_FD_INFO_LEN, EPT_INFO_LEN,
};
use crate::wire::{check_name, ADDR_ANY, NAME_SIZE};

mod answer;
mod request;
mod stats;
#[cfg(test)]
mod tests;

pub use answer::{
    attach_reply, create_ept_fd_reply, create_ept_reply, parse_create_ept_body,
    parse_create_ept_fd_body, parse_max_payload, parse_reply, reply_head,
};
pub(crate) use answer::{set_ept_fd_reply_addrs, set_reply_max_payload};
pub use request::{parse_header, AttachRequest, Refusal, Request};
pub(crate) use request::{RequestRef, MAX_REQUEST_LEN};
pub use stats::ServiceStats;

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
/// Size of a CREATE_EPT_FD answer: the fd info, then the endpoint's
/// largest payload (`u32`).
pub const CREATE_EPT_FD_REPLY_LEN: usize = 12 + EPT_FD_INFO_LEN + 4;
/// Size of a STATS answer.
pub const STATS_REPLY_LEN: usize = 12 + 4 * 4 + 6 * 8 + 2 * 4 + 8;
/// Size of a node greeting: header, status, the endpoint's largest
/// payload (`u32`).
pub const OPEN_REPLY_LEN: usize = 16;

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

/// `struct rpmsg_endpoint_info`, with `flags` of the fd variant (as JSON,
/// [`ADDR_ANY`] is `"any"`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct EptInfo {
    /// Endpoint name (at most 31 bytes).
    pub name: String,
    /// Local address, or [`ADDR_ANY`] for the next free one from 1024.
    #[serde(serialize_with = "addr_json")]
    pub src: u32,
    /// Peer address, or [`ADDR_ANY`] to bind to the channel of the same
    /// name (or to the first sender).
    #[serde(serialize_with = "addr_json")]
    pub dst: u32,
}

/// An address as a person writes it: `any` ([`ADDR_ANY`], any case), a
/// decimal number, or `0x` and hex digits; `None` for anything else.
pub fn parse_addr(s: &str) -> Option<u32> {
    if s.eq_ignore_ascii_case("any") {
        return Some(ADDR_ANY);
    }
    match s.strip_prefix("0x") {
        Some(h) => u32::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

fn addr_json<S: serde::Serializer>(a: &u32, s: S) -> Result<S::Ok, S::Error> {
    match *a {
        ADDR_ANY => s.serialize_str("any"),
        a => s.serialize_u32(a),
    }
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
