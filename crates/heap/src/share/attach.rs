//! [`attach`]: the buffers another process serves with
//! [`super::Share::serve`], mapped here, after checking everything that
//! comes from it.
//!
//! ```text
//!   handle ─► connect (within the timeout) ─► the server's uid is ours?
//!          ─► request ─► reply: busy (retry until the timeout), stale, or
//!             the table ─► each buffer: its fd, kind, length, inode, seals
//!          ─► every tensor inside its buffer
//! ```

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use iopath_sys::unix_socket::Peer;

use super::{
    check_tensors, inode, Attached, Table, HANDLE_PREFIX, MAGIC, MAX_BUFFERS, MAX_TABLE, MSG_LEN,
    STATUS_BUSY, STATUS_OK, STATUS_UNKNOWN_ID, VERSION,
};
use crate::buffer::sealed_against_shrinking;
use crate::error::escaped;
use crate::{Buffer, Error, HeapKind, Result};

/// How long [`attach`] waits for a share by default.
pub const DEFAULT_ATTACH_TIMEOUT: Duration = Duration::from_secs(30);

/// The shortest timeout set on a socket (a zero one means none at all).
const MIN_WAIT: Duration = Duration::from_millis(1);

/// Attaches to the tensors another process serves with
/// [`super::Share::serve`]: its buffers are mapped here from the same fds.
/// The whole exchange, connecting included, takes at most `timeout`; a
/// share busy with other connections of this process is asked again
/// meanwhile.
///
/// # Errors
/// [`Error::Share`] naming the handle: not an iopath share handle, no
/// share at its socket any more (closed, or its process exited), a server
/// of another user, an id that does not match (a stale handle), no answer
/// within `timeout` (named), or anything received that does not check out
/// (an fd that is not the file the table names or not of the kind it is
/// labelled, a memfd not sealed against shrinking, a tensor outside its
/// buffer).
pub fn attach(handle: &str, timeout: Duration) -> Result<Attached> {
    let bad = |reason: String| Error::Share {
        handle: handle.to_string(),
        reason,
    };
    let rest = handle.strip_prefix(HANDLE_PREFIX).ok_or_else(|| {
        bad(format!(
            "not an iopath share handle (they start with {HANDLE_PREFIX:?})"
        ))
    })?;
    let (id_hex, socket) = rest
        .split_once(':')
        .ok_or_else(|| bad("no socket path after the id".into()))?;
    let id = parse_id(id_hex).ok_or_else(|| bad("the id is not 32 hex digits".into()))?;
    let deadline = Instant::now() + timeout;
    let late = || {
        bad(format!(
            "no answer from the share within the attach timeout of {} s: its process may be \
             stopped or busy; give a longer timeout",
            timeout.as_secs_f64()
        ))
    };
    let mut pause = Duration::from_millis(5);
    loop {
        let mut conn = match connect(Path::new(socket), left(deadline)) {
            Ok(c) => c,
            Err(e) if timed_out(&e) => return Err(late()),
            Err(e) => {
                return Err(bad(format!(
                    "no share at {} ({e}): it was closed, or the process that shared it \
                     exited",
                    escaped(socket)
                )))
            }
        };
        check_server(&conn, socket).map_err(bad)?;
        let mut req = [0u8; MSG_LEN];
        req[..4].copy_from_slice(MAGIC);
        req[4..8].copy_from_slice(&VERSION.to_le_bytes());
        req[8..24].copy_from_slice(&id);
        conn.write_all(&req)
            .map_err(|e| bad(format!("the share hung up: {e}")))?;
        let mut reply = [0u8; MSG_LEN];
        read_by(&mut conn, &mut reply, deadline).map_err(|e| {
            if timed_out(&e) {
                late()
            } else {
                bad(format!("the share sent no answer: {e}"))
            }
        })?;
        let word = |i: usize| u32::from_le_bytes(reply[i..i + 4].try_into().expect("4 bytes"));
        if &reply[..4] != MAGIC {
            return Err(bad("the socket is not an iopath share".into()));
        }
        match word(4) {
            STATUS_UNKNOWN_ID => {
                return Err(bad(
                    "the share there has another id: the handle is stale (of an earlier share)"
                        .into(),
                ))
            }
            STATUS_BUSY => {
                if left(deadline) <= pause {
                    return Err(bad(format!(
                        "the share stayed busy serving other connections of this process for \
                         the attach timeout of {} s: attach fewer at once, or give a longer \
                         timeout",
                        timeout.as_secs_f64()
                    )));
                }
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(200));
                continue;
            }
            _ => {}
        }
        let table_len = u64::from_le_bytes(reply[8..16].try_into().expect("8 bytes"));
        let n = word(16);
        if word(4) != STATUS_OK || table_len > MAX_TABLE || n > MAX_BUFFERS {
            return Err(bad(format!(
                "the share's answer is out of bounds (status {}, table {table_len} bytes, {n} \
                 buffers)",
                word(4)
            )));
        }
        return receive(&mut conn, table_len as usize, n as usize, deadline).map_err(|e| match e {
            Received::Late => late(),
            Received::Bad(reason) => bad(reason),
        });
    }
}

