//! [`IoFile`]: a file opened for transfers, buffered and (when the file
//! system allows) direct.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use rustix::fs::{statx, AtFlags, StatxFlags};

use crate::align::DioAlign;
use crate::{Error, Result};

/// A regular file opened for transfers to and from buffers.
///
/// It holds a buffered descriptor and opens an `O_DIRECT` one on first use;
/// if the file system refuses `O_DIRECT` (`EINVAL`), direct engines fall back
/// to the buffered descriptor.
#[derive(Debug)]
pub struct IoFile {
    path: PathBuf,
    file: File,
    writable: bool,
    direct: OnceLock<Option<File>>,
    align: Option<DioAlign>,
}

impl IoFile {
    /// Opens an existing regular file for reading.
    ///
    /// # Errors
    /// [`Error::Open`] if it cannot be opened, [`Error::NotAFile`] for a
    /// directory, device, socket or pipe.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(path.as_ref(), false)
    }

    /// Opens a regular file for reading and writing, creating it if absent.
    ///
    /// # Errors
    /// As [`IoFile::open`].
    pub fn open_rw(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(path.as_ref(), true)
    }

    fn open_with(path: &Path, writable: bool) -> Result<Self> {
        let open_err = |source| Error::Open {
            path: path.to_path_buf(),
            source,
        };
        // Check the type before opening: opening a FIFO would block.
        match std::fs::metadata(path) {
            Ok(meta) => check_regular(path, meta.file_type())?,
            Err(e) if writable && e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(open_err(e)),
        }
        let file = OpenOptions::new()
            .read(true)
            .write(writable)
            .create(writable)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)
            .map_err(open_err)?;
        // It may have been swapped between the check and the open.
        check_regular(path, file.metadata().map_err(open_err)?.file_type())?;
        let align = query_dio_align(file.as_fd());
        Ok(IoFile {
            path: path.to_path_buf(),
            file,
            writable,
            direct: OnceLock::new(),
            align,
        })
    }

    /// The path the file was opened by.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The current size in bytes.
    ///
    /// # Errors
    /// [`Error::Open`] if `fstat` fails.
    pub fn size(&self) -> Result<u64> {
        self.file
            .metadata()
            .map(|m| m.len())
            .map_err(|source| Error::Open {
                path: self.path.clone(),
                source,
            })
    }

    /// The buffered descriptor.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    /// The `O_DIRECT` descriptor, opened on first use; `None` when the file
    /// system refuses direct I/O.
    ///
    /// # Errors
    /// [`Error::Open`] when opening fails for another reason.
    pub fn direct_fd(&self) -> Result<Option<BorrowedFd<'_>>> {
        if let Some(d) = self.direct.get() {
            return Ok(d.as_ref().map(AsFd::as_fd));
        }
        let opened = if self.align.is_none() {
            None
        } else {
            // Reopen through /proc so it is the same inode even if the path
            // was renamed meanwhile.
            let proc = format!(
                "/proc/self/fd/{}",
                std::os::fd::AsRawFd::as_raw_fd(&self.file)
            );
            match OpenOptions::new()
                .read(true)
                .write(self.writable)
                .custom_flags(libc::O_CLOEXEC | libc::O_DIRECT)
                .open(proc)
            {
                Ok(f) => Some(f),
                Err(e) if crate::sys::is_einval(&e) => None,
                Err(source) => {
                    return Err(Error::Open {
                        path: self.path.clone(),
                        source,
                    })
                }
            }
        };
        let d = self.direct.get_or_init(|| opened);
        Ok(d.as_ref().map(AsFd::as_fd))
    }

    /// Direct-I/O alignment of this file (from `statx(2)` `STATX_DIOALIGN`;
    /// one page when the kernel does not say); `None` when the file system
    /// reports that it does not support direct I/O.
    pub fn dio_align(&self) -> Option<DioAlign> {
        self.align
    }

    /// Overrides the direct-I/O alignment (for file systems that report it
    /// wrongly). With a too-small alignment the kernel refuses unaligned
    /// requests with `EINVAL` and the direct engines fall back to buffered I/O
    /// for them.
    ///
    /// # Errors
    /// [`Error::BadSize`] unless both alignments are powers of two.
    pub fn set_dio_align(&mut self, align: DioAlign) -> Result<()> {
        for a in [align.mem, align.offset] {
            if !a.is_power_of_two() {
                return Err(Error::BadSize { size: a, page: 1 });
            }
        }
        self.align = Some(align);
        Ok(())
    }

    /// Writes dirty pages back (`fsync`) and drops the file's pages from the
    /// page cache (`posix_fadvise(POSIX_FADV_DONTNEED)`), so the next read is
    /// cold.
    ///
    /// # Errors
    /// [`Error::Sys`] if either call fails.
    pub fn drop_cache(&self) -> Result<()> {
        // fsync works on a read-only descriptor too; dirty pages would
        // otherwise stay cached.
        self.file.sync_all().map_err(|e| Error::sys("fsync", e))?;
        rustix::fs::fadvise(&self.file, 0, None, rustix::fs::Advice::DontNeed)
            .map_err(|e| Error::sys("posix_fadvise(DONTNEED)", e))
    }

    /// How many bytes of the file are in the page cache now (`mincore(2)` over
    /// a read-only mapping of the file).
    ///
    /// # Errors
    /// [`Error::Sys`] if mapping or `mincore` fails.
    pub fn cached_bytes(&self) -> Result<u64> {
        let size = self.size()?;
        if size == 0 {
            return Ok(0);
        }
        let len = usize::try_from(size).map_err(|_| Error::BadSize {
            size: usize::MAX,
            page: crate::page_size(),
        })?;
        crate::mmap::resident_pages(self.file.as_fd(), len)
            .map(|pages| (pages as u64 * crate::page_size() as u64).min(size))
    }

    /// When the file's reported `size` is not the length of its contents,
    /// what it is: a file of a pseudo file system (/proc, /sys, debugfs,
    /// ...) whose last byte is not at `size - 1`, or any file that
    /// reports 0 bytes and has one. `None` for a file whose size holds.
    pub(crate) fn size_is_not_length(&self, size: u64) -> Option<&'static str> {
        let fs = pseudo_fs(self.fd());
        let mut probe = [0u8; 1];
        let mut bytes_at = |off: u64| rustix::io::pread(self.fd(), &mut probe, off).unwrap_or(0);
        if size == 0 {
            return (bytes_at(0) > 0).then_some(fs.unwrap_or("it has data"));
        }
        let fs = fs?;
        (bytes_at(size - 1) == 0 || bytes_at(size) > 0).then_some(fs)
    }

    pub(crate) fn io_err(
        &self,
        op: &'static str,
        offset: u64,
        len: usize,
        source: io::Error,
    ) -> Error {
        Error::FileIo {
            op,
            path: self.path.clone(),
            offset,
            len,
            source,
        }
    }

    /// Fails with [`Error::ShortFile`] unless `offset..offset+len` is inside
    /// the file.
    pub(crate) fn check_range(&self, offset: u64, len: usize) -> Result<()> {
        let size = self.size()?;
        let end = offset.saturating_add(len as u64);
        if end > size {
            return Err(self.short(size, offset, len));
        }
        Ok(())
    }

    pub(crate) fn short(&self, size: u64, offset: u64, len: usize) -> Error {
        let end = offset.saturating_add(len as u64);
        Error::ShortFile {
            path: self.path.clone(),
            size,
            offset,
            len: len as u64,
            missing: end.saturating_sub(size),
        }
    }
}

