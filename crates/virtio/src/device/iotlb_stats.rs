//! What one front end's IOTLB went through: the updates and invalidations
//! it sent, the misses the device reported to it and those it left
//! unanswered. Counted for the whole connection, logged when it ends.

use std::sync::atomic::{AtomicU64, Ordering};

/// A snapshot of a front end's IOTLB traffic.
#[derive(Clone, Copy, Debug, Default, Eq, PartialEq)]
pub struct IotlbStats {
    /// `VHOST_IOTLB_UPDATE` messages applied.
    pub updates: u64,
    /// `VHOST_IOTLB_INVALIDATE` messages applied.
    pub invalidations: u64,
    /// Misses reported to the front end (`VHOST_USER_BACKEND_IOTLB_MSG`).
    pub misses: u64,
    /// Reported misses no update answered in time (the access failed).
    pub unanswered: u64,
}

impl IotlbStats {
    /// Whether any message went either way.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

impl std::fmt::Display for IotlbStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} updates, {} invalidations, {} misses reported ({} unanswered)",
            self.updates, self.invalidations, self.misses, self.unanswered
        )
    }
}

/// The live counters behind [`IotlbStats`], shared by every view of one
/// IOMMU.
#[derive(Debug, Default)]
pub(crate) struct IotlbCounters {
    updates: AtomicU64,
    invalidations: AtomicU64,
    misses: AtomicU64,
    unanswered: AtomicU64,
}

/// Which counter an event bumps.
#[derive(Clone, Copy, Debug)]
pub(crate) enum IotlbEvent {
    Update,
    Invalidation,
    Miss,
    Unanswered,
}

impl IotlbCounters {
    pub(crate) fn count(&self, event: IotlbEvent) {
        let c = match event {
            IotlbEvent::Update => &self.updates,
            IotlbEvent::Invalidation => &self.invalidations,
            IotlbEvent::Miss => &self.misses,
            IotlbEvent::Unanswered => &self.unanswered,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> IotlbStats {
        IotlbStats {
            updates: self.updates.load(Ordering::Relaxed),
            invalidations: self.invalidations.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            unanswered: self.unanswered.load(Ordering::Relaxed),
        }
    }
}
