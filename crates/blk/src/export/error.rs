//! [`ExportError`]: why exports cannot be parsed, checked or served.

use std::path::PathBuf;

use iopath_sys::unix_socket::SocketError;
use iopath_virtio::device::ServerError;

use crate::BackendError;

/// Why an export spec or a set of exports is refused, or cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// An option no export takes.
    #[error("Unknown export option {option:?} (accepted: {})", accepted.join(", "))]
    UnknownOption {
        /// The option as written.
        option: String,
        /// The options an export takes.
        accepted: &'static [&'static str],
    },
    /// An option given twice in one export.
    #[error("Export option {option:?} is given twice")]
    RepeatedOption {
        /// The option.
        option: String,
    },
    /// `image` or `socket` left out.
    #[error("Export option {option:?} is missing")]
    MissingOption {
        /// The option.
        option: &'static str,
    },
    /// A value the option does not take.
    #[error("Export option {option}={value} is not accepted: it must be {accepted}")]
    BadValue {
        /// The option.
        option: &'static str,
        /// The value given.
        value: String,
        /// What it takes.
        accepted: &'static str,
    },
    /// Two options that exclude each other.
    #[error("Export options {} and {} cannot both be given", options.0, options.1)]
    Conflict {
        /// The two options.
        options: (&'static str, &'static str),
    },
    /// Two exports on one socket.
    #[error("Two exports on one socket: {} and {}", first.display(), second.display())]
    SameSocket {
        /// The first export's socket.
        first: PathBuf,
        /// The second's, the same once resolved.
        second: PathBuf,
    },
    /// One image exported writable by two exports.
    #[error(
        "Image {} is exported writable twice (again as {}); make all but one readonly",
        first.display(),
        second.display()
    )]
    WritableTwice {
        /// The image as the first export names it.
        first: PathBuf,
        /// As the second names it.
        second: PathBuf,
    },
    /// An image cannot be served.
    #[error("Cannot serve {}", image.display())]
    Open {
        /// The image.
        image: PathBuf,
        /// Why.
        #[source]
        source: BackendError,
    },
    /// A socket cannot be listened on.
    #[error("Cannot listen for the export of {}", image.display())]
    Listen {
        /// The image it was to serve.
        image: PathBuf,
        /// Why (the path is in it).
        #[source]
        source: SocketError,
    },
    /// An export's listener broke; it stopped serving.
    #[error("Export on {} stopped", socket.display())]
    Stopped {
        /// Its socket.
        socket: PathBuf,
        /// Why.
        #[source]
        source: ServerError,
    },
}

impl ExportError {
    /// Whether the error is in how the exports were written (a usage
    /// error), not in serving them.
    pub fn is_usage(&self) -> bool {
        !matches!(
            self,
            ExportError::Open { .. } | ExportError::Listen { .. } | ExportError::Stopped { .. }
        )
    }
}
