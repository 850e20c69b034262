//! `buffered`: `pread`/`pwrite` through the page cache.

use super::{check_read, check_write, Engine, Method, Transfer};
use crate::file::IoFile;
use crate::range::BufRange;
use crate::{sys, Buffer, Result};

/// `pread(2)`/`pwrite(2)` through the page cache. Works on every file system.
#[derive(Debug, Clone, Copy, Default)]
pub struct BufferedEngine;

/// Reads all of `dst` from `off`, failing with `ShortFile` at EOF.
pub(crate) fn read_into(file: &IoFile, off: u64, dst: BufRange<'_>) -> Result<()> {
    let len = dst.len();
    let mut done = 0;
    while done < len {
        let pos = off + done as u64;
        let n = sys::pread(file.fd(), dst.skip(done)?, pos)
            .map_err(|e| file.io_err("pread", pos, len - done, e))?;
        if n == 0 {
            return Err(file.short(file.size()?, off, len));
        }
        done += n;
    }
    Ok(())
}

/// Writes all of `src` at `off`.
pub(crate) fn write_from(file: &IoFile, off: u64, src: BufRange<'_>) -> Result<()> {
    let len = src.len();
    let mut done = 0;
    while done < len {
        let pos = off + done as u64;
        let n = sys::pwrite(file.fd(), src.skip(done)?, pos)
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
        read_into(
            file,
            file_off,
            check_read(file, file_off, buf, buf_off, len)?,
        )?;
        Ok(Transfer::moved(len as u64))
    }

    fn write(
        &self,
        buf: &Buffer,
        buf_off: usize,
        len: usize,
        file: &IoFile,
        file_off: u64,
    ) -> Result<Transfer> {
        write_from(file, file_off, check_write(buf, buf_off, len)?)?;
        Ok(Transfer::moved(len as u64))
    }
}
