//! Requests: parsing what a client sent, encoding what a client sends.

use super::*;
use crate::ctrl::CtrlError;

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
