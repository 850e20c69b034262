//! One load, many processes: loaded tensors served to other processes of
//! the same user, who map the very same buffers (no read, no copy).
//!
//! ```text
//!   loader:  Share::serve(buffers, table) ── unix socket in a 0700 directory
//!                 ▲ handle "iopath-share:v1:<id>:<socket>" (a string: argv,
//!                 │ env, a pipe, pickle)
//!   worker:  attach(handle, timeout) ─► connect, check the server's uid,
//!                 send the id ─► table (JSON)
//!                           ◄─ every buffer's fd (SCM_RIGHTS, Buffer::export)
//! ```
//!
//! - [`serve`]: the share, its socket and the thread that answers attaches;
//! - [`attach`]: the other side, which trusts nothing it receives.
//!
//! Neither side trusts the other. The sharer answers only processes of its
//! own user, a bounded number per process, and never spins on an accept it
//! cannot make. The attacher refuses a server of another user; a socket
//! that is gone, an id that does not match (a stale handle) or no answer
//! within its timeout is an error; every fd must be the file the table
//! names (same inode, same length, of the kind it is labelled: a memfd
//! sealed against shrinking, a dma-buf that is one), and every tensor must
//! lie inside its buffer, so a view is never made over other memory.

mod attach;
mod serve;

use std::collections::BTreeMap;

use crate::{Buffer, Error, Result};

pub use attach::{attach, DEFAULT_ATTACH_TIMEOUT};
pub use serve::Share;

const MAGIC: &[u8; 4] = b"IOPS";
const VERSION: u32 = 1;
/// Request: magic, version, id. Reply: magic, status, table length,
/// buffer count.
const MSG_LEN: usize = 24;
const STATUS_OK: u32 = 0;
const STATUS_UNKNOWN_ID: u32 = 1;
/// The sharer serves as many connections of the attaching process (or in
/// all) as it takes at once: try again shortly.
const STATUS_BUSY: u32 = 2;
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

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn inode(fd: std::os::fd::BorrowedFd<'_>) -> Result<u64> {
    Ok(rustix::fs::fstat(fd)
        .map_err(|e| Error::sys("fstat", e))?
        .st_ino)
}

/// A reply of `status`, with the table's length and the buffer count.
fn reply(status: u32, table_len: usize, buffers: usize) -> [u8; MSG_LEN] {
    let mut reply = [0u8; MSG_LEN];
    reply[..4].copy_from_slice(MAGIC);
    reply[4..8].copy_from_slice(&status.to_le_bytes());
    reply[8..16].copy_from_slice(&(table_len as u64).to_le_bytes());
    reply[16..20].copy_from_slice(&(buffers as u32).to_le_bytes());
    reply
}
