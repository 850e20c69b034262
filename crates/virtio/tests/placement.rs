//! Rings at fixed places (`SplitQueue::with_placement`): the legacy layout a
//! remoteproc resource table describes, inside a region at device address 0.

use std::sync::Arc;

use iopath_dma::{Coherent, Direct, DmaOps};
use iopath_heap::{Buffer, Heap, HugePages, MemfdHeap};
use iopath_virtio::{Error, QueueFeatures, RingPlacement, Seg, SplitQueue};

fn region() -> (Arc<Direct>, Buffer) {
    let shm = MemfdHeap::new(HugePages::None).alloc(0x10000).unwrap();
    let ops = Arc::new(Direct::new());
    ops.register_at(&shm, 0).unwrap();
    (ops, shm)
}

fn place(shm: &Buffer, offset: usize, align: usize) -> RingPlacement {
    RingPlacement {
        mem: Coherent::new(shm.clone(), 0),
        offset,
        align,
    }
}

fn u16_at(b: &Buffer, off: usize) -> u16 {
    let mut x = [0u8; 2];
    b.read_at(off, &mut x).unwrap();
    u16::from_le_bytes(x)
}

/// Plays the device: returns the next available head as used with `len`.
fn complete(shm: &Buffer, next: &mut u16, len: u32) {
    let head = u16_at(shm, 0x5004 + 2 * (*next as usize % 256));
    let mut e = [0u8; 8];
    e[..4].copy_from_slice(&u32::from(head).to_le_bytes());
    e[4..].copy_from_slice(&len.to_le_bytes());
    shm.write_at(0x6004 + 8 * (*next as usize % 256), &e)
        .unwrap();
    *next += 1;
    shm.write_at(0x6002, &next.to_le_bytes()).unwrap();
}

#[test]
fn legacy_layout_at_a_fixed_address() {
    let (ops, shm) = region();
    shm.fill(0x4000, 0x3000, 0xee).unwrap();
    let mut q = SplitQueue::with_placement(
        ops.clone(),
        0,
        256,
        QueueFeatures::default(),
        place(&shm, 0x4000, 0x1000),
    )
    .unwrap();
    let c = q.config();
    assert_eq!((c.desc, c.avail, c.used), (0x4000, 0x5000, 0x6000));
    // The window was zeroed (OpenAMP's driver zeroes its vrings too).
    assert_eq!(u16_at(&shm, 0x6002), 0);
    let data = Coherent::new(shm.clone(), 0);
    q.add(&[Seg::coherent(&data, 0x8000, 100)], &[], 1).unwrap();
    assert_eq!(u16_at(&shm, 0x5002), 1);
    let mut next = 0;
    // A device that reports the buffer length for a read-only buffer
    // (OpenAMP's device role does) is tolerated when asked.
    q.ignore_readonly_used_len(true);
    complete(&shm, &mut next, 100);
    let done = q.pop_used().unwrap().unwrap();
    assert_eq!((done.token, done.len), (1, 0));
    // Without the knob it breaks the queue, as before.
    q.ignore_readonly_used_len(false);
    q.add(&[Seg::coherent(&data, 0x8000, 100)], &[], 2).unwrap();
    complete(&shm, &mut next, 100);
    assert!(matches!(q.pop_used(), Err(Error::Device(_))));
    drop(q);
    // Placed rings are not the ops' to free: the region stays registered.
    assert_eq!(ops.regions().len(), 1);
}

#[test]
fn bad_placements_are_refused() {
    let (ops, shm) = region();
    for (offset, align) in [
        (0xf000, 0x1000),
        (0x4008, 0x1000),
        (0x4000, 0x1001),
        (0x4000, 2),
    ] {
        let r = SplitQueue::with_placement(
            ops.clone(),
            0,
            256,
            QueueFeatures::default(),
            place(&shm, offset, align),
        );
        assert!(
            matches!(r, Err(Error::BadPlacement { .. })),
            "{offset:#x} {align:#x}"
        );
    }
}
