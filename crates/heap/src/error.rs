use std::io;
use std::path::PathBuf;

/// Errors of the heap layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A heap device is not present on this machine.
    #[error("heap `{heap}` is not available: {path} does not exist")]
    Unavailable {
        /// Heap name.
        heap: String,
        /// The device node that was looked for.
        path: PathBuf,
    },
    /// A heap name that iopath does not know.
    #[error("unknown heap `{0}` (known: memfd, udmabuf, dma-heap[:NAME])")]
    UnknownHeap(String),
    /// A size that is zero or not a multiple of the page size.
    #[error("buffer size {size} is not a non-zero multiple of the page size ({page})")]
    BadSize {
        /// Requested size.
        size: usize,
        /// Page size.
        page: usize,
    },
    /// An access past the end of a buffer.
    #[error("range {offset}+{len} is outside the buffer of {buf_len} bytes")]
    OutOfRange {
        /// Start of the access.
        offset: usize,
        /// Length of the access.
        len: usize,
        /// Length of the buffer.
        buf_len: usize,
    },
    /// The buffer is mapped for a device; CPU writes and file transfers into
    /// it must wait until it is unmapped or synced back.
    #[error("buffer is busy: mapped for a device ({maps} mapping(s))")]
    Busy {
        /// How many device mappings are live.
        maps: usize,
    },
    /// A system call failed.
    #[error("{op} failed")]
    Sys {
        /// What was being done.
        op: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A peer sent something that is not a buffer.
    #[error("bad buffer message from peer: {0}")]
    BadMessage(&'static str),
}

impl Error {
    pub(crate) fn sys(op: &'static str, source: impl Into<io::Error>) -> Self {
        Error::Sys {
            op,
            source: source.into(),
        }
    }
}

/// Result with the heap [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
