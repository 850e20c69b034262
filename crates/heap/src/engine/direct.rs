//! `direct`: `O_DIRECT` straight into the buffer's mapping.
//!
//! Buffer memory is page aligned, so whenever the file offset and the buffer
//! offset agree modulo the file system's direct-I/O alignment, the aligned
//! middle of a transfer goes straight between the disk and the mapping. The
//! unaligned head and tail (and a whole transfer whose offsets disagree) go
//! through a small aligned staging buffer; writes read-modify-write the
//! partial blocks and trim the file back if the last block overshot it.

use std::os::fd::BorrowedFd;

use super::{buffered, fall_back, CheckedRead, Dir, Engine, Method, Transfer};
use crate::align::{align_down, align_up, direct_split, DioAlign};
use crate::aligned::AlignedBuf;
use crate::file::IoFile;
use crate::range::BufRange;
use crate::{sys, Error, Result};

/// Size of the staging buffer for unaligned heads and tails.
const STAGING: usize = 1 << 20;
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

/// The aligned middle of a direct transfer: buffer memory and where it goes
/// in the file.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Piece<'a> {
    pub file_off: u64,
    pub mem: BufRange<'a>,
}

/// Runs a direct transfer of `mem` at `file_off`: head and tail through the
/// staging buffer, the aligned middle through `middle` (direct
/// `pread`/`pwrite` here, io_uring there).
pub(crate) fn run(
    file: &IoFile,
    dir: Dir,
    file_off: u64,
    mem: BufRange<'_>,
    middle: &mut dyn FnMut(BorrowedFd<'_>, Piece<'_>) -> Result<(), Fail>,
) -> Result<(), Fail> {
    let (Some(align), Some(dfd)) = (file.dio_align(), file.direct_fd()?) else {
        return Err(Fail::Refused);
    };
    if !mem.buffer().takes_direct_io() {
        return Err(Fail::Refused);
    }
    let len = mem.len();
    let old_size = file.size()?;
    let s = direct_split(file_off, mem.addr(), len, align);
    let mut staging = None;
    if s.head > 0 {
        staged_io(
            file,
            dfd,
            align,
            dir,
            &mut staging,
            file_off,
            mem.sub(0, s.head)?,
        )?;
    }
    if s.middle > 0 {
        middle(
            dfd,
            Piece {
                file_off: file_off + s.head as u64,
                mem: mem.sub(s.head, s.middle)?,
            },
        )?;
    }
    if s.tail > 0 {
        let skip = s.head + s.middle;
        staged_io(
            file,
            dfd,
            align,
            dir,
            &mut staging,
            file_off + skip as u64,
            mem.sub(skip, s.tail)?,
        )?;
    }
    if dir == Dir::Write {
        // A staged last block may have grown the file past the range.
        let want = old_size.max(file_off + len as u64);
        if file.size()? > want {
            rustix::fs::ftruncate(file.fd(), want)
                .map_err(|e| file.io_err("ftruncate", want, 0, e.into()))?;
        }
    }
    Ok(())
}

/// Moves `mem` to or from the file at `file_off` through an aligned staging
/// buffer, whole blocks at a time (read-modify-write for partial blocks of a
/// write).
pub(crate) fn staged_io(
    file: &IoFile,
    dfd: BorrowedFd<'_>,
    align: DioAlign,
    dir: Dir,
    staging: &mut Option<AlignedBuf>,
    file_off: u64,
    mem: BufRange<'_>,
) -> Result<(), Fail> {
    let len = mem.len();
    let oa = align.offset as u64;
    let size = align_up(STAGING as u64, oa).unwrap_or(oa).max(2 * oa) as usize;
    let b = match staging {
        Some(b) => b,
        None => staging.insert(AlignedBuf::new(size, align.mem.max(align.offset))?),
    };
    let end = file_off + len as u64;
    let mut pos = file_off;
    while pos < end {
        let bs = align_down(pos, oa);
        let be = align_up(end, oa).unwrap_or(u64::MAX).min(bs + size as u64);
        let n = (be - bs) as usize;
        let lo = (pos - bs) as usize;
        let hi = (end.min(be) - bs) as usize;
        let part = mem.sub((pos - file_off) as usize, hi - lo)?;
        match dir {
            Dir::Read => {
                let got = direct_pread(file, dfd, &mut b.as_mut_slice()[..n], bs)?;
                if got < hi {
                    return Err(Fail::Err(file.short(file.size()?, file_off, len)));
                }
                part.copy_from(&b.as_slice()[lo..hi])?;
            }
            Dir::Write => {
                if lo > 0 || hi < n {
                    b.as_mut_slice()[..n].fill(0);
                    direct_pread(file, dfd, &mut b.as_mut_slice()[..n], bs)?;
                }
                part.copy_to(&mut b.as_mut_slice()[lo..hi])?;
                let mut w = 0;
                while w < n {
                    let at = bs + w as u64;
                    let r = retry(|| rustix::io::pwrite(dfd, &b.as_slice()[w..n], at));
                    w += r.map_err(|e| fail(file, "pwrite(O_DIRECT)", at, n - w, e))?;
                }
            }
        }
        pos = end.min(be);
    }
    Ok(())
}

