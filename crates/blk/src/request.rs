//! Parsing virtio-blk requests out of descriptor chains (virtio 1.2,
//! 5.2.6), separate from executing them.
//!
//! (Over 700 lines because of its tests: the parser itself is about 530
//! lines, its unit and property tests the rest.)
//!
//! A chain is seen as a byte stream: device-readable bytes (the 16-byte
//! header, then data for writes, discard and write-zeroes) followed by
//! device-writable bytes (data for reads and `GET_ID`, then the status
//! byte). Descriptors may split these anywhere. Every address is checked
//! against the memory the device may access with the access it will make,
//! so the executor only ever touches memory that was mapped for it.

use std::ops::Deref;

use virtio_queue::desc::split::Descriptor;
use virtio_queue::DescriptorChain;
use vm_memory::{Bytes, GuestAddress, GuestMemory, Permissions};

use virtio_bindings::virtio_blk as vb;

/// Bytes in a virtio-blk sector (virtio 1.x, 5.2.6: `sector` counts
/// 512-byte units whatever the device's block size).
pub const SECTOR_SIZE: u64 = 512;

// Request types (virtio 1.x, 5.2.6), from `virtio-bindings`.
pub use vb::{
    VIRTIO_BLK_T_DISCARD, VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN,
    VIRTIO_BLK_T_OUT, VIRTIO_BLK_T_WRITE_ZEROES,
};

/// Status: success (`VIRTIO_BLK_S_OK`, as the status byte it is written as).
pub const VIRTIO_BLK_S_OK: u8 = vb::VIRTIO_BLK_S_OK as u8;
/// Status: I/O error (also every malformed request).
pub const VIRTIO_BLK_S_IOERR: u8 = vb::VIRTIO_BLK_S_IOERR as u8;
/// Status: request type or flag not supported.
pub const VIRTIO_BLK_S_UNSUPP: u8 = vb::VIRTIO_BLK_S_UNSUPP as u8;
/// Length of the `GET_ID` string.
pub const VIRTIO_BLK_ID_BYTES: usize = vb::VIRTIO_BLK_ID_BYTES as usize;

const HEADER_LEN: u64 = 16;
const DISCARD_SEG_LEN: u64 = 16;
const UNMAP_FLAG: u32 = 1;
/// Descriptors beyond this in one chain are refused (virtio-queue already
/// stops a looping chain after queue-size descriptors).
const MAX_DESCRIPTORS: usize = 4096;

/// A range of memory the device reads or writes (part of a descriptor).
#[derive(Clone, Copy, Debug, Eq, PartialEq)]
pub struct Segment {
    /// Start (guest physical address or IOVA).
    pub addr: GuestAddress,
    /// Length in bytes.
    pub len: u32,
}

/// One range of a discard or write-zeroes request.
#[derive(Clone, Copy, Debug, Eq, PartialEq)]
pub struct SectorRange {
    /// First sector.
    pub sector: u64,
    /// Number of sectors.
    pub count: u32,
    /// Write-zeroes only: the device may deallocate.
    pub unmap: bool,
}

/// What a request asks for.
#[derive(Clone, Debug, Eq, PartialEq)]
pub enum RequestKind {
    /// Read sectors into `data` (device-writable).
    Read {
        /// First sector.
        sector: u64,
        /// Where the data goes, in order.
        data: Vec<Segment>,
    },
    /// Write sectors from `data` (device-readable).
    Write {
        /// First sector.
        sector: u64,
        /// Where the data comes from, in order.
        data: Vec<Segment>,
    },
    /// Make every completed write durable.
    Flush,
    /// Write the device id string into `data` (up to 20 bytes).
    GetId {
        /// Device-writable buffer.
        data: Vec<Segment>,
    },
    /// Discard ranges.
    Discard(Vec<SectorRange>),
    /// Write zeroes over ranges.
    WriteZeroes(Vec<SectorRange>),
}

/// A parsed, validated request.
#[derive(Clone, Debug, Eq, PartialEq)]
pub struct Request {
    /// Head descriptor index (for the used ring).
    pub head: u16,
    /// The operation.
    pub kind: RequestKind,
    /// Where the status byte goes (checked writable).
    pub status: GuestAddress,
}

