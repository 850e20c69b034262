//! Discard and write-zeroes on the image: synchronous `fallocate`s (both
//! are rare and metadata-only), with plain zero writes as the last resort.

use std::fs::File;
use std::io;

use iopath_heap::AlignedBuf;

use crate::image::BUF_ALIGN;
use crate::request::SectorRange;
use crate::wire::{SECTOR_SIZE, VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK};

/// Discard (`zero == false`) or write zeroes over `ranges`,
/// synchronously: both are rare and metadata-only on the image.
pub(super) fn discard(file: &File, ranges: &[SectorRange], zero: bool) -> u8 {
    use rustix::fs::{fallocate, FallocateFlags};
    let fd = file;
    for r in ranges {
        let (off, len) = (r.sector * SECTOR_SIZE, u64::from(r.count) * SECTOR_SIZE);
        if len == 0 {
            continue;
        }
        let punch = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
        if !zero {
            // Discard is a hint; a file system without holes keeps the
            // data, which the specification allows.
            let _ = fallocate(fd, punch, off, len);
            continue;
        }
        let first = if r.unmap {
            fallocate(fd, punch, off, len)
        } else {
            fallocate(
                fd,
                FallocateFlags::ZERO_RANGE | FallocateFlags::KEEP_SIZE,
                off,
                len,
            )
        };
        if first.is_ok() {
            continue;
        }
        // No ZERO_RANGE (e.g. tmpfs): a hole reads as zeroes too.
        if fallocate(fd, punch, off, len).is_ok() {
            continue;
        }
        if write_zero_bytes(file, off, len).is_err() {
            return VIRTIO_BLK_S_IOERR;
        }
    }
    VIRTIO_BLK_S_OK
}

fn write_zero_bytes(file: &File, mut off: u64, mut len: u64) -> io::Result<()> {
    let chunk = AlignedBuf::new(1 << 20, BUF_ALIGN).map_err(io::Error::other)?;
    while len > 0 {
        let n = len.min(chunk.len() as u64) as usize;
        let done = rustix::io::pwrite(file, &chunk.as_slice()[..n], off)?;
        if done == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        off += done as u64;
        len -= done as u64;
    }
    Ok(())
}
