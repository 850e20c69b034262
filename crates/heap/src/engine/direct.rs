//! `direct`: `O_DIRECT` straight into the buffer's mapping.
//!
//! Buffer memory is page aligned, so whenever the file offset and the buffer
//! offset agree modulo the file system's direct-I/O alignment, the aligned
//! middle of a transfer goes straight between the disk and the mapping. The
//! unaligned head and tail (and a whole transfer whose offsets disagree) go
//! through a small aligned bounce buffer; writes read-modify-write the
//! partial blocks and trim the file back if the last block overshot it.

use std::os::fd::BorrowedFd;

use super::{buffered, check_read, check_write, Engine, Method, Transfer};
use crate::align::{align_down, align_up, direct_split, DioAlign};
use crate::bounce::AlignedBuf;
use crate::file::IoFile;
use crate::{sys, Buffer, Error, Result};

/// Bounce buffer size.
const BOUNCE: usize = 1 << 20;
/// Bytes per direct `pread`/`pwrite` of the middle.
const DIRECT_CHUNK: usize = 64 << 20;

/// `O_DIRECT` `pread(2)`/`pwrite(2)`.
#[derive(Debug, Clone, Copy, Default)]
pub struct DirectEngine;

/// Why a direct transfer stopped.
#[derive(Debug)]
pub(crate) enum Fail {
    /// The file system refused direct I/O (`EINVAL`): fall back.
    Refused,
    /// Anything else.
    Err(Error),
}

impl From<Error> for Fail {
    fn from(e: Error) -> Self {
        Fail::Err(e)
    }
}

/// The pieces of a direct transfer. `mem` is the buffer-side pointer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Piece {
    pub file_off: u64,
    pub mem: *mut u8,
    pub len: usize,
}

/// Direction of a transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dir {
    /// File to buffer.
    Read,
    /// Buffer to file.
    Write,
}

