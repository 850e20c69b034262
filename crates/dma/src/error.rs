//! Errors of the DMA layer.

/// Errors of the DMA ops.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The buffer is not in a memory region registered with these ops, so the
    /// device cannot see it.
    #[error("buffer ({buf_len} bytes) is not registered with the {ops} DMA ops")]
    NotRegistered {
        /// Which ops refused.
        ops: &'static str,
        /// Length of the buffer.
        buf_len: usize,
    },
    /// The buffer is already registered.
    #[error("buffer is already registered at device address {addr:#x}")]
    AlreadyRegistered {
        /// Its device base address.
        addr: u64,
    },
    /// A mapping (or device address) these ops never handed out, or one that
    /// was already unmapped.
    #[error(
        "mapping {id} at device address {addr:#x} is not mapped (never mapped or already unmapped)"
    )]
    NotMapped {
        /// Mapping id.
        id: u64,
        /// Device address.
        addr: u64,
    },
    /// A range that goes past the end of a mapping.
    #[error("range {offset}+{len} is outside the mapping of {map_len} bytes")]
    OutsideMapping {
        /// Start of the range inside the mapping.
        offset: usize,
        /// Length of the range.
        len: usize,
        /// Length of the mapping.
        map_len: usize,
    },
    /// A zero-length mapping or allocation.
    #[error("zero-length DMA mapping or allocation")]
    ZeroLength,
    /// A mapping larger than these ops can ever map.
    #[error("mapping of {len} bytes is larger than the largest possible ({max} bytes)")]
    TooLarge {
        /// Requested length.
        len: usize,
        /// [`crate::DmaOps::max_mapping_size`].
        max: usize,
    },
    /// No room right now (bounce slots or IOVA space in use) and the caller
    /// asked not to wait (or the wait timed out).
    #[error("no room to map {len} bytes: {what} exhausted")]
    NoSpace {
        /// Requested length.
        len: usize,
        /// What ran out ("bounce slots", "IOVA space").
        what: &'static str,
    },
    /// The IOTLB sink (the transport's channel to the enforcer) failed.
    #[error("IOTLB sink refused a record")]
    Sink(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The device address space is exhausted.
    #[error("device address space exhausted")]
    AddressSpace,
    /// The policy cannot pick ops for this device.
    #[error("DMA policy: {0}")]
    Policy(&'static str),
    /// An error of the heap layer (out-of-range buffer access, busy buffer,
    /// allocation failure).
    #[error(transparent)]
    Heap(#[from] iopath_heap::Error),
}

/// Result with the DMA [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
