//! One queue's record in the inflight region: what a pop and a put write,
//! in the order that makes a crash between any two writes recoverable, and
//! the recovery after a restart (see the parent module for the layout).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use vm_memory::{Bytes, VolatileMemory};

use super::{
    InflightRegion, DESC_BYTES, HEADER_BYTES, OFF_COUNTER, OFF_DESC_NUM, OFF_INFLIGHT,
    OFF_LAST_BATCH_HEAD, OFF_USED_IDX, OFF_VERSION, VERSION,
};

/// What [`InflightQueue::recover`] found.
#[derive(Clone, Debug, Default, Eq, PartialEq)]
pub(crate) struct Recovery {
    /// The region was fresh (nothing to recover): the ring indices from
    /// `SET_VRING_BASE` stand.
    pub fresh: bool,
    /// Next available index: the used index plus the heads in flight.
    pub next_avail: u16,
    /// Next used index (the used ring's).
    pub next_used: u16,
    /// Heads to run again before any new available entry, oldest first.
    pub resubmit: Vec<u16>,
}

/// The inflight record of one queue.
#[derive(Debug)]
pub(crate) struct InflightQueue {
    region: Arc<InflightRegion>,
    /// Offset of the queue's region in the mapping.
    base: usize,
    /// Descriptors of the ring: heads at or past it are not this ring's.
    ring_size: u16,
    /// Counter for the next pop.
    counter: u64,
}

impl InflightQueue {
    pub(super) fn new(region: Arc<InflightRegion>, base: usize, ring_size: u16) -> Self {
        InflightQueue {
            region,
            base,
            ring_size,
            counter: 0,
        }
    }

    fn desc(&self, head: u16, field: usize) -> usize {
        self.base + HEADER_BYTES as usize + usize::from(head) * DESC_BYTES as usize + field
    }

    fn store<T: vm_memory::AtomicAccess>(&self, at: usize, value: T) {
        // Offsets are inside the mapping and naturally aligned by
        // construction (`queue` and the layout constants); a failure would
        // only lose tracking, never touch other memory.
        if let Err(e) = self
            .region
            .mapping
            .as_volatile_slice()
            .store(value, at, Ordering::Release)
        {
            tracing::warn!("inflight region store at {at}: {e}");
        }
    }

    fn load<T: vm_memory::AtomicAccess + Default>(&self, at: usize) -> T {
        self.region
            .mapping
            .as_volatile_slice()
            .load(at, Ordering::Acquire)
            .unwrap_or_default()
    }

    /// Restores the ring from the region after a (re)start, given the used
    /// ring's index. A fresh region (version 0) is initialised instead.
    pub(crate) fn recover(&mut self, ring_used: u16) -> Recovery {
        let version: u16 = self.load(self.base + OFF_VERSION);
        if version == 0 {
            // A new region, or one cleared at a device reset: no head is in
            // flight (a cleared region is all zeros).
            self.store(self.base + OFF_DESC_NUM, self.region.queue_size);
            self.store(self.base + OFF_USED_IDX, ring_used);
            self.store(self.base + OFF_VERSION, VERSION);
            self.counter = 0;
            return Recovery {
                fresh: true,
                next_avail: ring_used,
                next_used: ring_used,
                resubmit: Vec::new(),
            };
        }
        let recorded: u16 = self.load(self.base + OFF_USED_IDX);
        if recorded != ring_used {
            // The crash came after the used index moved and before the
            // record caught up: the last head put is done.
            let last: u16 = self.load(self.base + OFF_LAST_BATCH_HEAD);
            if last < self.region.queue_size {
                self.store(self.desc(last, OFF_INFLIGHT), 0u8);
            }
            self.store(self.base + OFF_USED_IDX, ring_used);
        }
        let mut heads: Vec<(u64, u16)> = (0..self.ring_size)
            .filter(|&h| self.load::<u8>(self.desc(h, OFF_INFLIGHT)) == 1)
            .map(|h| (self.load::<u64>(self.desc(h, OFF_COUNTER)), h))
            .collect();
        heads.sort_unstable();
        self.counter = heads.last().map_or(0, |&(c, _)| c.wrapping_add(1));
        // At most `ring_size` (<= 32768) heads: the count fits in u16.
        let n = heads.len() as u16;
        Recovery {
            fresh: false,
            next_avail: ring_used.wrapping_add(n),
            next_used: ring_used,
            resubmit: heads.into_iter().map(|(_, h)| h).collect(),
        }
    }

