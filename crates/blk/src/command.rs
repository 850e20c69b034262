//! The block-device commands a driver queue takes ([`Command`]) and what
//! it hands back ([`Done`]); shared by the driver and its queues.

use iopath_heap::Buffer;

use crate::error::Result;

/// One block-device command.
#[derive(Debug, Clone, Copy)]
pub enum Command<'a> {
    /// Read `len` bytes at byte `offset` of the device into `buf` at
    /// `buf_offset`.
    Read {
        /// Byte offset on the device (sector multiple).
        offset: u64,
        /// Destination.
        buf: &'a Buffer,
        /// Start in `buf`.
        buf_offset: usize,
        /// Bytes (sector multiple).
        len: usize,
    },
    /// Write `len` bytes of `buf` at `buf_offset` to byte `offset`.
    Write {
        /// Byte offset on the device (sector multiple).
        offset: u64,
        /// Source.
        buf: &'a Buffer,
        /// Start in `buf`.
        buf_offset: usize,
        /// Bytes (sector multiple).
        len: usize,
    },
    /// Make every completed write durable (`VIRTIO_BLK_T_FLUSH`).
    Flush,
    /// Let the device forget `len` bytes at `offset` (`DISCARD`).
    Discard {
        /// Byte offset (sector multiple).
        offset: u64,
        /// Bytes (sector multiple).
        len: u64,
    },
    /// Zero `len` bytes at `offset` (`WRITE_ZEROES`), deallocating them if
    /// `unmap` and the device allows it.
    WriteZeroes {
        /// Byte offset (sector multiple).
        offset: u64,
        /// Bytes (sector multiple).
        len: u64,
        /// Whether the device may deallocate.
        unmap: bool,
    },
}

/// A finished request: its tag and outcome.
#[derive(Debug)]
pub struct Done {
    /// The tag given to [`BlkQueue::submit`](crate::BlkQueue::submit).
    pub tag: u64,
    /// Outcome (the first error, if any of its pieces failed).
    pub result: Result<()>,
    /// For a request submitted under
    /// [`BlkQueue::limit_in_flight`](crate::BlkQueue::limit_in_flight),
    /// which may hold it back: when it was handed to the device, and when
    /// its completion was seen (for a request cut into pieces: the piece
    /// that completed last). `None`: it went to the device as it was
    /// submitted.
    pub timing: Option<(std::time::Instant, std::time::Instant)>,
}
