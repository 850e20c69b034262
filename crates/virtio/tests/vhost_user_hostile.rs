//! The vhost-user front end against hostile or broken back ends (a unix
//! socket server in a thread that answers with garbage): every case is an
//! error value from `connect`, never a panic or a hang.

use std::io::{Read, Write};
use std::os::unix::net::UnixListener;
use std::time::Duration;

use iopath_virtio::transport::vhost_user::{VhostUser, VhostUserError};

/// Serves one connection: reads `skip` request headers (with their
/// bodies), then writes `reply` and closes.
fn serve(reply: Vec<u8>, skip: usize) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("evil.sock");
    let l = UnixListener::bind(&path).unwrap();
    std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        for _ in 0..skip {
            let mut hdr = [0u8; 12];
            if s.read_exact(&mut hdr).is_err() {
                return;
            }
            let size = u32::from_le_bytes(hdr[8..12].try_into().unwrap()) as usize;
            let mut body = vec![0u8; size];
            let _ = s.read_exact(&mut body);
        }
        let _ = s.write_all(&reply);
    });
    (dir, path)
}

fn hdr(code: u32, flags: u32, size: u32) -> Vec<u8> {
    [code.to_le_bytes(), flags.to_le_bytes(), size.to_le_bytes()].concat()
}

fn connect_err(reply: Vec<u8>, skip: usize) -> VhostUserError {
    let (_dir, path) = serve(reply, skip);
    VhostUser::connect(&path, 2, Duration::from_secs(5)).unwrap_err()
}

#[test]
fn peer_that_closes_at_once() {
    let e = connect_err(Vec::new(), 0);
    assert!(
        matches!(
            e,
            VhostUserError::Request {
                request: "GET_FEATURES" | "SET_OWNER",
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn reply_with_a_huge_size() {
    // SET_OWNER has no reply; GET_FEATURES (1) gets a header claiming 256 MiB.
    let e = connect_err(hdr(1, 0x5, 256 << 20), 2);
    assert!(
        matches!(
            e,
            VhostUserError::Request {
                request: "GET_FEATURES",
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn reply_to_the_wrong_request() {
    let mut r = hdr(3, 0x5, 8);
    r.extend_from_slice(&u64::MAX.to_le_bytes());
    let e = connect_err(r, 2);
    assert!(
        matches!(
            e,
            VhostUserError::Request {
                request: "GET_FEATURES",
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn truncated_reply() {
    let mut r = hdr(1, 0x5, 8);
    r.extend_from_slice(&[1, 2, 3]);
    let e = connect_err(r, 2);
    assert!(
        matches!(
            e,
            VhostUserError::Request {
                request: "GET_FEATURES",
                ..
            }
        ),
        "{e:?}"
    );
}
