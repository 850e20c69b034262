//! The client side of the bus owner's control socket, a `SOCK_SEQPACKET`
//! unix socket through which local clients reach endpoints on the bus, and
//! its wire protocol ([`proto`]). The server is [`crate::CtrlServer`], in
//! the endpoint service; this module knows nothing of it.
//!
//! Every request starts with `"IOPR" ver u16 op u16` (little-endian); every
//! answer with the same eight bytes, then `status i32` (0 or a negative
//! errno) and request-specific fields. Version 1 knows these requests:
//!
//! - `ATTACH` (op 1): `name[32] src u32 dst u32 timeout_ms u32`. The owner
//!   waits up to `timeout_ms` for the peer to announce `name` (unless `dst`
//!   is given), creates an announced endpoint bound to it and answers
//!   `src u32 dst u32`. From then on the connection *is* the endpoint: one
//!   packet per message each way (at most 496 bytes), end of file when the
//!   peer destroys the service or the link goes down; closing the
//!   connection destroys the endpoint (name-service DESTROY).
//!
//! - The endpoint service's requests (`CREATE_EPT`, `CREATE_EPT_FD`,
//!   `STATS`; see [`proto`]), any number per connection, in order; the
//!   client side is [`CtrlClient`] and [`EptFd`]. They mirror the Linux
//!   rpmsg uAPI structs, defined once in [`uapi`].
//!
//! Unknown ops are answered with `-EOPNOTSUPP` and the connection closed;
//! so is anything that is not a request at all (one log line each). The
//! owner keeps serving every other client.

mod attach;
mod client;
mod ept_fd;
pub mod proto;
pub mod uapi;

pub use attach::CtrlEndpoint;
pub use client::CtrlClient;
pub use ept_fd::{hand_to_command, EptFd};
pub use proto::{
    AttachRequest, EptInfo, ServiceStats, ATTACH_LEN, ATTACH_REPLY_LEN, MAGIC, OP_ATTACH, VERSION,
};

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::net::{AddressFamily, SocketFlags, SocketType};
use thiserror::Error;

/// Where the endpoint service served on control socket `ctrl` puts its
/// legacy nodes unless told otherwise: the socket path with `.d` appended
/// (`/tmp/rp.ctrl` gives `/tmp/rp.ctrl.d`).
pub fn default_run_dir(ctrl: &Path) -> PathBuf {
    let mut p = ctrl.as_os_str().to_owned();
    p.push(".d");
    PathBuf::from(p)
}

/// Control-socket failures.
#[derive(Debug, Error)]
pub enum CtrlError {
    /// A socket call failed.
    #[error("{op} failed")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The owner refused the request.
    #[error("Request refused: {}", std::io::Error::from_raw_os_error(*errno))]
    Refused {
        /// The errno.
        errno: i32,
    },
    /// The other side spoke something else.
    #[error("Protocol error: {0}")]
    Protocol(&'static str),
    /// A bad name.
    #[error("Bad name")]
    Name(#[from] crate::wire::WireError),
    /// Another server listens on the socket path.
    #[error("{} is in use by another server", path.display())]
    InUse {
        /// The socket path.
        path: PathBuf,
    },
    /// An fd number given as an inherited endpoint is none.
    #[error("Not an inherited endpoint: {why}")]
    NotInherited {
        /// The fd number.
        fd: i32,
        /// Why not.
        why: &'static str,
    },
    /// The socket path is taken by a file that is not a socket.
    #[error("{} exists and is not a socket", path.display())]
    NotSocket {
        /// The path.
        path: std::path::PathBuf,
    },
}

impl CtrlError {
    /// Maps a refused claim of `path`.
    pub(crate) fn from_claim(r: iopath_sys::unix_socket::SocketError) -> Self {
        use iopath_sys::unix_socket::SocketError;
        match r {
            SocketError::InUse { path } => CtrlError::InUse { path },
            SocketError::NotSocket { path } => CtrlError::NotSocket { path },
            SocketError::Io { op, source, .. } => CtrlError::Io { op, source },
            e @ SocketError::TooLong { .. } => CtrlError::Io {
                op: "socket path",
                source: std::io::Error::other(e),
            },
        }
    }
}

fn sys(op: &'static str) -> impl FnOnce(rustix::io::Errno) -> CtrlError {
    move |e| CtrlError::Io {
        op,
        source: e.into(),
    }
}

/// A new `SOCK_SEQPACKET` unix socket (close-on-exec).
pub(crate) fn seqpacket() -> Result<OwnedFd, CtrlError> {
    rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .map_err(sys("socket"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_dir_is_beside_the_socket() {
        assert_eq!(
            default_run_dir(Path::new("/tmp/rp.ctrl")),
            Path::new("/tmp/rp.ctrl.d")
        );
    }
}