impl Request {
    /// Bytes of data the device writes on success, before the status byte.
    pub fn data_in_len(&self) -> u32 {
        match &self.kind {
            RequestKind::Read { data, .. } => data.iter().map(|s| s.len).sum(),
            RequestKind::GetId { data } => {
                let n: u32 = data.iter().map(|s| s.len).sum();
                n.min(VIRTIO_BLK_ID_BYTES as u32)
            }
            _ => 0,
        }
    }
}

/// Limits a request must respect (from the device's configuration).
#[derive(Clone, Copy, Debug, Eq, PartialEq)]
pub struct Limits {
    /// Capacity in sectors.
    pub capacity: u64,
    /// Refuse writes, discards and write-zeroes.
    pub readonly: bool,
    /// Most sectors per discard range.
    pub max_discard_sectors: u32,
    /// Most ranges per discard request.
    pub max_discard_seg: u32,
    /// Most sectors per write-zeroes range.
    pub max_write_zeroes_sectors: u32,
    /// Most ranges per write-zeroes request.
    pub max_write_zeroes_seg: u32,
}

/// Why a chain is not a valid request.
#[derive(Clone, Debug, thiserror::Error, Eq, PartialEq)]
pub enum ParseError {
    /// The chain has no descriptor (the head could not be read).
    #[error("Empty descriptor chain")]
    Empty,
    /// The chain loops, points past its table, or its next descriptor
    /// cannot be read.
    #[error("Descriptor chain is broken (loop, bad index or unreadable descriptor)")]
    BrokenChain,
    /// More descriptors than any request needs.
    #[error("Descriptor chain longer than {max} descriptors")]
    TooLong {
        /// The limit.
        max: usize,
    },
    /// A device-readable descriptor follows a device-writable one.
    #[error("Device-readable descriptor after a device-writable one")]
    ReadableAfterWritable,
    /// No device-writable byte for the status.
    #[error("No status byte")]
    NoStatus,
    /// Fewer than 16 device-readable bytes.
    #[error("Request header is {len} bytes")]
    ShortHeader {
        /// Readable bytes found.
        len: u64,
    },
    /// A buffer lies (partly) outside the memory the device may access, or
    /// the access it needs is not permitted there.
    #[error("Buffer {addr:#x}+{len:#x} is not accessible")]
    BadAddress {
        /// Start of the buffer.
        addr: u64,
        /// Its length.
        len: u64,
    },
    /// Data length is not a whole number of sectors.
    #[error("Data length {len} is not a multiple of 512")]
    NotSectorMultiple {
        /// The length in bytes.
        len: u64,
    },
    /// The request reaches past the end of the device.
    #[error("Sectors {sector}+{count} are past the capacity {capacity}")]
    OutOfRange {
        /// First sector.
        sector: u64,
        /// Number of sectors.
        count: u64,
        /// Capacity in sectors.
        capacity: u64,
    },
    /// Data where the request type has none, or the wrong direction.
    #[error("Unexpected data layout for request type {kind}")]
    BadLayout {
        /// The request type.
        kind: u32,
    },
    /// Too many discard or write-zeroes ranges, or too many sectors in one.
    #[error("Discard or write-zeroes request over the device limits")]
    OverLimit,
    /// A write-class request on a read-only device.
    #[error("Device is read-only")]
    ReadOnly,
    /// An unknown request type.
    #[error("Request type {kind} is not supported")]
    UnsupportedType {
        /// The request type.
        kind: u32,
    },
    /// A flag this device does not support.
    #[error("Flags {flags:#x} not supported")]
    UnsupportedFlags {
        /// The flags.
        flags: u32,
    },
}

impl ParseError {
    /// The status byte this error completes the request with.
    pub fn status(&self) -> u8 {
        match self {
            Self::UnsupportedType { .. } | Self::UnsupportedFlags { .. } => VIRTIO_BLK_S_UNSUPP,
            _ => VIRTIO_BLK_S_IOERR,
        }
    }
}

/// A chain that was not a valid request: complete it with
/// [`ParseError::status`] at `status` when there is a usable status byte.
#[derive(Clone, Debug, Eq, PartialEq)]
pub struct Rejected {
    /// Head descriptor index.
    pub head: u16,
    /// What was wrong.
    pub error: ParseError,
    /// The last device-writable byte of the chain, if it is writable memory.
    pub status: Option<GuestAddress>,
}

