//! Unit and property tests of the parser.

use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
use virtio_queue::mock::MockSplitQueue;
use virtio_queue::{Queue, QueueOwnedT};
use vm_memory::{ByteValued, Bytes, GuestAddress, GuestMemory, GuestMemoryMmap, Permissions};

use super::*;
use crate::wire::{
    OutHeader, RangeSegment, HEADER_LEN, SECTOR_SIZE, VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK,
    VIRTIO_BLK_S_UNSUPP, VIRTIO_BLK_T_DISCARD, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT,
    VIRTIO_BLK_T_WRITE_ZEROES,
};

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

fn header(kind: u32, sector: u64) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h.copy_from_slice(OutHeader::new(kind, sector).as_slice());
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
    m.write_obj(RangeSegment::new(8, 4, true), GuestAddress(0x10_9000))
        .unwrap();
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
    m.write_obj(RangeSegment::new(8, 17, false), GuestAddress(0x10_9000))
        .unwrap();
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
