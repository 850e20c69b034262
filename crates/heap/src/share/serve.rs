//! [`Share`]: tensors served from a thread of their own, on a unix socket
//! in a 0700 directory, to processes of the same user.
//!
//! ```text
//!   serve loop: poll(wake eventfd, listener) ─► accept ─► the peer's uid,
//!               its connections now ─► a thread per peer (request, table, fds)
//!                  accept fails (EMFILE...): wait on the wake alone, 10 ms,
//!                  doubling to 1 s, and try again; logged once
//!   close():    write the eventfd ─► the loop returns ─► join, remove
//! ```
//!
//! The wake is an eventfd, not a connection to the socket's path, so
//! `close()` returns even when the socket file is gone (a /tmp cleaner).

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use iopath_sys::unix_socket::{self, Peer, SocketError, MAX_PATH, PRIVATE_MODE};
use rustix::event::{PollFd, PollFlags};
use rustix::io::Errno;

use super::{
    check_tensors, hex, inode, reply, SharedTensor, Table, HANDLE_PREFIX, MAGIC, MSG_LEN,
    STATUS_BUSY, STATUS_OK, STATUS_UNKNOWN_ID, VERSION,
};
use crate::{Buffer, Error, Result};

/// Connections of one process served at once; more are answered busy
/// and closed, so one process cannot take every file the sharer has.
pub(super) const PER_PEER: usize = 4;
/// Connections served at once in all.
const MAX_LIVE: usize = 64;
/// How long a peer may take to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one write to a peer may wait for it to read.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// The first and the longest wait after an accept that failed.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(10), Duration::from_secs(1));

/// Tensors served to other processes until dropped.
#[derive(Debug)]
pub struct Share {
    dir: PathBuf,
    socket: PathBuf,
    id: [u8; 16],
    /// Written by [`Share::close`] to stop the serve loop.
    wake: Arc<OwnedFd>,
    thread: Option<JoinHandle<()>>,
}

fn random_id() -> Result<[u8; 16]> {
    let mut id = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut id))
        .map_err(|e| Error::sys("read /dev/urandom", e))?;
    Ok(id)
}

fn cannot(reason: String) -> Error {
    Error::Share {
        handle: String::new(),
        reason,
    }
}

/// Where shares' directories go: `$XDG_RUNTIME_DIR` when it is a
/// directory, else the temporary directory (`$TMPDIR`, else /tmp); with
/// the variable that chose it.
fn base_dir() -> (PathBuf, &'static str) {
    match std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from) {
        Some(p) if p.is_dir() => (p, "XDG_RUNTIME_DIR"),
        _ => (std::env::temp_dir(), "TMPDIR"),
    }
}

/// Makes the share's 0700 directory under `base` (chosen by the
/// environment variable `var`) and names its socket in it, refusing up
/// front a socket path too long for `sun_path`.
fn place(base: &Path, var: &str, id: &[u8; 16]) -> Result<(PathBuf, PathBuf)> {
    let dir = base.join(format!(
        "iopath-share-{}-{}",
        std::process::id(),
        hex(&id[..4])
    ));
    let socket = dir.join("socket");
    // The listener is bound under a temporary name beside it first
    // (`unix_socket::bind_listener`), this much longer.
    if let Err(SocketError::TooLong { len, max, .. }) = unix_socket::check_len(&socket) {
        return Err(cannot(format!(
            "its socket would be {} ({len} bytes), past the {max} bytes a socket path may have \
             here ({MAX_PATH} bytes a unix socket path holds, less the name it is set up under): \
             set {var} to a shorter directory (it is {}), such as /tmp",
            crate::error::shown(&socket),
            crate::error::shown(base),
        )));
    }
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(|e| {
            cannot(format!(
                "cannot make its directory {} ({e}): set {var} to a directory this user may \
                 write",
                crate::error::shown(&dir)
            ))
        })?;
    Ok((dir, socket))
}