    /// Records `head` as popped (in flight).
    pub(crate) fn pop(&mut self, head: u16) {
        if head >= self.ring_size {
            return;
        }
        let c = self.counter;
        self.counter = c.wrapping_add(1);
        self.store(self.desc(head, OFF_COUNTER), c);
        self.store(self.desc(head, OFF_INFLIGHT), 1u8);
    }

    /// Before `head` goes on the used ring.
    pub(crate) fn pre_put(&self, head: u16) {
        if head < self.ring_size {
            self.store(self.base + OFF_LAST_BATCH_HEAD, head);
        }
    }

    /// After `head` went on the used ring, whose index is now `used`.
    pub(crate) fn post_put(&self, head: u16, used: u16) {
        if head < self.ring_size {
            self.store(self.desc(head, OFF_INFLIGHT), 0u8);
        }
        self.store(self.base + OFF_USED_IDX, used);
    }
}

#[cfg(test)]
mod tests {
    use super::super::{queue_region_size, InflightError};
    use super::*;
    use std::fs::File;
    use std::os::unix::fs::FileExt;
    use vhost::vhost_user::message::VhostUserInflight;

    const SIZE: u16 = 8;

    /// A back end's first start: a region in a new memfd, queue 0 tracked.
    fn first_start() -> (InflightQueue, File, VhostUserInflight) {
        let (region, file, reply) = InflightRegion::create(1, SIZE, 4, 256).unwrap();
        let mut q = Arc::new(region).queue(0, SIZE).unwrap();
        assert!(q.recover(0).fresh);
        (q, file, reply)
    }

    /// What a restarted back end finds: the same fd mapped afresh.
    fn restart(
        file: &File,
        reply: &VhostUserInflight,
        ring_used: u16,
    ) -> (InflightQueue, Recovery) {
        let region = InflightRegion::open(reply, file.try_clone().unwrap(), 4, 256).unwrap();
        let mut q = Arc::new(region).queue(0, SIZE).unwrap();
        let r = q.recover(ring_used);
        (q, r)
    }

    /// The put sequence of `QueueContext::add_used`, stopped after `steps`
    /// of its four writes; `used` is the used ring's index.
    fn put(q: &InflightQueue, head: u16, used: &mut u16, steps: usize) {
        if steps >= 1 {
            q.pre_put(head);
        }
        if steps >= 2 {
            *used = used.wrapping_add(1);
        }
        if steps >= 3 {
            q.store(q.desc(head, OFF_INFLIGHT), 0u8);
        }
        if steps >= 4 {
            q.store(q.base + OFF_USED_IDX, *used);
        }
    }

    #[test]
    fn a_crash_at_each_step_of_a_put_resubmits_exactly_the_unfinished_heads() {
        for steps in 0..=4 {
            let (mut q, file, reply) = first_start();
            let mut used = 0u16;
            // Popped in this order: counters 0, 1, 2.
            for head in [3, 5, 1] {
                q.pop(head);
            }
            put(&q, 5, &mut used, 4);
            // The crash: head 3's put stops after `steps` writes.
            put(&q, 3, &mut used, steps);
            drop(q);
            let (_, r) = restart(&file, &reply, used);
            let want: &[u16] = if steps < 2 { &[3, 1] } else { &[1] };
            assert!(!r.fresh);
            assert_eq!(r.resubmit, want, "crash after {steps} step(s) of the put");
            assert_eq!(r.next_used, used);
            assert_eq!(
                r.next_avail,
                used + want.len() as u16,
                "after {steps} step(s)"
            );
            // The record was repaired: a second restart finds the same.
            let (_, again) = restart(&file, &reply, used);
            assert_eq!(again, r, "recovery is not idempotent after {steps} step(s)");
        }
    }

