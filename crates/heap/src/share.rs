//! One load, many processes: loaded tensors served to other processes of
//! the same user, who map the very same buffers (no read, no copy).
//!
//! ```text
//!   loader:  Share::serve(buffers, table) ── unix socket in a 0700 directory
//!                 ▲ handle "iopath-share:v1:<id>:<socket>" (a string: argv,
//!                 │ env, a pipe, pickle)
//!   worker:  attach(handle) ─► connect, send the id ─► table (JSON)
//!                           ◄─ every buffer's fd (SCM_RIGHTS, Buffer::export)
//! ```
//!
//! The attaching side trusts nothing it receives: a socket that is gone or
//! an id that does not match (a stale handle) is an error; every fd must be
//! the file the table names (same inode, same length, a memfd sealed
//! against shrinking), and every tensor must lie inside its buffer, so a
//! view is never made over other memory.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::{Buffer, Error, HeapKind, Result};

const MAGIC: &[u8; 4] = b"IOPS";
const VERSION: u32 = 1;
/// Request: magic, version, id. Reply: magic, status, table length,
/// buffer count.
const MSG_LEN: usize = 24;
const STATUS_OK: u32 = 0;
const STATUS_UNKNOWN_ID: u32 = 1;
const HANDLE_PREFIX: &str = "iopath-share:v1:";
/// Limits on what an attach accepts from the other side.
const MAX_TABLE: u64 = 256 << 20;
const MAX_BUFFERS: u32 = 1 << 16;

/// One tensor of a share: where it is and what it is.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SharedTensor {
    /// Its name.
    pub name: String,
    /// Index of its buffer.
    pub buffer: usize,
    /// Offset of its first byte in the buffer.
    pub offset: usize,
    /// Length in bytes.
    pub len: usize,
    /// Element type, as safetensors names it (`F32`, `BF16`, ...).
    pub dtype: String,
    /// Shape.
    pub shape: Vec<usize>,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Table {
    /// Per buffer: length and inode number.
    buffers: Vec<(usize, u64)>,
    tensors: Vec<SharedTensor>,
    metadata: BTreeMap<String, String>,
}

/// What an attach receives: the same buffers, mapped here, and the table.
#[derive(Debug)]
pub struct Attached {
    /// The buffers, mapped from the sharer's fds.
    pub buffers: Vec<Buffer>,
    /// Every tensor, checked to lie inside its buffer.
    pub tensors: Vec<SharedTensor>,
    /// The sharer's metadata.
    pub metadata: BTreeMap<String, String>,
}

/// Tensors served to other processes until dropped.
#[derive(Debug)]
pub struct Share {
    dir: PathBuf,
    socket: PathBuf,
    id: [u8; 16],
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

fn check_tensors(tensors: &[SharedTensor], lens: &[usize]) -> std::result::Result<(), String> {
    for t in tensors {
        let Some(&blen) = lens.get(t.buffer) else {
            return Err(format!(
                "tensor {:?} is in buffer {} of {}",
                t.name,
                t.buffer,
                lens.len()
            ));
        };
        if t.offset.checked_add(t.len).is_none_or(|end| end > blen) {
            return Err(format!(
                "tensor {:?} ({}+{} bytes) runs past its buffer of {blen} bytes",
                t.name, t.offset, t.len
            ));
        }
    }
    Ok(())
}

fn random_id() -> Result<[u8; 16]> {
    let mut id = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut id))
        .map_err(|e| Error::sys("read /dev/urandom", e))?;
    Ok(id)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn inode(fd: std::os::fd::BorrowedFd<'_>) -> Result<u64> {
    Ok(rustix::fs::fstat(fd)
        .map_err(|e| Error::sys("fstat", e))?
        .st_ino)
}

