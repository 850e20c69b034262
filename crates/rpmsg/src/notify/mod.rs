//! Notifications between host and remote, behind one trait.
//!
//! - [`EventfdNotifier`]: a pair of eventfds (one per direction), created by
//!   the listening side and passed to the connecting side over a unix socket
//!   with `SCM_RIGHTS`; the socket stays open so that a peer that exits is
//!   noticed (hang-up).
//! - [`UnixByteNotifier`]: one `0x01` byte per kick on a unix stream socket;
//!   the receiver drains what is pending and rescans both rings. This is
//!   what OpenAMP's Linux demo does (`/tmp/openamp.event.0`; the remote
//!   listens, the host connects).
//! - [`PollNotifier`]: no notification at all; both sides rescan the rings.
//!
//! Which side listens: the remote (it also writes the resource table, as in
//! OpenAMP's demo); the host connects, retrying while the remote starts up.

mod eventfd;
mod poll;
mod spec;
mod unix_byte;

pub use eventfd::EventfdNotifier;
pub use poll::{PollNotifier, PollSpin};
pub use spec::{NotifyListener, NotifySpec};
pub use unix_byte::UnixByteNotifier;

use std::fmt;
use std::os::fd::BorrowedFd;
use std::path::PathBuf;
use std::time::Duration;

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use thiserror::Error;

/// Why a notifier failed.
#[derive(Debug, Error)]
pub enum NotifyError {
    /// A system call failed.
    #[error("{op} failed")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The peer closed its end.
    #[error("Peer closed the notification channel")]
    PeerGone,
    /// The peer sent something that is not an eventfd pair.
    #[error("Bad eventfd handshake: {0}")]
    Handshake(&'static str),
    /// No peer came within the time allowed.
    #[error("No peer on {path} within {secs} s")]
    Timeout {
        /// Socket path.
        path: PathBuf,
        /// Seconds waited (the timeout given).
        secs: f64,
    },
    /// A remote listens but offered nothing in the time allowed: it serves
    /// another host.
    #[error("The remote on {path} did not answer within {secs} s: it is serving another host")]
    Busy {
        /// Socket path.
        path: PathBuf,
        /// Seconds waited (the timeout given).
        secs: f64,
    },
    /// Another remote listens on the socket path.
    #[error("{} is in use by another server", path.display())]
    InUse {
        /// The socket path.
        path: PathBuf,
    },
    /// A peer of another user connected to a private socket; it was hung
    /// up.
    #[error("Refused a peer of another user ({peer}): the socket is private (mode {mode:o})")]
    PeerRefused {
        /// Its credentials (pid, uid, gid).
        peer: String,
        /// The socket's mode.
        mode: u32,
    },
    /// The socket path is taken by a file that is not a socket.
    #[error("{} exists and is not a socket", path.display())]
    NotSocket {
        /// The path.
        path: PathBuf,
    },
    /// The vhost-user front end stopped the device's queues (it reset the
    /// device or went away).
    #[error("The front end stopped the device's queues")]
    QueuesStopped,
    /// A `--notify` value that is not `eventfd:PATH`, `unix:PATH` or `poll`.
    #[error("Unknown notifier {0:?} (expected eventfd:PATH, unix:PATH or poll)")]
    Spec(String),
}

impl From<iopath_sys::unix_socket::SocketError> for NotifyError {
    fn from(r: iopath_sys::unix_socket::SocketError) -> Self {
        use iopath_sys::unix_socket::SocketError;
        match r {
            SocketError::InUse { path } => NotifyError::InUse { path },
            SocketError::NotSocket { path } => NotifyError::NotSocket { path },
            SocketError::Io { op, source, .. } => NotifyError::Io { op, source },
            e @ SocketError::TooLong { .. } => NotifyError::Io {
                op: "socket path",
                source: std::io::Error::other(e),
            },
        }
    }
}

fn io(op: &'static str) -> impl FnOnce(std::io::Error) -> NotifyError {
    move |source| NotifyError::Io { op, source }
}

fn errno(op: &'static str) -> impl FnOnce(rustix::io::Errno) -> NotifyError {
    move |e| NotifyError::Io {
        op,
        source: e.into(),
    }
}

/// What woke a [`Notifier::wait`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// The peer kicked (or the notifier polls: rescan anyway).
    Kicked,
    /// The timeout passed.
    Timeout,
}