    #[test]
    fn a_crash_inside_a_pop_leaves_the_head_to_the_available_ring() {
        let (mut q, file, reply) = first_start();
        q.pop(2);
        // Head 6 popped from the ring, its counter written, not yet marked.
        q.store(q.desc(6, OFF_COUNTER), 1u64);
        drop(q);
        let (_, r) = restart(&file, &reply, 0);
        // Two entries were taken from the available ring; only one counts,
        // so the second (head 6) is taken again.
        assert_eq!(r.resubmit, [2]);
        assert_eq!(r.next_avail, 1);
    }

    #[test]
    fn out_of_order_completions_and_a_second_crash_keep_the_pop_order() {
        let (mut q, file, reply) = first_start();
        let mut used = 0u16;
        for head in 0..5 {
            q.pop(head);
        }
        put(&q, 2, &mut used, 4);
        put(&q, 0, &mut used, 4);
        drop(q);
        let (mut q, r) = restart(&file, &reply, used);
        assert_eq!(r.resubmit, [1, 3, 4]);
        assert_eq!((r.next_used, r.next_avail), (2, 5));
        // The restarted back end finishes 3, pops head 0 again (newer than
        // every resubmitted head) and crashes too.
        put(&q, 3, &mut used, 4);
        q.pop(0);
        drop(q);
        let (_, r) = restart(&file, &reply, used);
        assert_eq!(r.resubmit, [1, 4, 0]);
        assert_eq!((r.next_used, r.next_avail), (3, 6));
    }

    #[test]
    fn indices_wrap_around() {
        let (mut q, file, reply) = first_start();
        // The used index about to wrap, as after 65535 requests.
        let mut used = u16::MAX;
        q.store(q.base + OFF_USED_IDX, used);
        q.pop(4);
        q.pop(7);
        put(&q, 4, &mut used, 2);
        drop(q);
        let (_, r) = restart(&file, &reply, used);
        assert_eq!(r.resubmit, [7]);
        assert_eq!((r.next_used, r.next_avail), (0, 1));
    }

    #[test]
    fn a_region_cleared_by_the_front_end_is_fresh_again() {
        let (mut q, file, reply) = first_start();
        q.pop(1);
        drop(q);
        // QEMU zeroes the region when the guest resets the device.
        file.write_all_at(&vec![0u8; reply.mmap_size as usize], 0)
            .unwrap();
        let (_, r) = restart(&file, &reply, 9);
        assert!(r.fresh);
        assert_eq!((r.next_used, r.next_avail, r.resubmit.len()), (9, 9, 0));
        let (_, r) = restart(&file, &reply, 9);
        assert!(!r.fresh);
        assert!(r.resubmit.is_empty());
    }

    #[test]
    fn hostile_region_contents_yield_only_heads_of_the_ring() {
        let (q, file, reply) = first_start();
        drop(q);
        let len = reply.mmap_size as usize;
        for fill in [0xffu8, 0x01, 0x80] {
            let mut bytes = vec![fill; len];
            // Keep the version non-zero so the record is read.
            bytes[OFF_VERSION] = 1;
            file.write_all_at(&bytes, 0).unwrap();
            // A ring smaller than the region's queues: heads past it are
            // not this ring's.
            let region = InflightRegion::open(&reply, file.try_clone().unwrap(), 4, 256).unwrap();
            let mut q = Arc::new(region).queue(0, 4).unwrap();
            let r = q.recover(3);
            let want: Vec<u16> = if fill == 1 { vec![0, 1, 2, 3] } else { vec![] };
            assert_eq!(r.resubmit, want, "fill {fill:#x}");
            assert_eq!(r.next_avail, 3 + want.len() as u16);
        }
    }