/// Runs a direct transfer: head and tail through the bounce, the aligned
/// middle through `middle` (direct `pread`/`pwrite` here, io_uring there).
///
/// # Safety
/// `mem..mem+len` must be buffer memory kept mapped for the call (writable
/// for reads).
pub(crate) unsafe fn run(
    file: &IoFile,
    dir: Dir,
    file_off: u64,
    mem: *mut u8,
    len: usize,
    middle: &mut dyn FnMut(BorrowedFd<'_>, Piece) -> Result<(), Fail>,
) -> Result<(), Fail> {
    let (Some(align), Some(dfd)) = (file.dio_align(), file.direct_fd()?) else {
        return Err(Fail::Refused);
    };
    let old_size = file.size()?;
    let s = direct_split(file_off, mem as usize, len, align);
    let mut bounce = None;
    if s.head > 0 {
        // SAFETY: the head is the start of the caller's range.
        unsafe { bounce_io(file, dfd, align, dir, &mut bounce, file_off, mem, s.head) }?;
    }
    if s.middle > 0 {
        // SAFETY: the middle lies inside the caller's range.
        let mid = unsafe { mem.add(s.head) };
        middle(
            dfd,
            Piece {
                file_off: file_off + s.head as u64,
                mem: mid,
                len: s.middle,
            },
        )?;
    }
    if s.tail > 0 {
        let skip = s.head + s.middle;
        // SAFETY: the tail is the end of the caller's range.
        unsafe {
            bounce_io(
                file,
                dfd,
                align,
                dir,
                &mut bounce,
                file_off + skip as u64,
                mem.add(skip),
                s.tail,
            )
        }?;
    }
    if dir == Dir::Write {
        // A bounced last block may have grown the file past the range.
        let want = old_size.max(file_off + len as u64);
        if file.size()? > want {
            rustix::fs::ftruncate(file.fd(), want)
                .map_err(|e| file.io_err("ftruncate", want, 0, e.into()))?;
        }
    }
    Ok(())
}

/// Moves `len` bytes at `file_off` through an aligned bounce buffer, whole
/// blocks at a time (read-modify-write for partial blocks of a write).
///
/// # Safety
/// As [`run`], for `mem..mem+len`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn bounce_io(
    file: &IoFile,
    dfd: BorrowedFd<'_>,
    align: DioAlign,
    dir: Dir,
    bounce: &mut Option<AlignedBuf>,
    file_off: u64,
    mem: *mut u8,
    len: usize,
) -> Result<(), Fail> {
    let oa = align.offset as u64;
    let size = align_up(BOUNCE as u64, oa).unwrap_or(oa).max(2 * oa) as usize;
    if bounce.is_none() {
        *bounce = Some(AlignedBuf::new(size, align.mem.max(align.offset))?);
    }
    let b = bounce.as_mut().expect("just set");
    let end = file_off + len as u64;
    let mut pos = file_off;
    while pos < end {
        let bs = align_down(pos, oa);
        let be = align_up(end, oa).unwrap_or(u64::MAX).min(bs + size as u64);
        let n = (be - bs) as usize;
        let lo = (pos - bs) as usize;
        let hi = (end.min(be) - bs) as usize;
        let done = (pos - file_off) as usize;
        match dir {
            Dir::Read => {
                let got = direct_pread(file, dfd, b, bs, n)?;
                if got < hi {
                    return Err(Fail::Err(file.short(file.size()?, file_off, len)));
                }
                // SAFETY: `done + (hi - lo) <= len`, inside the caller's range;
                // the bounce is private memory.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        b.as_slice()[lo..hi].as_ptr(),
                        mem.add(done),
                        hi - lo,
                    )
                };
            }
            Dir::Write => {
                if lo > 0 || hi < n {
                    b.as_mut_slice()[..n].fill(0);
                    direct_pread(file, dfd, b, bs, n)?;
                }
                // SAFETY: as above, in the other direction.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        mem.add(done),
                        b.as_mut_slice()[lo..hi].as_mut_ptr(),
                        hi - lo,
                    )
                };
                let mut w = 0;
                while w < n {
                    // SAFETY: `w < n <= b.len()`, private bounce memory.
                    let r =
                        unsafe { sys::pwrite(dfd, b.as_mut_ptr().add(w), n - w, bs + w as u64) };
                    w += r.map_err(|e| fail(file, "pwrite(O_DIRECT)", bs + w as u64, n - w, e))?;
                }
            }
        }
        pos = end.min(be);
    }
    Ok(())
}

/// Reads up to `n` bytes at `off` into the bounce; fewer only at EOF.
fn direct_pread(
    file: &IoFile,
    dfd: BorrowedFd<'_>,
    b: &mut AlignedBuf,
    off: u64,
    n: usize,
) -> Result<usize, Fail> {
    let mut got = 0;
    while got < n {
        // SAFETY: `got < n <= b.len()`, private bounce memory.
        let r = unsafe { sys::pread(dfd, b.as_mut_ptr().add(got), n - got, off + got as u64) };
        let k = r.map_err(|e| fail(file, "pread(O_DIRECT)", off + got as u64, n - got, e))?;
        if k == 0 {
            break;
        }
        got += k;
    }
    Ok(got)
}

pub(crate) fn fail(
    file: &IoFile,
    op: &'static str,
    off: u64,
    len: usize,
    e: std::io::Error,
) -> Fail {
    if sys::is_einval(&e) {
        tracing::debug!(
            "{}: {op} at {off} refused with EINVAL; falling back",
            file.path().display()
        );
        Fail::Refused
    } else {
        Fail::Err(file.io_err(op, off, len, e))
    }
}