impl Share {
    /// Serves `buffers` and the `tensors` in them to any process of this
    /// user that attaches with [`Share::handle`], from a thread of its own,
    /// until the share is dropped.
    ///
    /// # Errors
    /// [`Error::Share`] for a tensor outside its buffer; [`Error::Sys`] if
    /// the socket cannot be made.
    pub fn serve(
        buffers: Vec<Buffer>,
        tensors: Vec<SharedTensor>,
        metadata: BTreeMap<String, String>,
    ) -> Result<Share> {
        let lens: Vec<usize> = buffers.iter().map(Buffer::len).collect();
        check_tensors(&tensors, &lens).map_err(|reason| Error::Share {
            handle: String::new(),
            reason,
        })?;
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
        let base = std::env::var_os("XDG_RUNTIME_DIR")
            .map(PathBuf::from)
            .filter(|p| p.is_dir())
            .unwrap_or_else(std::env::temp_dir);
        let dir = base.join(format!(
            "iopath-share-{}-{}",
            std::process::id(),
            hex(&id[..4])
        ));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| Error::sys("mkdir", e))?;
        let socket = dir.join("socket");
        let listener = UnixListener::bind(&socket).map_err(|e| Error::sys("bind", e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("iopath-share".into())
                .spawn(move || {
                    serve_loop(&listener, &stop, id, &Arc::new(table), &Arc::new(buffers))
                })
                .map_err(|e| Error::sys("spawn", e))?
        };
        Ok(Share {
            dir,
            socket,
            id,
            stop,
            thread: Some(thread),
        })
    }

    /// The string another process passes to [`attach`].
    pub fn handle(&self) -> String {
        format!("{HANDLE_PREFIX}{}:{}", hex(&self.id), self.socket.display())
    }