/// Why receiving the table and the buffers failed.
enum Received {
    /// The timeout passed.
    Late,
    /// Something that does not check out.
    Bad(String),
}

/// Receives the table and its `n` buffers, and checks them.
fn receive(
    conn: &mut UnixStream,
    table_len: usize,
    n: usize,
    deadline: Instant,
) -> std::result::Result<Attached, Received> {
    let mut table = vec![0u8; table_len];
    read_by(conn, &mut table, deadline).map_err(|e| {
        if timed_out(&e) {
            Received::Late
        } else {
            Received::Bad(format!("the table was cut short: {e}"))
        }
    })?;
    let table: Table = serde_json::from_slice(&table)
        .map_err(|e| Received::Bad(format!("the table is not valid: {e}")))?;
    if table.buffers.len() != n {
        return Err(Received::Bad(format!(
            "the table lists {} buffers, the share sends {n}",
            table.buffers.len()
        )));
    }
    let mut buffers = Vec::with_capacity(n);
    for (i, &(len, ino)) in table.buffers.iter().enumerate() {
        conn.set_read_timeout(Some(left(deadline).max(MIN_WAIT)))
            .map_err(|e| Received::Bad(format!("SO_RCVTIMEO: {e}")))?;
        let b = Buffer::import(conn).map_err(|e| match &e {
            Error::Sys { source, .. } if timed_out(source) => Received::Late,
            _ => Received::Bad(format!("buffer {i}: {e}")),
        })?;
        let same = inode(b.fd()).is_ok_and(|got| got == ino);
        if b.len() != len || !same {
            return Err(Received::Bad(format!(
                "buffer {i} is not the file the table names ({} bytes, not {len}, or another \
                 inode)",
                b.len()
            )));
        }
        if b.kind() == HeapKind::Memfd && !sealed_against_shrinking(b.fd()) {
            return Err(Received::Bad(format!(
                "buffer {i} is not sealed against shrinking: the sharer could cut it under the \
                 mapping"
            )));
        }
        buffers.push(b);
    }
    let lens: Vec<usize> = buffers.iter().map(Buffer::len).collect();
    check_tensors(&table.tensors, &lens).map_err(Received::Bad)?;
    Ok(Attached {
        buffers,
        tensors: table.tensors,
        metadata: table.metadata,
    })
}

