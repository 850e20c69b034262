//! IOTLB updates, invalidations and translations interleaved, as a front
//! end's `IOTLB_MSG` payloads (through `IotlbMsg::parse`) into the device's
//! `VhostIommu`, checked against a byte-granular model: every translation
//! either covers exactly the bytes the model maps with the needed
//! permission, at the addresses it says, or fails when the model says some
//! byte is unmapped or lacks the permission.
#![no_main]

use std::collections::BTreeMap;

use arbitrary::Arbitrary;
use iopath_virtio::device::{IotlbMsg, VhostIommu};
use iopath_virtio::vhost_wire::RawIotlb;
use libfuzzer_sys::fuzz_target;
use vm_memory::{GuestAddress, Iommu, Permissions};

/// IOVAs of the modelled window: small, so the model can hold every byte.
const SPACE: u64 = 1 << 14;

#[derive(Debug, Arbitrary)]
enum Op {
    /// An `IOTLB_MSG` with any fields (type and permission included).
    Msg {
        iova: u16,
        size: u16,
        uaddr: u32,
        perm: u8,
        kind: u8,
    },
    /// A message near the top of the address space (must be refused or
    /// handled without wrapping).
    High {
        iova_from_top: u16,
        size: u16,
        kind: u8,
    },
    /// A device access.
    Translate { iova: u16, len: u16, access: u8 },
}

/// byte IOVA -> (user address of that byte, perm bits R1 W2).
type Model = BTreeMap<u64, (u64, u8)>;

fn access(a: u8) -> (Permissions, u8) {
    match a % 3 {
        0 => (Permissions::Read, 1),
        1 => (Permissions::Write, 2),
        _ => (Permissions::ReadWrite, 3),
    }
}

fn apply_model(model: &mut Model, msg: &IotlbMsg) {
    match *msg {
        IotlbMsg::Update {
            iova,
            size,
            uaddr,
            perm,
        } => {
            for i in 0..size {
                model.insert(iova + i, (uaddr + i, perm.to_wire()));
            }
        }
        IotlbMsg::Invalidate { iova, size } => {
            for i in 0..size {
                model.remove(&(iova + i));
            }
        }
    }
}

fuzz_target!(|ops: Vec<Op>| {
    let mmu = VhostIommu::new();
    let mut model = Model::new();
    for op in ops.into_iter().take(64) {
        match op {
            Op::Msg {
                iova,
                size,
                uaddr,
                perm,
                kind,
            } => {
                let iova = u64::from(iova) % SPACE;
                let size = u64::from(size) % (SPACE / 4);
                let raw = RawIotlb {
                    iova,
                    size,
                    uaddr: u64::from(uaddr),
                    perm,
                    kind,
                };
                match IotlbMsg::parse(&raw.encode()) {
                    Ok(msg) => {
                        // Only updates and invalidations of a non-empty
                        // range with a valid permission are accepted.
                        assert!(size > 0 && matches!(kind, 2 | 3), "{raw:?} accepted");
                        if kind == 2 {
                            assert!(matches!(perm, 1..=3), "{raw:?} accepted");
                        }
                        mmu.apply(&msg);
                        apply_model(&mut model, &msg);
                    }
                    Err(_) => assert!(
                        size == 0
                            || !matches!(kind, 2 | 3)
                            || (kind == 2 && !matches!(perm, 1..=3)),
                        "{raw:?} refused"
                    ),
                }
            }
            Op::High {
                iova_from_top,
                size,
                kind,
            } => {
                let iova = u64::MAX - u64::from(iova_from_top);
                let raw = RawIotlb {
                    iova,
                    size: u64::from(size),
                    uaddr: 0x1000,
                    perm: 3,
                    kind: 2 + kind % 2,
                };
                if let Ok(msg) = IotlbMsg::parse(&raw.encode()) {
                    // Accepted only if it does not wrap; it lies outside
                    // the modelled window, which it must leave untouched.
                    assert!(iova.checked_add(u64::from(size) - 1).is_some());
                    mmu.apply(&msg);
                }
                // A translation there never panics either.
                let _ = mmu.translate(GuestAddress(iova), usize::from(size), Permissions::Read);
            }
            Op::Translate {
                iova,
                len,
                access: a,
            } => {
                let iova = u64::from(iova) % SPACE;
                let len = u64::from(len) % 512 + 1;
                let (perm, bits) = access(a);
                let allowed = (iova..iova + len)
                    .all(|b| model.get(&b).is_some_and(|&(_, p)| p & bits == bits));
                match mmu.translate(GuestAddress(iova), len as usize, perm) {
                    Ok(it) => {
                        assert!(
                            allowed,
                            "translated {iova:#x}+{len} {perm:?} the model refuses"
                        );
                        let mut at = iova;
                        for r in it {
                            for i in 0..r.length as u64 {
                                let want = model[&(at + i)].0;
                                assert_eq!(
                                    r.base.0 + i,
                                    want,
                                    "byte {:#x} translated wrong",
                                    at + i
                                );
                            }
                            at += r.length as u64;
                        }
                        assert_eq!(
                            at,
                            iova + len,
                            "translation covers {} of {len} bytes",
                            at - iova
                        );
                    }
                    Err(_) => assert!(
                        !allowed,
                        "{iova:#x}+{len} {perm:?} refused, the model maps it"
                    ),
                }
            }
        }
    }
});