    /// Stops serving: later attaches with this handle fail. Processes
    /// already attached keep their mappings.
    pub fn close(&mut self) {
        if let Some(t) = self.thread.take() {
            self.stop.store(true, Ordering::Release);
            // Wake the accept.
            let _ = UnixStream::connect(&self.socket);
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

fn serve_loop(
    listener: &UnixListener,
    stop: &AtomicBool,
    id: [u8; 16],
    table: &Arc<Vec<u8>>,
    buffers: &Arc<Vec<Buffer>>,
) {
    for conn in listener.incoming() {
        if stop.load(Ordering::Acquire) {
            break;
        }
        let Ok(mut conn) = conn else { continue };
        // A thread per peer: one that connects and says nothing holds up
        // no one else.
        let (table, buffers) = (table.clone(), buffers.clone());
        let spawned = std::thread::Builder::new()
            .name("iopath-share-peer".into())
            .spawn(move || {
                if let Err(e) = serve_one(&mut conn, id, &table, &buffers) {
                    tracing::debug!("share: a peer went away: {e}");
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("share: no thread for a peer: {e}");
        }
    }
}

fn serve_one(conn: &mut UnixStream, id: [u8; 16], table: &[u8], buffers: &[Buffer]) -> Result<()> {
    let me = rustix::process::geteuid().as_raw();
    let peer =
        rustix::net::sockopt::socket_peercred(&*conn).map_err(|e| Error::sys("SO_PEERCRED", e))?;
    if peer.uid.as_raw() != me && !peer.uid.is_root() {
        return Ok(());
    }
    conn.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .map_err(|e| Error::sys("SO_RCVTIMEO", e))?;
    let mut req = [0u8; MSG_LEN];
    conn.read_exact(&mut req)
        .map_err(|e| Error::sys("read", e))?;
    let ok = &req[..4] == MAGIC && req[4..8] == VERSION.to_le_bytes() && req[8..24] == id;
    let mut reply = [0u8; MSG_LEN];
    reply[..4].copy_from_slice(MAGIC);
    let status = if ok { STATUS_OK } else { STATUS_UNKNOWN_ID };
    reply[4..8].copy_from_slice(&status.to_le_bytes());
    reply[8..16].copy_from_slice(&(table.len() as u64).to_le_bytes());
    reply[16..20].copy_from_slice(&(buffers.len() as u32).to_le_bytes());
    conn.write_all(&reply).map_err(|e| Error::sys("write", e))?;
    if !ok {
        return Ok(());
    }
    conn.write_all(table).map_err(|e| Error::sys("write", e))?;
    for b in buffers {
        b.export(conn)?;
    }
    Ok(())
}

/// Attaches to the tensors another process serves with [`Share::serve`]:
/// its buffers are mapped here from the same fds.
///
/// # Errors
/// [`Error::Share`] naming the handle: not an iopath share handle, no
/// share at its socket any more (closed, or its process exited), an id
/// that does not match (a stale handle), or anything received that does
/// not check out (an fd that is not the file the table names, a memfd not
/// sealed against shrinking, a tensor outside its buffer).
pub fn attach(handle: &str) -> Result<Attached> {
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
    let mut conn = UnixStream::connect(Path::new(socket)).map_err(|e| {
        bad(format!(
            "no share at {socket} ({e}): it was closed, or the process that shared it exited"
        ))
    })?;
    conn.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .map_err(|e| Error::sys("SO_RCVTIMEO", e))?;
    let mut req = [0u8; MSG_LEN];
    req[..4].copy_from_slice(MAGIC);
    req[4..8].copy_from_slice(&VERSION.to_le_bytes());
    req[8..24].copy_from_slice(&id);
    conn.write_all(&req)
        .map_err(|e| bad(format!("the share hung up: {e}")))?;
    let mut reply = [0u8; MSG_LEN];
    conn.read_exact(&mut reply)
        .map_err(|e| bad(format!("the share sent no answer: {e}")))?;
    let word = |i: usize| u32::from_le_bytes(reply[i..i + 4].try_into().expect("4 bytes"));
    if &reply[..4] != MAGIC {
        return Err(bad("the socket is not an iopath share".into()));
    }
    if word(4) == STATUS_UNKNOWN_ID {
        return Err(bad(
            "the share there has another id: the handle is stale (of an earlier share)".into(),
        ));
    }
    let table_len = u64::from_le_bytes(reply[8..16].try_into().expect("8 bytes"));
    let n = word(16);
    if word(4) != STATUS_OK || table_len > MAX_TABLE || n > MAX_BUFFERS {
        return Err(bad(format!(
            "the share's answer is out of bounds (status {}, table {table_len} bytes, {n} buffers)",
            word(4)
        )));
    }
    let mut table = vec![0u8; table_len as usize];
    conn.read_exact(&mut table)
        .map_err(|e| bad(format!("the table was cut short: {e}")))?;
    let table: Table =
        serde_json::from_slice(&table).map_err(|e| bad(format!("the table is not valid: {e}")))?;
    if table.buffers.len() != n as usize {
        return Err(bad(format!(
            "the table lists {} buffers, the share sends {n}",
            table.buffers.len()
        )));
    }
    let mut buffers = Vec::with_capacity(n as usize);
    for (i, &(len, ino)) in table.buffers.iter().enumerate() {
        let b = Buffer::import(&conn).map_err(|e| bad(format!("buffer {i}: {e}")))?;
        if b.len() != len || inode(b.fd())? != ino {
            return Err(bad(format!(
                "buffer {i} is not the file the table names ({} bytes, not {len}, or another inode)",
                b.len()
            )));
        }
        if b.kind() == HeapKind::Memfd {
            let sealed = rustix::fs::fcntl_get_seals(b.fd())
                .is_ok_and(|s| s.contains(rustix::fs::SealFlags::SHRINK));
            if !sealed {
                return Err(bad(format!(
                    "buffer {i} is not sealed against shrinking: the sharer could cut it under the mapping"
                )));
            }
        }
        buffers.push(b);
    }
    let lens: Vec<usize> = buffers.iter().map(Buffer::len).collect();
    check_tensors(&table.tensors, &lens).map_err(bad)?;
    Ok(Attached {
        buffers,
        tensors: table.tensors,
        metadata: table.metadata,
    })
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
    use super::*;
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
        let socket = &handle[HANDLE_PREFIX.len() + 33..];
        let _silent = UnixStream::connect(socket).unwrap();
        let t = std::time::Instant::now();
        let got = attach(&handle).unwrap();
        // Served at once, not after the silent peer's 10 s read timeout.
        assert!(t.elapsed() < std::time::Duration::from_secs(5));
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

    fn refused(handle: &str) -> String {
        match attach(handle) {
            Err(Error::Share { reason, .. }) => reason,
            other => panic!("{other:?}"),
        }
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
    }
}