fn check_regular(path: &Path, ft: std::fs::FileType) -> Result<()> {
    match not_regular(ft) {
        Some(what) => Err(Error::NotAFile {
            path: path.to_path_buf(),
            what,
        }),
        None => Ok(()),
    }
}

/// What a file of type `ft` is when it is not a regular file (`a pipe`),
/// as errors name it.
pub(crate) fn not_regular(ft: std::fs::FileType) -> Option<&'static str> {
    Some(if ft.is_file() {
        return None;
    } else if ft.is_dir() {
        "a directory"
    } else if ft.is_fifo() {
        "a pipe"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_block_device() {
        "a block device"
    } else if ft.is_char_device() {
        "a character device"
    } else if ft.is_symlink() {
        "a symbolic link"
    } else {
        "not a file"
    })
}

/// Why `path` cannot be opened as a regular file, following symbolic
/// links, in words that follow "the shard": `does not exist`, `is not a
/// regular file (a pipe)`, `is a symbolic link to X, which does not
/// exist`; `None` for a regular file.
pub(crate) fn why_not_regular(path: &Path) -> Option<String> {
    match std::fs::metadata(path) {
        Ok(m) => not_regular(m.file_type()).map(|what| format!("is not a regular file ({what})")),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Some(match std::fs::read_link(path) {
            Ok(to) => format!(
                "is a symbolic link to {}, which does not exist (an interrupted download?)",
                crate::error::shown(&to)
            ),
            Err(_) => "does not exist".to_string(),
        }),
        Err(e) => Some(format!("cannot be read ({e})")),
    }
}

/// What a file on a pseudo file system is (see statfs(2) and
/// include/uapi/linux/magic.h): there a file's size is made up (0, or a
/// page) unless its driver says otherwise.
fn pseudo_fs(fd: BorrowedFd<'_>) -> Option<&'static str> {
    let f_type = rustix::fs::fstatfs(fd).ok()?.f_type as u64;
    Some(match f_type {
        0x9fa0 => "a /proc file",
        0x6265_6572 => "a /sys file",
        0x6462_6720 => "a debugfs file",
        0x7472_6163 => "a tracefs file",
        0x7363_6673 => "a securityfs file",
        0x6265_6570 => "a configfs file",
        0x0027_e0eb | 0x6367_7270 => "a cgroup file",
        _ => return None,
    })
}

/// Direct-I/O alignment from `statx(2)` `STATX_DIOALIGN` (Linux 6.1+).
fn query_dio_align(fd: BorrowedFd<'_>) -> Option<DioAlign> {
    match statx(fd, "", AtFlags::EMPTY_PATH, StatxFlags::DIOALIGN) {
        Ok(st) if st.stx_mask & StatxFlags::DIOALIGN.bits() != 0 => {
            if st.stx_dio_offset_align == 0 || st.stx_dio_mem_align == 0 {
                // The file system says: no direct I/O here.
                None
            } else {
                Some(DioAlign {
                    mem: st.stx_dio_mem_align as usize,
                    offset: st.stx_dio_offset_align as usize,
                })
            }
        }
        // Older kernel or file system that does not report: try with a page.
        _ => Some(DioAlign::page()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_size_that_is_not_a_length_is_told_apart() {
        let sys = Path::new("/sys/kernel/mm/transparent_hugepage/enabled");
        if sys.exists() {
            let f = IoFile::open(sys).unwrap();
            assert_eq!(f.size().unwrap(), 4096);
            assert_eq!(f.size_is_not_length(4096), Some("a /sys file"));
        }
        let proc = IoFile::open("/proc/self/status").unwrap();
        assert_eq!(proc.size_is_not_length(0), Some("a /proc file"));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"0123456789").unwrap();
        let f = IoFile::open(&path).unwrap();
        assert_eq!(f.size_is_not_length(10), None);
    }
}