/// The `skip..skip + take` bytes of a list of segments.
fn sub_segments(segs: &[Segment], mut skip: u64, mut take: u64) -> Vec<Segment> {
    let mut out = Vec::new();
    for s in segs {
        if take == 0 {
            break;
        }
        let len = u64::from(s.len);
        if skip >= len {
            skip -= len;
            continue;
        }
        let n = (len - skip).min(take);
        // `addr + skip` stays inside a descriptor whose range was already
        // checked not to wrap.
        out.push(Segment {
            addr: GuestAddress(s.addr.0.wrapping_add(skip)),
            len: n as u32,
        });
        take -= n;
        skip = 0;
    }
    out
}

fn total(segs: &[Segment]) -> u64 {
    segs.iter().map(|s| u64::from(s.len)).sum()
}

fn check_access<M: GuestMemory + ?Sized>(
    mem: &M,
    segs: &[Segment],
    access: Permissions,
) -> Result<(), ParseError> {
    for s in segs {
        let bad = ParseError::BadAddress {
            addr: s.addr.0,
            len: u64::from(s.len),
        };
        if s.addr.0.checked_add(u64::from(s.len)).is_none() {
            return Err(bad);
        }
        if s.len > 0 && !mem.check_range(s.addr, s.len as usize, access) {
            return Err(bad);
        }
    }
    Ok(())
}

fn read_bytes<M: GuestMemory + ?Sized>(
    mem: &M,
    segs: &[Segment],
    out: &mut [u8],
) -> Result<(), ParseError> {
    let mut off = 0usize;
    for s in segs {
        let n = s.len as usize;
        mem.read_slice(&mut out[off..off + n], s.addr)
            .map_err(|_| ParseError::BadAddress {
                addr: s.addr.0,
                len: u64::from(s.len),
            })?;
        off += n;
    }
    Ok(())
}

fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

fn le_u64(b: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[..8]);
    u64::from_le_bytes(w)
}

fn check_sectors(sector: u64, count: u64, capacity: u64) -> Result<(), ParseError> {
    match sector.checked_add(count) {
        Some(end) if end <= capacity => Ok(()),
        _ => Err(ParseError::OutOfRange {
            sector,
            count,
            capacity,
        }),
    }
}

impl Request {
    /// Parses the chain at its head; `mem` is the memory the chain lives
    /// in. Nothing is written to memory.
    ///
    /// # Errors
    /// A [`Rejected`] that says why and where to put the error status.
    pub fn parse<M>(
        chain: DescriptorChain<M>,
        mem: &M::Target,
        limits: &Limits,
    ) -> Result<Request, Rejected>
    where
        M: Deref,
        M::Target: GuestMemory,
    {
        let head = chain.head_index();
        Self::parse_descriptors(head, chain, mem, limits)
    }

    /// [`Request::parse`] for the descriptors of the chain at `head`
    /// however they were walked (e.g. a head resubmitted from an inflight
    /// record, whose chain is not on the available ring any more).
    ///
    /// # Errors
    /// As [`Request::parse`].
    pub fn parse_descriptors<M: GuestMemory + ?Sized>(
        head: u16,
        chain: impl IntoIterator<Item = Descriptor>,
        mem: &M,
        limits: &Limits,
    ) -> Result<Request, Rejected> {
        let mut readable: Vec<Segment> = Vec::new();
        let mut writable: Vec<Segment> = Vec::new();
        let mut structure: Result<(), ParseError> = Ok(());
        let mut last: Option<Descriptor> = None;
        let mut count = 0usize;
        for d in chain {
            count += 1;
            if count > MAX_DESCRIPTORS {
                structure = Err(ParseError::TooLong {
                    max: MAX_DESCRIPTORS,
                });
                break;
            }
            let seg = Segment {
                addr: GuestAddress(d.addr().0),
                len: d.len(),
            };
            if d.is_write_only() {
                writable.push(seg);
            } else {
                if !writable.is_empty() && structure.is_ok() {
                    structure = Err(ParseError::ReadableAfterWritable);
                }
                readable.push(seg);
            }
            last = Some(d);
        }
        match last {
            None => structure = Err(ParseError::Empty),
            // A loop shows up as a chain cut off after queue-size
            // descriptors, still pointing on; report that before whatever
            // the repeated descriptors look like.
            Some(d) if d.has_next() && !matches!(structure, Err(ParseError::TooLong { .. })) => {
                structure = Err(ParseError::BrokenChain);
            }
            _ => {}
        }
        // The status byte: the last byte of the last device-writable
        // descriptor with any length, if the device may write it.
        let status = writable.iter().rev().find(|s| s.len > 0).and_then(|s| {
            let at = s.addr.0.checked_add(u64::from(s.len) - 1)?;
            mem.check_range(GuestAddress(at), 1, Permissions::Write)
                .then_some(GuestAddress(at))
        });
        let reject = |error: ParseError| Rejected {
            head,
            error,
            status,
        };
        structure.map_err(reject)?;
        let status_at = match status {
            Some(s) => s,
            None if writable.iter().all(|s| s.len == 0) => {
                return Err(reject(ParseError::NoStatus));
            }
            None => {
                let s = writable.iter().rev().find(|s| s.len > 0);
                let (addr, len) = s.map_or((0, 0), |s| (s.addr.0, u64::from(s.len)));
                return Err(reject(ParseError::BadAddress { addr, len }));
            }
        };
        let kind = Self::parse_body(mem, &readable, &writable, limits).map_err(reject)?;
        Ok(Request {
            head,
            kind,
            status: status_at,
        })
    }

