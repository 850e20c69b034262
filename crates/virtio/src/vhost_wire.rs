//! The vhost-user message codec iopath writes itself, used by the front end
//! ([`crate::transport::vhost_user`]) and the device side ([`crate::device`]).
//!
//! Every message is a 12-byte little-endian header `{request u32, flags u32,
//! size u32}` followed by `size` payload bytes (vhost-user spec, "Message
//! Specification"). Most messages are encoded and decoded by the `vhost`
//! crate (`Frontend`, `BackendReqHandler`); what it lacks is here, once:
//! the header, the `u64` reply, and the `vhost_iotlb_msg` payload (both
//! directions: updates and invalidations from the front end, misses from the
//! device). Request codes come from the `vhost` crate's [`FrontendReq`] and
//! [`BackendReq`].
//!
//! ```text
//!  Header::request(code, len, need_reply) ─to_bytes─► [12 bytes] + payload
//!  [12 bytes] ─Header::parse─► Header ─check(max)─► payload length to read
//! ```

use vhost::vhost_user::message::{
    BackendReq, FrontendReq, VhostUserHeaderFlag, VhostUserMemoryRegion, MAX_ATTACHED_FD_ENTRIES,
};
use vhost::VhostIotlbType;

/// Bytes in a message header.
pub const HEADER_SIZE: usize = 12;
/// Largest payload either side accepts (the `vhost` crate's `MAX_MSG_SIZE`):
/// an announced size above it is refused before anything is allocated.
pub const MAX_PAYLOAD: usize = vhost::vhost_user::message::MAX_MSG_SIZE;
/// The header's version field (bits 0-1): 1.
pub const VERSION: u32 = 0x1;
const VERSION_MASK: u32 = 0x3;
/// Header flag: this message is a reply.
pub const REPLY: u32 = VhostUserHeaderFlag::REPLY.bits();
/// Header flag: the sender wants a reply (`REPLY_ACK`).
pub const NEED_REPLY: u32 = VhostUserHeaderFlag::NEED_REPLY.bits();
/// Bytes of a `u64` reply: header and value.
pub const U64_REPLY_SIZE: usize = HEADER_SIZE + 8;

/// `VHOST_USER_SET_MEM_TABLE` (front end to device).
pub const FRONTEND_SET_MEM_TABLE: u32 = FrontendReq::SET_MEM_TABLE as u32;
/// `VHOST_USER_SET_BACKEND_REQ_FD` (front end to device).
pub const FRONTEND_SET_BACKEND_REQ_FD: u32 = FrontendReq::SET_BACKEND_REQ_FD as u32;
/// `VHOST_USER_IOTLB_MSG` (front end to device).
pub const FRONTEND_IOTLB_MSG: u32 = FrontendReq::IOTLB_MSG as u32;
/// `VHOST_USER_BACKEND_IOTLB_MSG` (device to front end, back-end channel).
pub const BACKEND_IOTLB_MSG: u32 = BackendReq::IOTLB_MSG as u32;
/// `VHOST_USER_BACKEND_CONFIG_CHANGE_MSG` (device to front end).
pub const BACKEND_CONFIG_CHANGE: u32 = BackendReq::CONFIG_CHANGE_MSG as u32;

