//! The IOTLB message parser and the IOMMU: ranges, permissions, and misses
//! reported to the front end.

use super::*;

fn update(iova: u64, size: u64, uaddr: u64, perm: Perm) -> IotlbMsg {
    IotlbMsg::Update {
        iova,
        size,
        uaddr,
        perm,
    }
}

#[test]
fn parse_round_trips_and_rejects_bad_fields() {
    let m = update(0x1000, 0x2000, 0x7f00_0000, Perm::ReadWrite);
    assert_eq!(IotlbMsg::parse(&m.to_wire()), Ok(m));
    let mut w = m.to_wire();
    w[24] = 0;
    assert_eq!(IotlbMsg::parse(&w), Err(IotlbMsgError::BadPerm { perm: 0 }));
    w[24] = 1;
    w[25] = 1;
    assert_eq!(IotlbMsg::parse(&w), Err(IotlbMsgError::BadType { kind: 1 }));
    assert_eq!(
        IotlbMsg::parse(&w[..20]),
        Err(IotlbMsgError::BadSize { len: 20 })
    );
    let wrap = update(u64::MAX - 10, 100, 0, Perm::ReadOnly).to_wire();
    assert!(matches!(
        IotlbMsg::parse(&wrap),
        Err(IotlbMsgError::BadRange { .. })
    ));
    let empty = update(0, 0, 0, Perm::ReadOnly).to_wire();
    assert!(matches!(
        IotlbMsg::parse(&empty),
        Err(IotlbMsgError::BadRange { .. })
    ));
}

/// A front end that answers every miss with failure and never sends
/// an update (`virtio_uml`: "unexpected slave request 1"): the access
/// fails, and the IOMMU knows it faces a front end without one.
#[test]
fn refused_miss_without_updates_marks_a_front_end_without_iommu() {
    use std::io::{Read, Write};
    let mmu = VhostIommu::new();
    let (mine, mut theirs) = UnixStream::pair().unwrap();
    mmu.set_miss_channel(Some(mine), true);
    let front_end = std::thread::spawn(move || {
        let mut msg = [0u8; vhost_wire::HEADER_SIZE + IOTLB_MSG_SIZE];
        theirs.read_exact(&mut msg).unwrap();
        theirs
            .write_all(&vhost_wire::u64_reply(vhost_wire::BACKEND_IOTLB_MSG, 1))
            .unwrap();
        msg
    });
    assert!(!mmu.front_end_runs_no_iommu());
    let e = mmu
        .translate(GuestAddress(0x3100_0000), 16, Permissions::Read)
        .err()
        .unwrap();
    assert!(e.to_string().ends_with("IOTLB miss not answered"), "{e}");
    let msg = front_end.join().unwrap();
    let hdr = vhost_wire::Header::parse(msg[..12].try_into().unwrap());
    assert_eq!(hdr.request, vhost_wire::BACKEND_IOTLB_MSG);
    let miss = RawIotlb::decode(&msg[12..]).unwrap();
    assert_eq!((miss.iova, miss.kind), (0x3100_0000, IOTLB_MISS));
    assert!(mmu.front_end_runs_no_iommu());
}

#[test]
fn translate_enforces_ranges_and_permissions() {
    let mmu = VhostIommu::new();
    assert!(!mmu.apply(&update(0x10_000, 0x1000, 0x5000_0000, Perm::ReadOnly)));
    assert!(!mmu.apply(&update(0x11_000, 0x1000, 0x6000_0000, Perm::ReadWrite)));
    // Overlapping an existing entry is a change, as is an invalidation
    // that hits something; one over nothing is not.
    assert!(mmu.apply(&update(0x11_000, 0x800, 0x6000_0000, Perm::ReadWrite)));
    assert!(!mmu.apply(&IotlbMsg::Invalidate {
        iova: 0x90_000,
        size: 0x1000
    }));
    let got: Vec<_> = mmu
        .translate(GuestAddress(0x10_ff0), 0x20, Permissions::Read)
        .unwrap()
        .map(|r| (r.base.0, r.length))
        .collect();
    assert_eq!(got, vec![(0x5000_0ff0, 0x10), (0x6000_0000, 0x10)]);
    assert!(mmu
        .translate(GuestAddress(0x10_000), 4, Permissions::Write)
        .is_err());
    assert!(mmu
        .translate(GuestAddress(0x11_ff0), 0x20, Permissions::Read)
        .is_err());
    assert!(mmu
        .translate(GuestAddress(u64::MAX - 2), 16, Permissions::Read)
        .is_err());
    assert!(mmu.apply(&IotlbMsg::Invalidate {
        iova: 0x11_000,
        size: 0x800,
    }));
    assert!(mmu
        .translate(GuestAddress(0x11_000), 4, Permissions::Read)
        .is_err());
    assert!(mmu
        .translate(GuestAddress(0x11_800), 4, Permissions::Read)
        .is_ok());
    mmu.clear();
    assert!(mmu
        .translate(GuestAddress(0x10_000), 4, Permissions::Read)
        .is_err());
    // Without a miss channel no miss is reported: failures are not
    // counted as misses.
    let want = IotlbStats {
        updates: 3,
        invalidations: 2,
        misses: 0,
        unanswered: 0,
    };
    assert_eq!(mmu.stats(), want);
    assert_eq!(
        want.to_string(),
        "3 updates, 2 invalidations, 0 misses reported (0 unanswered)"
    );
}

/// A miss reported on the back-end channel is counted, and counted as
/// unanswered when no update follows.
#[test]
fn reported_misses_are_counted() {
    let mmu = VhostIommu::new();
    let (ours, mut theirs) = UnixStream::pair().unwrap();
    mmu.set_miss_channel(Some(ours), false);
    assert!(mmu
        .translate(GuestAddress(0x20_000), 8, Permissions::Read)
        .is_err());
    let stats = mmu.stats();
    assert!(stats.misses >= 1, "{stats}");
    assert_eq!(stats.misses, stats.unanswered, "{stats}");
    let mut msg = [0u8; vhost_wire::HEADER_SIZE + IOTLB_MSG_SIZE];
    theirs.read_exact(&mut msg).unwrap();
    assert_eq!(
        RawIotlb::decode(&msg[vhost_wire::HEADER_SIZE..]).map(|r| (r.iova, r.kind)),
        Some((0x20_000, IOTLB_MISS))
    );
}
