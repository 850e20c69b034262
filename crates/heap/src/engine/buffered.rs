//! `buffered`: `pread`/`pwrite` through the page cache.

use super::{CheckedRead, Engine, Method, Transfer};
use crate::file::IoFile;
use crate::range::BufRange;
use crate::{sys, Result};

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

    fn read_checked(&self, r: CheckedRead<'_>) -> Result<Transfer> {
        read_into(r.file(), r.file_off(), r.mem())?;
        Ok(Transfer::moved(r.mem().len() as u64))
    }

    fn write_range(&self, src: BufRange<'_>, file: &IoFile, file_off: u64) -> Result<Transfer> {
        write_from(file, file_off, src)?;
        Ok(Transfer::moved(src.len() as u64))
    }
}