    #[test]
    fn set_inflight_fd_checks_the_message_against_the_file() {
        let (q, file, reply) = first_start();
        drop(q);
        let open =
            |m: VhostUserInflight| InflightRegion::open(&m, file.try_clone().unwrap(), 4, 256);
        let needed = queue_region_size(SIZE);
        assert_eq!(reply.mmap_size, needed);
        assert!(open(reply).is_ok());
        // Past the end of the file, or a size smaller than the layout.
        for (size, offset) in [(needed, 4096), (needed - 1, 0), (needed, u64::MAX)] {
            let m = VhostUserInflight::new(size, offset, 1, SIZE);
            assert!(
                matches!(open(m), Err(InflightError::TooSmall { needed: n, .. }) if n == needed),
                "size {size} offset {offset}"
            );
        }
        // More queues than the file holds.
        let m = VhostUserInflight::new(needed, 0, 2, SIZE);
        assert!(matches!(open(m), Err(InflightError::TooSmall { .. })));
        // Shapes this device never has.
        for (nq, qs) in [(0, SIZE), (5, SIZE), (1, 0), (1, 512)] {
            let m = VhostUserInflight::new(needed, 0, nq, qs);
            assert!(
                matches!(
                    open(m),
                    Err(InflightError::Shape {
                        max_queues: 4,
                        max_queue_size: 256,
                        ..
                    })
                ),
                "{nq} queues of {qs}"
            );
        }
        // The memfd this side made cannot be resized by the front end.
        assert!(file.set_len(0).is_err());
    }

    #[test]
    fn a_two_queue_record_at_an_offset_is_read_per_queue_region() {
        // What a front end may hand back: the record 4096 bytes into its
        // file, written by hand in the spec's layout.
        let region = queue_region_size(SIZE);
        let fd = rustix::fs::memfd_create("record", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        let file = File::from(fd);
        file.set_len(4096 + 2 * region).unwrap();
        let header = |q: u64, used: u16| {
            let at = 4096 + q * region;
            file.write_all_at(&VERSION.to_le_bytes(), at + OFF_VERSION as u64)
                .unwrap();
            file.write_all_at(&used.to_le_bytes(), at + OFF_USED_IDX as u64)
                .unwrap();
        };
        let inflight = |q: u64, head: u64, counter: u64| {
            let at = 4096 + q * region + HEADER_BYTES + head * DESC_BYTES;
            file.write_all_at(&[1], at + OFF_INFLIGHT as u64).unwrap();
            file.write_all_at(&counter.to_le_bytes(), at + OFF_COUNTER as u64)
                .unwrap();
        };
        header(0, 7);
        inflight(0, 5, 0);
        header(1, 3);
        inflight(1, 5, 9);
        inflight(1, 2, 4);
        let msg = VhostUserInflight::new(2 * region, 4096, 2, SIZE);
        let region = Arc::new(InflightRegion::open(&msg, file, 4, 256).unwrap());
        let (mut q0, mut q1) = (
            region.queue(0, SIZE).unwrap(),
            region.queue(1, SIZE).unwrap(),
        );
        let r1 = q1.recover(3);
        assert_eq!((r1.resubmit, r1.next_avail), (vec![2, 5], 5));
        let r0 = q0.recover(7);
        assert_eq!((r0.resubmit, r0.next_avail), (vec![5], 8));
        // The next pops go on from each queue's own newest counter.
        assert_eq!((q0.counter, q1.counter), (1, 10));
    }

    #[test]
    fn queues_outside_the_region_are_not_tracked() {
        let (region, _file, _) = InflightRegion::create(2, SIZE, 4, 256).unwrap();
        let region = Arc::new(region);
        assert!(region.queue(1, SIZE).is_some());
        assert!(region.queue(2, SIZE).is_none());
        assert!(region.queue(0, SIZE * 2).is_none());
        // Queue 1 starts after queue 0's padded region.
        assert_eq!(
            region.queue(1, SIZE).unwrap().base as u64,
            queue_region_size(SIZE)
        );
        assert_eq!(queue_region_size(SIZE), 192);
        assert_eq!(queue_region_size(128), 16 + 16 * 128 + 48);
    }
}
