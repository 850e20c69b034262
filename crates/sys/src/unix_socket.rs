//! The unix sockets iopath's servers listen on (vhost-user back ends, the
//! rpmsg control and notify sockets, model shares): a path claimed first (a
//! live server's socket is refused, a dead one's replaced, any other file
//! left alone), made with exactly the mode asked for whatever the umask,
//! and a peer of another user turned away unless that mode lets group or
//! others in. Whoever connects to such a socket drives a device or reads a
//! bus, so the file's mode alone is not trusted to keep other users out (a
//! socket made under `umask 000` would be 0777).

use std::fmt;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use std::time::{Duration, Instant};

use rustix::io::Errno;
use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};

/// The default mode of a socket iopath listens on: its user only.
pub const PRIVATE_MODE: u32 = 0o600;

/// Binds a listening socket of type `ty` at `path` with permission bits
/// `mode` (and `backlog`). It is bound under a temporary name, set to
/// `mode`, made to listen, then renamed into place: no one can connect
/// before its mode is right (a connect before `listen` is refused), and
/// once `path` exists a connect succeeds. A file at `path` is replaced:
/// the caller checks beforehand that it may be (a stale socket).
///
/// # Errors
/// The failing step (`socket`, `bind`, `chmod`, `listen`, `rename`) and
/// its error; nothing is left behind.
pub fn bind_listener(
    path: &Path,
    ty: SocketType,
    mode: u32,
    backlog: i32,
) -> Result<OwnedFd, (&'static str, std::io::Error)> {
    let fd = rustix::net::socket_with(AddressFamily::UNIX, ty, SocketFlags::CLOEXEC, None)
        .map_err(|e| ("socket", e.into()))?;
    let tmp = temp_name(path);
    let _ = std::fs::remove_file(&tmp);
    let addr = SocketAddrUnix::new(&tmp).map_err(|e| ("socket path", e.into()))?;
    rustix::net::bind(&fd, &addr).map_err(|e| ("bind", e.into()))?;
    let placed = rustix::fs::chmod(&tmp, rustix::fs::Mode::from_raw_mode(mode & 0o777))
        .map_err(|e| ("chmod", e.into()))
        .and_then(|()| rustix::net::listen(&fd, backlog).map_err(|e| ("listen", e.into())))
        .and_then(|()| std::fs::rename(&tmp, path).map_err(|e| ("rename", e)));
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(fd)
}

/// The longest socket path `sun_path` holds, its terminating NUL excluded.
pub const MAX_PATH: usize = 107;

/// Why a socket path cannot be claimed or listened on.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    /// A server listens on it.
    #[error("{} is in use by another server (stop it, or choose another path)", path.display())]
    InUse {
        /// The path.
        path: PathBuf,
    },
    /// It exists and is not a socket.
    #[error("{} exists and is not a socket (remove it, or choose another path)", path.display())]
    NotSocket {
        /// The path.
        path: PathBuf,
    },
    /// Longer than `sun_path` holds.
    #[error(
        "{} is {len} bytes; a socket iopath listens on can be at most {max} \
         ({MAX_PATH}, what a unix socket path holds, less the temporary name it is bound under) \
         (choose a shorter path, or a shorter directory such as /run or /tmp)",
        path.display()
    )]
    TooLong {
        /// The path.
        path: PathBuf,
        /// Its length in bytes.
        len: usize,
        /// The longest path this process can listen on.
        max: usize,
    },
    /// A step failed.
    #[error("{op} {}", path.display())]
    Io {
        /// The step (`stat`, `connect`, `bind`, ...).
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
}

impl SocketError {
    /// The errno that stands for this refusal where only an errno can be
    /// answered (`EADDRINUSE` for a path that is taken).
    pub fn errno(&self) -> i32 {
        match self {
            SocketError::InUse { .. } | SocketError::NotSocket { .. } => {
                rustix::io::Errno::ADDRINUSE.raw_os_error()
            }
            SocketError::TooLong { .. } => rustix::io::Errno::NAMETOOLONG.raw_os_error(),
            SocketError::Io { source, .. } => source
                .raw_os_error()
                .unwrap_or(rustix::io::Errno::IO.raw_os_error()),
        }
    }
}

/// The name a listener is bound under before it is renamed to `path`.
fn temp_name(path: &Path) -> PathBuf {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".{}.tmp", std::process::id()));
    PathBuf::from(tmp)
}

/// Checks that this process can listen on `path`: the path, and the
/// temporary name [`bind_listener`] binds under first, fit `sun_path`.
///
/// # Errors
/// [`SocketError::TooLong`], naming the longest path that fits.
pub fn check_len(path: &Path) -> Result<(), SocketError> {
    let len = path.as_os_str().len();
    let extra = temp_name(path).as_os_str().len() - len;
    if len + extra > MAX_PATH {
        return Err(SocketError::TooLong {
            path: path.to_owned(),
            len,
            max: MAX_PATH - extra,
        });
    }
    Ok(())
}

