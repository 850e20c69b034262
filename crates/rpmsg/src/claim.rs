//! Claiming a unix socket path before binding it: a socket file with a live
//! listener belongs to another server and is refused; one nobody listens on
//! any more (its server died) is stale and removed; any other file is left
//! alone. `iopath blk serve` does the same for its socket.

use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};

/// Why a socket path cannot be claimed.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// A server listens on it.
    InUse,
    /// It exists and is not a socket.
    NotSocket,
    /// Probing or removing it failed.
    Io(&'static str, std::io::Error),
}

/// Makes `path` free to bind a socket of type `ty` on: nothing there, or a
/// stale socket (removed). A probe connection to a live server is closed at
/// once; servers of iopath take it as a client that went away.
pub(crate) fn claim(path: &Path, ty: SocketType) -> Result<(), Refusal> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Refusal::Io("stat", e)),
    };
    if !meta.file_type().is_socket() {
        return Err(Refusal::NotSocket);
    }
    let fd = rustix::net::socket_with(AddressFamily::UNIX, ty, SocketFlags::CLOEXEC, None)
        .map_err(|e| Refusal::Io("socket", e.into()))?;
    let addr = SocketAddrUnix::new(path).map_err(|e| Refusal::Io("socket path", e.into()))?;
    match rustix::net::connect(&fd, &addr) {
        // A listener of the other socket type answers EPROTOTYPE: in use too.
        Ok(()) | Err(rustix::io::Errno::PROTOTYPE) => Err(Refusal::InUse),
        Err(rustix::io::Errno::CONNREFUSED) => match std::fs::remove_file(path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Refusal::Io("removing the stale socket", e)),
        },
        Err(rustix::io::Errno::NOENT) => Ok(()),
        Err(e) => Err(Refusal::Io("connect", e.into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    #[test]
    fn live_refused_stale_replaced_file_kept() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s");
        assert!(claim(&p, SocketType::STREAM).is_ok());
        let l = UnixListener::bind(&p).unwrap();
        assert!(matches!(claim(&p, SocketType::STREAM), Err(Refusal::InUse)));
        assert!(matches!(
            claim(&p, SocketType::SEQPACKET),
            Err(Refusal::InUse)
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
        assert!(matches!(
            claim(&p, SocketType::STREAM),
            Err(Refusal::NotSocket)
        ));
        assert_eq!(std::fs::read(&p).unwrap(), b"data");
    }
}
