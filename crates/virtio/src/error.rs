//! Errors of the virtio layer.

use std::io;

/// Errors of the virtio driver side and transports.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A DMA ops error (mapping refused, unknown mapping, ...).
    #[error(transparent)]
    Dma(#[from] iopath_dma::Error),
    /// Not enough free descriptors for the request; retry after completions.
    #[error("virtqueue full: request needs {needed} descriptors, {free} free")]
    QueueFull {
        /// Descriptors the request needs.
        needed: usize,
        /// Descriptors free now.
        free: usize,
    },
    /// A request with no buffers.
    #[error("request has no buffers")]
    EmptyRequest,
    /// A segment longer than a descriptor can describe.
    #[error("segment of {len} bytes is longer than a descriptor allows (u32)")]
    SegmentTooLong {
        /// Its length.
        len: usize,
    },
    /// A queue size that is zero, not a power of two, or above the device's maximum.
    #[error("queue size {size} is invalid (power of two, 1..={max})")]
    BadQueueSize {
        /// Requested size.
        size: u16,
        /// Device maximum.
        max: u16,
    },
    /// Rings placed where they cannot go (see `RingPlacement`).
    #[error("rings at offset {offset:#x} with used-ring alignment {align:#x} do not fit a {region}-byte region")]
    BadPlacement {
        /// Offset of the descriptor table in the region.
        offset: usize,
        /// Used-ring alignment.
        align: usize,
        /// Region size.
        region: usize,
    },
    /// A queue index the device does not have.
    #[error("queue {index} does not exist (device has {count})")]
    NoSuchQueue {
        /// Requested index.
        index: u16,
        /// Number of queues.
        count: u16,
    },
    /// The device misbehaved on the used ring; the queue is now broken and the
    /// device needs a reset.
    #[error("device broke the used ring: {0}")]
    Device(#[from] DeviceError),
    /// The queue was broken by an earlier device error.
    #[error("virtqueue is broken (an earlier device error); reset the device")]
    Broken,
    /// Feature negotiation failed.
    #[error("device features {device:#x} rejected: missing {missing:#x}")]
    FeaturesRejected {
        /// What the device offered.
        device: u64,
        /// Required bits it lacks (0: the device cleared FEATURES_OK).
        missing: u64,
    },
    /// The DMA ops need an IOTLB enforcer but the transport has none.
    #[error("the DMA ops translate through an IOTLB but the transport cannot enforce one")]
    NoIotlb,
    /// The device side failed to map the shared regions.
    #[error("cannot map shared region at {gpa:#x} ({len} bytes) on the device side")]
    MapRegion {
        /// Region base.
        gpa: u64,
        /// Region length.
        len: usize,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// The transport failed; its own error, boxed (a caller that knows
    /// the transport finds it with `downcast_ref`).
    #[error(transparent)]
    Transport(Box<dyn std::error::Error + Send + Sync + 'static>),
    /// The transport is gone (device thread ended, peer closed).
    #[error("transport closed")]
    Closed,
    /// A system call failed.
    #[error("{op} failed")]
    Sys {
        /// What was being done.
        op: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// A device breaking the split-ring protocol (never trusted, never a panic).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    /// A used element whose id is not a descriptor head.
    #[error("used id {id} is out of range (queue size {size})")]
    UsedIdOutOfRange {
        /// The id the device wrote.
        id: u32,
        /// Queue size.
        size: u16,
    },
    /// A used element for a descriptor head not in flight.
    #[error("used id {id} is not in flight")]
    UsedIdNotInFlight {
        /// The id the device wrote.
        id: u32,
    },
    /// A used length above what the driver offered for writing.
    #[error("used len {len} for id {id} exceeds the {max} writable bytes")]
    UsedLenTooLarge {
        /// Head id.
        id: u32,
        /// Length the device wrote.
        len: u32,
        /// Writable bytes offered.
        max: u64,
    },
    /// `used.idx` moved by more than the queue size.
    #[error("used idx jumped from {last} to {idx} (queue size {size})")]
    UsedIdxJump {
        /// Last used index seen.
        last: u16,
        /// Index the device published.
        idx: u16,
        /// Queue size.
        size: u16,
    },
}

impl Error {
    pub(crate) fn sys(op: &'static str, source: impl Into<io::Error>) -> Self {
        Error::Sys {
            op,
            source: source.into(),
        }
    }
}

/// Result with the virtio [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