/// One direction out, one direction in: tell the peer there is work, wait
/// until the peer says so.
pub trait Notifier: Send + Sync + fmt::Debug {
    /// Tells the peer to rescan the rings.
    ///
    /// # Errors
    /// [`NotifyError::PeerGone`] once the peer has closed its end.
    fn kick(&self) -> Result<(), NotifyError>;

    /// Waits for a kick from the peer, at most `timeout`; consumes every
    /// pending kick.
    ///
    /// # Errors
    /// [`NotifyError::PeerGone`] once the peer has closed its end.
    fn wait(&self, timeout: Duration) -> Result<Wake, NotifyError>;

    /// Whether this notifier only polls (the caller should spin and back
    /// off itself rather than sleep for long).
    fn is_polling(&self) -> bool {
        false
    }

    /// The fds that turn readable when the peer kicks or goes away, for a
    /// caller that waits on them among fds of its own (an epoll set, so
    /// one thread serves the rings and its other sources alike). Once one
    /// is readable, [`Notifier::wait`] with a zero timeout consumes what is
    /// pending and reports a peer gone. Empty for a notifier that polls.
    fn wait_fds(&self) -> Vec<BorrowedFd<'_>> {
        Vec::new()
    }

    /// Short name for logs and reports.
    fn kind(&self) -> &'static str;
}

fn timespec(d: Duration) -> Timespec {
    Timespec {
        tv_sec: d.as_secs().min(i64::MAX as u64) as i64,
        tv_nsec: i64::from(d.subsec_nanos()),
    }
}

/// Polls `fds` for input; returns which are readable or hung up.
pub(crate) fn poll_in(
    fds: &[BorrowedFd<'_>],
    timeout: Duration,
) -> Result<Vec<PollFlags>, NotifyError> {
    let mut pfds: Vec<PollFd<'_>> = fds.iter().map(|f| PollFd::new(f, PollFlags::IN)).collect();
    let ts = timespec(timeout);
    match poll(&mut pfds, Some(&ts)) {
        Ok(_) | Err(rustix::io::Errno::INTR) => {}
        Err(e) => return Err(errno("poll")(e)),
    }
    Ok(pfds.iter().map(|p| p.revents()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the shared behaviour checks against a connected pair.
    fn exercise(a: &dyn Notifier, b: &dyn Notifier) {
        assert_eq!(b.wait(Duration::from_millis(10)).unwrap(), Wake::Timeout);
        a.kick().unwrap();
        a.kick().unwrap();
        assert_eq!(b.wait(Duration::from_secs(5)).unwrap(), Wake::Kicked);
        // Both kicks were consumed by one wait.
        assert_eq!(b.wait(Duration::from_millis(10)).unwrap(), Wake::Timeout);
        b.kick().unwrap();
        assert_eq!(a.wait(Duration::from_secs(5)).unwrap(), Wake::Kicked);
        // Across threads.
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(20));
                a.kick().unwrap();
            });
            assert_eq!(b.wait(Duration::from_secs(5)).unwrap(), Wake::Kicked);
        });
    }

    fn pair(spec: NotifySpec) -> (Box<dyn Notifier>, Box<dyn Notifier>) {
        let l = spec.bind().unwrap();
        std::thread::scope(|s| {
            let h = s.spawn(|| spec.connect(Duration::from_secs(5)).unwrap());
            let remote = l.accept().unwrap();
            (remote, h.join().unwrap())
        })
    }

    #[test]
    fn unix_byte_and_eventfd() {
        let dir = tempfile::tempdir().unwrap();
        for spec in [
            NotifySpec::Unix(dir.path().join("u")),
            NotifySpec::Eventfd(dir.path().join("e")),
        ] {
            let (remote, host) = pair(spec.clone());
            exercise(&*remote, &*host);
            drop(remote);
            assert!(
                matches!(
                    host.wait(Duration::from_secs(5)),
                    Err(NotifyError::PeerGone)
                ),
                "{spec}"
            );
        }
    }

    #[test]
    fn connect_retries_a_listener_that_closes_before_offering() {
        // The first connection is dropped unanswered, as by a remote that
        // was killed with the host's connect queued; the second is offered
        // a pair. The host must end up with the second, not an error.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ev");
        let l = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let t = std::thread::spawn(move || {
            drop(l.accept().unwrap());
            let (s, _) = l.accept().unwrap();
            EventfdNotifier::offer(s).unwrap()
        });
        let host = NotifySpec::Eventfd(path)
            .connect(Duration::from_secs(5))
            .unwrap();
        let remote = t.join().unwrap();
        exercise(host.as_ref(), &remote);
    }
}