impl Share {
    /// Serves `buffers` and the `tensors` in them to any process of this
    /// user that attaches with [`Share::handle`], from a thread of its own,
    /// until the share is closed or dropped.
    ///
    /// # Errors
    /// [`Error::Share`] for a tensor outside its buffer, or a socket that
    /// cannot be made (naming its path and what to change);
    /// [`Error::Sys`] if the thread or its eventfd cannot be made. Nothing
    /// is left behind.
    pub fn serve(
        buffers: Vec<Buffer>,
        tensors: Vec<SharedTensor>,
        metadata: BTreeMap<String, String>,
    ) -> Result<Share> {
        let lens: Vec<usize> = buffers.iter().map(Buffer::len).collect();
        check_tensors(&tensors, &lens).map_err(cannot)?;
        let table = Table {
            buffers: buffers
                .iter()
                .map(|b| Ok((b.len(), inode(b.fd())?)))
                .collect::<Result<_>>()?,
            tensors,
            metadata,
        };
        let table = serde_json::to_vec(&table).map_err(|e| Error::sys("encode", e))?;
        let id = random_id()?;
        let (base, var) = base_dir();
        let (dir, socket) = place(&base, var, &id)?;
        let started = start(&socket, var, id, table, buffers);
        match started {
            Ok((wake, thread)) => Ok(Share {
                dir,
                socket,
                id,
                wake,
                thread: Some(thread),
            }),
            Err(e) => {
                let _ = std::fs::remove_file(&socket);
                let _ = std::fs::remove_dir(&dir);
                Err(e)
            }
        }
    }

    /// The string another process passes to [`super::attach`].
    pub fn handle(&self) -> String {
        format!("{HANDLE_PREFIX}{}:{}", hex(&self.id), self.socket.display())
    }

    /// Stops serving: later attaches with this handle fail. Processes
    /// already attached keep their mappings. Returns at once, whatever
    /// became of the socket's file.
    pub fn close(&mut self) {
        if let Some(t) = self.thread.take() {
            let _ = rustix::io::write(&*self.wake, &1u64.to_ne_bytes());
            let _ = t.join();
            let _ = std::fs::remove_file(&self.socket);
            let _ = std::fs::remove_dir(&self.dir);
        }
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        self.close();
    }
}

/// Listens at `socket` and starts the serve loop: its wake and thread.
fn start(
    socket: &Path,
    var: &str,
    id: [u8; 16],
    table: Vec<u8>,
    buffers: Vec<Buffer>,
) -> Result<(Arc<OwnedFd>, JoinHandle<()>)> {
    let listener = unix_socket::listen(socket, rustix::net::SocketType::STREAM, PRIVATE_MODE, 128)
        .map_err(|e| match e {
            SocketError::TooLong { .. } => cannot(format!(
                "{e}; set {var} to a shorter directory, such as /tmp"
            )),
            e => cannot(iopath_sys::error_chain(&e)),
        })?;
    rustix::io::ioctl_fionbio(&listener, true).map_err(|e| Error::sys("FIONBIO", e))?;
    let wake = Arc::new(
        rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )
        .map_err(|e| Error::sys("eventfd", e))?,
    );
    let served = Served {
        id,
        table: Arc::new(table),
        buffers: Arc::new(buffers),
        live: Arc::new(Mutex::new(HashMap::new())),
    };
    let thread = {
        let wake = wake.clone();
        std::thread::Builder::new()
            .name("iopath-share".into())
            .spawn(move || serve_loop(&listener, &wake, &served))
            .map_err(|e| Error::sys("spawn", e))?
    };
    Ok((wake, thread))
}

/// What every peer is served, and the connections being served now.
struct Served {
    id: [u8; 16],
    table: Arc<Vec<u8>>,
    buffers: Arc<Vec<Buffer>>,
    /// Process id → its connections being served.
    live: Arc<Mutex<HashMap<i32, usize>>>,
}