/// A malformed vhost-user message: its framing or its payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum VhostUserWireError {
    /// The version bits are not 1.
    #[error("vhost-user request {request}: header flags {flags:#x} are not version 1")]
    BadVersion {
        /// Request code.
        request: u32,
        /// The flags field.
        flags: u32,
    },
    /// A payload larger than accepted.
    #[error(
        "vhost-user request {request} announces {size} payload bytes (at most {max} accepted)"
    )]
    Oversized {
        /// Request code.
        request: u32,
        /// Announced size.
        size: u32,
        /// Largest size accepted.
        max: usize,
    },
    /// A `SET_MEM_TABLE` payload that does not hold its regions.
    #[error(
        "SET_MEM_TABLE of {size} payload bytes cannot hold {regions} regions \
         (1 to {max} regions of {MEM_REGION_SIZE} bytes after an {MEM_TABLE_HEAD}-byte head)"
    )]
    BadMemTable {
        /// Payload length.
        size: usize,
        /// The region count the payload announces.
        regions: u32,
        /// Most regions accepted.
        max: usize,
    },
    /// Not the reply that was expected.
    #[error(
        "expected a {expected_size}-byte reply to request {expected}, got request {request} \
         flags {flags:#x} size {size}"
    )]
    NotAReply {
        /// Request code the reply should carry.
        expected: u32,
        /// Payload size the reply should have.
        expected_size: u32,
        /// Request code received.
        request: u32,
        /// Flags received.
        flags: u32,
        /// Payload size received.
        size: u32,
    },
}

/// A message header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Request code.
    pub request: u32,
    /// Flags: version (bits 0-1), `REPLY`, `NEED_REPLY`.
    pub flags: u32,
    /// Payload bytes that follow.
    pub size: u32,
}

impl Header {
    /// A request header (version 1), asking for a reply when `need_reply`.
    pub fn request(request: u32, size: usize, need_reply: bool) -> Self {
        Self {
            request,
            flags: VERSION | if need_reply { NEED_REPLY } else { 0 },
            size: payload_len(size),
        }
    }

    /// A reply header for `request`.
    pub fn reply(request: u32, size: usize) -> Self {
        Self {
            request,
            flags: VERSION | REPLY,
            size: payload_len(size),
        }
    }

    /// Decodes the 12 header bytes.
    pub fn parse(bytes: &[u8; HEADER_SIZE]) -> Self {
        let word = |at: usize| {
            u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        Self {
            request: word(0),
            flags: word(4),
            size: word(8),
        }
    }

    /// Encodes the header.
    pub fn to_bytes(&self) -> [u8; HEADER_SIZE] {
        let mut out = [0u8; HEADER_SIZE];
        out[0..4].copy_from_slice(&self.request.to_le_bytes());
        out[4..8].copy_from_slice(&self.flags.to_le_bytes());
        out[8..12].copy_from_slice(&self.size.to_le_bytes());
        out
    }

    /// The sender wants a reply.
    pub fn need_reply(&self) -> bool {
        self.flags & NEED_REPLY != 0
    }

    /// Checks the version and that the payload is at most `max` bytes;
    /// returns the payload length to read.
    ///
    /// # Errors
    /// [`VhostUserWireError::BadVersion`], [`VhostUserWireError::Oversized`].
    pub fn check(&self, max: usize) -> Result<usize, VhostUserWireError> {
        if self.flags & VERSION_MASK != VERSION {
            return Err(VhostUserWireError::BadVersion {
                request: self.request,
                flags: self.flags,
            });
        }
        let size = self.size as usize;
        if size > max {
            return Err(VhostUserWireError::Oversized {
                request: self.request,
                size: self.size,
                max,
            });
        }
        Ok(size)
    }
}

/// A payload length as the header carries it; every caller bounds it by
/// [`MAX_PAYLOAD`] long before `u32` could overflow.
fn payload_len(size: usize) -> u32 {
    u32::try_from(size).unwrap_or(u32::MAX)
}

/// Encodes a whole message: header and payload.
pub fn message(header: Header, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_SIZE + payload.len());
    out.extend_from_slice(&header.to_bytes());
    out.extend_from_slice(payload);
    out
}

/// Encodes a `u64` reply to `request` (`REPLY_ACK`: 0 is success).
pub fn u64_reply(request: u32, value: u64) -> [u8; U64_REPLY_SIZE] {
    let mut out = [0u8; U64_REPLY_SIZE];
    out[..HEADER_SIZE].copy_from_slice(&Header::reply(request, 8).to_bytes());
    out[HEADER_SIZE..].copy_from_slice(&value.to_le_bytes());
    out
}

