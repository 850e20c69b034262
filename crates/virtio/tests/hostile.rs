//! The test plays the device by hand on the shared ring memory (through its
//! own mappings of the fds): descriptor format, notification suppression,
//! and a device that breaks the protocol — errors, never a panic.

use std::sync::Arc;

use iopath_dma::testing::DeviceView;
use iopath_dma::{Direct, DmaOps};
use iopath_heap::{Buffer, Heap, HugePages, MemfdHeap};
use iopath_virtio::{DeviceError, Error, QueueConfig, QueueFeatures, Seg, SplitQueue};

const SIZE: u16 = 8;

struct Rig {
    ops: Arc<Direct>,
    q: SplitQueue<Direct>,
    view: DeviceView,
    cfg: QueueConfig,
    out: Buffer,
    inb: Buffer,
}

fn rig(event_idx: bool, indirect: bool) -> Rig {
    let ops = Arc::new(Direct::new());
    let q = SplitQueue::new(
        ops.clone(),
        0,
        SIZE,
        QueueFeatures {
            event_idx,
            indirect,
        },
    )
    .unwrap();
    let heap = MemfdHeap::new(HugePages::None);
    let (out, inb) = (heap.alloc(4096).unwrap(), heap.alloc(4096).unwrap());
    ops.register(&out).unwrap();
    ops.register(&inb).unwrap();
    let view = DeviceView::connect(&*ops).unwrap();
    let cfg = q.config();
    Rig {
        ops,
        q,
        view,
        cfg,
        out,
        inb,
    }
}

impl Rig {
    fn r16(&self, addr: u64) -> u16 {
        let mut b = [0u8; 2];
        self.view.read(addr, &mut b).unwrap();
        u16::from_le_bytes(b)
    }
    fn w16(&self, addr: u64, v: u16) {
        self.view.write(addr, &v.to_le_bytes()).unwrap();
    }
    fn desc(&self, table: u64, i: u16) -> (u64, u32, u16, u16) {
        let mut b = [0u8; 16];
        self.view.read(table + 16 * i as u64, &mut b).unwrap();
        (
            u64::from_le_bytes(b[0..8].try_into().unwrap()),
            u32::from_le_bytes(b[8..12].try_into().unwrap()),
            u16::from_le_bytes(b[12..14].try_into().unwrap()),
            u16::from_le_bytes(b[14..16].try_into().unwrap()),
        )
    }
    fn avail_idx(&self) -> u16 {
        self.r16(self.cfg.avail + 2)
    }
    fn avail_head(&self, slot: u16) -> u16 {
        self.r16(self.cfg.avail + 4 + 2 * slot as u64)
    }
    fn used_event(&self) -> u16 {
        self.r16(self.cfg.avail + 4 + 2 * SIZE as u64)
    }
    fn set_avail_event(&self, v: u16) {
        self.w16(self.cfg.used + 4 + 8 * SIZE as u64, v);
    }
    fn push_used(&self, slot: u16, id: u32, len: u32) {
        let mut b = [0u8; 8];
        b[..4].copy_from_slice(&id.to_le_bytes());
        b[4..].copy_from_slice(&len.to_le_bytes());
        self.view
            .write(self.cfg.used + 4 + 8 * slot as u64, &b)
            .unwrap();
    }
    fn set_used_idx(&self, v: u16) {
        self.w16(self.cfg.used + 2, v);
    }
    fn add_simple(&mut self, token: u64) -> u16 {
        self.q
            .add(
                &[Seg::buf(&self.out, 0, 5)],
                &[Seg::buf(&self.inb, 0, 16)],
                token,
            )
            .unwrap()
    }
}

#[test]
fn hand_written_device_reads_the_chain_and_completes_it() {
    let mut r = rig(false, false);
    r.out.write_at(0, b"hello").unwrap();
    let head = r.add_simple(42);
    assert_eq!(r.avail_idx(), 1);
    assert_eq!(r.avail_head(0), head);
    let (addr, len, flags, next) = r.desc(r.cfg.desc, head);
    assert_eq!((len, flags), (5, 1), "readable, NEXT");
    let mut got = [0u8; 5];
    r.view.read(addr, &mut got).unwrap();
    assert_eq!(&got, b"hello");
    let (waddr, wlen, wflags, _) = r.desc(r.cfg.desc, next);
    assert_eq!((wlen, wflags), (16, 2), "writable, last");
    r.view.write(waddr, b"HELLO").unwrap();
    r.push_used(0, head as u32, 5);
    r.set_used_idx(1);
    let c = r.q.pop_used().unwrap().unwrap();
    assert_eq!((c.token, c.len), (42, 5));
    let mut back = [0u8; 5];
    r.inb.read_at(0, &mut back).unwrap();
    assert_eq!(&back, b"HELLO");
    assert_eq!(r.q.num_free(), SIZE);
    assert_eq!(r.ops.live_mappings(), 0);
    assert!(r.q.pop_used().unwrap().is_none());
}

