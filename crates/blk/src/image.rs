//! The image a back end serves, shared by its queues' executors: the open
//! file, whether it is accessed with `O_DIRECT`, and the limits requests
//! are checked against.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use iopath_heap::AlignedBuf;

use crate::request::Limits;

/// Alignment `O_DIRECT` needs on this machine's file systems (ext4 with
/// 512-byte sectors); bounce buffers are page-aligned.
pub(crate) const DIRECT_ALIGN: usize = 512;
pub(crate) const BOUNCE_ALIGN: usize = 4096;

/// The image being served, shared by the queues' executors.
#[derive(Debug)]
pub(crate) struct Image {
    /// The open image file.
    pub(crate) file: File,
    /// Whether `file` was opened with `O_DIRECT`.
    pub(crate) direct: bool,
    /// What requests may address.
    pub(crate) limits: Limits,
}

/// Opens the image at `path` (read-write unless `readonly`): with
/// `O_DIRECT` when the file system allows it, buffered otherwise. Returns
/// the file and whether it is direct.
pub(crate) fn open(path: &Path, readonly: bool) -> io::Result<(File, bool)> {
    match open_with(path, readonly, true) {
        Ok(f) if direct_read_works(&f) => Ok((f, true)),
        Ok(_) | Err(_) => Ok((open_with(path, readonly, false)?, false)),
    }
}

fn open_with(path: &Path, readonly: bool, direct: bool) -> io::Result<File> {
    let mut o = OpenOptions::new();
    o.read(true).write(!readonly);
    if direct {
        o.custom_flags(libc::O_DIRECT);
    }
    o.open(path)
}

/// Whether the file accepts an aligned `O_DIRECT` read (some file systems
/// accept the open flag and refuse the I/O).
fn direct_read_works(file: &File) -> bool {
    let Ok(mut buf) = AlignedBuf::new(DIRECT_ALIGN, BOUNCE_ALIGN) else {
        return false;
    };
    rustix::io::pread(file, buf.as_mut_slice(), 0).is_ok()
}