/// Runs a rustix call until it is not interrupted.
fn retry(mut call: impl FnMut() -> rustix::io::Result<usize>) -> std::io::Result<usize> {
    loop {
        match call() {
            Err(rustix::io::Errno::INTR) => {}
            r => return r.map_err(Into::into),
        }
    }
}

/// Reads up to `dst.len()` bytes at `off` into private staging memory; fewer
/// only at EOF.
fn direct_pread(
    file: &IoFile,
    dfd: BorrowedFd<'_>,
    dst: &mut [u8],
    off: u64,
) -> Result<usize, Fail> {
    let n = dst.len();
    let mut got = 0;
    while got < n {
        let at = off + got as u64;
        let r = retry(|| rustix::io::pread(dfd, &mut dst[got..], at));
        let k = r.map_err(|e| fail(file, "pread(O_DIRECT)", at, n - got, e))?;
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
            crate::error::shown(file.path())
        );
        Fail::Refused
    } else {
        Fail::Err(file.io_err(op, off, len, e))
    }
}

/// Finishes a direct transfer of `mem` at `file_off`: on `Refused`, redo it
/// buffered ([`fall_back`]).
pub(crate) fn finish(
    r: Result<(), Fail>,
    file: &IoFile,
    dir: Dir,
    file_off: u64,
    mem: BufRange<'_>,
) -> Result<Transfer> {
    match r {
        Ok(()) => Ok(Transfer::moved(mem.len() as u64)),
        Err(Fail::Err(e)) => Err(e),
        Err(Fail::Refused) => fall_back(file, dir, file_off, mem),
    }
}

/// The middle of a direct transfer with plain `pread`/`pwrite`.
fn middle_sync(file: &IoFile, dir: Dir, dfd: BorrowedFd<'_>, p: Piece<'_>) -> Result<(), Fail> {
    let len = p.mem.len();
    let mut done = 0;
    while done < len {
        let off = p.file_off + done as u64;
        let want = (len - done).min(DIRECT_CHUNK);
        let part = p.mem.sub(done, want)?;
        let r = match dir {
            Dir::Read => sys::pread(dfd, part, off),
            Dir::Write => sys::pwrite(dfd, part, off),
        };
        let op = if dir == Dir::Read {
            "pread(O_DIRECT)"
        } else {
            "pwrite(O_DIRECT)"
        };
        let n = r.map_err(|e| fail(file, op, off, want, e))?;
        if n == 0 {
            return Err(Fail::Err(file.short(file.size()?, p.file_off, len)));
        }
        if n % file.dio_align().map_or(1, |a| a.offset) != 0 && done + n < len {
            // A short direct transfer that is not at EOF: continue the rest
            // (unaligned now) through the buffered path.
            let rest = p.mem.skip(done + n)?;
            let off = off + n as u64;
            match dir {
                Dir::Read => buffered::read_into(file, off, rest)?,
                Dir::Write => buffered::write_from(file, off, rest)?,
            }
            return Ok(());
        }
        done += n;
    }
    Ok(())
}

/// One direct transfer of `mem` at `file_off`, the middle by `pread` or
/// `pwrite` on this thread.
fn transfer(file: &IoFile, dir: Dir, file_off: u64, mem: BufRange<'_>) -> Result<Transfer> {
    if mem.is_empty() {
        return Ok(Transfer::default());
    }
    let mut mid = |dfd: BorrowedFd<'_>, p: Piece<'_>| middle_sync(file, dir, dfd, p);
    let r = run(file, dir, file_off, mem, &mut mid);
    finish(r, file, dir, file_off, mem)
}

impl Engine for DirectEngine {
    fn method(&self) -> Method {
        Method::Direct
    }

    fn read_checked(&self, r: CheckedRead<'_>) -> Result<Transfer> {
        transfer(r.file(), Dir::Read, r.file_off(), r.mem())
    }

    fn write_range(&self, src: BufRange<'_>, file: &IoFile, file_off: u64) -> Result<Transfer> {
        transfer(file, Dir::Write, file_off, src)
    }
}
