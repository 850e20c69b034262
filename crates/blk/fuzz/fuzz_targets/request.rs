//! Descriptor chains from a hostile front end into the back end's
//! virtio-blk request path: `Request::parse`, then the parsed request
//! executed over an in-memory image through the same checked accessors the
//! executor uses (`get_slices` for the io_uring iovecs, `read_slice` /
//! `write_slice` for staging buffers, the `GET_ID` answer and the status
//! byte).
//!
//! Guest memory is three 64 KiB regions (data in two, with a hole between
//! them; the ring in the third). With
//! ACCESS_PLATFORM off, addresses are guest-physical; with it on they are
//! IOVAs translated through an IOTLB that the input fills (page-granular
//! updates with any permission, pointing anywhere, holes included).
//!
//! The target asserts what the back end promises a hostile front end:
//! every segment of an accepted request lies inside the regions (off) or
//! inside IOTLB mappings that allow the access, onto the regions (on); the
//! accessors never fail on what the parser accepted; and after execution
//! no byte of guest memory changed outside the device-writable segments
//! and the status byte.
#![no_main]

use std::collections::HashMap;

use arbitrary::Arbitrary;
use iopath_blk::request::{Limits, Rejected, Request, RequestKind, Segment};
use iopath_blk::wire::{OutHeader, HEADER_LEN, SECTOR_SIZE};
use iopath_virtio::device::{IotlbMsg, Perm, VhostIommu};
use libfuzzer_sys::fuzz_target;
use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
use virtio_queue::mock::MockSplitQueue;
use virtio_queue::{Queue, QueueOwnedT};
use vm_memory::{ByteValued, Bytes, GuestAddress, GuestMemory, GuestMemoryMmap, IommuMemory, Permissions};

const PAGE: u64 = 4096;
const REGION: u64 = 0x1_0000;
/// The regions' guest-physical bases; 0x1_0000..0x2_0000 is a hole. The
/// third holds the ring (identity-mapped read-write in the IOTLB, as a
/// front end maps its rings).
const REGIONS: [u64; 3] = [0, 0x2_0000, 0x10_0000];
const RING: u64 = REGIONS[2];
/// Where the IOVAs the input maps start.
const IOVA_BASE: u64 = 0x1_0000_0000;

#[derive(Debug, Arbitrary)]
enum Addr {
    /// `off` into region 0 or 1 (may run past its end).
    Region { second: bool, off: u16 },
    /// An IOVA page (of 32; the first 16 start mapped), and an offset in it.
    Iova { page: u8, off: u16 },
    /// Anything.
    Raw(u64),
}

#[derive(Debug, Arbitrary)]
struct Desc {
    addr: Addr,
    len: Len,
    write: bool,
    indirect: bool,
}

#[derive(Debug, Arbitrary)]
enum Len {
    /// Whole sectors.
    Sectors(u8),
    /// A header's or a status byte's worth, or a few bytes off.
    Small(u8),
    /// Anything.
    Raw(u32),
}

impl Len {
    fn bytes(&self) -> u32 {
        match *self {
            Len::Sectors(n) => u32::from(n) * 512,
            Len::Small(n) => u32::from(n % 24),
            Len::Raw(n) => n,
        }
    }
}

#[derive(Debug, Arbitrary)]
struct Map {
    /// Which IOVA page the change starts at (see its use).
    iova_page: u8,
    pages: u8,
    /// Target page in the guest-physical space (0..0x30, holes included).
    target_page: u8,
    perm: u8,
    invalidate: bool,
}