/// Decodes a `u64` reply that must answer `request`.
///
/// # Errors
/// [`VhostUserWireError::NotAReply`] when the code, the `REPLY` flag or the size is
/// not that of a reply to `request`.
pub fn parse_u64_reply(
    request: u32,
    msg: &[u8; U64_REPLY_SIZE],
) -> Result<u64, VhostUserWireError> {
    let mut hdr = [0u8; HEADER_SIZE];
    hdr.copy_from_slice(&msg[..HEADER_SIZE]);
    let h = Header::parse(&hdr);
    if h.request != request || h.flags & REPLY == 0 || h.size != 8 {
        return Err(VhostUserWireError::NotAReply {
            expected: request,
            expected_size: 8,
            request: h.request,
            flags: h.flags,
            size: h.size,
        });
    }
    let mut v = [0u8; 8];
    v.copy_from_slice(&msg[HEADER_SIZE..]);
    Ok(u64::from_le_bytes(v))
}

/// Size in bytes of `struct vhost_iotlb_msg` as front ends send it
/// (`iova u64, size u64, uaddr u64, perm u8, type u8`, padded to 8 bytes).
pub const IOTLB_MSG_SIZE: usize = 32;
/// The meaningful prefix of an IOTLB message (without the tail padding).
pub const IOTLB_MSG_MIN_SIZE: usize = 26;
/// `VHOST_IOTLB_MISS`, from the `vhost` crate.
pub const IOTLB_MISS: u8 = VhostIotlbType::Miss as u8;
/// `VHOST_IOTLB_UPDATE`, from the `vhost` crate.
pub const IOTLB_UPDATE: u8 = VhostIotlbType::Update as u8;
/// `VHOST_IOTLB_INVALIDATE`, from the `vhost` crate.
pub const IOTLB_INVALIDATE: u8 = VhostIotlbType::Invalidate as u8;

/// `struct vhost_iotlb_msg`, fields as they are on the wire (unvalidated;
/// [`crate::device::IotlbMsg::parse`] validates what a front end sends).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RawIotlb {
    /// I/O virtual address.
    pub iova: u64,
    /// Length in bytes.
    pub size: u64,
    /// Front-end user address.
    pub uaddr: u64,
    /// `VHOST_ACCESS_*` ([`iopath_dma::Perm::to_wire`]).
    pub perm: u8,
    /// `VHOST_IOTLB_*` ([`VhostIotlbType`]).
    pub kind: u8,
}

impl RawIotlb {
    /// Decodes a payload of [`IOTLB_MSG_MIN_SIZE`]..=[`IOTLB_MSG_SIZE`] bytes.
    pub fn decode(payload: &[u8]) -> Option<Self> {
        if payload.len() < IOTLB_MSG_MIN_SIZE || payload.len() > IOTLB_MSG_SIZE {
            return None;
        }
        let word = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&payload[at..at + 8]);
            u64::from_le_bytes(b)
        };
        Some(Self {
            iova: word(0),
            size: word(8),
            uaddr: word(16),
            perm: payload[24],
            kind: payload[25],
        })
    }

    /// Encodes the 32-byte payload.
    pub fn encode(&self) -> [u8; IOTLB_MSG_SIZE] {
        let mut out = [0u8; IOTLB_MSG_SIZE];
        out[0..8].copy_from_slice(&self.iova.to_le_bytes());
        out[8..16].copy_from_slice(&self.size.to_le_bytes());
        out[16..24].copy_from_slice(&self.uaddr.to_le_bytes());
        out[24] = self.perm;
        out[25] = self.kind;
        out
    }
}

