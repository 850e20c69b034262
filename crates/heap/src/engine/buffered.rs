//! `buffered`: `pread`/`pwrite` through the page cache.

use super::{check_read, check_write, Engine, Method, Transfer};
use crate::file::IoFile;
use crate::{sys, Buffer, Result};

/// `pread(2)`/`pwrite(2)` through the page cache. Works on every file system.
#[derive(Debug, Clone, Copy, Default)]
pub struct BufferedEngine;

/// Reads `len` bytes at `off` into `dst`, failing with `ShortFile` at EOF.
///
/// # Safety
/// `dst..dst+len` must be writable memory that stays mapped for the call.
pub(crate) unsafe fn read_into(file: &IoFile, off: u64, dst: *mut u8, len: usize) -> Result<()> {
    let mut done = 0;
    while done < len {
        let pos = off + done as u64;
        // SAFETY: `done < len`, so the range is inside the caller's range.
        let n = unsafe { sys::pread(file.fd(), dst.add(done), len - done, pos) }
            .map_err(|e| file.io_err("pread", pos, len - done, e))?;
        if n == 0 {
            return Err(file.short(file.size()?, off, len));
        }
        done += n;
    }
    Ok(())
}

/// Writes `len` bytes from `src` at `off`.
///
/// # Safety
/// `src..src+len` must be readable memory that stays mapped for the call.
pub(crate) unsafe fn write_from(file: &IoFile, off: u64, src: *const u8, len: usize) -> Result<()> {
    let mut done = 0;
    while done < len {
        let pos = off + done as u64;
        // SAFETY: `done < len`, so the range is inside the caller's range.
        let n = unsafe { sys::pwrite(file.fd(), src.add(done), len - done, pos) }
            .map_err(|e| file.io_err("pwrite", pos, len - done, e))?;
        done += n;
    }
    Ok(())
}

impl Engine for BufferedEngine {
    fn method(&self) -> Method {
        Method::Buffered
    }

    fn read(
        &self,
        file: &IoFile,
        file_off: u64,
        buf: &Buffer,
        buf_off: usize,
        len: usize,
    ) -> Result<Transfer> {
        let dst = check_read(file, file_off, buf, buf_off, len)?;
        // SAFETY: `check_read` put the range inside `buf`'s mapping, which
        // `buf` keeps alive for the call.
        unsafe { read_into(file, file_off, dst, len) }?;
        Ok(Transfer {
            bytes: len as u64,
            fallbacks: 0,
        })
    }

    fn write(
        &self,
        buf: &Buffer,
        buf_off: usize,
        len: usize,
        file: &IoFile,
        file_off: u64,
    ) -> Result<Transfer> {
        let src = check_write(buf, buf_off, len)?;
        // SAFETY: as in `read`.
        unsafe { write_from(file, file_off, src, len) }?;
        Ok(Transfer {
            bytes: len as u64,
            fallbacks: 0,
        })
    }
}
