//! [`BlkError`]: the errors of the virtio-blk driver and its queues.

use std::time::Duration;

use iopath_virtio::PolicyError;

/// Errors of the virtio-blk driver.
#[derive(Debug, thiserror::Error)]
pub enum BlkError {
    /// The virtio layer failed (queue, transport, DMA).
    #[error(transparent)]
    Virtio(#[from] iopath_virtio::Error),
    /// A DMA ops call failed.
    #[error(transparent)]
    Dma(#[from] iopath_dma::Error),
    /// The platform policy refused the device or could not make its ops.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// The transport refused an IOTLB record of the shared regions.
    #[error("Cannot map the shared regions in the device's IOTLB")]
    Iotlb(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A heap buffer access failed.
    #[error(transparent)]
    Heap(#[from] iopath_heap::Error),
    /// The device is not a block device.
    #[error("Device id {id} is not a block device (2)")]
    NotBlock {
        /// Device id the transport reports.
        id: u32,
    },
    /// Offset or length not a multiple of the 512-byte sector.
    #[error("Offset {offset} or length {len} is not a multiple of 512")]
    Unaligned {
        /// Byte offset on the device.
        offset: u64,
        /// Length in bytes.
        len: u64,
    },
    /// A range past the end of the device.
    #[error("Range {offset}+{len} is past the device's end ({capacity} bytes)")]
    OutOfRange {
        /// Byte offset.
        offset: u64,
        /// Length.
        len: u64,
        /// Device capacity in bytes.
        capacity: u64,
    },
    /// A zero-length transfer.
    #[error("Zero-length transfer")]
    Empty,
    /// The device's segment limits (or the DMA ops' largest mapping) do not
    /// allow even one block per request.
    #[error("Device limits (size_max {size_max:?}, seg_max {seg_max:?}, largest mapping {max_map}) cannot carry one block per request")]
    Limits {
        /// Largest segment, from config space.
        size_max: Option<u32>,
        /// Most segments, from config space.
        seg_max: Option<u32>,
        /// The DMA ops' largest mapping.
        max_map: u64,
    },
    /// The device does not offer the command (feature not negotiated).
    #[error("Device does not support {what}")]
    NotSupported {
        /// The command.
        what: &'static str,
    },
    /// The device is read-only.
    #[error("Device is read-only")]
    ReadOnly,
    /// The device answered `VIRTIO_BLK_S_IOERR`.
    #[error("Device reported an I/O error at sector {sector}")]
    IoError {
        /// First sector of the failed request.
        sector: u64,
    },
    /// The device answered `VIRTIO_BLK_S_UNSUPP`.
    #[error("Device does not support request type {kind}")]
    Unsupported {
        /// The request type.
        kind: u32,
    },
    /// The device wrote a status byte that means nothing, or none at all.
    #[error("Device returned invalid status {status:#x} for request type {kind}")]
    BadStatus {
        /// The status byte.
        status: u8,
        /// The request type.
        kind: u32,
    },
    /// The device did not complete anything within the timeout.
    #[error("No completion on queue {queue} within {} s: the {request} at sector {sector} (oldest of {in_flight} in flight) is unanswered", timeout.as_secs_f64())]
    Timeout {
        /// The queue.
        queue: u16,
        /// How long we waited.
        timeout: Duration,
        /// The oldest request in flight: `read`, `write`, `flush`, ...
        request: &'static str,
        /// Its first sector.
        sector: u64,
        /// Virtio requests in flight on the queue.
        in_flight: usize,
    },
    /// A wait for a completion with nothing in flight.
    #[error("Nothing in flight on queue {queue} to wait for")]
    Idle {
        /// The queue.
        queue: u16,
    },
    /// A queue index past the queues the driver set up.
    #[error("Queue {index} does not exist (driver uses {count})")]
    NoSuchQueue {
        /// Index.
        index: usize,
        /// Queues in use.
        count: usize,
    },
    /// A tag that is already in flight on the queue.
    #[error("Tag {tag} is already in flight")]
    DuplicateTag {
        /// The tag.
        tag: u64,
    },
}

/// Result of the virtio-blk driver.
pub type Result<T, E = BlkError> = std::result::Result<T, E>;
