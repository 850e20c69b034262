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
    /// A file could not be opened or inspected.
    #[error("cannot open {path}")]
    Open {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The path names something that is not a regular file (a directory, a
    /// device, a socket).
    #[error("{path} is not a regular file ({what})")]
    NotAFile {
        /// The path.
        path: PathBuf,
        /// What it is instead.
        what: &'static str,
    },
    /// The file has no bytes to load.
    #[error("{path} is empty")]
    EmptyFile {
        /// The file.
        path: PathBuf,
    },
    /// The file ends before the requested range does.
    #[error(
        "{path} is {missing} bytes too short: {offset}+{len} was asked, the file has {size} bytes"
    )]
    ShortFile {
        /// The file.
        path: PathBuf,
        /// The file's size when the shortfall was seen.
        size: u64,
        /// Start of the requested range in the file.
        offset: u64,
        /// Length of the requested range.
        len: u64,
        /// How many bytes of the range are missing.
        missing: u64,
    },
    /// A read or write of a file failed.
    #[error("{op} of {path} at offset {offset} ({len} bytes) failed")]
    FileIo {
        /// The system call.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// File offset of the failed request.
        offset: u64,
        /// Length of the failed request.
        len: usize,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A transfer method that cannot work with this buffer or file.
    #[error("method `{method}` cannot be used here: {reason}")]
    Unsupported {
        /// The method.
        method: &'static str,
        /// Why not.
        reason: String,
    },
    /// A method name that iopath does not know.
    #[error("unknown transfer method `{0}` (known: auto, buffered, direct, sendfile, uring)")]
    UnknownMethod(String),
    /// The loader's allocator thread died (a bug; reported instead of a panic).
    #[error("allocator thread failed: {0}")]
    Loader(String),
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