/// Finishes a direct transfer: on `Refused`, redo it buffered and count the
/// fallback.
///
/// # Safety
/// As [`run`].
pub(crate) unsafe fn finish(
    r: Result<(), Fail>,
    file: &IoFile,
    dir: Dir,
    file_off: u64,
    mem: *mut u8,
    len: usize,
) -> Result<Transfer> {
    let fallbacks = match r {
        Ok(()) => 0,
        Err(Fail::Err(e)) => return Err(e),
        Err(Fail::Refused) => {
            match dir {
                // SAFETY: forwarded from the caller.
                Dir::Read => unsafe { buffered::read_into(file, file_off, mem, len) }?,
                // SAFETY: forwarded from the caller.
                Dir::Write => unsafe { buffered::write_from(file, file_off, mem, len) }?,
            }
            1
        }
    };
    Ok(Transfer {
        bytes: len as u64,
        fallbacks,
    })
}

/// The middle of a direct transfer with plain `pread`/`pwrite`.
fn middle_sync(file: &IoFile, dir: Dir, dfd: BorrowedFd<'_>, p: Piece) -> Result<(), Fail> {
    let mut done = 0;
    while done < p.len {
        let off = p.file_off + done as u64;
        let want = (p.len - done).min(DIRECT_CHUNK);
        // SAFETY: `done < p.len`, inside the piece the caller vouched for.
        let ptr = unsafe { p.mem.add(done) };
        let r = match dir {
            // SAFETY: as above; `ptr..ptr+want` is writable buffer memory.
            Dir::Read => unsafe { sys::pread(dfd, ptr, want, off) },
            // SAFETY: as above; readable buffer memory.
            Dir::Write => unsafe { sys::pwrite(dfd, ptr, want, off) },
        };
        let op = if dir == Dir::Read {
            "pread(O_DIRECT)"
        } else {
            "pwrite(O_DIRECT)"
        };
        let n = r.map_err(|e| fail(file, op, off, want, e))?;
        if n == 0 {
            return Err(Fail::Err(file.short(file.size()?, p.file_off, p.len)));
        }
        if n % file.dio_align().map_or(1, |a| a.offset) != 0 && done + n < p.len {
            // A short direct transfer that is not at EOF: continue the rest
            // (unaligned now) through the buffered path.
            let rest = p.len - done - n;
            // SAFETY: inside the piece.
            let ptr = unsafe { ptr.add(n) };
            let off = off + n as u64;
            match dir {
                // SAFETY: inside the piece.
                Dir::Read => unsafe { buffered::read_into(file, off, ptr, rest) }?,
                // SAFETY: inside the piece.
                Dir::Write => unsafe { buffered::write_from(file, off, ptr, rest) }?,
            }
            return Ok(());
        }
        done += n;
    }
    Ok(())
}

impl Engine for DirectEngine {
    fn method(&self) -> Method {
        Method::Direct
    }

    fn read(
        &self,
        file: &IoFile,
        file_off: u64,
        buf: &Buffer,
        buf_off: usize,
        len: usize,
    ) -> Result<Transfer> {
        let mem = check_read(file, file_off, buf, buf_off, len)?;
        if len == 0 {
            return Ok(Transfer::default());
        }
        let mut mid = |dfd: BorrowedFd<'_>, p: Piece| middle_sync(file, Dir::Read, dfd, p);
        // SAFETY: `check_read` put `mem..mem+len` inside `buf`'s mapping,
        // which `buf` keeps alive for the call.
        let r = unsafe { run(file, Dir::Read, file_off, mem, len, &mut mid) };
        // SAFETY: as above.
        unsafe { finish(r, file, Dir::Read, file_off, mem, len) }
    }

    fn write(
        &self,
        buf: &Buffer,
        buf_off: usize,
        len: usize,
        file: &IoFile,
        file_off: u64,
    ) -> Result<Transfer> {
        let mem = check_write(buf, buf_off, len)?;
        if len == 0 {
            return Ok(Transfer::default());
        }
        let mut mid = |dfd: BorrowedFd<'_>, p: Piece| middle_sync(file, Dir::Write, dfd, p);
        // SAFETY: as in `read`.
        let r = unsafe { run(file, Dir::Write, file_off, mem, len, &mut mid) };
        // SAFETY: as in `read`.
        unsafe { finish(r, file, Dir::Write, file_off, mem, len) }
    }
}
