//! The rpmsg wire format of Linux's `virtio_rpmsg_bus` (and OpenAMP).
//!
//! Every message is one virtio buffer holding a 16-byte header followed by
//! the payload:
//!
//! ```text
//!  0      4      8          12     14      16
//!  | src  | dst  | reserved | len  | flags | payload[len] ...
//! ```
//!
//! The name service lives at address [`NS_ADDR`] (53); its payload is
//! `{name[32], addr u32, flags u32}` with flags [`NsOp::Create`] (0) or
//! [`NsOp::Destroy`] (1). Multi-byte fields are little-endian when
//! `VIRTIO_F_VERSION_1` was negotiated and native-endian otherwise (legacy
//! devices, which is what every remoteproc resource table describes: its
//! feature words are only 32 bits wide).
//!
//! Everything here parses bytes copied out of shared memory; a peer that
//! lies gets a [`WireError`], never a panic.

use thiserror::Error;

/// Size of the rpmsg header.
pub const HDR_LEN: usize = 16;
/// Buffer size Linux and OpenAMP use by default.
pub const BUF_SIZE: usize = 512;
/// Largest payload in a default buffer (`BUF_SIZE - HDR_LEN`).
pub const MAX_PAYLOAD: usize = BUF_SIZE - HDR_LEN;
/// Address of the name service endpoint.
pub const NS_ADDR: u32 = 53;
/// Size of a name-service message.
pub const NS_MSG_LEN: usize = 40;
/// Size of the name field, NUL included.
pub const NAME_SIZE: usize = 32;
/// "Any address": let the bus pick (source) or bind later (destination).
pub const ADDR_ANY: u32 = 0xFFFF_FFFF;
/// First dynamically allocated address; below are reserved services.
pub const RESERVED_ADDRESSES: u32 = 1024;
/// Feature bit: the device supports name-service announcements.
pub const VIRTIO_RPMSG_F_NS: u32 = 0;

/// Why a message or name-service record was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum WireError {
    /// The buffer is shorter than a header.
    #[error("Message of {got} bytes is shorter than the {HDR_LEN}-byte header")]
    Short {
        /// Bytes available.
        got: usize,
    },
    /// The header's `len` points past the end of the buffer.
    #[error("Header len {len} runs past the buffer ({room} payload bytes available)")]
    LenPastBuffer {
        /// The claimed payload length.
        len: usize,
        /// Payload bytes actually present.
        room: usize,
    },
    /// A name-service payload of the wrong size.
    #[error("Name-service message of {len} bytes, expected {NS_MSG_LEN}")]
    NsLen {
        /// The payload length.
        len: usize,
    },
    /// A name without a terminating NUL inside its 32 bytes.
    #[error("Name is not NUL-terminated within {NAME_SIZE} bytes")]
    NameNotTerminated,
    /// A name that is empty or not UTF-8.
    #[error("Name is empty or not UTF-8")]
    BadName,
    /// A name too long to send (at most 31 bytes).
    #[error("Name of {len} bytes is longer than {} bytes", NAME_SIZE - 1)]
    NameTooLong {
        /// The name's length.
        len: usize,
    },
    /// Name-service flags other than CREATE or DESTROY.
    #[error("Unknown name-service flags {flags:#x}")]
    NsFlags {
        /// The flags received.
        flags: u32,
    },
    /// A payload too large for a buffer.
    #[error("Payload of {len} bytes does not fit a {room}-byte buffer payload")]
    TooLarge {
        /// The payload length.
        len: usize,
        /// Room in the buffer.
        room: usize,
    },
}

/// Byte order of the multi-byte fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endian {
    /// Little-endian (`VIRTIO_F_VERSION_1`).
    Little,
    /// Big-endian (a legacy device on a big-endian machine).
    Big,
}

impl Endian {
    /// The byte order for the negotiated features: little-endian with
    /// `VIRTIO_F_VERSION_1`, this machine's native order otherwise.
    pub fn for_features(version_1: bool) -> Self {
        if version_1 || cfg!(target_endian = "little") {
            Endian::Little
        } else {
            Endian::Big
        }
    }

    fn u16(self, b: [u8; 2]) -> u16 {
        match self {
            Endian::Little => u16::from_le_bytes(b),
            Endian::Big => u16::from_be_bytes(b),
        }
    }

    fn u32(self, b: [u8; 4]) -> u32 {
        match self {
            Endian::Little => u32::from_le_bytes(b),
            Endian::Big => u32::from_be_bytes(b),
        }
    }

    fn put16(self, v: u16) -> [u8; 2] {
        match self {
            Endian::Little => v.to_le_bytes(),
            Endian::Big => v.to_be_bytes(),
        }
    }

    fn put32(self, v: u32) -> [u8; 4] {
        match self {
            Endian::Little => v.to_le_bytes(),
            Endian::Big => v.to_be_bytes(),
        }
    }
}

