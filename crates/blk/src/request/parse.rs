//! [`Request::parse`]: a descriptor chain, seen as a byte stream, into a
//! checked [`Request`] or a [`Rejected`] with the status to complete it with.

use std::ops::Deref;

use virtio_queue::desc::split::Descriptor;
use virtio_queue::DescriptorChain;
use vm_memory::{ByteValued, Bytes, GuestAddress, GuestMemory, Permissions};

use super::error::{ParseError, Rejected};
use super::types::{Limits, Request, RequestKind, SectorRange, Segment};
use crate::wire::{
    OutHeader, RangeSegment, HEADER_LEN, RANGE_LEN, SECTOR_SIZE, VIRTIO_BLK_ID_BYTES,
    VIRTIO_BLK_T_DISCARD, VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN,
    VIRTIO_BLK_T_OUT, VIRTIO_BLK_T_WRITE_ZEROES, VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP,
};

/// [`HEADER_LEN`] and [`RANGE_LEN`] in the byte counts of a chain.
const HEADER_SIZE: u64 = HEADER_LEN as u64;
const RANGE_SEG_LEN: u64 = RANGE_LEN as u64;
/// Descriptors beyond this in one chain are refused (virtio-queue already
/// stops a looping chain after queue-size descriptors).
const MAX_DESCRIPTORS: usize = 4096;

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
        if r_len < HEADER_SIZE {
            return Err(ParseError::ShortHeader { len: r_len });
        }
        let header_segs = sub_segments(readable, 0, HEADER_SIZE);
        check_access(mem, &header_segs, Permissions::Read)?;
        let mut header = OutHeader::default();
        read_bytes(mem, &header_segs, header.as_mut_slice())?;
        let kind = header.kind();
        let sector = header.sector();
        let out_data = sub_segments(readable, HEADER_SIZE, r_len - HEADER_SIZE);
        // `w_len >= 1`: the caller found a status byte.
        let in_data = sub_segments(writable, 0, w_len - 1);
        let out_len = r_len - HEADER_SIZE;
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
                if in_len != 0 || out_len == 0 || out_len % RANGE_SEG_LEN != 0 {
                    return Err(ParseError::BadLayout { kind });
                }
                let (max_seg, max_sectors) = if discard {
                    (limits.max_discard_seg, limits.max_discard_sectors)
                } else {
                    (limits.max_write_zeroes_seg, limits.max_write_zeroes_sectors)
                };
                let n = out_len / RANGE_SEG_LEN;
                if n > u64::from(max_seg) {
                    return Err(ParseError::OverLimit);
                }
                check_access(mem, &out_data, Permissions::Read)?;
                let mut raw = vec![0u8; out_len as usize];
                read_bytes(mem, &out_data, &mut raw)?;
                let mut ranges = Vec::with_capacity(n as usize);
                for bytes in raw.chunks_exact(RANGE_LEN) {
                    let mut seg = RangeSegment::default();
                    seg.as_mut_slice().copy_from_slice(bytes);
                    let (sector, count, flags) = (seg.sector(), seg.num_sectors(), seg.flags());
                    // Discard has no flags; write-zeroes only UNMAP.
                    let allowed = if discard {
                        0
                    } else {
                        VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP
                    };
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
                        unmap: flags & VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP != 0,
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
