//! The limits' far ends: bare servers in another process that do what the
//! rpmsg path does with nothing of rpmsg in them, and their clients.
//!
//! ```text
//!   bench (client)                   child ([`crate::child`])
//!   fd::RawFdServer   <-SEQPACKET->  fd::serve: a packet answered with an fd
//!   poll::RawPollPath <-SEQPACKET->  poll::forward <-page-> poll::echo
//!   sink::Sinks       <-SEQPACKET->  sink::serve: packets counted
//! ```

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use iopath_sys::unix_socket;
use rustix::net::{SocketFlags, SocketType};

use crate::child::Server;
use crate::place::Spawned;
use crate::{Error, Result};

pub(crate) mod fd;
pub(crate) mod poll;
pub(crate) mod sink;

/// Runs the bench server `server` until its client is done.
pub(crate) fn serve(server: Server) -> Result<()> {
    match server {
        Server::Fd { sock } => fd::serve(&sock),
        Server::PollForward { sock, shm, count } => poll::forward(&sock, &shm, count),
        Server::PollEcho { shm, count } => poll::echo(&shm, count),
        Server::Sink { sock } => sink::serve(&sock),
    }
}

/// The far end of a raw limit: listens on the `SOCK_SEQPACKET` socket
/// `sock` and takes its one client; with the error mapper for `sock`.
fn accept_one(sock: &Path) -> Result<(OwnedFd, impl Fn(rustix::io::Errno) -> Error + Copy + '_)> {
    let io = Error::io(sock);
    let l = unix_socket::listen(sock, SocketType::SEQPACKET, unix_socket::PRIVATE_MODE, 1)
        .map_err(Error::layer(format!("listening on {}", sock.display())))?;
    let c = rustix::net::accept_with(&l, SocketFlags::CLOEXEC).map_err(io)?;
    Ok((c, io))
}

/// A `SOCK_SEQPACKET` connection to `sock`, retrying for 10 s while its
/// server starts.
fn connect_retry(sock: &Path) -> Result<OwnedFd> {
    let deadline = Instant::now() + Duration::from_secs(10);
    unix_socket::connect_until(sock, SocketType::SEQPACKET, deadline).map_err(Error::io(sock))
}

/// Raw server children and the client's connection to the one listening
/// on `sock` in their scratch directory.
#[derive(Debug)]
struct Connected {
    _children: Vec<Spawned>,
    conn: OwnedFd,
    _dir: tempfile::TempDir,
}

impl Connected {
    /// Makes a scratch directory in `parent` named after `prefix`, starts
    /// the children `spawn(dir, socket)` returns, and connects to the socket.
    fn start(
        prefix: &str,
        parent: &Path,
        spawn: impl FnOnce(&Path, PathBuf) -> Result<Vec<Spawned>>,
    ) -> Result<Connected> {
        let dir = crate::cleanup::temp_dir(prefix, parent)?;
        let sock = dir.path().join("sock");
        let children = spawn(dir.path(), sock.clone())?;
        let conn = connect_retry(&sock)?;
        Ok(Connected {
            _children: children,
            conn,
            _dir: dir,
        })
    }

    /// One raw server, `server(socket)` of the executable `exe`, on `cpu`.
    fn server(
        exe: &Path,
        prefix: &str,
        cpu: Option<usize>,
        server: impl FnOnce(PathBuf) -> Server,
    ) -> Result<Connected> {
        Connected::start(prefix, &std::env::temp_dir(), |_, sock| {
            let mut cmd = server(sock).command(exe);
            Ok(vec![crate::place::spawn(
                "a raw server",
                None,
                cpu,
                &mut cmd,
            )?])
        })
    }
}