/// Accepts until `wake` is written. An accept that fails (out of files,
/// of memory) is retried after a wait that doubles from 10 ms to 1 s,
/// during which only the wake is watched; the first failure of a run is
/// logged.
fn serve_loop(listener: &OwnedFd, wake: &OwnedFd, served: &Served) {
    let mut backoff: Option<Duration> = None;
    let mut logged = false;
    loop {
        let mut fds = [
            PollFd::new(wake, PollFlags::IN),
            PollFd::new(listener, PollFlags::IN),
        ];
        let watched = if backoff.is_some() { 1 } else { 2 };
        let timeout = backoff.and_then(|d| rustix::event::Timespec::try_from(d).ok());
        match rustix::event::poll(&mut fds[..watched], timeout.as_ref()) {
            Ok(_) | Err(Errno::INTR) => {}
            Err(e) => {
                tracing::warn!("share: poll failed ({e}); stopped serving");
                return;
            }
        }
        if !fds[0].revents().is_empty() {
            return;
        }
        backoff = None;
        loop {
            match rustix::net::accept_with(listener, rustix::net::SocketFlags::CLOEXEC) {
                Ok(conn) => {
                    logged = false;
                    admit(UnixStream::from(conn), served);
                }
                Err(Errno::AGAIN) => break,
                Err(Errno::INTR | Errno::CONNABORTED) => {}
                // Out of files or memory: nothing to retry at once.
                Err(e) => {
                    if !logged {
                        tracing::warn!(
                            "share: cannot accept an attach ({e}); retrying, waiting up to {:?} \
                             between tries, until it can",
                            BACKOFF.1
                        );
                        logged = true;
                    }
                    backoff = Some(backoff.map_or(BACKOFF.0, |d| (d * 2).min(BACKOFF.1)));
                    break;
                }
            }
        }
    }
}

