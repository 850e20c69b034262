//! A [`Buffer`] that is a regular file's own pages: the file mapped
//! private, so its bytes are the page cache's (nothing copied) and writes
//! through the buffer make private copies that never reach the file.
//!
//! ```text
//!   file (O_RDONLY, its own fd) ── mmap MAP_PRIVATE ──► Buffer { kind: File }
//!        page cache pages ◄── a read of each page (mapped, read-only, shared)
//!        a write ──► copy-on-write page, private to this process
//! ```
//!
//! Such a buffer is shareable like any other: [`Buffer::export`] sends the
//! file's fd, and [`Buffer::import`] maps it private again, so every
//! process maps the same page-cache pages. It is never a transfer's
//! destination (the loader and a [`crate::Pool`] only fill buffers a heap
//! allocated). What it costs, as any mapping of a file does: a later write
//! to the file shows through pages not copied yet, and a file truncated
//! under it loses the pages past its new end, which then read as zeros (the
//! SIGBUS guard; [`Buffer::peer_truncated`] says so); a file the guard
//! cannot watch is not mapped ([`Error::Unguarded`]).

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Arc;

use super::{Buffer, Inner};
use crate::heap::HeapKind;
use crate::mmap::Mmap;
use crate::{Error, Result};

/// How [`Buffer::populate_read`] makes pages resident, as load statistics
/// name it: `madvise(MADV_POPULATE_READ)`, where the mapping is not guarded
/// against SIGBUS.
pub const POPULATE_READ: &str = "MADV_POPULATE_READ";

/// How [`Buffer::populate_read`] makes pages resident where the mapping is
/// guarded (every file buffer): one read of every page, whose faults map
/// the pages around them.
pub const TOUCH_READ: &str = "read faults";

