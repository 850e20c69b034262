//! Which notifier, as given on the command line (`eventfd:PATH`,
//! `unix:PATH`, `poll`), and how the two sides meet: the remote listens
//! (it also writes the resource table, as in OpenAMP's demo); the host
//! connects, retrying while the remote starts up.

use std::fmt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{Duration, Instant};

use iopath_sys::unix_socket;
use rustix::net::SocketType;

use super::{io, EventfdNotifier, Notifier, NotifyError, PollNotifier, UnixByteNotifier};

/// How host and remote notify each other, as given on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotifySpec {
    /// `eventfd:PATH`: an eventfd pair handed over on the unix socket PATH.
    Eventfd(PathBuf),
    /// `unix:PATH`: one byte per kick on the unix socket PATH.
    Unix(PathBuf),
    /// `poll`: no notifications.
    Poll,
}

impl FromStr for NotifySpec {
    type Err = NotifyError;

    fn from_str(s: &str) -> Result<Self, NotifyError> {
        if s == "poll" {
            Ok(NotifySpec::Poll)
        } else if let Some(p) = s.strip_prefix("eventfd:").filter(|p| !p.is_empty()) {
            Ok(NotifySpec::Eventfd(p.into()))
        } else if let Some(p) = s.strip_prefix("unix:").filter(|p| !p.is_empty()) {
            Ok(NotifySpec::Unix(p.into()))
        } else {
            Err(NotifyError::Spec(s.to_owned()))
        }
    }
}

impl fmt::Display for NotifySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotifySpec::Eventfd(p) => write!(f, "eventfd:{}", p.display()),
            NotifySpec::Unix(p) => write!(f, "unix:{}", p.display()),
            NotifySpec::Poll => f.write_str("poll"),
        }
    }
}

/// A bound listening socket for the remote side; bind it before announcing
/// readiness so the host's connect cannot race the bind.
#[derive(Debug)]
pub struct NotifyListener {
    spec: NotifySpec,
    listener: Option<UnixListener>,
    mode: u32,
}

impl NotifySpec {
    /// Remote side, step 1: binds the socket (replacing a stale one) with
    /// mode 0600 whatever the umask.
    ///
    /// # Errors
    /// As [`NotifySpec::bind_with_mode`].
    pub fn bind(&self) -> Result<NotifyListener, NotifyError> {
        self.bind_with_mode(iopath_sys::unix_socket::PRIVATE_MODE)
    }

    /// As [`NotifySpec::bind`], with permission bits `mode`. A host that
    /// connects as another user (not root) is refused unless `mode` lets
    /// group or others in: whoever holds the socket holds the remote.
    ///
    /// # Errors
    /// [`NotifyError::InUse`] if another remote listens there,
    /// [`NotifyError::NotSocket`] for another kind of file,
    /// [`NotifyError::Io`] if the socket cannot be bound.
    pub fn bind_with_mode(&self, mode: u32) -> Result<NotifyListener, NotifyError> {
        let listener = match self {
            NotifySpec::Eventfd(p) | NotifySpec::Unix(p) => {
                let fd =
                    iopath_sys::unix_socket::listen(p, rustix::net::SocketType::STREAM, mode, 16)?;
                Some(UnixListener::from(fd))
            }
            NotifySpec::Poll => None,
        };
        Ok(NotifyListener {
            spec: self.clone(),
            listener,
            mode,
        })
    }

    /// Host side: connects, retrying for up to `timeout` while the remote
    /// starts.
    ///
    /// # Errors
    /// [`NotifyError::Timeout`] if nobody listens in time, or a handshake
    /// error.
    pub fn connect(&self, timeout: Duration) -> Result<Box<dyn Notifier>, NotifyError> {
        let path = match self {
            NotifySpec::Poll => return Ok(Box::new(PollNotifier)),
            NotifySpec::Eventfd(p) | NotifySpec::Unix(p) => p,
        };
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let sock = connect_retry(path, deadline, timeout)?;
            return Ok(match self {
                NotifySpec::Eventfd(_) => match offered(&sock, path, deadline, timeout)
                    .and_then(|()| EventfdNotifier::accept(sock))
                {
                    Ok(n) => Box::new(n),
                    // A remote killed a moment ago closes its listener
                    // last: a connect in between is queued, then reset.
                    // The next remote is on its way; retry.
                    Err(NotifyError::PeerGone) if !left.is_zero() => {
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    }
                    Err(e) => return Err(e),
                },
                _ => Box::new(UnixByteNotifier::new(sock)?),
            });
        }
    }
}

impl NotifyListener {
    /// The socket path, if the notifier has one.
    pub fn path(&self) -> Option<&Path> {
        match &self.spec {
            NotifySpec::Eventfd(p) | NotifySpec::Unix(p) => Some(p),
            NotifySpec::Poll => None,
        }
    }

