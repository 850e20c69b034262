//! The fence between IOTLB invalidations and the device accesses that may
//! still use the old translations: a ticket per access, a generation per
//! invalidation.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use iopath_sys::{lock, wait_timeout_while};

/// Makes an IOTLB invalidation wait for the device accesses that may still
/// use the old translation.
///
/// Every device access to front-end memory happens under a [`DmaTicket`]
/// (a batch of ring work, or one request's I/O in flight). An invalidation
/// is applied to the IOTLB first, then [`DmaFence::wait_older`] opens a new
/// generation and waits until every ticket of the previous one is gone; only
/// then is it acknowledged, so the front end may reuse the memory. Two
/// generations suffice because invalidations are handled one at a time.
///
/// A batch whose thread waits for the front end to answer an IOTLB miss
/// holds no translation meanwhile, and the front end may be waiting for this
/// very acknowledgement before it answers: such a thread is parked
/// ([`DmaFence::park`]) and does not hold the invalidation up.
#[derive(Debug, Default)]
pub struct DmaFence {
    state: Mutex<FenceState>,
    idle: Condvar,
}

#[derive(Debug, Default)]
struct FenceState {
    generation: u64,
    live: [u64; 2],
    parked: [u64; 2],
    /// Threads in [`DmaFence::wait_older`]: a ticket dropped or parked
    /// wakes them, and with none it makes no `futex` call (one per batch
    /// of requests otherwise).
    waiters: usize,
}

thread_local! {
    /// Batch tickets held by this thread: (fence address, slot).
    static BATCHES: std::cell::RefCell<Vec<(usize, usize)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

impl DmaFence {
    fn id(&self) -> usize {
        self as *const Self as usize
    }

    /// Takes a ticket in the current generation (for I/O in flight).
    pub fn ticket(self: &Arc<Self>) -> DmaTicket {
        let mut st = lock(&self.state);
        let slot = (st.generation % 2) as usize;
        st.live[slot] += 1;
        DmaTicket {
            fence: Arc::clone(self),
            slot,
            batch: false,
        }
    }

    /// Takes a ticket for work done by this thread (parked while the thread
    /// waits for an IOTLB miss to be answered); drop it on this thread.
    pub fn batch(self: &Arc<Self>) -> DmaTicket {
        let mut t = self.ticket();
        t.batch = true;
        BATCHES.with(|b| b.borrow_mut().push((self.id(), t.slot)));
        t
    }

    /// Parks this thread's batch tickets until the guard is dropped.
    pub fn park(&self) -> Parked<'_> {
        let slots: Vec<usize> = BATCHES.with(|b| {
            b.borrow()
                .iter()
                .filter(|(id, _)| *id == self.id())
                .map(|&(_, slot)| slot)
                .collect()
        });
        let mut st = lock(&self.state);
        for &slot in &slots {
            st.parked[slot] += 1;
        }
        let wake = st.waiters > 0;
        drop(st);
        if wake {
            self.idle.notify_all();
        }
        Parked { fence: self, slots }
    }

    /// Starts a new generation and waits (at most `limit`) until no ticket
    /// of the previous one is left but parked ones. Returns whether they
    /// all went.
    pub fn wait_older(&self, limit: Duration) -> bool {
        let mut st = lock(&self.state);
        let old = (st.generation % 2) as usize;
        st.generation += 1;
        // Counted under the lock, so a ticket dropped after this sees a
        // waiter to wake, and one dropped before is seen by the predicate.
        st.waiters += 1;
        let (mut st, timeout) =
            wait_timeout_while(&self.idle, st, limit, |st| st.live[old] > st.parked[old]);
        st.waiters -= 1;
        drop(st);
        !timeout.timed_out()
    }
}

/// Batch tickets of one thread, parked (see [`DmaFence::park`]).
#[derive(Debug)]
pub struct Parked<'a> {
    fence: &'a DmaFence,
    slots: Vec<usize>,
}

impl Drop for Parked<'_> {
    fn drop(&mut self) {
        let mut st = lock(&self.fence.state);
        for &slot in &self.slots {
            st.parked[slot] -= 1;
        }
    }
}

/// Permission to access front-end memory through the translations current
/// when it was taken; dropping it ends the access.
#[derive(Debug)]
pub struct DmaTicket {
    fence: Arc<DmaFence>,
    slot: usize,
    batch: bool,
}

impl Drop for DmaTicket {
    fn drop(&mut self) {
        if self.batch {
            let key = (self.fence.id(), self.slot);
            BATCHES.with(|b| {
                let mut b = b.borrow_mut();
                if let Some(i) = b.iter().rposition(|e| *e == key) {
                    b.remove(i);
                }
            });
        }
        let mut st = lock(&self.fence.state);
        st.live[self.slot] -= 1;
        let wake = st.waiters > 0;
        drop(st);
        if wake {
            self.fence.idle.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fence_waits_for_older_tickets_only() {
        let fence = Arc::new(DmaFence::default());
        let held = fence.ticket();
        // A held ticket keeps the invalidation from completing.
        assert!(!fence.wait_older(Duration::from_millis(20)));
        drop(held);

        let older = fence.ticket();
        let f2 = Arc::clone(&fence);
        let waiter = std::thread::spawn(move || f2.wait_older(Duration::from_secs(10)));
        // Wait (without a timing guess) until the waiter has started the new
        // generation: it bumps it and blocks under the same lock.
        while fence.state.lock().unwrap().generation < 2 {
            std::thread::yield_now();
        }
        assert!(!waiter.is_finished(), "did not wait for the older ticket");
        // A ticket taken after the invalidation began does not hold it up.
        let newer = fence.ticket();
        drop(older);
        assert!(waiter.join().unwrap());
        drop(newer);
        assert!(fence.wait_older(Duration::from_millis(1)));
    }

    #[test]
    fn parked_batches_do_not_hold_invalidations() {
        let fence = Arc::new(DmaFence::default());
        let batch = fence.batch();
        assert!(!fence.wait_older(Duration::from_millis(10)));
        {
            let _parked = fence.park();
            assert!(fence.wait_older(Duration::from_secs(1)));
        }
        // An I/O ticket is never parked.
        let io = fence.ticket();
        let _parked = fence.park();
        assert!(!fence.wait_older(Duration::from_millis(10)));
        drop(io);
        drop(batch);
    }
}