fn arr<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[at..at + N]);
    a
}

/// The 16-byte rpmsg header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Header {
    /// Source address.
    pub src: u32,
    /// Destination address.
    pub dst: u32,
    /// Reserved (OpenAMP keeps a buffer index here while it holds a buffer).
    pub reserved: u32,
    /// Payload length.
    pub len: u16,
    /// Flags (unused by Linux and OpenAMP; sent as 0).
    pub flags: u16,
}

impl Header {
    /// Encodes the header.
    pub fn encode(&self, e: Endian) -> [u8; HDR_LEN] {
        let mut b = [0u8; HDR_LEN];
        b[0..4].copy_from_slice(&e.put32(self.src));
        b[4..8].copy_from_slice(&e.put32(self.dst));
        b[8..12].copy_from_slice(&e.put32(self.reserved));
        b[12..14].copy_from_slice(&e.put16(self.len));
        b[14..16].copy_from_slice(&e.put16(self.flags));
        b
    }

    /// Decodes a header from the first 16 bytes of `b`.
    ///
    /// # Errors
    /// [`WireError::Short`] if `b` holds fewer than 16 bytes.
    pub fn decode(b: &[u8], e: Endian) -> Result<Self, WireError> {
        if b.len() < HDR_LEN {
            return Err(WireError::Short { got: b.len() });
        }
        Ok(Header {
            src: e.u32(arr(b, 0)),
            dst: e.u32(arr(b, 4)),
            reserved: e.u32(arr(b, 8)),
            len: e.u16(arr(b, 12)),
            flags: e.u16(arr(b, 14)),
        })
    }
}

/// Parses one received buffer: `buf` is what the peer handed over (for a
/// used buffer, the bytes it says it wrote). Returns the header and the
/// payload slice.
///
/// # Errors
/// [`WireError::Short`] or [`WireError::LenPastBuffer`].
pub fn parse_message(buf: &[u8], e: Endian) -> Result<(Header, &[u8]), WireError> {
    let hdr = Header::decode(buf, e)?;
    let room = buf.len() - HDR_LEN;
    let len = usize::from(hdr.len);
    if len > room {
        return Err(WireError::LenPastBuffer { len, room });
    }
    Ok((hdr, &buf[HDR_LEN..HDR_LEN + len]))
}

/// Encodes a whole message (header then payload) into `out`, which is
/// cleared first. `buf_size` is the size of the buffer it will go into.
///
/// # Errors
/// [`WireError::TooLarge`] if the payload does not fit.
pub fn encode_message(
    src: u32,
    dst: u32,
    payload: &[u8],
    buf_size: usize,
    e: Endian,
    out: &mut Vec<u8>,
) -> Result<(), WireError> {
    let room = buf_size.saturating_sub(HDR_LEN).min(usize::from(u16::MAX));
    if payload.len() > room {
        return Err(WireError::TooLarge {
            len: payload.len(),
            room,
        });
    }
    let hdr = Header {
        src,
        dst,
        reserved: 0,
        len: payload.len() as u16,
        flags: 0,
    };
    out.clear();
    out.extend_from_slice(&hdr.encode(e));
    out.extend_from_slice(payload);
    Ok(())
}

/// What a name-service message announces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NsOp {
    /// A service was created at `addr`.
    Create,
    /// The service at `addr` is gone.
    Destroy,
}

/// A name-service record: `{name[32], addr u32, flags u32}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NsMsg {
    /// Service name (at most 31 bytes).
    pub name: String,
    /// The announcing endpoint's address.
    pub addr: u32,
    /// Create or destroy.
    pub op: NsOp,
}

/// Checks that `name` can be sent (1..=31 bytes, no NUL).
///
/// # Errors
/// [`WireError::NameTooLong`] or [`WireError::BadName`].
pub fn check_name(name: &str) -> Result<(), WireError> {
    if name.len() > NAME_SIZE - 1 {
        return Err(WireError::NameTooLong { len: name.len() });
    }
    if name.is_empty() || name.as_bytes().contains(&0) {
        return Err(WireError::BadName);
    }
    Ok(())
}

impl NsMsg {
    /// Parses a name-service payload.
    ///
    /// # Errors
    /// [`WireError::NsLen`], [`WireError::NameNotTerminated`],
    /// [`WireError::BadName`], [`WireError::NsFlags`].
    pub fn parse(payload: &[u8], e: Endian) -> Result<Self, WireError> {
        if payload.len() != NS_MSG_LEN {
            return Err(WireError::NsLen { len: payload.len() });
        }
        let raw = &payload[..NAME_SIZE];
        let nul = raw
            .iter()
            .position(|&c| c == 0)
            .ok_or(WireError::NameNotTerminated)?;
        let name = std::str::from_utf8(&raw[..nul]).map_err(|_| WireError::BadName)?;
        if name.is_empty() {
            return Err(WireError::BadName);
        }
        let addr = e.u32(arr(payload, 32));
        let flags = e.u32(arr(payload, 36));
        let op = match flags {
            0 => NsOp::Create,
            1 => NsOp::Destroy,
            flags => return Err(WireError::NsFlags { flags }),
        };
        Ok(NsMsg {
            name: name.to_owned(),
            addr,
            op,
        })
    }