    /// Remote side, step 2: waits for the host to connect (no time limit).
    /// A peer of another user is refused (see
    /// [`NotifySpec::bind_with_mode`]) and hung up.
    /// The listener stays bound, so a host that comes later (after this
    /// one went) can connect again, and a second remote is refused.
    ///
    /// # Errors
    /// [`NotifyError::Io`] if `accept` fails, a handshake error if the
    /// connection is not a host (e.g. another server's probe),
    /// [`NotifyError::PeerRefused`] for a peer of another user.
    pub fn accept(&self) -> Result<Box<dyn Notifier>, NotifyError> {
        let Some(l) = &self.listener else {
            return Ok(Box::new(PollNotifier));
        };
        let (sock, _) = l.accept().map_err(io("accept"))?;
        if let Err(peer) = iopath_sys::unix_socket::admit(&sock, self.mode) {
            return Err(NotifyError::PeerRefused {
                peer,
                mode: self.mode,
            });
        }
        Ok(match self.spec {
            NotifySpec::Eventfd(_) => Box::new(EventfdNotifier::offer(sock)?),
            _ => Box::new(UnixByteNotifier::new(sock)?),
        })
    }
}

impl NotifyListener {
    /// Like [`accept`](Self::accept), but gives up at `deadline` when no
    /// host has connected; `given` is the wait the caller was given, for
    /// the error.
    ///
    /// # Errors
    /// [`NotifyError::Timeout`] when nobody connects in time; as
    /// [`accept`](Self::accept) otherwise.
    pub fn accept_until(
        &self,
        deadline: Instant,
        given: Duration,
    ) -> Result<Box<dyn Notifier>, NotifyError> {
        if let (Some(l), Some(path)) = (&self.listener, self.path()) {
            use std::os::fd::AsFd;
            let left = deadline.saturating_duration_since(Instant::now());
            let ready = super::poll_in(&[l.as_fd()], left)?;
            if ready.first().is_none_or(|f| f.is_empty()) {
                return Err(NotifyError::Timeout {
                    path: path.to_owned(),
                    secs: given.as_secs_f64(),
                });
            }
        }
        self.accept()
    }
}

/// Waits until the remote offers its eventfds on `sock`, at most until
/// `deadline`. A remote serving another host queues the connection and
/// offers nothing: after a second this says so once, and at the deadline
/// fails with [`NotifyError::Busy`].
fn offered(
    sock: &UnixStream,
    path: &Path,
    deadline: Instant,
    timeout: Duration,
) -> Result<(), NotifyError> {
    use std::os::fd::AsFd;
    let mut warned = false;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let step = if warned {
            left
        } else {
            left.min(Duration::from_secs(1))
        };
        let ready = super::poll_in(&[sock.as_fd()], step)?;
        if ready.first().is_some_and(|f| !f.is_empty()) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(NotifyError::Busy {
                path: path.to_owned(),
                secs: timeout.as_secs_f64(),
            });
        }
        if !warned {
            tracing::warn!(
                "the remote on {} has not answered for 1 s: is it serving another host? \
                 (waiting up to {} s in all)",
                path.display(),
                timeout.as_secs_f64()
            );
            warned = true;
        }
    }
}

/// Connects to `path`, retrying until `deadline` while nobody listens;
/// `timeout` is the wait the caller was given, for the error.
fn connect_retry(
    path: &Path,
    deadline: Instant,
    timeout: Duration,
) -> Result<UnixStream, NotifyError> {
    match unix_socket::connect_until(path, SocketType::STREAM, deadline) {
        Ok(fd) => Ok(UnixStream::from(fd)),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            Err(NotifyError::Timeout {
                path: path.to_owned(),
                secs: timeout.as_secs_f64(),
            })
        }
        Err(e) => Err(io("connect")(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_parsing() {
        assert_eq!("poll".parse::<NotifySpec>().unwrap(), NotifySpec::Poll);
        assert_eq!(
            "unix:/tmp/openamp.event.0".parse::<NotifySpec>().unwrap(),
            NotifySpec::Unix("/tmp/openamp.event.0".into())
        );
        assert_eq!(
            "eventfd:/x".parse::<NotifySpec>().unwrap().to_string(),
            "eventfd:/x"
        );
        assert!("unix:".parse::<NotifySpec>().is_err());
        assert!("tcp:1".parse::<NotifySpec>().is_err());
    }

    #[test]
    fn connect_times_out() {
        let dir = tempfile::tempdir().unwrap();
        let spec = NotifySpec::Unix(dir.path().join("none"));
        assert!(matches!(
            spec.connect(Duration::from_millis(30)),
            Err(NotifyError::Timeout { .. })
        ));
    }
}
