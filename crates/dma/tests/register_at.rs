//! `Direct::register_at`: regions at device addresses the platform fixes
//! (remoteproc shared memory: device address = offset into the file).

use iopath_dma::{Direct, Direction, DmaOps, Error, MapWait};
use iopath_heap::{Heap, HugePages, MemfdHeap};

#[test]
fn fixed_address_regions() {
    let heap = MemfdHeap::new(HugePages::None);
    let shm = heap.alloc(0x80000).unwrap();
    let ops = Direct::new();
    assert_eq!(ops.register_at(&shm, 0).unwrap(), 0);
    // Device address = offset.
    let m = ops
        .map(&shm, 0x10200, 512, Direction::FromDevice, MapWait::Block)
        .unwrap();
    assert_eq!(m.addr(), 0x10200);
    ops.unmap(&m).unwrap();
    // Twice, or overlapping another region: refused.
    assert!(matches!(
        ops.register_at(&shm, 0x100000),
        Err(Error::AlreadyRegistered { addr: 0 })
    ));
    let other = heap.alloc(0x1000).unwrap();
    assert!(matches!(
        ops.register_at(&other, 0x7f000),
        Err(Error::AddressSpace)
    ));
    assert!(matches!(
        ops.register_at(&other, u64::MAX - 10),
        Err(Error::AddressSpace)
    ));
    // Automatic placement still works and does not collide.
    ops.register(&other).unwrap();
    let m = ops
        .map(&other, 0, 16, Direction::ToDevice, MapWait::Block)
        .unwrap();
    assert!(m.addr() >= 0x80000);
    ops.unmap(&m).unwrap();
    assert_eq!(ops.regions().len(), 2);
}