#[test]
fn indirect_table_holds_the_segments() {
    let mut r = rig(false, true);
    r.out.write_at(0, b"abcdef").unwrap();
    let head =
        r.q.add(
            &[Seg::buf(&r.out, 0, 3), Seg::buf(&r.out, 3, 3)],
            &[Seg::buf(&r.inb, 0, 8)],
            1,
        )
        .unwrap();
    assert_eq!(
        r.q.num_free(),
        SIZE - 1,
        "one descriptor for three segments"
    );
    let (table, len, flags, _) = r.desc(r.cfg.desc, head);
    assert_eq!((len, flags), (48, 4), "INDIRECT, 3 entries");
    let mut seen = Vec::new();
    for i in 0..2 {
        let (a, l, f, n) = r.desc(table, i);
        assert_eq!((l, f, n), (3, 1, i + 1));
        let mut b = [0u8; 3];
        r.view.read(a, &mut b).unwrap();
        seen.extend(b);
    }
    assert_eq!(seen, b"abcdef");
    assert_eq!(r.desc(table, 2).2, 2, "last entry writable, no NEXT");
}

#[test]
fn the_driver_area_shares_the_rings_region_and_is_bounded() {
    let ops = Arc::new(Direct::new());
    let features = QueueFeatures {
        event_idx: false,
        indirect: true,
    };
    let mut q = SplitQueue::with_area(ops.clone(), 0, SIZE, features, 64).unwrap();
    assert_eq!(ops.regions().len(), 1, "rings, tables and area: one region");
    let view = DeviceView::connect(&*ops).unwrap();
    let cfg = q.config();
    let last = 64 * (usize::from(SIZE) - 1);
    q.area_write(last, b"head").unwrap();
    let mut back = [0u8; 4];
    q.area_read(last, &mut back).unwrap();
    assert_eq!(&back, b"head");
    let head = q
        .add(&[Seg::area(last, 4)], &[Seg::area(last + 8, 1)], 5)
        .unwrap();
    // Through the indirect table (in the same region), the device finds
    // the bytes at the first descriptor's address.
    let desc = |at: u64| {
        let mut d = [0u8; 16];
        view.read(at, &mut d).unwrap();
        u64::from_le_bytes(d[..8].try_into().unwrap())
    };
    let addr = desc(desc(cfg.desc + 16 * u64::from(head)));
    let mut seen = [0u8; 4];
    view.read(addr, &mut seen).unwrap();
    assert_eq!(&seen, b"head");
    view.write(addr + 8, &[0x5a]).unwrap();
    let mut status = [0u8; 1];
    q.area_read(last + 8, &mut status).unwrap();
    assert_eq!(status, [0x5a]);
    // Past the area's end: refused, and nothing is added.
    let out_of_range = |e: Error| {
        matches!(
            e,
            Error::Dma(iopath_dma::Error::Heap(iopath_heap::Error::OutOfRange {
                len: 2,
                buf_len: 512,
                ..
            }))
        )
    };
    assert!(out_of_range(q.area_write(511, b"xy").unwrap_err()));
    assert!(out_of_range(q.area_read(511, &mut [0u8; 2]).unwrap_err()));
    let free = q.num_free();
    let e = q.add(&[Seg::area(511, 2)], &[], 6).unwrap_err();
    assert!(out_of_range(e));
    assert_eq!(q.num_free(), free);
}

