use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

/// Errors of the heap layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A heap device is not present on this machine.
    #[error("heap `{heap}` is not available: {path} does not exist", path = shown(path))]
    Unavailable {
        /// Heap name.
        heap: String,
        /// The device node that was looked for.
        path: PathBuf,
    },
    /// A heap name that iopath does not know.
    #[error("unknown heap `{0}` (known: auto, memfd, memfd:thp, memfd:hugetlb, udmabuf, dma-heap[:NAME])")]
    UnknownHeap(String),
    /// A dma-heap name this kernel does not have.
    #[error("this kernel has no dma-heap `{name}` (it has: {known})")]
    NoSuchDmaHeap {
        /// The name asked for.
        name: String,
        /// The names in /dev/dma_heap.
        known: String,
    },
    /// A buffer larger than the kernel's udmabuf takes.
    #[error(
        "udmabuf refuses a buffer of {size} bytes: the kernel's limit is {} MiB per buffer; \
         raise the udmabuf module option size_limit_mb (udmabuf.size_limit_mb=N on the kernel \
         command line, or /sys/module/udmabuf/parameters/size_limit_mb) or use smaller buffers",
        limit_mb.map_or("size_limit_mb (64 by default)".to_string(), |m| m.to_string())
    )]
    UdmabufLimit {
        /// Bytes asked for.
        size: usize,
        /// The limit in MiB, when it could be read.
        limit_mb: Option<u64>,
    },
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
    /// An integer access at an address that is not a multiple of its size.
    #[error("access at buffer offset {offset} is not aligned to {align} bytes")]
    Misaligned {
        /// Offset of the access in its buffer.
        offset: usize,
        /// The alignment it needs.
        align: usize,
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
    /// A mapping that must be guarded against SIGBUS and cannot be.
    #[error(
        "cannot guard a mapping of {len} bytes against SIGBUS (65,536 mappings are guarded \
         already, or the handler could not be installed): a file shrunk under it would kill \
         the process, so it is not mapped; drop buffers no longer used"
    )]
    Unguarded {
        /// Its length.
        len: usize,
    },
    /// A peer sent something that is not a buffer.
    #[error("bad buffer message from peer: {0}")]
    BadMessage(&'static str),
    /// A file could not be opened or inspected.
    #[error("cannot open {path}", path = shown(path))]
    Open {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The path names something that is not a regular file (a directory, a
    /// device, a socket).
    #[error("{path} is not a regular file ({what})", path = shown(path))]
    NotAFile {
        /// The path.
        path: PathBuf,
        /// What it is instead.
        what: &'static str,
    },
    /// The file has no bytes to load.
    #[error("{path} is empty", path = shown(path))]
    EmptyFile {
        /// The file.
        path: PathBuf,
    },
    /// The file ends before the requested range does.
    #[error(
        "{path} is {missing} bytes too short: {offset}+{len} was asked, the file has {size} bytes",
        path = shown(path)
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
    #[error("{op} of {path} at offset {offset} ({len} bytes) failed", path = shown(path))]
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
    /// A prefault mode that iopath does not know.
    #[error("`{0}` is not one of auto, allocate, map, none")]
    UnknownPrefault(String),
    /// A method name that iopath does not know.
    #[error(
        "unknown transfer method `{0}` (known: auto, buffered, direct, sendfile, uring, bounce; map for safetensors)"
    )]
    UnknownMethod(String),
    /// An io_uring queue depth out of range.
    #[error("io_uring queue depth {depth} is out of range: use 1 to 4096")]
    BadQueueDepth {
        /// The depth asked for.
        depth: u32,
    },
    /// An io_uring request size that is not accepted.
    #[error("io_uring request size {chunk} must be a non-zero multiple of 4096 up to 1 GiB")]
    BadChunk {
        /// The size asked for.
        chunk: usize,
    },
    /// Zero buffers asked for.
    #[error("0 buffers asked for: ask for at least 1, or leave the count out to fit the file")]
    NoBuffers,
    /// The load would need more memory than the machine can give now.
    #[error(
        "loading needs {needed} bytes of buffers, but only {available} bytes can be allocated \
         now ({what}): load fewer bytes or free memory"
    )]
    OutOfMemory {
        /// Bytes of buffers the load would allocate.
        needed: u64,
        /// Bytes that can be allocated.
        available: u64,
        /// What limits it.
        what: &'static str,
    },
    /// The load would need more buffers than may exist at once.
    #[error(
        "{buffers} buffers of {buffer_size} bytes would be needed, but only {room} more can \
         exist (each is one of the process's {what}): use a buffer size of at least {min_buffer_size}"
    )]
    TooManyBuffers {
        /// Buffers the load would make.
        buffers: u64,
        /// Their size.
        buffer_size: usize,
        /// How many more may exist.
        room: u64,
        /// The limit.
        what: &'static str,
        /// The smallest buffer size that would fit.
        min_buffer_size: u64,
    },
    /// A checkpoint of more shards than the process may hold files for:
    /// each shard needs a buffer of its own, whatever their size.
    #[error(
        "the checkpoint's {shards} shards need at least {needed} more open files (a buffer \
         of its own for each shard, and each shard's file while it loads), but only {room} \
         more can exist (each is one of the process's {what}): a larger buffer size cannot \
         help; {fix}"
    )]
    TooManyShards {
        /// Shards in the checkpoint.
        shards: u64,
        /// Files (and mappings) they need at least.
        needed: u64,
        /// How many more may exist.
        room: u64,
        /// The limit.
        what: &'static str,
        /// How to raise it.
        fix: &'static str,
    },
    /// A file whose reported size is not the length of its contents (a
    /// /proc or /sys file: size 0 with data, or 4096 with a line of text).
    #[error(
        "{path} reports a size of {reported} ({what}): only files whose size is known can be \
         loaded; copy it to a regular file first (cp {path} FILE)",
        path = shown(path),
        reported = if *size == 0 {
            "0 but has data".to_string()
        } else {
            format!("{size} bytes that is not the length of its contents")
        }
    )]
    UnknownSize {
        /// The file.
        path: PathBuf,
        /// The size it reports.
        size: u64,
        /// What it is, as far as can be told (`a /sys file`).
        what: &'static str,
    },
    /// A safetensors file whose header is refused.
    #[error("{path} is not a safetensors file iopath accepts: {reason}", path = shown(path))]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A checkpoint whose files disagree: an index that is malformed or
    /// names a shard that does not exist, a tensor in two shards, a shard
    /// holding a tensor the index puts elsewhere.
    #[error("{path} is not a checkpoint iopath accepts: {reason}", path = shown(path))]
    Checkpoint {
        /// The file or directory given.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// One shard of a checkpoint failed, and with it the whole load.
    #[error("shard {index} of {count} ({path})", path = shown(path))]
    Shard {
        /// Its place among the shards, from 1, files ordered by name.
        index: usize,
        /// Shards in the checkpoint.
        count: usize,
        /// The shard's file.
        path: PathBuf,
        /// What went wrong.
        #[source]
        source: Box<Error>,
    },
    /// A file that changed while it was loaded: written, truncated or
    /// replaced between the open and the last read.
    #[error(
        "{path} changed while it was being loaded (its size, modification or change time \
         moved): nothing was kept; load it again",
        path = shown(path)
    )]
    Changed {
        /// The file.
        path: PathBuf,
    },
    /// An attach to shared tensors that cannot be made, or a share that
    /// cannot be served.
    #[error("{}: {reason}", if handle.is_empty() { "cannot share".to_string() } else { format!("cannot attach to {handle:?}") })]
    Share {
        /// The handle given (empty when serving).
        handle: String,
        /// Why not.
        reason: String,
    },
    /// A loaded buffer differs from the file it was loaded from.
    #[error(
        "verify failed: byte {file_offset} of {path} differs (buffer {buffer}, offset \
         {buffer_offset}: file has {file_byte:#04x}, buffer has {buffer_byte:#04x})",
        path = shown(path)
    )]
    Mismatch {
        /// The file.
        path: PathBuf,
        /// Offset of the first differing byte in the file.
        file_offset: u64,
        /// Index of the buffer that holds it.
        buffer: usize,
        /// Its offset in that buffer.
        buffer_offset: usize,
        /// The byte in the file.
        file_byte: u8,
        /// The byte in the buffer.
        buffer_byte: u8,
    },
    /// A loaded tensor differs from its bytes in the file.
    #[error(
        "verify failed: tensor `{tensor}` byte {index} differs (file offset {file_offset}: file \
         has {file_byte:#04x}, buffer {buffer} has {buffer_byte:#04x})"
    )]
    TensorMismatch {
        /// The tensor's name.
        tensor: String,
        /// Index of the first differing byte in the tensor.
        index: usize,
        /// Its offset in the file.
        file_offset: u64,
        /// Index of the buffer that holds the tensor.
        buffer: usize,
        /// The byte in the file.
        file_byte: u8,
        /// The byte in the buffer.
        buffer_byte: u8,
    },
    /// The loader's allocator thread died (a bug; reported instead of a panic).
    #[error("allocator thread failed: {0}")]
    Loader(String),
}