/// Makes `path` free to bind a socket of type `ty` on: nothing there, or a
/// stale socket (removed). A probe connection to a live server is closed at
/// once; servers of iopath take it as a client that went away.
///
/// # Errors
/// [`SocketError::InUse`] when a server listens there (of either socket
/// type), [`SocketError::NotSocket`] for any other file (left alone),
/// [`SocketError::TooLong`], or the probe's failure.
pub fn claim(path: &Path, ty: SocketType) -> Result<(), SocketError> {
    check_len(path)?;
    let io = |op| {
        move |source: std::io::Error| SocketError::Io {
            op,
            path: path.to_owned(),
            source,
        }
    };
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io("stat")(e)),
    };
    if !meta.file_type().is_socket() {
        return Err(SocketError::NotSocket {
            path: path.to_owned(),
        });
    }
    let fd = rustix::net::socket_with(AddressFamily::UNIX, ty, SocketFlags::CLOEXEC, None)
        .map_err(|e| io("socket")(e.into()))?;
    let addr = SocketAddrUnix::new(path).map_err(|e| io("socket path")(e.into()))?;
    match rustix::net::connect(&fd, &addr) {
        // A listener of the other socket type answers EPROTOTYPE: in use too.
        Ok(()) | Err(rustix::io::Errno::PROTOTYPE) => Err(SocketError::InUse {
            path: path.to_owned(),
        }),
        Err(rustix::io::Errno::CONNREFUSED) => match std::fs::remove_file(path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io("removing the stale socket")(e)),
        },
        Err(rustix::io::Errno::NOENT) => Ok(()),
        Err(e) => Err(io("connect")(e.into())),
    }
}

/// Claims `path` ([`claim`]) and binds a listener of type `ty` there with
/// permission bits `mode` ([`bind_listener`]): what every iopath server
/// does before it serves.
///
/// # Errors
/// The claim's refusal, or the failing step of the bind, naming the path.
pub fn listen(
    path: &Path,
    ty: SocketType,
    mode: u32,
    backlog: i32,
) -> Result<OwnedFd, SocketError> {
    claim(path, ty)?;
    bind_listener(path, ty, mode, backlog).map_err(|(op, source)| SocketError::Io {
        op,
        path: path.to_owned(),
        source,
    })
}