#[test]
fn short_requests_chain_in_the_ring_while_it_has_room() {
    let mut r = rig(false, true);
    r.q.chain_up_to(3);
    r.out.write_at(0, b"abcdef").unwrap();
    let three = |r: &mut Rig, token| {
        r.q.add(
            &[Seg::buf(&r.out, 0, 3), Seg::buf(&r.out, 3, 3)],
            &[Seg::buf(&r.inb, 0, 8)],
            token,
        )
        .unwrap()
    };
    // Two chains of three take 6 of the 8 descriptors: no INDIRECT flag,
    // each segment where it belongs.
    for token in 0..2 {
        let head = three(&mut r, token);
        assert_eq!(r.q.num_free(), SIZE - 3 * (token as u16 + 1));
        let (a0, l0, f0, n0) = r.desc(r.cfg.desc, head);
        let (_, l1, f1, n1) = r.desc(r.cfg.desc, n0);
        let (_, l2, f2, _) = r.desc(r.cfg.desc, n1);
        assert_eq!(
            (l0, f0, l1, f1, l2, f2),
            (3, 1, 3, 1, 8, 2),
            "NEXT, NEXT, WRITE"
        );
        let mut b = [0u8; 3];
        r.view.read(a0, &mut b).unwrap();
        assert_eq!(&b, b"abc");
    }
    // Two descriptors left: the third request goes in an indirect table.
    let head = three(&mut r, 2);
    assert_eq!(r.q.num_free(), 1, "one descriptor for three segments");
    let (_, len, flags, _) = r.desc(r.cfg.desc, head);
    assert_eq!((len, flags), (48, 4), "INDIRECT, 3 entries");
    // A request of four segments is longer than the chain limit.
    let four = r.q.add(
        &[Seg::buf(&r.out, 0, 2), Seg::buf(&r.out, 2, 2)],
        &[Seg::buf(&r.inb, 0, 4), Seg::buf(&r.inb, 4, 4)],
        3,
    );
    assert_eq!(r.desc(r.cfg.desc, four.unwrap()).2, 4, "INDIRECT");
    assert_eq!(r.q.num_free(), 0);
}

#[test]
fn event_idx_suppresses_kicks_until_avail_event_is_passed() {
    let mut r = rig(true, false);
    r.set_avail_event(2);
    r.add_simple(0);
    assert!(!r.q.should_notify(), "idx 0 published, device waits for 2");
    r.add_simple(1);
    assert!(!r.q.should_notify(), "idx 1 published");
    r.add_simple(2);
    assert!(r.q.should_notify(), "idx 2 published: notify");
    r.add_simple(3);
    assert!(!r.q.should_notify(), "already notified for 2");
}

#[test]
fn no_notify_flag_suppresses_kicks_without_event_idx() {
    let mut r = rig(false, false);
    r.w16(r.cfg.used, 1); // VIRTQ_USED_F_NO_NOTIFY
    r.add_simple(0);
    assert!(!r.q.should_notify());
    r.w16(r.cfg.used, 0);
    r.add_simple(1);
    assert!(r.q.should_notify());
    assert!(!r.q.should_notify(), "nothing new to notify about");
}

#[test]
fn interrupt_suppression_fields() {
    // EVENT_IDX: used_event follows the consumed index.
    let mut r = rig(true, false);
    assert_eq!(r.used_event(), 0);
    let h = r.add_simple(0);
    r.push_used(0, h as u32, 0);
    r.set_used_idx(1);
    assert!(!r.q.enable_interrupts(), "a completion is pending");
    r.q.pop_used().unwrap().unwrap();
    assert_eq!(r.used_event(), 1, "interrupt wanted at the next used entry");
    assert!(r.q.enable_interrupts());
    // Suppressed: an index the device has passed; enabling puts it back.
    r.q.disable_interrupts();
    assert_eq!(r.used_event(), 0);
    assert!(r.q.enable_interrupts());
    assert_eq!(r.used_event(), 1);

    // Without: the NO_INTERRUPT flag.
    let mut r = rig(false, false);
    r.q.disable_interrupts();
    assert_eq!(r.r16(r.cfg.avail), 1);
    assert!(r.q.enable_interrupts());
    assert_eq!(r.r16(r.cfg.avail), 0);
}

#[test]
fn delayed_interrupt_lets_n_completions_pass() {
    // EVENT_IDX: used_event n entries ahead; asleep-safe only while at
    // most n completions are pending.
    let mut r = rig(true, false);
    let heads: Vec<u16> = (0..4).map(|t| r.add_simple(t)).collect();
    assert!(r.q.enable_interrupts_after(2));
    assert_eq!(r.used_event(), 2, "interrupt at the third completion");
    for (i, h) in heads.iter().take(2).enumerate() {
        r.push_used(i as u16, u32::from(*h), 0);
    }
    r.set_used_idx(2);
    assert!(r.q.enable_interrupts_after(2), "two pending, two may pass");
    r.push_used(2, u32::from(heads[2]), 0);
    r.set_used_idx(3);
    assert!(!r.q.enable_interrupts_after(2), "three pending: take them");
    // Taking completions while suppressed leaves used_event where it was
    // put (one store, not one per completion).
    r.q.disable_interrupts();
    let suppressed = r.used_event();
    r.q.disable_interrupts();
    for _ in 0..3 {
        r.q.pop_used().unwrap().unwrap();
    }
    assert_eq!(r.used_event(), suppressed);
    assert!(r.q.enable_interrupts_after(5));
    assert_eq!(r.used_event(), 8);

    // Without EVENT_IDX there is no index to put ahead: the next
    // completion interrupts, and one pending is already too many.
    let mut r = rig(false, false);
    let h = r.add_simple(0);
    r.q.disable_interrupts();
    r.push_used(0, u32::from(h), 0);
    r.set_used_idx(1);
    assert!(!r.q.enable_interrupts_after(3));
    assert_eq!(r.r16(r.cfg.avail), 0, "NO_INTERRUPT cleared");
}

