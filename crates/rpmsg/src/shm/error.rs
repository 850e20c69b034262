//! Why a shared-memory file could not be used, and who holds one.

use std::path::PathBuf;

use thiserror::Error;

use crate::rsc_table::RscError;

/// Why the shared memory could not be used.
#[derive(Debug, Error)]
pub enum ShmError {
    /// Opening, creating or sizing the file failed.
    #[error("Shared memory {path}: {op} failed")]
    File {
        /// The file.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// Mapping it failed.
    #[error("Mapping the shared memory failed")]
    Map(#[source] iopath_heap::Error),
    /// Building the guest-memory view failed.
    #[error("Guest memory view of the shared memory: {0}")]
    View(String),
    /// An access outside the shared memory.
    #[error("Access of {len} bytes at {addr:#x} lies outside the shared memory")]
    Outside {
        /// Device address.
        addr: u64,
        /// Length.
        len: usize,
    },
    /// The resource table is refused.
    #[error("Resource table refused")]
    Table(#[from] RscError),
    /// A file whose size no shared memory has.
    #[error("Shared memory {} is {len} bytes, not a non-zero multiple of the page size ({page})", path.display())]
    Size {
        /// The file.
        path: PathBuf,
        /// Its size.
        len: u64,
        /// The page size.
        page: usize,
    },
    /// A file users other than its owner (or an owner other than this user
    /// or root) can write: whoever can write it can forge any message.
    #[error("Shared memory {} (mode {mode:o}, owner uid {uid}) can be written by other users", path.display())]
    Writable {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
        /// Its owner.
        uid: u32,
    },
    /// Another process holds the file (see [`super::ShmOwner`]).
    #[error("Shared memory {} is in use by another {holder}{}", path.display(),
        pid.map(|p| format!(" (pid {p})")).unwrap_or_default())]
    InUse {
        /// The file.
        path: PathBuf,
        /// Who holds it.
        holder: ShmHolder,
        /// Its pid, where the kernel tells it.
        pid: Option<u32>,
    },
}

/// Who was found holding a shared-memory file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShmHolder {
    /// A remote holds it.
    Remote,
    /// A host holds it.
    Host,
    /// A process has it mapped in a session (a host whose remote is not
    /// iopath's, or one that has not yet seen its remote go).
    Session,
}

impl std::fmt::Display for ShmHolder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ShmHolder::Remote => "remote",
            ShmHolder::Host => "host",
            ShmHolder::Session => "process that has it mapped",
        })
    }
}