#[derive(Debug, Arbitrary)]
struct Input {
    access_platform: bool,
    readonly: bool,
    capacity: u16,
    maps: Vec<Map>,
    /// 16-byte writes into guest memory before parsing (discard ranges,
    /// anything): (region, offset, bytes).
    fills: Vec<(bool, u16, [u8; 16])>,
    /// The request type (index into the known ones, else `raw_kind`) and
    /// sector written as the header at the first descriptor's address.
    kind: u8,
    raw_kind: u32,
    sector: u16,
    /// Descriptors 0, 1, ... chained in order, the last one ending it.
    descs: Vec<Desc>,
    /// Descriptor `.0` chains to `.1` instead (loops, skips).
    relink: Option<(u8, u8)>,
    /// Take each descriptor's write flag, length and indirect flag from the
    /// input; else the shape of a request of `kind` (a 16-byte readable
    /// header, data as the type wants, a 1-byte writable status), so deep
    /// paths are reached often.
    free_flags: bool,
    /// The status byte of a shaped chain (after the input's descriptors).
    status_at: Addr,
}

impl Addr {
    fn resolve(&self) -> u64 {
        match *self {
            Addr::Region { second, off } => REGIONS[usize::from(second)] + u64::from(off),
            Addr::Iova { page, off } => IOVA_BASE + u64::from(page % 32) * PAGE + u64::from(off),
            Addr::Raw(a) => a,
        }
    }
}

fn perm(p: u8) -> Perm {
    match p % 3 {
        0 => Perm::ReadOnly,
        1 => Perm::WriteOnly,
        _ => Perm::ReadWrite,
    }
}

fn allows(p: Perm, write: bool) -> bool {
    match p {
        Perm::ReadWrite => true,
        Perm::ReadOnly => !write,
        Perm::WriteOnly => write,
    }
}

/// Whether guest-physical `gpa..gpa + len` lies inside one region.
fn in_region(gpa: u64, len: u64) -> bool {
    REGIONS
        .iter()
        .any(|&b| gpa >= b && gpa.checked_add(len).is_some_and(|e| e <= b + REGION))
}

/// The model of the IOTLB: IOVA page -> (guest-physical page, permission).
type Model = HashMap<u64, (u64, Perm)>;

/// The guest-physical byte ranges `addr..addr + len` reaches, if the whole
/// of it is reachable for a `write` (or read) access; `None` otherwise.
fn reach(model: Option<&Model>, addr: u64, len: u64, write: bool) -> Option<Vec<(u64, u64)>> {
    let end = addr.checked_add(len)?;
    let Some(model) = model else {
        return in_region(addr, len).then(|| vec![(addr, len)]);
    };
    let mut out = Vec::new();
    let mut at = addr;
    while at < end {
        let page = at / PAGE;
        let (target, p) = *model.get(&page)?;
        if !allows(p, write) {
            return None;
        }
        let n = (PAGE - at % PAGE).min(end - at);
        let gpa = target * PAGE + at % PAGE;
        if !in_region(gpa, n) {
            return None;
        }
        out.push((gpa, n));
        at += n;
    }
    Some(out)
}

fn snapshot(mem: &GuestMemoryMmap) -> Vec<Vec<u8>> {
    REGIONS
        .iter()
        .map(|&b| {
            let mut v = vec![0u8; REGION as usize];
            mem.read_slice(&mut v, GuestAddress(b)).unwrap();
            v
        })
        .collect()
}