/// Bytes before the first region of a `SET_MEM_TABLE` payload
/// (`num_regions u32, padding u32`).
pub const MEM_TABLE_HEAD: usize = 8;
/// Bytes of one region (`guest_phys_addr, memory_size, userspace_addr,
/// mmap_offset`, each `u64`).
pub const MEM_REGION_SIZE: usize = 32;
/// Most regions one `SET_MEM_TABLE` carries (the `vhost` crate's limit;
/// QEMU sends at most 8).
pub const MAX_MEM_TABLE_REGIONS: usize = MAX_ATTACHED_FD_ENTRIES;
/// Largest `SET_MEM_TABLE` payload accepted.
pub const MAX_MEM_TABLE_SIZE: usize = MEM_TABLE_HEAD + MAX_MEM_TABLE_REGIONS * MEM_REGION_SIZE;

/// Decodes a `SET_MEM_TABLE` payload: `num_regions`, padding, then the
/// regions. The payload may have room for more regions than it announces
/// (whole, unused entries after them): Linux's `virtio_uml` always sends
/// its two-entry table, 72 bytes, with `num_regions` 1. QEMU's
/// `libvhost-user` reads only the announced entries too; the `vhost` crate
/// refuses such a table, so the device side decodes it here. The regions'
/// own values are checked where they are mapped.
///
/// # Errors
/// [`VhostUserWireError::BadMemTable`] when `num_regions` is 0 or above
/// [`MAX_MEM_TABLE_REGIONS`], or the payload is not the head plus whole
/// entries enough for them (and at most [`MAX_MEM_TABLE_SIZE`] bytes).
pub fn decode_mem_table(payload: &[u8]) -> Result<Vec<VhostUserMemoryRegion>, VhostUserWireError> {
    let word = |at: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&payload[at..at + 8]);
        u64::from_le_bytes(b)
    };
    let size = payload.len();
    let regions = match payload.get(..4) {
        Some(b) => u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        None => 0,
    };
    let n = regions as usize;
    let fits = size >= MEM_TABLE_HEAD + n * MEM_REGION_SIZE
        && size <= MAX_MEM_TABLE_SIZE
        && (size - MEM_TABLE_HEAD) % MEM_REGION_SIZE == 0;
    if n == 0 || n > MAX_MEM_TABLE_REGIONS || !fits {
        return Err(VhostUserWireError::BadMemTable {
            size,
            regions,
            max: MAX_MEM_TABLE_REGIONS,
        });
    }
    Ok((0..n)
        .map(|i| {
            let at = MEM_TABLE_HEAD + i * MEM_REGION_SIZE;
            VhostUserMemoryRegion::new(word(at), word(at + 8), word(at + 16), word(at + 24))
        })
        .collect())
}

/// Encodes a `SET_MEM_TABLE` payload with room for `slots` entries (at
/// least `regions.len()`; the unused ones zero), as front ends send it.
pub fn encode_mem_table(regions: &[VhostUserMemoryRegion], slots: usize) -> Vec<u8> {
    let mut out = vec![0u8; MEM_TABLE_HEAD + slots.max(regions.len()) * MEM_REGION_SIZE];
    out[..4].copy_from_slice(&payload_len(regions.len()).to_le_bytes());
    for (i, r) in regions.iter().enumerate() {
        let at = MEM_TABLE_HEAD + i * MEM_REGION_SIZE;
        let fields = [r.guest_phys_addr, r.memory_size, r.user_addr, r.mmap_offset];
        for (j, v) in fields.into_iter().enumerate() {
            out[at + j * 8..at + j * 8 + 8].copy_from_slice(&v.to_le_bytes());
        }
    }
    out
}

