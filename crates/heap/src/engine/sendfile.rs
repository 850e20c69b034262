//! `sendfile`: the kernel moves the bytes, no user-space read loop.
//!
//! What really works, and what this engine does:
//! - file → memfd buffer (or the memfd under a udmabuf): `sendfile(2)` with
//!   the memfd as the output. The
//!   output side of `sendfile` writes at the output descriptor's file
//!   position, so the engine opens a private description of the memfd
//!   (`/proc/self/fd/N`), seeks it to the buffer offset, and never disturbs
//!   the position other users of the buffer's fd see.
//! - file → other buffers (dma-bufs have no `write_iter`, so `sendfile` to
//!   them fails): `splice(2)` the file into a pipe, then `read(2)` the pipe
//!   into the buffer's mapping.
//! - buffer → file: `vmsplice(2)` the mapping into a pipe, then `splice(2)`
//!   the pipe into the file at the offset (explicit offsets, no position);
//!   `pwrite(2)` from a mapping that cannot be pinned (a dma-heap buffer).
//!
//! The file side is read or written through the page cache.

use std::fs::{File, OpenOptions};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;

use rustix::pipe::{pipe_with, splice, PipeFlags, SpliceFlags};

use super::{fall_back, CheckedRead, Dir, Engine, Method, Transfer};
use crate::file::IoFile;
use crate::range::BufRange;
use crate::{sys, Buffer, Error, HeapKind, Result};

/// `sendfile(2)` / `splice(2)` transfers.
#[derive(Debug, Clone, Copy, Default)]
pub struct SendfileEngine;

/// Bytes per `splice` through the pipe (the pipe is grown to this).
const PIPE_SIZE: usize = 1 << 20;

fn make_pipe() -> Result<(OwnedFd, OwnedFd)> {
    let (r, w) = pipe_with(PipeFlags::CLOEXEC).map_err(|e| Error::sys("pipe2", e))?;
    // A bigger pipe means fewer round trips; the default is 64 KiB and an
    // unprivileged process may be capped lower (pipe-max-size), so best effort.
    let _ = rustix::pipe::fcntl_setpipe_size(&w, PIPE_SIZE);
    Ok((r, w))
}

/// A private description of the buffer's memfd (the buffer itself, or the
/// memfd under a udmabuf), for `sendfile`'s output side.
fn reopen(buf: &Buffer) -> Option<File> {
    let fd = match buf.kind() {
        HeapKind::Memfd => buf.fd(),
        _ => buf.memfd()?,
    };
    OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .ok()
}

impl SendfileEngine {
    fn read_sendfile(
        file: &IoFile,
        out: &File,
        file_off: u64,
        buf_off: usize,
        len: usize,
    ) -> Result<()> {
        rustix::fs::seek(out, rustix::fs::SeekFrom::Start(buf_off as u64))
            .map_err(|e| Error::sys("lseek(memfd)", e))?;
        let mut off = file_off;
        let end = file_off + len as u64;
        while off < end {
            let want = ((end - off) as usize).min(sys::MAX_RW);
            let at = off;
            let n = rustix::fs::sendfile(out, file.fd(), Some(&mut off), want)
                .map_err(|e| file.io_err("sendfile", at, want, e.into()))?;
            if n == 0 {
                return Err(file.short(file.size()?, file_off, len));
            }
        }
        Ok(())
    }

    fn read_splice(file: &IoFile, file_off: u64, dst: BufRange<'_>) -> Result<()> {
        let len = dst.len();
        let (r, w) = make_pipe()?;
        let mut off = file_off;
        let mut done = 0usize;
        while done < len {
            let at = off;
            let want = (len - done).min(PIPE_SIZE);
            let n = splice(file.fd(), Some(&mut off), &w, None, want, SpliceFlags::MOVE)
                .map_err(|e| file.io_err("splice", at, want, e.into()))?;
            if n == 0 {
                return Err(file.short(file.size()?, file_off, len));
            }
            let mut got = 0;
            while got < n {
                let k = sys::read(r.as_fd(), dst.sub(done + got, n - got)?)
                    .map_err(|e| Error::sys("read(pipe)", e))?;
                got += k;
            }
            done += n;
        }
        Ok(())
    }
}

impl Engine for SendfileEngine {
    fn method(&self) -> Method {
        Method::Sendfile
    }

    fn read_checked(&self, r: CheckedRead<'_>) -> Result<Transfer> {
        let (file, file_off, dst) = (r.file(), r.file_off(), r.mem());
        let len = dst.len();
        if len == 0 {
            return Ok(Transfer::default());
        }
        match reopen(dst.buffer()) {
            Some(out) => Self::read_sendfile(file, &out, file_off, dst.offset(), len)?,
            None => Self::read_splice(file, file_off, dst)?,
        }
        Ok(Transfer::moved(len as u64))
    }

    fn write_range(&self, src: BufRange<'_>, file: &IoFile, file_off: u64) -> Result<Transfer> {
        let len = src.len();
        if !src.buffer().takes_direct_io() {
            // `vmsplice` pins the pages, which a dma-buf's mapping refuses.
            return fall_back(file, Dir::Write, file_off, src);
        }
        let (r, w) = make_pipe()?;
        let mut off = file_off;
        let mut done = 0usize;
        while done < len {
            let want = (len - done).min(PIPE_SIZE);
            // The pipe is drained into the file before we return.
            let n = sys::vmsplice(w.as_fd(), src.sub(done, want)?)
                .map_err(|e| Error::sys("vmsplice", e))?;
            let mut put = 0;
            while put < n {
                let at = off;
                let k = splice(
                    &r,
                    None,
                    file.fd(),
                    Some(&mut off),
                    n - put,
                    SpliceFlags::MOVE,
                )
                .map_err(|e| file.io_err("splice", at, n - put, e.into()))?;
                put += k;
            }
            done += n;
        }
        Ok(Transfer::moved(len as u64))
    }
}