impl Buffer {
    /// Maps the first `len` bytes of the regular file `fd` (opened
    /// read-only is enough) private and copy-on-write, guarded against
    /// SIGBUS: a buffer whose bytes are the file's page-cache pages. No page
    /// is mapped yet; [`Buffer::populate_read`] maps them.
    ///
    /// # Errors
    /// [`Error::BadMessage`] for an fd that is not a regular file or a
    /// file shorter than `len`; [`Error::BadSize`] for a zero length;
    /// [`Error::Sys`] if `fstat` or `mmap` fails.
    pub fn map_file(fd: OwnedFd, len: usize) -> Result<Self> {
        let st = rustix::fs::fstat(&fd).map_err(|e| Error::sys("fstat", e))?;
        if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
            return Err(Error::BadMessage(
                "a file buffer's fd is not a regular file",
            ));
        }
        if (st.st_size.max(0) as u64) < len as u64 {
            return Err(Error::BadMessage("length larger than the file"));
        }
        let map = Mmap::map_private(fd.as_fd(), len, true)?;
        Ok(Buffer {
            inner: Arc::new(Inner {
                fd,
                memfd: None,
                map,
                kind: HeapKind::File,
                direct_io: false,
                populated: AtomicBool::new(false),
                device_maps: AtomicUsize::new(0),
                exported: AtomicBool::new(false),
            }),
        })
    }

    /// Maps the pages holding `offset..offset + len` now, readable, without
    /// writing them (as [`Buffer::populate_read_how`] says): for a buffer of
    /// [`HeapKind::File`], its bytes become resident (a page not in the
    /// page cache is read into it), and still the page cache's own pages,
    /// not copies.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] unless the range is inside the buffer;
    /// [`Error::Sys`] for a page past the file's end (the file shrank) or
    /// one that cannot be read in (`EFAULT` where the buffer is guarded:
    /// such a page then reads as zeros and [`Buffer::peer_truncated`] is
    /// true; else the madvise's error, which needs Linux 5.14).
    pub fn populate_read(&self, offset: usize, len: usize) -> Result<()> {
        self.inner.map.populate_read(offset, len)
    }

    /// How [`Buffer::populate_read`] makes this buffer's pages resident:
    /// [`TOUCH_READ`] where the mapping is guarded against SIGBUS (a page
    /// the file lost then reads as zeros, and is reported), else
    /// [`POPULATE_READ`].
    pub fn populate_read_how(&self) -> &'static str {
        if self.inner.map.is_guarded() {
            TOUCH_READ
        } else {
            POPULATE_READ
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn file_of(data: &[u8]) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::File::create(&path)
            .unwrap()
            .write_all(data)
            .unwrap();
        (dir, path)
    }

    #[test]
    fn a_file_buffer_reads_the_file_and_never_writes_it() {
        let page = crate::page_size();
        let data: Vec<u8> = (0..3 * page + 100).map(|i| (i % 241) as u8).collect();
        let (_dir, path) = file_of(&data);
        let fd = OwnedFd::from(std::fs::File::open(&path).unwrap());
        let buf = Buffer::map_file(fd, data.len()).unwrap();
        assert_eq!((buf.kind(), buf.len()), (HeapKind::File, data.len()));
        assert!(!buf.takes_direct_io());
        assert_eq!(buf.populate_read_how(), TOUCH_READ);
        buf.populate_read(page - 1, 2).unwrap();
        let mut got = vec![0u8; data.len()];
        buf.read_at(0, &mut got).unwrap();
        assert_eq!(got, data);
        // Copy-on-write: the buffer changes, the file does not.
        buf.write_at(10, b"private").unwrap();
        buf.read_at(10, &mut got[..7]).unwrap();
        assert_eq!(&got[..7], b"private");
        assert_eq!(std::fs::read(&path).unwrap(), data);
        assert!(matches!(
            buf.populate_read(data.len() - 1, 2),
            Err(Error::OutOfRange { .. })
        ));
        // Too long for the file, or not a file at all: refused.
        let fd = OwnedFd::from(std::fs::File::open(&path).unwrap());
        assert!(matches!(
            Buffer::map_file(fd, data.len() + 1),
            Err(Error::BadMessage(_))
        ));
        let dir = OwnedFd::from(std::fs::File::open(path.parent().unwrap()).unwrap());
        assert!(matches!(
            Buffer::map_file(dir, 1),
            Err(Error::BadMessage(_))
        ));
    }

    #[test]
    fn populating_a_file_buffer_past_a_shrunk_file_fails() {
        let page = crate::page_size();
        let data = vec![7u8; 4 * page];
        let (_dir, path) = file_of(&data);
        let fd = OwnedFd::from(std::fs::File::open(&path).unwrap());
        let buf = Buffer::map_file(fd, data.len()).unwrap();
        buf.populate_read(0, page).unwrap();
        let shrink = std::fs::OpenOptions::new().write(true).open(&path);
        shrink.and_then(|f| f.set_len(page as u64)).unwrap();
        // Its first page is still there; past it the file is gone, and the
        // guard's zeros are reported, not taken for the file's bytes.
        buf.populate_read(0, page).unwrap();
        assert!(matches!(
            buf.populate_read(page, 3 * page),
            Err(Error::Sys { source, .. }) if source.raw_os_error() == Some(libc::EFAULT)
        ));
        assert!(buf.peer_truncated());
        // What the file still has populates and reads as before; what it
        // lost reads as zeros.
        buf.populate_read(0, page).unwrap();
        let mut got = vec![1u8; data.len()];
        buf.read_at(0, &mut got).unwrap();
        assert_eq!(got[..page], data[..page]);
        assert!(got[page..].iter().all(|&b| b == 0));
    }

    #[test]
    fn a_file_buffer_travels_as_the_file() {
        let page = crate::page_size();
        let data: Vec<u8> = (0..2 * page).map(|i| (i % 13) as u8).collect();
        let (_dir, path) = file_of(&data);
        let fd = OwnedFd::from(std::fs::File::open(&path).unwrap());
        let buf = Buffer::map_file(fd, data.len()).unwrap();
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        buf.export(&a).unwrap();
        let peer = Buffer::import(&b).unwrap();
        assert_eq!((peer.kind(), peer.len()), (HeapKind::File, data.len()));
        let mut got = vec![0u8; data.len()];
        peer.read_at(0, &mut got).unwrap();
        assert_eq!(got, data);
        // Each side's writes are its own.
        peer.write_at(0, b"peer").unwrap();
        buf.read_at(0, &mut got[..4]).unwrap();
        assert_eq!(got[..4], data[..4]);
    }
}
