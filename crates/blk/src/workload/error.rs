//! [`WorkloadError`]: what can go wrong with a workload, from a field out
//! of range to a block the device failed.

use super::choices::Pattern;
use crate::error::BlkError;
use crate::names::UnknownName;

/// Errors of a workload.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// A field out of its range.
    #[error("Workload {field} = {value} is not accepted: it must be {accepted}")]
    Invalid {
        /// The field of [`Workload`](super::Workload) at fault.
        field: &'static str,
        /// Its value.
        value: u64,
        /// What it accepts.
        accepted: &'static str,
    },
    /// A name that is none of an enum's.
    #[error(transparent)]
    UnknownName(#[from] UnknownName),
    /// A product or sum of fields does not fit.
    #[error("{what} overflows (at most {limit})")]
    Overflow {
        /// The expression, in field names.
        what: &'static str,
        /// Its largest value.
        limit: u64,
    },
    /// Fewer blocks in flight than queues: a queue would idle.
    #[error("Queue depth {queue_depth} is less than the {queues} queues: each queue needs a block in flight")]
    DepthBelowQueues {
        /// Blocks in flight.
        queue_depth: usize,
        /// Queues the driver uses.
        queues: usize,
    },
    /// The range ends past the device.
    #[error("Range end {end} is past the device's end ({capacity} bytes)")]
    PastEnd {
        /// offset + bs x count.
        end: u64,
        /// Device capacity.
        capacity: u64,
    },
    /// A write workload on a read-only device.
    #[error("The device is read-only")]
    ReadOnly,
    /// The block buffers cannot be allocated.
    #[error("Cannot allocate {len} bytes of block buffers")]
    Alloc {
        /// Bytes asked for.
        len: usize,
        /// The heap's error.
        #[source]
        source: iopath_heap::Error,
    },
    /// A block buffer access failed.
    #[error(transparent)]
    Heap(#[from] iopath_heap::Error),
    /// A block could not be submitted.
    #[error("Cannot submit block {block} (device byte {offset})")]
    Submit {
        /// Index of the block in the range.
        block: u64,
        /// Its device byte offset.
        offset: u64,
        /// The driver's error.
        #[source]
        source: BlkError,
    },
    /// The device failed a block.
    #[error("Block {block} (device byte {offset}) failed")]
    Block {
        /// Index of the block in the range.
        block: u64,
        /// Its device byte offset.
        offset: u64,
        /// The driver's error.
        #[source]
        source: BlkError,
    },
    /// Waiting for a completion (or a flush) failed.
    #[error(transparent)]
    Driver(#[from] BlkError),
    /// A completion whose tag is no slot in flight.
    #[error("Completion for tag {tag}, which no block in flight has")]
    UnknownTag {
        /// The tag.
        tag: u64,
    },
    /// The verify pass read data that is not the pattern.
    #[error("Verify failed: the device's byte {offset} differs from the {pattern} pattern")]
    Mismatch {
        /// Lowest device byte offset of a bad 8-byte word.
        offset: u64,
        /// The pattern expected.
        pattern: Pattern,
    },
    /// A queue's thread panicked.
    #[error("The thread of queue {queue} panicked")]
    Panicked {
        /// The queue.
        queue: usize,
    },
}