/// Time left until `deadline`.
fn left(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

/// Whether `e` is a socket timeout.
fn timed_out(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// Connects to `path`, waiting at most `timeout` when its listener's
/// queue is full.
fn connect(path: &Path, timeout: Duration) -> std::io::Result<UnixStream> {
    use rustix::net::{sockopt, AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let fd = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )?;
    sockopt::set_socket_timeout(&fd, sockopt::Timeout::Send, Some(timeout.max(MIN_WAIT)))?;
    let addr = SocketAddrUnix::new(path)?;
    rustix::net::connect(&fd, &addr)?;
    Ok(UnixStream::from(fd))
}

/// Fills `buf` from `conn`, failing with a timeout at `deadline`.
fn read_by(conn: &mut UnixStream, buf: &mut [u8], deadline: Instant) -> std::io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        let wait = left(deadline);
        if wait.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        conn.set_read_timeout(Some(wait.max(MIN_WAIT)))?;
        match conn.read(&mut buf[got..]) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(k) => got += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Refuses a server that is not a process of this user: whoever serves
/// the buffers can write them under us.
fn check_server(conn: &UnixStream, socket: &str) -> std::result::Result<(), String> {
    let me = rustix::process::geteuid().as_raw();
    let peer =
        Peer::of(conn).map_err(|e| format!("cannot tell who serves {}: {e}", escaped(socket)))?;
    server_is_ours(peer, me)
}

fn server_is_ours(peer: Peer, me: u32) -> std::result::Result<(), String> {
    if peer.uid != me {
        return Err(format!(
            "the share is served by uid {} (pid {}), not by this user (uid {me}): only a share \
             of the same user is attached (it could rewrite the tensors under this process)",
            peer.uid, peer.pid
        ));
    }
    Ok(())
}

fn parse_id(s: &str) -> Option<[u8; 16]> {
    if s.len() != 32 || !s.is_ascii() {
        return None;
    }
    let mut id = [0u8; 16];
    for (i, b) in id.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(id)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::io::BufRead;
    use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
    use std::os::unix::net::UnixListener;
    use std::os::unix::process::CommandExt;

    use super::*;
    use crate::buffer::send_export;
    use crate::buffer::tests::unsealed;
    use crate::share::{reply, Share, SharedTensor};
    use crate::{Heap, HugePages, MemfdHeap};

    fn tensor(name: &str, buffer: usize, offset: usize, len: usize) -> SharedTensor {
        SharedTensor {
            name: name.into(),
            buffer,
            offset,
            len,
            dtype: "U8".into(),
            shape: vec![len],
        }
    }

    fn socket_of(handle: &str) -> &str {
        &handle[HANDLE_PREFIX.len() + 33..]
    }

    #[test]
    fn an_attach_maps_the_same_memory() {
        let heap = MemfdHeap::new(HugePages::None);
        let a = heap.alloc(8192).unwrap();
        let b = heap.alloc(4096).unwrap();
        a.write_at(100, b"hello").unwrap();
        b.write_at(0, b"world").unwrap();
        let share = Share::serve(
            vec![a.clone(), b],
            vec![tensor("x", 0, 100, 5), tensor("y", 1, 0, 5)],
            [("k".to_string(), "v".to_string())].into(),
        )
        .unwrap();
        // A peer that connects and says nothing holds up no one.
        let handle = share.handle();
        let _silent = UnixStream::connect(socket_of(&handle)).unwrap();
        let t = Instant::now();
        let got = attach(&handle, DEFAULT_ATTACH_TIMEOUT).unwrap();
        // Served at once, not after the silent peer's 10 s read timeout.
        assert!(t.elapsed() < Duration::from_secs(5));
        assert_eq!(
            got.tensors,
            vec![tensor("x", 0, 100, 5), tensor("y", 1, 0, 5)]
        );
        assert_eq!(got.metadata["k"], "v");
        let mut s = [0u8; 5];
        got.buffers[1].read_at(0, &mut s).unwrap();
        assert_eq!(&s, b"world");
        // The same pages: a write on one side shows on the other.
        got.buffers[0].write_at(100, b"HELLO").unwrap();
        a.read_at(100, &mut s).unwrap();
        assert_eq!(&s, b"HELLO");
    }

    #[test]
    fn more_attaches_at_once_than_a_process_is_served_all_get_through() {
        let heap = MemfdHeap::new(HugePages::None);
        let a = heap.alloc(4096).unwrap();
        a.write_at(0, b"same").unwrap();
        let share = Share::serve(vec![a], vec![tensor("x", 0, 0, 4)], BTreeMap::new()).unwrap();
        let handle = share.handle();
        let n = 4 * super::super::serve::PER_PEER;
        let got: Vec<_> = std::thread::scope(|s| {
            let all: Vec<_> = (0..n)
                .map(|_| s.spawn(|| attach(&handle, Duration::from_secs(20))))
                .collect();
            all.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for g in got {
            let mut b = [0u8; 4];
            g.unwrap().buffers[0].read_at(0, &mut b).unwrap();
            assert_eq!(&b, b"same");
        }
    }

    fn refused_within(handle: &str, timeout: Duration) -> String {
        match attach(handle, timeout) {
            Err(Error::Share { reason, .. }) => reason,
            other => panic!("{other:?}"),
        }
    }

    fn refused(handle: &str) -> String {
        refused_within(handle, DEFAULT_ATTACH_TIMEOUT)
    }

    #[test]
    fn wrong_and_stale_handles_are_refused() {
        let heap = MemfdHeap::new(HugePages::None);
        let mut share = Share::serve(
            vec![heap.alloc(4096).unwrap()],
            vec![tensor("x", 0, 0, 4096)],
            BTreeMap::new(),
        )
        .unwrap();
        let h = share.handle();
        assert!(refused("model.safetensors").starts_with("not an iopath share handle"));
        let other_id = format!(
            "{HANDLE_PREFIX}{}{}",
            "0".repeat(32),
            &h[HANDLE_PREFIX.len() + 32..]
        );
        assert_eq!(
            refused(&other_id),
            "the share there has another id: the handle is stale (of an earlier share)"
        );
        share.close();
        assert!(refused(&h).contains("it was closed, or the process that shared it exited"));
        // A tensor outside its buffer is refused before anything is served.
        let e = Share::serve(
            vec![heap.alloc(4096).unwrap()],
            vec![tensor("x", 0, 4000, 100)],
            BTreeMap::new(),
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("runs past its buffer of 4096 bytes"),
            "{e}"
        );
        // A socket path that would drive a terminal is shown escaped.
        let e = attach(
            &format!(
                "{HANDLE_PREFIX}{}:/nonexistent/\u{1b}]0;owned\u{7}",
                "0".repeat(32)
            ),
            DEFAULT_ATTACH_TIMEOUT,
        )
        .unwrap_err()
        .to_string();
        assert!(!e.contains('\u{1b}') && !e.contains('\u{7}'), "{e:?}");
        assert!(e.contains(r"/nonexistent/\u{1b}]0;owned\u{7}"), "{e}");
    }

    #[test]
    fn a_share_that_never_answers_fails_at_the_timeout_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        // Listens, never accepts: the connection waits in its queue.
        let _listener = UnixListener::bind(&path).unwrap();
        let handle = format!("{HANDLE_PREFIX}{}:{}", "ab".repeat(16), path.display());
        let t = Instant::now();
        let reason = refused_within(&handle, Duration::from_millis(300));
        assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
        assert_eq!(
            reason,
            "no answer from the share within the attach timeout of 0.3 s: its process may be \
             stopped or busy; give a longer timeout"
        );
    }

    /// A server that answers one attach with a table of one 8 KiB buffer
    /// (the inode of `fds[0]`) and sends `fds` labelled `kind`, then
    /// shrinks the first to nothing, as a hostile sharer would.
    fn forged(kind: HeapKind, fds: Vec<OwnedFd>) -> String {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let listener = UnixListener::bind(&path).unwrap();
        let table = Table {
            buffers: vec![(8192, inode(fds[0].as_fd()).unwrap())],
            tensors: vec![tensor("x", 0, 0, 8192)],
            metadata: BTreeMap::new(),
        };
        let table = serde_json::to_vec(&table).unwrap();
        let server = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut req = [0u8; MSG_LEN];
            conn.read_exact(&mut req).unwrap();
            conn.write_all(&reply(STATUS_OK, table.len(), 1)).unwrap();
            conn.write_all(&table).unwrap();
            let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(AsFd::as_fd).collect();
            send_export(&conn, kind.to_wire(), 8192, &borrowed).unwrap();
            // Wait for the attacher to be done with the socket.
            let _ = conn.read(&mut req);
            rustix::fs::ftruncate(&fds[0], 0).unwrap();
        });
        let handle = format!("{HANDLE_PREFIX}{}:{}", "ab".repeat(16), path.display());
        let got = attach(&handle, Duration::from_secs(10));
        let reason = match got {
            Err(Error::Share { reason, .. }) => reason,
            Ok(a) => {
                // What a forged kind did before: the mapping dies of
                // SIGBUS once the file is cut.
                drop(a);
                panic!("{kind:?} accepted")
            }
            Err(e) => panic!("{e:?}"),
        };
        server.join().unwrap();
        reason
    }

    #[test]
    fn a_forged_kind_is_refused_naming_the_buffer() {
        let not_dmabuf = "buffer 0: bad buffer message from peer: a buffer labelled udmabuf or \
                          dma-heap is not a dma-buf (its sender could shrink it under the mapping)";
        assert_eq!(forged(HeapKind::DmaHeap, vec![unsealed(8192)]), not_dmabuf);
        assert_eq!(forged(HeapKind::Udmabuf, vec![unsealed(8192)]), not_dmabuf);
        let sealed = unsealed(8192);
        rustix::fs::fcntl_add_seals(&sealed, rustix::fs::SealFlags::SHRINK).unwrap();
        assert_eq!(
            forged(HeapKind::Udmabuf, vec![unsealed(8192), sealed]),
            not_dmabuf
        );
        assert_eq!(
            forged(HeapKind::Memfd, vec![unsealed(8192)]),
            "buffer 0 is not sealed against shrinking: the sharer could cut it under the mapping"
        );
    }

    #[test]
    fn a_server_of_another_user_is_refused() {
        if std::env::var_os("IOPATH_SHARE_AS_OTHER").is_some() {
            // The other user's sharer: serve until stdin closes.
            let heap = MemfdHeap::new(HugePages::None);
            let b = heap.alloc(4096).unwrap();
            let share = Share::serve(vec![b], vec![tensor("x", 0, 0, 4)], BTreeMap::new()).unwrap();
            println!("HANDLE {}", share.handle());
            let _ = std::io::stdin().read_to_end(&mut Vec::new());
            return;
        }
        let me = rustix::process::geteuid().as_raw();
        if me != 0 {
            eprintln!("skipped: serving as another user needs root");
            return;
        }
        assert_eq!(
            server_is_ours(
                Peer {
                    pid: 1,
                    uid: 0,
                    gid: 0
                },
                0
            ),
            Ok(())
        );
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o777),
        )
        .unwrap();
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "share::attach::tests::a_server_of_another_user_is_refused",
                "--nocapture",
            ])
            .env("IOPATH_SHARE_AS_OTHER", "1")
            .env("XDG_RUNTIME_DIR", dir.path())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .uid(65534)
            .gid(65534)
            .spawn()
            .unwrap();
        let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let handle = lines
            .by_ref()
            .map_while(std::result::Result::ok)
            .find_map(|l| l.strip_prefix("HANDLE ").map(str::to_string))
            .expect("the other user's sharer says its handle");
        let reason = refused(&handle);
        drop(child.stdin.take());
        lines.for_each(drop);
        assert!(child.wait().unwrap().success());
        assert!(
            reason.starts_with("the share is served by uid 65534 (pid ")
                && reason.ends_with(
                    "not by this user (uid 0): only a share of the same user is attached (it \
                     could rewrite the tensors under this process)"
                ),
            "{reason}"
        );
    }
}
