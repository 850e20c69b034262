//! The bench's error type.

use std::io;
use std::path::{Path, PathBuf};

/// Why an experiment could not run (a missing peer is not one of them when
/// the peer only has a row: that row is dropped and the run goes on).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A setting outside what the experiment accepts.
    #[error("{option}: {reason}")]
    Invalid {
        /// The option (as the CLI spells it).
        option: &'static str,
        /// What is wrong and what would be accepted.
        reason: String,
    },
    /// A program the experiment needs is not installed.
    #[error("{}", .0.note())]
    MissingPeer(crate::Missing),
    /// A program ran and failed, or said something the bench cannot read.
    #[error("{program} failed: {reason}")]
    Peer {
        /// The program.
        program: String,
        /// Its status and last words.
        reason: String,
    },
    /// I/O on a file or socket.
    #[error("I/O on {}", path.display())]
    Io {
        /// The file, directory or socket.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A system call on no particular file.
    #[error("{op} failed")]
    Sys {
        /// What was being done.
        op: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A measurement's own check failed (an echo came back wrong, the
    /// service kept endpoints, a peer did not come up in time).
    #[error("{0}")]
    Check(String),
    /// A report file could not be written.
    #[error("{option}: cannot write {}", path.display())]
    Write {
        /// The option that asked for it (`--plot`, `--json`, `--markdown`).
        option: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A program could not be started, or did not do what the bench
    /// waited for.
    #[error(transparent)]
    Child(#[from] iopath_sys::process::ChildError),
    /// A lower layer failed: the heap, the virtio-blk driver, the endpoint
    /// service, the rpmsg bus, a notifier.
    #[error("{context}")]
    Layer {
        /// What was being done.
        context: String,
        /// The layer's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// Results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The error and its sources on one line.
    pub fn chain(&self) -> String {
        iopath_sys::error_chain(self)
    }

    /// [`Error::Io`] on `path` from an OS or a rustix error.
    pub(crate) fn io<E: Into<io::Error>>(
        path: &(impl AsRef<Path> + ?Sized),
    ) -> impl Fn(E) -> Error + Copy + '_ {
        move |e| Error::Io {
            path: path.as_ref().to_path_buf(),
            source: e.into(),
        }
    }

    pub(crate) fn write(
        option: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(io::Error) -> Error {
        let path = path.into();
        move |source| Error::Write {
            option,
            path,
            source,
        }
    }

    pub(crate) fn sys<E: Into<io::Error>>(op: &'static str) -> impl FnOnce(E) -> Error {
        move |e| Error::Sys {
            op,
            source: e.into(),
        }
    }

    pub(crate) fn spawn(program: impl Into<String>) -> impl FnOnce(io::Error) -> Error {
        let program = program.into();
        move |source| Error::Child(iopath_sys::process::ChildError::Spawn { program, source })
    }

    pub(crate) fn layer<E: std::error::Error + Send + Sync + 'static>(
        context: impl Into<String>,
    ) -> impl FnOnce(E) -> Error {
        let context = context.into();
        move |e| Error::Layer {
            context,
            source: Box::new(e),
        }
    }
}

/// The `Err(Error::Check)` of `format!(...)`, like `anyhow::bail!`.
macro_rules! check_failed {
    ($($t:tt)*) => { return Err($crate::Error::Check(format!($($t)*))) };
}

/// `check_failed!` unless the condition holds, like `anyhow::ensure!`.
macro_rules! check {
    ($cond:expr, $($t:tt)*) => { if !$cond { check_failed!($($t)*) } };
}

/// `Err(Error::Invalid)` for `option`.
macro_rules! invalid {
    ($option:expr, $($t:tt)*) => {
        return Err($crate::Error::Invalid { option: $option, reason: format!($($t)*) })
    };
}

pub(crate) use {check, check_failed, invalid};