fn assert_broken(r: &mut Rig, expect: DeviceError) {
    match r.q.pop_used() {
        Err(Error::Device(e)) => assert_eq!(e, expect),
        other => panic!("expected {expect:?}, got {other:?}"),
    }
    assert!(r.q.is_broken());
    assert!(matches!(r.q.pop_used(), Err(Error::Broken)));
    assert!(matches!(
        r.q.add(&[Seg::buf(&r.out, 0, 1)], &[], 9),
        Err(Error::Broken)
    ));
}

#[test]
fn used_id_out_of_range() {
    let mut r = rig(true, true);
    r.add_simple(0);
    r.push_used(0, 100, 0);
    r.set_used_idx(1);
    assert_broken(
        &mut r,
        DeviceError::UsedIdOutOfRange {
            id: 100,
            size: SIZE,
        },
    );
}

#[test]
fn used_id_not_in_flight() {
    let mut r = rig(false, false);
    let h = r.add_simple(0);
    r.push_used(0, (h + 3) as u32, 0);
    r.set_used_idx(1);
    assert_broken(
        &mut r,
        DeviceError::UsedIdNotInFlight { id: (h + 3) as u32 },
    );
}

#[test]
fn used_len_larger_than_the_buffers() {
    let mut r = rig(false, false);
    let h = r.add_simple(0);
    r.push_used(0, h as u32, 17);
    r.set_used_idx(1);
    assert_broken(
        &mut r,
        DeviceError::UsedLenTooLarge {
            id: h as u32,
            len: 17,
            max: 16,
        },
    );
}

#[test]
fn used_idx_jumping_past_the_ring() {
    let mut r = rig(true, false);
    r.add_simple(0);
    r.set_used_idx(SIZE + 1);
    assert_broken(
        &mut r,
        DeviceError::UsedIdxJump {
            last: 0,
            idx: SIZE + 1,
            size: SIZE,
        },
    );
}

#[test]
fn full_queue_is_an_error_and_maps_nothing() {
    let mut r = rig(false, false);
    for t in 0..4 {
        r.add_simple(t);
    }
    let live = r.ops.live_mappings();
    assert!(matches!(
        r.q.add(&[Seg::buf(&r.out, 0, 1)], &[Seg::buf(&r.inb, 0, 1)], 9),
        Err(Error::QueueFull { needed: 2, free: 0 })
    ));
    assert_eq!(r.ops.live_mappings(), live);
    assert!(matches!(r.q.add(&[], &[], 9), Err(Error::EmptyRequest)));
}

#[test]
fn dropping_the_queue_releases_mappings_and_ring_memory() {
    let mut r = rig(true, true);
    r.add_simple(0);
    assert!(r.out.write_at(0, b"x").is_err(), "busy while in flight");
    let regions_before = r.ops.regions().len();
    let Rig { ops, q, out, .. } = r;
    drop(q);
    assert_eq!(ops.live_mappings(), 0);
    assert_eq!(
        ops.regions().len(),
        regions_before - 1,
        "the ring memory, indirect tables included, freed"
    );
    out.write_at(0, b"x").unwrap();
}

mod random_device {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Dev {
        /// Write a used element at `slot` and publish used idx `idx`.
        Used {
            slot: u16,
            id: u32,
            len: u32,
            idx: u16,
        },
        /// Complete the oldest in-flight request properly.
        Honest,
    }

    fn dev() -> impl Strategy<Value = Dev> {
        prop_oneof![
            (0u16..SIZE, any::<u32>(), 0u32..40, any::<u16>())
                .prop_map(|(slot, id, len, idx)| Dev::Used { slot, id, len, idx }),
            (0u16..SIZE, 0u32..SIZE as u32 + 2, 0u32..20, 0u16..SIZE + 2)
                .prop_map(|(slot, id, len, idx)| Dev::Used { slot, id, len, idx }),
            Just(Dev::Honest),
        ]
    }