/// Serves `conn` on a thread of its own if it is a process of this user
/// (or root) with fewer than [`PER_PEER`] connections being served, and
/// fewer than [`MAX_LIVE`] in all; else answers busy (or, another user,
/// nothing) and closes it at once.
fn admit(mut conn: UnixStream, served: &Served) {
    let me = rustix::process::geteuid().as_raw();
    let Ok(peer) = Peer::of(&conn) else { return };
    if peer.uid != me && peer.uid != 0 {
        tracing::debug!("share: refused {peer}: another user");
        return;
    }
    let taken = {
        let mut live = iopath_sys::lock(&served.live);
        let total: usize = live.values().sum();
        let mine = live.entry(peer.pid).or_default();
        let free = *mine < PER_PEER && total < MAX_LIVE;
        if free {
            *mine += 1;
        }
        free
    };
    if !taken {
        tracing::debug!("share: {peer} answered busy");
        // 24 bytes into a new connection's empty buffer: never blocks.
        let _ = conn.write_all(&reply(STATUS_BUSY, 0, 0));
        return;
    }
    let slot = Slot {
        live: served.live.clone(),
        pid: peer.pid,
    };
    let (id, table, buffers) = (served.id, served.table.clone(), served.buffers.clone());
    // A thread per peer: one that connects and says nothing holds up no
    // one else.
    let spawned = std::thread::Builder::new()
        .name("iopath-share-peer".into())
        .spawn(move || {
            let _slot = slot;
            if let Err(e) = serve_one(&mut conn, id, &table, &buffers) {
                tracing::debug!("share: {peer} went away: {e}");
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("share: no thread for {peer}: {e}");
    }
}

/// One connection of a process being served; counted off when dropped.
struct Slot {
    live: Arc<Mutex<HashMap<i32, usize>>>,
    pid: i32,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut live = iopath_sys::lock(&self.live);
        if let Some(n) = live.get_mut(&self.pid) {
            *n -= 1;
            if *n == 0 {
                live.remove(&self.pid);
            }
        }
    }
}

fn serve_one(conn: &mut UnixStream, id: [u8; 16], table: &[u8], buffers: &[Buffer]) -> Result<()> {
    conn.set_read_timeout(Some(REQUEST_TIMEOUT))
        .map_err(|e| Error::sys("SO_RCVTIMEO", e))?;
    conn.set_write_timeout(Some(WRITE_TIMEOUT))
        .map_err(|e| Error::sys("SO_SNDTIMEO", e))?;
    let mut req = [0u8; MSG_LEN];
    conn.read_exact(&mut req)
        .map_err(|e| Error::sys("read", e))?;
    let ok = &req[..4] == MAGIC && req[4..8] == VERSION.to_le_bytes() && req[8..24] == id;
    let status = if ok { STATUS_OK } else { STATUS_UNKNOWN_ID };
    conn.write_all(&reply(status, table.len(), buffers.len()))
        .map_err(|e| Error::sys("write", e))?;
    if !ok {
        return Ok(());
    }
    conn.write_all(table).map_err(|e| Error::sys("write", e))?;
    for b in buffers {
        b.export(conn)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Heap, HugePages, MemfdHeap};

    fn one_buffer_share() -> Share {
        let heap = MemfdHeap::new(HugePages::None);
        let b = heap.alloc(4096).unwrap();
        b.write_at(0, b"kept").unwrap();
        let t = SharedTensor {
            name: "x".into(),
            buffer: 0,
            offset: 0,
            len: 4,
            dtype: "U8".into(),
            shape: vec![4],
        };
        Share::serve(vec![b], vec![t], BTreeMap::new()).unwrap()
    }

    #[test]
    fn close_returns_when_the_socket_file_is_gone() {
        let mut share = one_buffer_share();
        // A /tmp cleaner removes the socket (and its directory).
        std::fs::remove_file(&share.socket).unwrap();
        let dir = share.dir.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            share.close();
            let _ = tx.send(());
        });
        rx.recv_timeout(Duration::from_secs(10))
            .expect("close() returned");
        assert!(!dir.exists(), "its directory removed");
        // Dropping without close() does not hang either.
        let share = one_buffer_share();
        std::fs::remove_file(&share.socket).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            drop(share);
            let _ = tx.send(());
        });
        rx.recv_timeout(Duration::from_secs(10))
            .expect("the drop returned");
    }

    /// This test's binary in `role`, its stdin and stdout piped.
    fn spawn_role(role: &str, socket: &str) -> std::process::Child {
        std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "share::serve::tests::a_process_holding_connections_neither_spins_the_sharer_nor_starves_attaches",
                "--nocapture",
            ])
            .env("IOPATH_SHARE_ROLE", role)
            .env("IOPATH_SHARE_SOCKET", socket)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    }

    /// The first line of `child`'s stdout that starts with `tag`, the rest
    /// of it.
    fn said(child: &mut std::process::Child, tag: &str) -> String {
        use std::io::BufRead;
        let out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut lines = out.lines();
        let got = lines
            .by_ref()
            .map_while(std::result::Result::ok)
            .find_map(|l| l.strip_prefix(tag).map(str::to_string))
            .unwrap_or_else(|| panic!("no {tag:?} line"));
        // Keep reading, so the child's writes never fail.
        std::thread::spawn(move || lines.for_each(drop));
        got
    }

    /// Files the sharer has left for connections.
    const FREE_FILES: u64 = 6;

    #[test]
    fn a_process_holding_connections_neither_spins_the_sharer_nor_starves_attaches() {
        match std::env::var("IOPATH_SHARE_ROLE").as_deref() {
            Ok("sharer") => {
                let share = one_buffer_share();
                let r = rustix::process::getrlimit(rustix::process::Resource::Nofile);
                let low = iopath_sys::limits::open_fds() + FREE_FILES;
                rustix::process::setrlimit(
                    rustix::process::Resource::Nofile,
                    rustix::process::Rlimit {
                        current: Some(low),
                        maximum: r.maximum,
                    },
                )
                .unwrap();
                println!("HANDLE {}", share.handle());
                let _ = std::io::stdin().read_to_end(&mut Vec::new());
                return;
            }
            Ok("holder") => {
                let socket = std::env::var("IOPATH_SHARE_SOCKET").unwrap();
                let held: Vec<_> = (0..10)
                    .filter_map(|_| UnixStream::connect(&socket).ok())
                    .collect();
                println!("HELD {}", held.len());
                let _ = std::io::stdin().read_to_end(&mut Vec::new());
                return;
            }
            _ => {}
        }
        let mut sharer = spawn_role("sharer", "");
        let handle = said(&mut sharer, "HANDLE ");
        let socket = handle[HANDLE_PREFIX.len() + 33..].to_string();
        let attach = |timeout| super::super::attach(&handle, Duration::from_secs(timeout));
        // One process holds connections: the sharer serves PER_PEER of
        // them and answers the others busy, so files remain for others.
        let mut holder = spawn_role("holder", &socket);
        said(&mut holder, "HELD ");
        std::thread::sleep(Duration::from_millis(300));
        let t = std::time::Instant::now();
        attach(10).expect("an attach while one process holds connections");
        assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
        // A second holder takes the files left: accept fails (EMFILE),
        // and the sharer waits instead of retrying at once.
        let mut second = spawn_role("holder", &socket);
        said(&mut second, "HELD ");
        std::thread::sleep(Duration::from_millis(300));
        let cpu = iopath_sys::process::cpu_time(sharer.id()).unwrap();
        std::thread::sleep(Duration::from_secs(2));
        let spent = iopath_sys::process::cpu_time(sharer.id()).unwrap() - cpu;
        assert!(
            spent < Duration::from_millis(400),
            "the sharer spun: {spent:?} of CPU in 2 s"
        );
        // An attach waits meanwhile, and gets through once the holder
        // lets go.
        std::thread::scope(|s| {
            let waiting = s.spawn(|| attach(20));
            std::thread::sleep(Duration::from_millis(500));
            assert!(!waiting.is_finished(), "served with no file to spare?");
            second.kill().unwrap();
            second.wait().unwrap();
            let t = std::time::Instant::now();
            let got = waiting
                .join()
                .unwrap()
                .expect("the attach once the holder let go");
            assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
            let mut b = [0u8; 4];
            got.buffers[0].read_at(0, &mut b).unwrap();
            assert_eq!(&b, b"kept");
        });
        holder.kill().unwrap();
        holder.wait().unwrap();
        drop(sharer.stdin.take());
        assert!(sharer.wait().unwrap().success());
    }

    #[test]
    fn a_socket_path_too_long_names_it_the_limit_and_the_fix_and_leaves_nothing() {
        let top = tempfile::tempdir().unwrap();
        let base = top.path().join("d".repeat(100));
        std::fs::create_dir(&base).unwrap();
        let e = place(&base, "TMPDIR", &[7; 16]).unwrap_err();
        let msg = e.to_string();
        let socket = base.join(format!(
            "iopath-share-{}-07070707/socket",
            std::process::id()
        ));
        assert!(
            msg.starts_with("cannot share: its socket would be "),
            "{msg}"
        );
        assert!(msg.contains(&socket.display().to_string()), "{msg}");
        assert!(
            msg.contains("past the") && msg.contains("(107 bytes a unix socket path holds"),
            "{msg}"
        );
        assert!(msg.contains("set TMPDIR to a shorter directory"), "{msg}");
        assert_eq!(std::fs::read_dir(&base).unwrap().count(), 0, "nothing left");
    }

    #[test]
    fn serve_under_a_long_tmpdir_fails_naming_it_and_leaves_nothing() {
        // The environment is the process's: a child of its own.
        if let Some(dir) = std::env::var_os("IOPATH_SHARE_LONG_TMPDIR") {
            let e = Share::serve(Vec::new(), Vec::new(), BTreeMap::new()).unwrap_err();
            println!("ERROR {e}");
            assert_eq!(std::fs::read_dir(dir).unwrap().count(), 0);
            return;
        }
        let top = tempfile::tempdir().unwrap();
        let long = top.path().join("t".repeat(110));
        std::fs::create_dir(&long).unwrap();
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "share::serve::tests::serve_under_a_long_tmpdir_fails_naming_it_and_leaves_nothing",
                "--nocapture",
            ])
            .env("IOPATH_SHARE_LONG_TMPDIR", &long)
            .env("TMPDIR", &long)
            .env_remove("XDG_RUNTIME_DIR")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{stdout}");
        let line = stdout.lines().find(|l| l.starts_with("ERROR ")).unwrap();
        assert!(line.contains(&long.display().to_string()), "{line}");
        assert!(line.contains("107 bytes"), "{line}");
        assert!(line.contains("set TMPDIR to a shorter directory"), "{line}");
    }
}