/// Connects a socket of type `ty` to `path`, retrying until `deadline`
/// while nobody listens there yet (the path missing, or the connect
/// refused): a server that is starting. Backs off from 1 ms to 50 ms.
///
/// # Errors
/// The last connect error once `deadline` has passed; any other error at
/// once.
pub fn connect_until(path: &Path, ty: SocketType, deadline: Instant) -> io::Result<OwnedFd> {
    let addr = SocketAddrUnix::new(path)?;
    let mut delay = Duration::from_millis(1);
    loop {
        let fd = rustix::net::socket_with(AddressFamily::UNIX, ty, SocketFlags::CLOEXEC, None)?;
        match rustix::net::connect(&fd, &addr) {
            Ok(()) => return Ok(fd),
            Err(Errno::NOENT | Errno::CONNREFUSED) if Instant::now() < deadline => {
                let left = deadline.saturating_duration_since(Instant::now());
                std::thread::sleep(delay.min(left));
                delay = (delay * 2).min(Duration::from_millis(50));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Who is at the other end of a connected unix socket (`SO_PEERCRED`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    /// Its process id when it connected.
    pub pid: i32,
    /// Its effective user.
    pub uid: u32,
    /// Its effective group.
    pub gid: u32,
}

impl Peer {
    /// The credentials of the peer on `sock`.
    ///
    /// # Errors
    /// `getsockopt(SO_PEERCRED)` failed.
    pub fn of(sock: impl AsFd) -> std::io::Result<Peer> {
        let u = rustix::net::sockopt::socket_peercred(sock)?;
        Ok(Peer {
            pid: u.pid.as_raw_nonzero().get(),
            uid: u.uid.as_raw(),
            gid: u.gid.as_raw(),
        })
    }

    /// Whether this peer may use a socket of permission bits `mode`: this
    /// process's effective user and root always (root passes any mode
    /// anyway); anyone else only when `mode` lets group or others in, as
    /// the file system then already does for those it lets through.
    pub fn admitted(&self, mode: u32) -> bool {
        mode & 0o077 != 0 || self.uid == 0 || self.uid == rustix::process::geteuid().as_raw()
    }
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pid {} uid {} gid {}", self.pid, self.uid, self.gid)
    }
}

/// Checks the peer of a socket accepted on a listener of mode `mode`:
/// `Ok` with the peer's line for the log when it is admitted, `Err` with
/// the same line when it is another user's and `mode` is private.
///
/// # Errors
/// The peer is refused, or its credentials cannot be read (refused too).
pub fn admit(sock: impl AsFd, mode: u32) -> Result<String, String> {
    match Peer::of(sock) {
        Ok(p) if p.admitted(mode) => Ok(p.to_string()),
        Ok(p) => Err(p.to_string()),
        Err(e) => Err(format!("(credentials unknown: {e})")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn exact_mode_whatever_the_umask_and_own_peer_admitted() {
        let dir = tempfile::tempdir().unwrap();
        for mode in [0o600, 0o660, 0o777] {
            let p = dir.path().join(format!("s{mode:o}"));
            let fd = bind_listener(&p, SocketType::STREAM, mode, 4).unwrap();
            let got = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
            assert_eq!(got, mode);
            let c = std::os::unix::net::UnixStream::connect(&p).unwrap();
            let me = Peer::of(&c).unwrap();
            assert_eq!(me.pid as u32, std::process::id());
            assert!(me.admitted(0o600));
            assert!(admit(&c, mode).is_ok());
            drop(fd);
        }
        // Another user: admitted only through a widened mode.
        let other = Peer {
            pid: 1,
            uid: 4242,
            gid: 4242,
        };
        if rustix::process::geteuid().as_raw() != 4242 {
            assert!(!other.admitted(0o600));
            assert!(other.admitted(0o660));
            assert!(other.admitted(0o606));
        }
        assert!(Peer { uid: 0, ..other }.admitted(0o600));
        assert_eq!(other.to_string(), "pid 1 uid 4242 gid 4242");
        // Nothing left under a temporary name.
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(left.is_empty());
    }

    #[test]
    fn connects_once_the_server_listens_and_gives_up_at_the_deadline() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("late.sock");
        let late = p.clone();
        let server = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            bind_listener(&late, SocketType::SEQPACKET, PRIVATE_MODE, 1).unwrap()
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        let c = connect_until(&p, SocketType::SEQPACKET, deadline).unwrap();
        let l = server.join().unwrap();
        let a = rustix::net::accept(&l).unwrap();
        assert_eq!(
            rustix::net::send(&c, b"hi", rustix::net::SendFlags::empty()),
            Ok(2)
        );
        let mut b = [0u8; 8];
        let got = rustix::net::recv(&a, &mut b, rustix::net::RecvFlags::empty()).unwrap();
        assert_eq!(&b[..got.0], b"hi");
        // Nobody there: NotFound once the deadline passed, not before.
        let start = Instant::now();
        let none = dir.path().join("none.sock");
        let deadline = start + Duration::from_millis(100);
        let e = connect_until(&none, SocketType::STREAM, deadline).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(start.elapsed() >= Duration::from_millis(100));
        // A socket of the other type is refused at once.
        let start = Instant::now();
        let e = connect_until(&p, SocketType::STREAM, start + Duration::from_secs(10));
        assert!(e.is_err() && start.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn live_refused_stale_replaced_file_kept() {
        use std::os::unix::net::UnixListener;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s");
        assert!(claim(&p, SocketType::STREAM).is_ok());
        let l = UnixListener::bind(&p).unwrap();
        assert!(matches!(
            claim(&p, SocketType::STREAM),
            Err(SocketError::InUse { .. })
        ));
        assert!(matches!(
            claim(&p, SocketType::SEQPACKET),
            Err(SocketError::InUse { .. })
        ));
        // The probe was a connection, now closed.
        let (c, _) = l.accept().unwrap();
        let mut b = [0u8; 1];
        assert_eq!(std::io::Read::read(&mut &c, &mut b).unwrap(), 0);
        drop(l);
        assert!(p.exists());
        assert!(claim(&p, SocketType::STREAM).is_ok());
        assert!(!p.exists(), "stale socket removed");
        std::fs::write(&p, b"data").unwrap();
        let e = claim(&p, SocketType::STREAM).unwrap_err();
        assert!(matches!(e, SocketError::NotSocket { .. }));
        assert_eq!(e.errno(), rustix::io::Errno::ADDRINUSE.raw_os_error());
        assert_eq!(std::fs::read(&p).unwrap(), b"data");
        // listen: claims, then binds.
        std::fs::remove_file(&p).unwrap();
        let fd = listen(&p, SocketType::STREAM, 0o600, 4).unwrap();
        assert!(matches!(
            listen(&p, SocketType::STREAM, 0o600, 4),
            Err(SocketError::InUse { .. })
        ));
        drop(fd);
        let _fd = listen(&p, SocketType::STREAM, 0o600, 4).unwrap();
    }

    #[test]
    fn a_path_past_sun_path_names_the_limit() {
        let long = PathBuf::from(format!("/tmp/{}", "d".repeat(120)));
        let e = listen(&long, SocketType::STREAM, 0o600, 4).unwrap_err();
        let max = 107 - format!(".{}.tmp", std::process::id()).len();
        assert!(
            matches!(e, SocketError::TooLong { len: 125, max: m, .. } if m == max),
            "{e:?}"
        );
        let msg = e.to_string();
        assert!(
            msg.contains(&format!("at most {max}")) && msg.contains("shorter"),
            "{msg}"
        );
        // A path that fits sun_path but not with the temporary name: refused
        // up front, not at bind.
        let edge = PathBuf::from(format!("/tmp/{}", "e".repeat(100)));
        assert!(matches!(
            check_len(&edge),
            Err(SocketError::TooLong { len: 105, .. })
        ));
        let fits = PathBuf::from(format!("/tmp/{}", "f".repeat(max - 5)));
        assert!(check_len(&fits).is_ok());
    }
}