    /// Encodes the record.
    ///
    /// # Errors
    /// [`WireError::NameTooLong`] or [`WireError::BadName`].
    pub fn encode(&self, e: Endian) -> Result<[u8; NS_MSG_LEN], WireError> {
        check_name(&self.name)?;
        let mut b = [0u8; NS_MSG_LEN];
        b[..self.name.len()].copy_from_slice(self.name.as_bytes());
        b[32..36].copy_from_slice(&e.put32(self.addr));
        let flags = match self.op {
            NsOp::Create => 0,
            NsOp::Destroy => 1,
        };
        b[36..40].copy_from_slice(&e.put32(flags));
        Ok(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn header_layout_matches_linux() {
        let h = Header {
            src: 0x0102_0304,
            dst: 53,
            reserved: 0,
            len: 40,
            flags: 0,
        };
        let b = h.encode(Endian::Little);
        assert_eq!(&b[0..4], &[4, 3, 2, 1]);
        assert_eq!(&b[4..8], &[53, 0, 0, 0]);
        assert_eq!(&b[12..14], &[40, 0]);
        assert_eq!(Header::decode(&b, Endian::Little).unwrap(), h);
        let be = h.encode(Endian::Big);
        assert_eq!(&be[0..4], &[1, 2, 3, 4]);
        assert_eq!(Header::decode(&be, Endian::Big).unwrap(), h);
    }

    #[test]
    fn len_past_buffer_is_refused() {
        let mut out = Vec::new();
        encode_message(1024, 1025, &[7u8; 100], BUF_SIZE, Endian::Little, &mut out).unwrap();
        assert_eq!(out.len(), 116);
        let (h, p) = parse_message(&out, Endian::Little).unwrap();
        assert_eq!((h.src, h.dst, p.len()), (1024, 1025, 100));
        assert_eq!(
            parse_message(&out[..115], Endian::Little),
            Err(WireError::LenPastBuffer { len: 100, room: 99 })
        );
        assert_eq!(
            parse_message(&out[..10], Endian::Little),
            Err(WireError::Short { got: 10 })
        );
        assert_eq!(
            encode_message(1, 2, &[0; 497], BUF_SIZE, Endian::Little, &mut out),
            Err(WireError::TooLarge {
                len: 497,
                room: 496
            })
        );
    }

    #[test]
    fn ns_round_trip_and_refusals() {
        let m = NsMsg {
            name: "rpmsg-openamp-demo-channel".into(),
            addr: 1024,
            op: NsOp::Create,
        };
        let b = m.encode(Endian::Little).unwrap();
        assert_eq!(NsMsg::parse(&b, Endian::Little).unwrap(), m);
        let mut bad = b;
        bad[..32].fill(b'a');
        assert_eq!(
            NsMsg::parse(&bad, Endian::Little),
            Err(WireError::NameNotTerminated)
        );
        let mut bad = b;
        bad[36] = 7;
        assert_eq!(
            NsMsg::parse(&bad, Endian::Little),
            Err(WireError::NsFlags { flags: 7 })
        );
        assert_eq!(
            NsMsg::parse(&b[..39], Endian::Little),
            Err(WireError::NsLen { len: 39 })
        );
        let mut empty = b;
        empty[0] = 0;
        assert_eq!(
            NsMsg::parse(&empty, Endian::Little),
            Err(WireError::BadName)
        );
        let long = NsMsg {
            name: "x".repeat(32),
            ..m
        };
        assert_eq!(
            long.encode(Endian::Little),
            Err(WireError::NameTooLong { len: 32 })
        );
    }

    proptest! {
        #[test]
        fn parse_never_panics(buf in proptest::collection::vec(any::<u8>(), 0..600)) {
            if let Ok((h, p)) = parse_message(&buf, Endian::Little) {
                prop_assert_eq!(usize::from(h.len), p.len());
                prop_assert!(HDR_LEN + p.len() <= buf.len());
                let _ = NsMsg::parse(p, Endian::Little);
            }
        }

        #[test]
        fn message_round_trip(src: u32, dst: u32, data in proptest::collection::vec(any::<u8>(), 0..=MAX_PAYLOAD)) {
            let mut out = Vec::new();
            encode_message(src, dst, &data, BUF_SIZE, Endian::Little, &mut out).unwrap();
            let (h, p) = parse_message(&out, Endian::Little).unwrap();
            prop_assert_eq!((h.src, h.dst), (src, dst));
            prop_assert_eq!(p, &data[..]);
        }
    }
}
