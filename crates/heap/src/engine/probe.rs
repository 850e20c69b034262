//! What `auto`'s probe measures ([`Probe`]), how much, and how it chooses
//! from the figures: the faster of io_uring and direct (direct by more than
//! [`DIRECT_MARGIN`]), or for a buffer whose mapping refuses direct I/O the
//! faster of bounce and buffered. The engine that runs the probe is
//! [`super::AutoEngine`]; [`super::SharedChoice`] shares its result.

use std::time::Duration;

use super::Method;

/// Bytes each engine moves (over its slices) before `auto` chooses.
pub const PROBE_BYTES: u64 = 48 << 20;

/// Probe slices, alternating io_uring and direct.
pub const PROBE_SLICES: usize = 4;

/// How much faster than io_uring direct must measure to be chosen (0.1:
/// 10%).
pub const DIRECT_MARGIN: f64 = 0.1;

/// What the probe measured.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Probe {
    /// Bytes and time through io_uring.
    pub uring: (u64, Duration),
    /// Bytes and time through direct `pread`.
    pub direct: (u64, Duration),
    /// Bytes and time through the memfd bounce (a buffer whose mapping
    /// refuses direct I/O).
    pub bounce: (u64, Duration),
    /// Bytes and time through buffered `pread` (the same).
    pub buffered: (u64, Duration),
    /// The engine chosen.
    pub chosen: Option<Method>,
}

impl Probe {
    fn rate((bytes, t): (u64, Duration)) -> f64 {
        bytes as f64 / t.as_secs_f64().max(1e-9)
    }

    /// io_uring's rate in GiB/s (0 if it moved nothing).
    pub fn uring_gib_per_s(&self) -> f64 {
        Self::rate(self.uring) / f64::from(1u32 << 30)
    }

    /// Direct's rate in GiB/s (0 if it moved nothing).
    pub fn direct_gib_per_s(&self) -> f64 {
        Self::rate(self.direct) / f64::from(1u32 << 30)
    }

    /// The bounce's rate in GiB/s (0 if it moved nothing).
    pub fn bounce_gib_per_s(&self) -> f64 {
        Self::rate(self.bounce) / f64::from(1u32 << 30)
    }

    /// Buffered reads' rate in GiB/s (0 if they moved nothing).
    pub fn buffered_gib_per_s(&self) -> f64 {
        Self::rate(self.buffered) / f64::from(1u32 << 30)
    }

    /// Whether the probe weighed bounce against buffered (the buffer's
    /// mapping refuses direct I/O).
    pub fn mapping_refused_direct(&self) -> bool {
        self.bounce.0 > 0 || self.buffered.0 > 0
    }

    /// The figures of method `m` (buffered for any other).
    pub(super) fn slot(&mut self, m: Method) -> &mut (u64, Duration) {
        match m {
            Method::Uring => &mut self.uring,
            Method::Direct => &mut self.direct,
            Method::Bounce => &mut self.bounce,
            _ => &mut self.buffered,
        }
    }

    pub(super) fn choose(&mut self) -> Method {
        let m = if self.mapping_refused_direct() {
            // The faster of the two; bounce keeps the page cache out on a tie.
            if self.bounce.0 > 0 && Self::rate(self.bounce) >= Self::rate(self.buffered) {
                Method::Bounce
            } else {
                Method::Buffered
            }
        } else if Self::rate(self.direct) <= Self::rate(self.uring) * (1.0 + DIRECT_MARGIN) {
            Method::Uring
        } else {
            Method::Direct
        };
        self.chosen = Some(m);
        m
    }
}

/// A probe that saw each method move so many MiB in one second.
#[cfg(test)]
pub(super) fn probe(uring_mib: u64, direct_mib: u64) -> Probe {
    Probe {
        uring: (uring_mib << 20, Duration::from_secs(1)),
        direct: (direct_mib << 20, Duration::from_secs(1)),
        ..Probe::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn direct_must_lead_by_the_margin() {
        assert_eq!(probe(100, 100).choose(), Method::Uring);
        assert_eq!(probe(100, 109).choose(), Method::Uring);
        assert_eq!(probe(100, 111).choose(), Method::Direct);
        assert_eq!(probe(100, 50).choose(), Method::Uring);
        // io_uring moved nothing (the batch ended in the first slice).
        assert_eq!(probe(0, 0).choose(), Method::Uring);
        let mut p = probe(100, 200);
        p.choose();
        assert_eq!(p.chosen, Some(Method::Direct));
    }

    #[test]
    fn a_refusing_mapping_takes_the_faster_of_bounce_and_buffered() {
        let mut p = Probe {
            bounce: (200 << 20, Duration::from_secs(1)),
            buffered: (100 << 20, Duration::from_secs(1)),
            ..Probe::default()
        };
        assert!(p.mapping_refused_direct());
        assert_eq!(p.choose(), Method::Bounce);
        p.buffered.0 = 300 << 20;
        assert_eq!(p.choose(), Method::Buffered);
    }
}
