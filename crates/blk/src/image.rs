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
/// 512-byte sectors).
pub(crate) const DIRECT_ALIGN: usize = 512;
/// Alignment of the buffers the back end allocates for `O_DIRECT` itself
/// (staging buffers, probes, zeros): a page.
pub(crate) const BUF_ALIGN: usize = 4096;

/// Largest read or write done inline with `preadv`/`pwritev` on an image
/// without [`Image::nowait`]: a small copy costs less than handing it to
/// an io_uring worker; a large one is left to io_uring, whose workers may
/// copy on other CPUs.
pub(crate) const INLINE_MAX: usize = 128 << 10;

/// The image being served, shared by the queues' executors.
#[derive(Debug)]
pub(crate) struct Image {
    /// The open image file.
    pub(crate) file: File,
    /// Whether `file` was opened with `O_DIRECT`.
    pub(crate) direct: bool,
    /// Whether the file system reads without blocking where it can
    /// (`preadv2(RWF_NOWAIT)` is accepted). Without it (tmpfs) io_uring
    /// hands every read and write to one of its worker threads, a
    /// wake-up and a context switch per request, so small ones are done
    /// inline by the queue thread instead ([`INLINE_MAX`]).
    pub(crate) nowait: bool,
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
    let Ok(mut buf) = AlignedBuf::new(DIRECT_ALIGN, BUF_ALIGN) else {
        return false;
    };
    rustix::io::pread(file, buf.as_mut_slice(), 0).is_ok()
}

/// Whether `file` accepts `preadv2(RWF_NOWAIT)` ([`Image::nowait`]): only
/// `EOPNOTSUPP` says no (`EAGAIN` means data not cached, which is a yes).
/// [`preadv2(2)`](https://man7.org/linux/man-pages/man2/preadv2.2.html).
pub(crate) fn reads_nowait(file: &File) -> bool {
    let Ok(mut buf) = AlignedBuf::new(DIRECT_ALIGN, BUF_ALIGN) else {
        return true;
    };
    let mut iov = [io::IoSliceMut::new(buf.as_mut_slice())];
    !matches!(
        rustix::io::preadv2(file, &mut iov, 0, rustix::io::ReadWriteFlags::NOWAIT),
        Err(rustix::io::Errno::OPNOTSUPP)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nowait_is_probed_per_file_system() {
        // tmpfs has no non-blocking reads (Linux 6.x); the probe must say so
        // there, and yes on the build's own file system if that is not tmpfs.
        let dir = std::path::Path::new("/dev/shm");
        if !dir.is_dir() {
            iopath_testkit::skip(iopath_testkit::Feature::ShmTmpfs, "no /dev/shm");
            return;
        }
        let path = dir.join(format!("iopath-nowait-{}", std::process::id()));
        std::fs::write(&path, vec![0u8; 4096]).unwrap();
        let (file, _) = open(&path, true).unwrap();
        let on_tmpfs = reads_nowait(&file);
        std::fs::remove_file(&path).unwrap();
        let manifest = File::open(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml")).unwrap();
        let stat = rustix::fs::fstatfs(&manifest).unwrap();
        if stat.f_type != libc::TMPFS_MAGIC {
            assert!(
                reads_nowait(&manifest),
                "ext4-like file systems read with RWF_NOWAIT"
            );
        }
        let tmp = rustix::fs::statfs(dir).unwrap();
        if tmp.f_type == libc::TMPFS_MAGIC {
            // Linux added FMODE_NOWAIT to shmem nowhere up to 6.18; should
            // a later one, the inline path is simply not taken.
            eprintln!("tmpfs RWF_NOWAIT: {on_tmpfs}");
        }
    }
}