/// A path or file name as an error shows it: characters that would
/// drive a terminal (controls, escape sequences, bidirectional
/// overrides) escaped as Rust escapes them (`\u{1b}`), the rest as is. A
/// name from outside (an index, a directory listing, a handle) can then
/// neither retitle nor clear the terminal of whoever reads the error.
pub(crate) fn shown(path: &Path) -> Shown<'_> {
    Shown(path)
}

/// See [`shown`].
pub(crate) struct Shown<'a>(&'a Path);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        escape(&self.0.to_string_lossy(), f)
    }
}

/// Writes `s` with its control and bidirectional-override characters
/// escaped.
pub(crate) fn escape(s: &str, f: &mut impl fmt::Write) -> fmt::Result {
    for c in s.chars() {
        let bidi = matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
        if c.is_control() || bidi {
            write!(f, "{}", c.escape_unicode())?;
        } else {
            f.write_char(c)?;
        }
    }
    Ok(())
}

/// `s` with its control and bidirectional-override characters escaped.
pub(crate) fn escaped(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let _ = escape(s, &mut out);
    out
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

#[cfg(test)]
mod tests {
    use super::*;

    /// An error one level above the heap's.
    #[derive(Debug, thiserror::Error)]
    #[error("loading model.bin")]
    struct Outer(#[source] Error);

    #[test]
    fn error_chain_joins_every_source_outermost_first() {
        let e = Outer(Error::sys("pread", io::Error::from_raw_os_error(5)));
        assert_eq!(
            iopath_sys::error_chain(&e),
            "loading model.bin: pread failed: Input/output error (os error 5)"
        );
        // No source: the message alone.
        assert_eq!(
            iopath_sys::error_chain(&Error::NoBuffers),
            "0 buffers asked for: ask for at least 1, or leave the count out to fit the file"
        );
    }
}
