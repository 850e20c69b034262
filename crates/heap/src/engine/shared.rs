//! One probe for the engines of one load: the shards of a checkpoint,
//! each read by its own [`super::AutoEngine`], measure io_uring against
//! direct once, not once per shard.
//!
//! ```text
//!   Open ─claim─► Probing ─publish (both engines measured)─► Chosen(probe)
//!                    │ publish (one engine only) / abandon (error)
//!                    └──────────────► Open
//! ```
//!
//! On an 8-shard checkpoint of 128 MiB shards a probe per shard measured
//! the whole of every shard (2 x [`super::PROBE_BYTES`] is 96 MiB, and a
//! slice ends only at a read's end), so half of every byte went through
//! one `pread` at a time and the queue drained at every slice's end.

use std::sync::Mutex;

use iopath_sys::lock;

use super::probe::Probe;

/// Where a shared probe stands.
#[derive(Debug, Clone, Copy, Default)]
enum Choosing {
    /// Nobody has measured yet.
    #[default]
    Open,
    /// A batch is measuring.
    Probing,
    /// Measured and chosen.
    Chosen(Probe),
}

/// One probe for the engines of one load (the shards of a checkpoint,
/// each with its own engine): the first of them with cold reads measures,
/// every other one runs io_uring (or bounce, for a mapping that refuses
/// direct I/O) until that probe has chosen, and the choice from then on.
#[derive(Debug, Default)]
pub struct SharedChoice {
    state: Mutex<Choosing>,
}

/// What a batch does about a shared probe.
pub(super) enum Claim {
    /// Measure, and publish the choice.
    Measure,
    /// Another batch measures: the first engine of the pair until it has
    /// chosen.
    Wait,
    /// Take this choice.
    Take(Probe),
}

impl SharedChoice {
    /// A probe nobody has run yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The choice made, if any.
    pub fn chosen(&self) -> Option<Probe> {
        match *lock(&self.state) {
            Choosing::Chosen(p) => Some(p),
            _ => None,
        }
    }

    /// What a batch whose buffers take direct I/O (or not: `direct`) does.
    /// A choice made for the other pair is not taken.
    pub(super) fn claim(&self, direct: bool) -> Claim {
        let mut s = lock(&self.state);
        match *s {
            Choosing::Chosen(p) if p.mapping_refused_direct() != direct => Claim::Take(p),
            Choosing::Chosen(_) => Claim::Measure,
            Choosing::Probing => Claim::Wait,
            Choosing::Open => {
                *s = Choosing::Probing;
                Claim::Measure
            }
        }
    }

    /// The measuring batch's result: a probe that weighed both engines is
    /// the choice; one that did not (its batch ended first) reopens it.
    pub(super) fn publish(&self, p: &Probe) {
        let mut s = lock(&self.state);
        if matches!(*s, Choosing::Chosen(_)) {
            return;
        }
        let (a, b) = if p.mapping_refused_direct() {
            (p.bounce.0, p.buffered.0)
        } else {
            (p.uring.0, p.direct.0)
        };
        *s = if a > 0 && b > 0 && p.chosen.is_some() {
            Choosing::Chosen(*p)
        } else {
            Choosing::Open
        };
    }

    /// The measuring batch failed: another may measure.
    pub(super) fn abandon(&self) {
        let mut s = lock(&self.state);
        if matches!(*s, Choosing::Probing) {
            *s = Choosing::Open;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::probe::probe;
    use super::*;

    #[test]
    fn a_shared_probe_is_measured_once_and_reopened_when_it_could_not_choose() {
        let s = SharedChoice::new();
        assert!(matches!(s.claim(true), Claim::Measure));
        assert!(matches!(s.claim(true), Claim::Wait));
        // The measuring batch ended before direct moved a byte: no choice.
        let mut short = probe(100, 0);
        short.choose();
        s.publish(&short);
        assert_eq!(s.chosen(), None);
        assert!(matches!(s.claim(true), Claim::Measure));
        // A failed measurement lets another batch measure.
        s.abandon();
        assert!(matches!(s.claim(true), Claim::Measure));
        let mut p = probe(100, 200);
        p.choose();
        s.publish(&p);
        assert_eq!(s.chosen(), Some(p));
        assert!(matches!(s.claim(true), Claim::Take(q) if q == p));
        // A later publication or abandon does not undo the choice.
        s.publish(&probe(300, 1));
        s.abandon();
        assert_eq!(s.chosen(), Some(p));
        // A buffer that refuses direct I/O does not take a uring/direct
        // choice: it measures its own pair.
        assert!(matches!(s.claim(false), Claim::Measure));
    }
}