    proptest! {
        /// Whatever a device writes into the used ring, the driver returns
        /// completions for requests it made or a device error, never panics,
        /// and, once broken, stays broken.
        #[test]
        fn arbitrary_used_rings_never_panic(steps in proptest::collection::vec(dev(), 1..40), event_idx: bool) {
            let mut r = rig(event_idx, false);
            let mut inflight: std::collections::VecDeque<(u16, u64)> = Default::default();
            let mut used_idx = 0u16;
            let mut next_token = 0u64;
            for step in steps {
                while r.q.num_free() >= 2 && !r.q.is_broken() {
                    let h = r.add_simple(next_token);
                    inflight.push_back((h, next_token));
                    next_token += 1;
                }
                match step {
                    Dev::Used { slot, id, len, idx } => {
                        r.push_used(slot, id, len);
                        r.set_used_idx(idx);
                        used_idx = idx;
                    }
                    Dev::Honest => {
                        if let Some(&(h, _)) = inflight.front() {
                            r.push_used(used_idx % SIZE, h as u32, 3);
                            used_idx = used_idx.wrapping_add(1);
                            r.set_used_idx(used_idx);
                        }
                    }
                }
                loop {
                    match r.q.pop_used() {
                        Ok(Some(c)) => {
                            prop_assert!(c.len <= 16);
                            let pos = inflight.iter().position(|&(_, t)| t == c.token);
                            prop_assert!(pos.is_some(), "completion for a token never issued");
                            inflight.remove(pos.unwrap());
                        }
                        Ok(None) => break,
                        Err(Error::Device(_)) | Err(Error::Broken) => {
                            prop_assert!(r.q.is_broken());
                            break;
                        }
                        Err(e) => return Err(TestCaseError::fail(format!("unexpected {e}"))),
                    }
                }
                if r.q.is_broken() {
                    break;
                }
            }
            // Mappings of completed requests are gone; the rest go with the queue.
            prop_assert_eq!(r.ops.live_mappings(), 2 * r.q.in_flight());
            let Rig { ops, q, .. } = r;
            drop(q);
            prop_assert_eq!(ops.live_mappings(), 0);
        }
    }
}

/// Requests added while the queue holds are written but not published:
/// `avail.idx` moves only with `publish`, oldest first, a notification is
/// asked for what is published only, and lifting the hold publishes the
/// rest.
#[test]
fn held_requests_reach_the_device_only_when_published() {
    let mut r = rig(true, false);
    r.q.hold(true);
    let heads: Vec<u16> = (0..3).map(|t| r.add_simple(t)).collect();
    assert_eq!((r.avail_idx(), r.q.held(), r.q.in_flight()), (0, 3, 3));
    assert!(!r.q.should_notify(), "nothing published yet");
    // The entries are in place, ahead of the index.
    for (slot, &head) in heads.iter().enumerate() {
        assert_eq!(r.avail_head(slot as u16), head);
    }
    assert_eq!(r.q.publish(2), 2);
    assert_eq!((r.avail_idx(), r.q.held()), (2, 1));
    assert!(r.q.should_notify(), "avail_event 0 passed");
    // The device completes the first; the queue sees it pending.
    r.push_used(0, u32::from(heads[0]), 16);
    r.set_used_idx(1);
    assert_eq!(r.q.used_pending(), 1);
    assert_eq!(r.q.pop_used().unwrap().unwrap().token, 0);
    assert_eq!(r.q.used_pending(), 0);
    // At most what is held is published; the hold lifted publishes it.
    assert_eq!(r.q.publish(5), 1);
    assert_eq!((r.avail_idx(), r.q.held()), (3, 0));
    let h = r.add_simple(3);
    assert_eq!((r.avail_idx(), r.q.held()), (3, 1));
    r.q.hold(false);
    assert_eq!((r.avail_idx(), r.q.held()), (4, 0));
    assert_eq!(r.avail_head(3), h);
    r.add_simple(4);
    assert_eq!(r.avail_idx(), 5, "published as added again");
}

/// A device that completes a request held back (one it was never given)
/// breaks the queue with the exact error, as for any head not in flight.
#[test]
fn a_held_request_completed_by_the_device_breaks_the_queue() {
    let mut r = rig(true, false);
    r.q.hold(true);
    let first = r.add_simple(0);
    let held = r.add_simple(1);
    assert_eq!(r.q.publish(1), 1);
    assert_eq!((r.avail_idx(), r.q.held()), (1, 1));
    r.push_used(0, u32::from(held), 0);
    r.set_used_idx(1);
    assert_broken(
        &mut r,
        DeviceError::UsedIdNotInFlight {
            id: u32::from(held),
        },
    );
    assert_ne!(first, held);
}