    fn parse_body<M: GuestMemory + ?Sized>(
        mem: &M,
        readable: &[Segment],
        writable: &[Segment],
        limits: &Limits,
    ) -> Result<RequestKind, ParseError> {
        let r_len = total(readable);
        let w_len = total(writable);
        if r_len < HEADER_LEN {
            return Err(ParseError::ShortHeader { len: r_len });
        }
        let header_segs = sub_segments(readable, 0, HEADER_LEN);
        check_access(mem, &header_segs, Permissions::Read)?;
        let mut header = [0u8; HEADER_LEN as usize];
        read_bytes(mem, &header_segs, &mut header)?;
        let kind = le_u32(&header[0..4]);
        let sector = le_u64(&header[8..16]);
        let out_data = sub_segments(readable, HEADER_LEN, r_len - HEADER_LEN);
        // `w_len >= 1`: the caller found a status byte.
        let in_data = sub_segments(writable, 0, w_len - 1);
        let out_len = r_len - HEADER_LEN;
        let in_len = w_len - 1;
        match kind {
            VIRTIO_BLK_T_IN => {
                if out_len != 0 {
                    return Err(ParseError::BadLayout { kind });
                }
                if in_len % SECTOR_SIZE != 0 {
                    return Err(ParseError::NotSectorMultiple { len: in_len });
                }
                check_sectors(sector, in_len / SECTOR_SIZE, limits.capacity)?;
                check_access(mem, &in_data, Permissions::Write)?;
                Ok(RequestKind::Read {
                    sector,
                    data: in_data,
                })
            }
            VIRTIO_BLK_T_OUT => {
                if in_len != 0 {
                    return Err(ParseError::BadLayout { kind });
                }
                if limits.readonly {
                    return Err(ParseError::ReadOnly);
                }
                if out_len % SECTOR_SIZE != 0 {
                    return Err(ParseError::NotSectorMultiple { len: out_len });
                }
                check_sectors(sector, out_len / SECTOR_SIZE, limits.capacity)?;
                check_access(mem, &out_data, Permissions::Read)?;
                Ok(RequestKind::Write {
                    sector,
                    data: out_data,
                })
            }
            VIRTIO_BLK_T_FLUSH => {
                if out_len != 0 || in_len != 0 {
                    return Err(ParseError::BadLayout { kind });
                }
                Ok(RequestKind::Flush)
            }
            VIRTIO_BLK_T_GET_ID => {
                if out_len != 0 || in_len == 0 {
                    return Err(ParseError::BadLayout { kind });
                }
                let data = sub_segments(writable, 0, in_len.min(VIRTIO_BLK_ID_BYTES as u64));
                check_access(mem, &data, Permissions::Write)?;
                Ok(RequestKind::GetId { data })
            }
            VIRTIO_BLK_T_DISCARD | VIRTIO_BLK_T_WRITE_ZEROES => {
                let discard = kind == VIRTIO_BLK_T_DISCARD;
                if in_len != 0 || out_len == 0 || out_len % DISCARD_SEG_LEN != 0 {
                    return Err(ParseError::BadLayout { kind });
                }
                let (max_seg, max_sectors) = if discard {
                    (limits.max_discard_seg, limits.max_discard_sectors)
                } else {
                    (limits.max_write_zeroes_seg, limits.max_write_zeroes_sectors)
                };
                let n = out_len / DISCARD_SEG_LEN;
                if n > u64::from(max_seg) {
                    return Err(ParseError::OverLimit);
                }
                check_access(mem, &out_data, Permissions::Read)?;
                let mut raw = vec![0u8; out_len as usize];
                read_bytes(mem, &out_data, &mut raw)?;
                let mut ranges = Vec::with_capacity(n as usize);
                for seg in raw.chunks_exact(DISCARD_SEG_LEN as usize) {
                    let sector = le_u64(&seg[0..8]);
                    let count = le_u32(&seg[8..12]);
                    let flags = le_u32(&seg[12..16]);
                    // Discard has no flags; write-zeroes only UNMAP.
                    let allowed = if discard { 0 } else { UNMAP_FLAG };
                    if flags & !allowed != 0 {
                        return Err(ParseError::UnsupportedFlags { flags });
                    }
                    if count > max_sectors {
                        return Err(ParseError::OverLimit);
                    }
                    check_sectors(sector, u64::from(count), limits.capacity)?;
                    ranges.push(SectorRange {
                        sector,
                        count,
                        unmap: flags & UNMAP_FLAG != 0,
                    });
                }
                if limits.readonly {
                    return Err(ParseError::ReadOnly);
                }
                Ok(if discard {
                    RequestKind::Discard(ranges)
                } else {
                    RequestKind::WriteZeroes(ranges)
                })
            }
            kind => Err(ParseError::UnsupportedType { kind }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
    use virtio_queue::mock::MockSplitQueue;
    use virtio_queue::{Queue, QueueOwnedT};
    use vm_memory::GuestMemoryMmap;

    const F_NEXT: u16 = 1;
    const F_WRITE: u16 = 2;

    fn limits() -> Limits {
        Limits {
            capacity: 64,
            readonly: false,
            max_discard_sectors: 16,
            max_discard_seg: 2,
            max_write_zeroes_sectors: 16,
            max_write_zeroes_seg: 2,
        }
    }

    fn header(kind: u32, sector: u64) -> [u8; 16] {
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&kind.to_le_bytes());
        h[8..16].copy_from_slice(&sector.to_le_bytes());
        h
    }

    /// Builds a chain of `(addr, len, flags)` descriptors (next = i + 1)
    /// and parses it.
    fn parse_chain(
        mem: &GuestMemoryMmap,
        descs: &[(u64, u32, u16)],
        next_override: Option<(usize, u16)>,
    ) -> Result<Request, Rejected> {
        let vq = MockSplitQueue::new(mem, 16);
        let raw: Vec<RawDescriptor> = descs
            .iter()
            .enumerate()
            .map(|(i, &(a, l, f))| {
                let mut next = (i + 1) as u16;
                if let Some((at, to)) = next_override {
                    if at == i {
                        next = to;
                    }
                }
                RawDescriptor::from(SplitDescriptor::new(a, l, f, next))
            })
            .collect();
        vq.add_desc_chains(&raw, 0).unwrap();
        let mut q: Queue = vq.create_queue().unwrap();
        let chain = q.iter(mem).unwrap().next().unwrap();
        Request::parse(chain, mem, &limits())
    }

    /// A header (16 bytes at 0x10_8000), one `data` descriptor and a
    /// status byte (at 0x10_b000): the descriptors of a one-segment request.
    fn chain3(data: (u64, u32, u16)) -> [(u64, u32, u16); 3] {
        [(0x10_8000, 16, F_NEXT), data, (0x10_b000, 1, F_WRITE)]
    }

    fn mem() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x20_0000)]).unwrap()
    }

    #[test]
    fn parses_read_write_with_split_header() {
        let m = mem();
        m.write_slice(&header(VIRTIO_BLK_T_OUT, 3), GuestAddress(0x10_8000))
            .unwrap();
        // Header split over two descriptors, data in two more.
        let r = parse_chain(
            &m,
            &[
                (0x10_8000, 10, F_NEXT),
                (0x10_800a, 6, F_NEXT),
                (0x10_9000, 512, F_NEXT),
                (0x10_a000, 1024, F_NEXT),
                (0x10_b000, 1, F_WRITE),
            ],
            None,
        )
        .unwrap();
        assert_eq!(
            r.kind,
            RequestKind::Write {
                sector: 3,
                data: vec![
                    Segment {
                        addr: GuestAddress(0x10_9000),
                        len: 512
                    },
                    Segment {
                        addr: GuestAddress(0x10_a000),
                        len: 1024
                    }
                ]
            }
        );
        assert_eq!(r.status, GuestAddress(0x10_b000));

        m.write_slice(&header(VIRTIO_BLK_T_IN, 0), GuestAddress(0x10_8000))
            .unwrap();
        // Data and status in one writable descriptor.
        let r = parse_chain(
            &m,
            &[(0x10_8000, 16, F_NEXT), (0x10_9000, 513, F_WRITE)],
            None,
        )
        .unwrap();
        assert_eq!(r.status, GuestAddress(0x10_9200));
        assert_eq!(r.data_in_len(), 512);
    }

    #[test]
    fn rejects_hostile_chains_with_the_right_status() {
        let m = mem();
        m.write_slice(&header(VIRTIO_BLK_T_IN, 0), GuestAddress(0x10_8000))
            .unwrap();
        let err = |d: &[(u64, u32, u16)], o| parse_chain(&m, d, o).unwrap_err();
        // Data outside memory.
        let e = err(&chain3((0x40_0000, 512, F_NEXT | F_WRITE)), None);
        assert!(matches!(e.error, ParseError::BadAddress { .. }));
        assert_eq!(e.status, Some(GuestAddress(0x10_b000)));
        assert_eq!(e.error.status(), VIRTIO_BLK_S_IOERR);
        // Length that wraps the address space.
        let e = err(&chain3((u64::MAX - 100, 512, F_NEXT | F_WRITE)), None);
        assert!(matches!(e.error, ParseError::BadAddress { .. }));
        // A loop: the status descriptor points back at the header.
        let e = err(
            &[
                (0x10_8000, 16, F_NEXT),
                (0x10_9000, 512, F_NEXT | F_WRITE),
                (0x10_b000, 1, F_WRITE | F_NEXT),
            ],
            Some((2, 0)),
        );
        assert_eq!(e.error, ParseError::BrokenChain);
        assert_eq!(e.status, Some(GuestAddress(0x10_b000)));
        // Past the capacity (64 sectors).
        m.write_slice(&header(VIRTIO_BLK_T_IN, 64), GuestAddress(0x10_8000))
            .unwrap();
        let e = err(&chain3((0x10_9000, 512, F_NEXT | F_WRITE)), None);
        assert!(matches!(e.error, ParseError::OutOfRange { .. }));
        m.write_slice(&header(VIRTIO_BLK_T_IN, u64::MAX), GuestAddress(0x10_8000))
            .unwrap();
        let e = err(&chain3((0x10_9000, 512, F_NEXT | F_WRITE)), None);
        assert!(matches!(e.error, ParseError::OutOfRange { .. }));
        // Not a sector multiple.
        m.write_slice(&header(VIRTIO_BLK_T_IN, 0), GuestAddress(0x10_8000))
            .unwrap();
        let e = err(&chain3((0x10_9000, 100, F_NEXT | F_WRITE)), None);
        assert_eq!(e.error, ParseError::NotSectorMultiple { len: 100 });
        // Short header, no status.
        let e = err(&[(0x10_8000, 8, F_NEXT), (0x10_b000, 1, F_WRITE)], None);
        assert_eq!(e.error, ParseError::ShortHeader { len: 8 });
        let e = err(&[(0x10_8000, 16, 0)], None);
        assert_eq!(e.error, ParseError::NoStatus);
        assert_eq!(e.status, None);
        // Unknown type.
        m.write_slice(&header(99, 0), GuestAddress(0x10_8000))
            .unwrap();
        let e = err(&[(0x10_8000, 16, F_NEXT), (0x10_b000, 1, F_WRITE)], None);
        assert_eq!(e.error.status(), VIRTIO_BLK_S_UNSUPP);
    }

    #[test]
    fn parses_discard_ranges_and_limits() {
        let m = mem();
        m.write_slice(
            &header(VIRTIO_BLK_T_WRITE_ZEROES, 0),
            GuestAddress(0x10_8000),
        )
        .unwrap();
        let mut seg = [0u8; 16];
        seg[0..8].copy_from_slice(&8u64.to_le_bytes());
        seg[8..12].copy_from_slice(&4u32.to_le_bytes());
        seg[12..16].copy_from_slice(&1u32.to_le_bytes());
        m.write_slice(&seg, GuestAddress(0x10_9000)).unwrap();
        let r = parse_chain(&m, &chain3((0x10_9000, 16, F_NEXT)), None).unwrap();
        assert_eq!(
            r.kind,
            RequestKind::WriteZeroes(vec![SectorRange {
                sector: 8,
                count: 4,
                unmap: true
            }])
        );
        m.write_slice(&header(VIRTIO_BLK_T_DISCARD, 0), GuestAddress(0x10_8000))
            .unwrap();
        let e = parse_chain(&m, &chain3((0x10_9000, 16, F_NEXT)), None).unwrap_err();
        assert_eq!(e.error, ParseError::UnsupportedFlags { flags: 1 });
        seg[8..12].copy_from_slice(&17u32.to_le_bytes());
        seg[12..16].copy_from_slice(&0u32.to_le_bytes());
        m.write_slice(&seg, GuestAddress(0x10_9000)).unwrap();
        let e = parse_chain(&m, &chain3((0x10_9000, 16, F_NEXT)), None).unwrap_err();
        assert_eq!(e.error, ParseError::OverLimit);
    }

    mod prop {
        use super::*;
        use proptest::prelude::*;

        fn addr() -> impl Strategy<Value = u64> {
            prop_oneof![
                Just(0x10_8000u64),
                (0x10_0000u64..0x20_0000),
                Just(0x20_0000 - 512),
                (0x20_0000u64..0x30_0000),
                Just(u64::MAX - 100),
                any::<u64>(),
            ]
        }

        fn len() -> impl Strategy<Value = u32> {
            prop_oneof![
                Just(0u32),
                Just(1),
                Just(16),
                Just(512),
                Just(513),
                Just(4096),
                Just(u32::MAX),
                any::<u32>(),
            ]
        }

        fn desc() -> impl Strategy<Value = (u64, u32, u16, u16)> {
            (addr(), len(), 0u16..8, 0u16..20)
        }

        proptest! {
            /// Whatever the chain, parsing never panics, and what it
            /// accepts lies inside memory with the access it will need.
            #[test]
            fn parse_accepts_only_what_fits(
                descs in proptest::collection::vec(desc(), 1..6),
                kind in prop_oneof![Just(0u32), Just(1), Just(4), Just(8), Just(11), Just(13), any::<u32>()],
                sector in prop_oneof![0u64..80, any::<u64>()],
                range in any::<[u8; 16]>(),
            ) {
                let m = mem();
                m.write_slice(&header(kind, sector), GuestAddress(0x10_8000)).unwrap();
                m.write_slice(&range, GuestAddress(0x10_9000)).unwrap();
                let vq = MockSplitQueue::new(&m, 16);
                let raw: Vec<RawDescriptor> = descs
                    .iter()
                    .map(|&(a, l, f, n)| RawDescriptor::from(SplitDescriptor::new(a, l, f, n)))
                    .collect();
                vq.add_desc_chains(&raw, 0).unwrap();
                let mut q: Queue = vq.create_queue().unwrap();
                let chain = q.iter(&m).unwrap().next().unwrap();
                let lim = limits();
                match Request::parse(chain, &m, &lim) {
                    Ok(r) => {
                        prop_assert!(m.check_range(r.status, 1, Permissions::Write));
                        let (segs, access) = match &r.kind {
                            RequestKind::Read { sector, data } | RequestKind::Write { sector, data } => {
                                let bytes: u64 = data.iter().map(|s| u64::from(s.len)).sum();
                                prop_assert_eq!(bytes % SECTOR_SIZE, 0);
                                prop_assert!(sector + bytes / SECTOR_SIZE <= lim.capacity);
                                let w = matches!(r.kind, RequestKind::Read { .. });
                                (data.clone(), if w { Permissions::Write } else { Permissions::Read })
                            }
                            RequestKind::GetId { data } => (data.clone(), Permissions::Write),
                            RequestKind::Discard(rs) | RequestKind::WriteZeroes(rs) => {
                                for x in rs {
                                    prop_assert!(x.sector + u64::from(x.count) <= lim.capacity);
                                }
                                (Vec::new(), Permissions::Read)
                            }
                            RequestKind::Flush => (Vec::new(), Permissions::Read),
                        };
                        for s in segs {
                            prop_assert!(s.len == 0 || m.check_range(s.addr, s.len as usize, access));
                        }
                    }
                    Err(rej) => {
                        if let Some(st) = rej.status {
                            prop_assert!(m.check_range(st, 1, Permissions::Write));
                        }
                        prop_assert!(rej.error.status() != VIRTIO_BLK_S_OK);
                    }
                }
            }
        }
    }
}
