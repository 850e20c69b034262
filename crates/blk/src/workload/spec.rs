//! [`Workload`]: the block size, range, depth and data of a dd, and the
//! checks of its fields against each other.

use super::choices::{Access, Op, Pattern};
use super::error::WorkloadError;

/// What to run: the block size, range, depth and data of a dd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Workload {
    /// Write or read.
    pub op: Op,
    /// Data written, and expected by `verify`.
    pub pattern: Pattern,
    /// Sequential or random block order.
    pub access: Access,
    /// Seed of the random order (`Access::Rand`).
    pub seed: u64,
    /// Bytes per block (a positive multiple of 512).
    pub bs: usize,
    /// Blocks per pass.
    pub count: u64,
    /// Byte offset of block 0 on the device (a multiple of 512).
    pub offset: u64,
    /// Blocks in flight at once, over all queues (1 to 256, at least one
    /// per queue the driver uses).
    pub queue_depth: usize,
    /// Timed passes.
    pub runs: usize,
    /// After the runs, read the range back and check it against `pattern`.
    pub verify: bool,
}

impl Default for Workload {
    /// 1024 sequential writes of 8 MiB zeros, 4 in flight, one run.
    fn default() -> Self {
        Workload {
            op: Op::Write,
            pattern: Pattern::Zero,
            access: Access::Seq,
            seed: 0,
            bs: 8 << 20,
            count: 1024,
            offset: 0,
            queue_depth: 4,
            runs: 1,
            verify: false,
        }
    }
}

/// Most blocks in flight a workload may ask for.
pub const MAX_QUEUE_DEPTH: usize = 256;

impl Workload {
    /// Bytes moved by one pass.
    pub fn bytes(&self) -> u64 {
        self.bs as u64 * self.count
    }

    /// Checks the fields against each other (not against a device).
    ///
    /// # Errors
    /// [`WorkloadError::Invalid`] naming the field and what it accepts;
    /// [`WorkloadError::Overflow`] when the range does not fit in 64 bits.
    pub fn validate(&self) -> Result<(), WorkloadError> {
        let bad = |field, value, accepted| {
            Err(WorkloadError::Invalid {
                field,
                value,
                accepted,
            })
        };
        if self.bs == 0 || self.bs % 512 != 0 {
            return bad("bs", self.bs as u64, "a positive multiple of 512 bytes");
        }
        if self.offset % 512 != 0 {
            return bad("offset", self.offset, "a multiple of 512 bytes");
        }
        if self.count == 0 {
            return bad("count", 0, "at least 1");
        }
        if self.runs == 0 {
            return bad("runs", 0, "at least 1");
        }
        if self.queue_depth == 0 || self.queue_depth > MAX_QUEUE_DEPTH {
            return bad("queue_depth", self.queue_depth as u64, "1 to 256");
        }
        let len = (self.bs as u64)
            .checked_mul(self.count)
            .ok_or(WorkloadError::Overflow {
                what: "bs x count",
                limit: u64::MAX,
            })?;
        len.checked_add(self.offset)
            .ok_or(WorkloadError::Overflow {
                what: "offset + bs x count",
                limit: u64::MAX,
            })?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validate_names_the_field_at_fault() {
        let w = |f: fn(&mut Workload)| {
            let mut w = Workload::default();
            f(&mut w);
            w.validate()
        };
        assert!(w(|_| ()).is_ok());
        let field = |r: Result<(), WorkloadError>| match r {
            Err(WorkloadError::Invalid { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(field(w(|w| w.bs = 1000)), "bs");
        assert_eq!(field(w(|w| w.bs = 0)), "bs");
        assert_eq!(field(w(|w| w.offset = 100)), "offset");
        assert_eq!(field(w(|w| w.count = 0)), "count");
        assert_eq!(field(w(|w| w.runs = 0)), "runs");
        assert_eq!(field(w(|w| w.queue_depth = 257)), "queue_depth");
        assert!(matches!(
            w(|w| w.offset = u64::MAX - 511),
            Err(WorkloadError::Overflow {
                what: "offset + bs x count",
                ..
            })
        ));
        assert!(matches!(
            w(|w| w.count = u64::MAX),
            Err(WorkloadError::Overflow {
                what: "bs x count",
                ..
            })
        ));
    }
}