fuzz_target!(|input: Input| {
    let data =
        GuestMemoryMmap::<()>::from_ranges(&REGIONS.map(|b| (GuestAddress(b), REGION as usize)))
            .unwrap();
    for (second, off, bytes) in input.fills.iter().take(16) {
        let at = REGIONS[usize::from(*second)] + u64::from(*off);
        let _ = data.write_slice(bytes, GuestAddress(at));
    }
    // The IOTLB, and its model at page granularity.
    let iommu = VhostIommu::new();
    let mut model = Model::new();
    if input.access_platform {
        iommu.apply(&IotlbMsg::Update {
            iova: RING,
            size: REGION,
            uaddr: RING,
            perm: Perm::ReadWrite,
        });
        for p in 0..REGION / PAGE {
            model.insert(RING / PAGE + p, (RING / PAGE + p, Perm::ReadWrite));
        }
        // The data regions start identity-mapped read-write, and IOVA
        // pages 0..16 mapped onto region 0 (the input's updates and
        // invalidations then change both).
        for (iova, gpa) in [
            (REGIONS[0], REGIONS[0]),
            (REGIONS[1], REGIONS[1]),
            (IOVA_BASE, REGIONS[0]),
        ] {
            iommu.apply(&IotlbMsg::Update {
                iova,
                size: REGION,
                uaddr: gpa,
                perm: Perm::ReadWrite,
            });
            for p in 0..REGION / PAGE {
                model.insert(iova / PAGE + p, (gpa / PAGE + p, Perm::ReadWrite));
            }
        }
        for m in input.maps.iter().take(16) {
            // High bit: a page of the IOVA window; else a page of the
            // identity-mapped guest-physical range.
            let iova_page = if m.iova_page & 0x80 != 0 {
                IOVA_BASE / PAGE + u64::from(m.iova_page & 0x1f)
            } else {
                u64::from(m.iova_page % 0x30)
            };
            let pages = u64::from(m.pages % 8) + 1;
            let (iova, size) = (iova_page * PAGE, pages * PAGE);
            if m.invalidate {
                iommu.apply(&IotlbMsg::Invalidate { iova, size });
                for p in 0..pages {
                    model.remove(&(iova_page + p));
                }
            } else {
                let target = u64::from(m.target_page % 0x30);
                let p = perm(m.perm);
                iommu.apply(&IotlbMsg::Update {
                    iova,
                    size,
                    uaddr: target * PAGE,
                    perm: p,
                });
                for i in 0..pages {
                    model.insert(iova_page + i, (target + i, p));
                }
            }
        }
    }
    let view = IommuMemory::new(data.clone(), iommu, input.access_platform, ());
    let model = input.access_platform.then_some(&model);

    // The header where the first descriptor points, written the way the
    // front end would (into guest-physical memory behind the IOVA).
    const KINDS: [u32; 6] = [0, 1, 4, 8, 11, 13];
    let kind = KINDS
        .get(usize::from(input.kind))
        .copied()
        .unwrap_or(input.raw_kind);
    let header = OutHeader::new(kind, u64::from(input.sector));
    let header = header.as_slice();
    if let Some(first) = input.descs.first() {
        if let Some(pieces) = reach(model, first.addr.resolve(), HEADER_LEN as u64, false) {
            let mut at = 0usize;
            for (gpa, n) in pieces {
                let _ = data.write_slice(&header[at..at + n as usize], GuestAddress(gpa));
                at += n as usize;
            }
        }
    }

    // The chain, in the ring region.
    let vq = MockSplitQueue::create(&data, GuestAddress(RING), 16);
    // (address, length, device-writable, indirect) of each descriptor.
    let mut list: Vec<(u64, u32, bool, bool)> = input
        .descs
        .iter()
        .take(15)
        .enumerate()
        .map(|(i, d)| {
            if input.free_flags {
                (d.addr.resolve(), d.len.bytes(), d.write, d.indirect)
            } else if i == 0 {
                (d.addr.resolve(), 16, false, false)
            } else {
                (
                    d.addr.resolve(),
                    d.len.bytes(),
                    kind == 0 || kind == 8,
                    false,
                )
            }
        })
        .collect();
    if !input.free_flags {
        list.push((input.status_at.resolve(), 1, true, false));
    }
    let n = list.len();
    let descs: Vec<RawDescriptor> = list
        .iter()
        .enumerate()
        .map(|(i, &(addr, len, write, indirect))| {
            let mut flags = 0u16;
            let mut next = (i + 1) as u16;
            let relinked = input.relink.filter(|&(from, _)| usize::from(from) % n == i);
            if let Some((_, to)) = relinked {
                next = u16::from(to) % 16;
            }
            if write {
                flags |= 2;
            }
            if i + 1 < n || relinked.is_some() {
                flags |= 1;
            }
            if indirect {
                flags |= 4;
            }
            RawDescriptor::from(SplitDescriptor::new(addr, len, flags, next))
        })
        .collect();
    if descs.is_empty() || vq.add_desc_chains(&descs, 0).is_err() {
        return;
    }
    let Ok(mut q) = vq.create_queue::<Queue>() else {
        return;
    };
    let Some(chain) = q.iter(&view).ok().and_then(|mut it| it.next()) else {
        return;
    };
    let limits = Limits {
        capacity: 256 + u64::from(input.capacity),
        readonly: input.readonly,
        max_discard_sectors: 64,
        max_discard_seg: 4,
        max_write_zeroes_sectors: 64,
        max_write_zeroes_seg: 4,
    };
    let before = snapshot(&data);
    let parsed = Request::parse(chain, &view, &limits);

    // Execute, noting every guest-physical byte the device may write.
    let mut writable: Vec<(u64, u64)> = Vec::new();
    let mut may_write = |addr: GuestAddress, len: u64| {
        let r = reach(model, addr.0, len, true);
        let r = r.unwrap_or_else(|| panic!("write outside the granted memory: {addr:?}+{len}"));
        writable.extend(r);
    };
    match parsed {
        Ok(req) => {
            let check_data = |segs: &[Segment], write: bool| {
                for s in segs {
                    assert!(
                        reach(model, s.addr.0, u64::from(s.len), write).is_some(),
                        "accepted segment {s:?} (write {write}) outside the granted memory"
                    );
                    // The executor's iovecs come from these, checked.
                    let access = if write {
                        Permissions::Write
                    } else {
                        Permissions::Read
                    };
                    let slices = view.get_slices(s.addr, s.len as usize, access).unwrap();
                    for sl in slices {
                        sl.unwrap();
                    }
                }
            };
            match &req.kind {
                RequestKind::Read { sector, data: segs } => {
                    let bytes: u64 = segs.iter().map(|s| u64::from(s.len)).sum();
                    assert!(sector * SECTOR_SIZE + bytes <= limits.capacity * SECTOR_SIZE);
                    check_data(segs, true);
                    for s in segs {
                        may_write(s.addr, u64::from(s.len));
                        view.write_slice(&vec![0x11; s.len as usize], s.addr)
                            .unwrap();
                    }
                }
                RequestKind::Write { sector, data: segs } => {
                    assert!(!limits.readonly);
                    let bytes: u64 = segs.iter().map(|s| u64::from(s.len)).sum();
                    assert!(sector * SECTOR_SIZE + bytes <= limits.capacity * SECTOR_SIZE);
                    check_data(segs, false);
                    for s in segs {
                        let mut b = vec![0; s.len as usize];
                        view.read_slice(&mut b, s.addr).unwrap();
                    }
                }
                RequestKind::GetId { data: segs } => {
                    check_data(segs, true);
                    for s in segs {
                        may_write(s.addr, u64::from(s.len));
                        view.write_slice(&vec![0x22; s.len as usize], s.addr)
                            .unwrap();
                    }
                }
                RequestKind::Discard(ranges) | RequestKind::WriteZeroes(ranges) => {
                    assert!(!limits.readonly);
                    for r in ranges {
                        assert!(r.sector + u64::from(r.count) <= limits.capacity);
                    }
                }
                RequestKind::Flush => {}
            }
            may_write(req.status, 1);
            view.write_obj(0u8, req.status).unwrap();
        }
        Err(Rejected { status, .. }) => {
            if let Some(at) = status {
                may_write(at, 1);
                view.write_obj(1u8, at).unwrap();
            }
        }
    }

    // Nothing changed outside what the device may write.
    let after = snapshot(&data);
    for (ri, (b, a)) in before.iter().zip(&after).enumerate() {
        for (i, (x, y)) in b.iter().zip(a).enumerate() {
            if x != y {
                let gpa = REGIONS[ri] + i as u64;
                assert!(
                    writable.iter().any(|&(s, n)| gpa >= s && gpa < s + n),
                    "guest byte {gpa:#x} changed outside the writable segments"
                );
            }
        }
    }
});