/// The name of a front-end request code, for messages ("GET_FEATURES").
pub fn frontend_request_name(request: u32) -> String {
    match FrontendReq::try_from(request) {
        Ok(r) => format!("{r:?}"),
        Err(()) => format!("request {request}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_checks_version_and_size() {
        let h = Header::request(FRONTEND_IOTLB_MSG, IOTLB_MSG_SIZE, true);
        assert_eq!(h.flags, VERSION | NEED_REPLY);
        assert_eq!(h.to_bytes()[..4], 22u32.to_le_bytes());
        assert_eq!(Header::parse(&h.to_bytes()), h);
        assert_eq!(h.check(MAX_PAYLOAD), Ok(32));
        let huge = Header {
            size: 0xffff_fff0,
            ..h
        };
        assert_eq!(
            huge.check(MAX_PAYLOAD),
            Err(VhostUserWireError::Oversized {
                request: 22,
                size: 0xffff_fff0,
                max: 4096
            })
        );
        let v2 = Header { flags: 0x2, ..h };
        assert!(matches!(
            v2.check(64),
            Err(VhostUserWireError::BadVersion { .. })
        ));
    }

    #[test]
    fn u64_reply_round_trips_and_refuses_other_replies() {
        let r = u64_reply(FRONTEND_IOTLB_MSG, 1);
        assert_eq!(parse_u64_reply(FRONTEND_IOTLB_MSG, &r), Ok(1));
        assert!(parse_u64_reply(FRONTEND_SET_BACKEND_REQ_FD, &r).is_err());
        let mut not_reply = r;
        not_reply[4] = VERSION as u8;
        assert!(parse_u64_reply(FRONTEND_IOTLB_MSG, &not_reply).is_err());
    }

    #[test]
    fn iotlb_payload_round_trips_and_bounds_its_length() {
        let m = RawIotlb {
            iova: 0x1000,
            size: 0x2000,
            uaddr: 0x7f00_0000,
            perm: iopath_dma::Perm::ReadWrite.to_wire(),
            kind: IOTLB_UPDATE,
        };
        assert_eq!(RawIotlb::decode(&m.encode()), Some(m));
        assert_eq!(RawIotlb::decode(&m.encode()[..26]), Some(m));
        assert_eq!(RawIotlb::decode(&m.encode()[..25]), None);
        assert_eq!(RawIotlb::decode(&[0u8; 33]), None);
        assert_eq!(frontend_request_name(1), "GET_FEATURES");
        assert_eq!(frontend_request_name(999), "request 999");
    }

    /// The table Linux's `virtio_uml` sends (6.1 and 6.12): one region in
    /// a payload with room for two, 72 bytes.
    #[test]
    fn mem_table_with_room_for_more_regions_decodes_the_announced_ones() {
        let r = VhostUserMemoryRegion::new(0x30fa_6000, 0x0f57_9000, 0x30fa_6000, 0x30fa_6000);
        let payload = encode_mem_table(&[r], 2);
        assert_eq!(payload.len(), 72);
        let got = decode_mem_table(&payload).unwrap();
        assert_eq!(got.len(), 1);
        let fields = |r: &VhostUserMemoryRegion| {
            [r.guest_phys_addr, r.memory_size, r.user_addr, r.mmap_offset]
        };
        assert_eq!(fields(&got[0]), fields(&r));
        assert_eq!(
            decode_mem_table(&encode_mem_table(&[r, r], 0))
                .unwrap()
                .len(),
            2
        );
    }

    #[test]
    fn mem_table_that_cannot_hold_its_regions_is_refused() {
        let r = VhostUserMemoryRegion::new(0, 0x1000, 0x7f00_0000, 0);
        let two = encode_mem_table(&[r, r], 0);
        let bad = |payload: &[u8], regions: u32| {
            assert_eq!(
                decode_mem_table(payload).err(),
                Some(VhostUserWireError::BadMemTable {
                    size: payload.len(),
                    regions,
                    max: MAX_MEM_TABLE_REGIONS
                })
            );
        };
        // Announces two, holds one.
        bad(&two[..MEM_TABLE_HEAD + MEM_REGION_SIZE], 2);
        // A torn entry after the announced one.
        bad(&encode_mem_table(&[r], 2)[..60], 1);
        // No regions, no head, too many.
        bad(&encode_mem_table(&[], 1), 0);
        bad(&[], 0);
        let mut many = encode_mem_table(&[r], MAX_MEM_TABLE_REGIONS + 1);
        bad(&many, 1);
        many[..4].copy_from_slice(&33u32.to_le_bytes());
        bad(&many, 33);
    }
}
