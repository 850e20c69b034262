//! A device that writes anything into the shared ring memory: used
//! elements, used idx, avail_event and used flags, between driver calls.
//! The driver must return completions only for requests it made and
//! published (with a length within what it offered; one held back was
//! never the device's) or a device error, never panic, and release every
//! mapping when the queue goes.
#![no_main]

use std::collections::VecDeque;
use std::sync::Arc;

use arbitrary::Arbitrary;
use iopath_dma::testing::DeviceView;
use iopath_dma::{Direct, DmaOps};
use iopath_heap::{Heap, HugePages, MemfdHeap};
use iopath_virtio::{Error, QueueFeatures, Seg, SplitQueue};
use libfuzzer_sys::fuzz_target;

const SIZE: u16 = 8;

#[derive(Debug, Arbitrary)]
enum Step {
    /// Write a used element and publish a used idx.
    Used {
        slot: u8,
        id: u32,
        len: u32,
        idx: u16,
    },
    /// Complete the oldest request properly.
    Honest { len: u8 },
    /// Device-side suppression fields.
    Suppress { avail_event: u16, used_flags: u16 },
    /// Driver: add as many requests as fit, and decide on a kick.
    Add,
    /// Driver: interrupt control.
    Interrupts(bool),
    /// Driver: take completions.
    Pop,
    /// Driver: hold added requests back, or publish them all.
    Hold(bool),
    /// Driver: publish up to this many held requests.
    Publish(u8),
}

#[derive(Debug, Arbitrary)]
struct Input {
    event_idx: bool,
    indirect: bool,
    steps: Vec<Step>,
}

fuzz_target!(|input: Input| {
    let ops = Arc::new(Direct::new());
    let features = QueueFeatures {
        event_idx: input.event_idx,
        indirect: input.indirect,
    };
    let mut q = SplitQueue::new(ops.clone(), 0, SIZE, features).unwrap();
    let heap = MemfdHeap::new(HugePages::None);
    let (out, inb) = (heap.alloc(4096).unwrap(), heap.alloc(4096).unwrap());
    ops.register(&out).unwrap();
    ops.register(&inb).unwrap();
    let view = DeviceView::connect(&*ops).unwrap();
    let cfg = q.config();
    let w16 = |addr: u64, v: u16| view.write(addr, &v.to_le_bytes()).unwrap();

    // (head, token, published)
    let mut inflight: VecDeque<(u16, u64, bool)> = VecDeque::new();
    let mut holding = false;
    let mut next_token = 0u64;
    let mut used_idx = 0u16;
    for step in input.steps.into_iter().take(200) {
        match step {
            Step::Used { slot, id, len, idx } => {
                let mut b = [0u8; 8];
                b[..4].copy_from_slice(&id.to_le_bytes());
                b[4..].copy_from_slice(&len.to_le_bytes());
                let slot = u64::from(slot) % u64::from(SIZE);
                view.write(cfg.used + 4 + 8 * slot, &b).unwrap();
                w16(cfg.used + 2, idx);
                used_idx = idx;
            }
            Step::Honest { len } => {
                if let Some(&(head, _, _)) = inflight.iter().find(|r| r.2) {
                    let mut b = [0u8; 8];
                    b[..4].copy_from_slice(&u32::from(head).to_le_bytes());
                    b[4..].copy_from_slice(&u32::from(len % 17).to_le_bytes());
                    let slot = u64::from(used_idx % SIZE);
                    view.write(cfg.used + 4 + 8 * slot, &b).unwrap();
                    used_idx = used_idx.wrapping_add(1);
                    w16(cfg.used + 2, used_idx);
                }
            }
            Step::Suppress {
                avail_event,
                used_flags,
            } => {
                w16(cfg.used + 4 + 8 * u64::from(SIZE), avail_event);
                w16(cfg.used, used_flags);
            }
            Step::Add => {
                while q.num_free() >= 2 && !q.is_broken() {
                    let head = q
                        .add(
                            &[Seg::buf(&out, 0, 5)],
                            &[Seg::buf(&inb, 0, 16)],
                            next_token,
                        )
                        .unwrap();
                    inflight.push_back((head, next_token, !holding));
                    next_token += 1;
                }
                let _ = q.should_notify();
            }
            Step::Interrupts(on) => {
                if on {
                    let _ = q.enable_interrupts();
                } else {
                    q.disable_interrupts();
                }
            }
            Step::Pop => loop {
                match q.pop_used() {
                    Ok(Some(c)) => {
                        assert!(c.len <= 16, "length beyond the offered buffer");
                        let pos = inflight
                            .iter()
                            .position(|&(_, t, _)| t == c.token)
                            .expect("completion for a token never issued");
                        let (_, _, published) = inflight.remove(pos).expect("found");
                        assert!(published, "completion for a request held back");
                    }
                    Ok(None) => break,
                    Err(Error::Device(_)) | Err(Error::Broken) => {
                        assert!(q.is_broken());
                        break;
                    }
                    Err(e) => panic!("unexpected error {e}"),
                }
            },
            Step::Hold(on) => {
                q.hold(on);
                holding = on;
                if !on {
                    inflight.iter_mut().for_each(|r| r.2 = true);
                }
            }
            Step::Publish(n) => {
                let done = q.publish(u16::from(n));
                let held = inflight.iter_mut().filter(|r| !r.2);
                let marked = held.take(usize::from(done)).map(|r| r.2 = true).count();
                assert_eq!(marked, usize::from(done), "published more than held");
            }
        }
    }
    assert_eq!(ops.live_mappings(), 2 * q.in_flight());
    drop(q);
    assert_eq!(ops.live_mappings(), 0);
});
