//! The shared memory both sides map: a heap [`Buffer`] over a file (any
//! path, e.g. `/dev/shm/NAME`) or a memfd, seen through `vm-memory` as a
//! guest memory whose address 0 is the first byte of the file. Every access
//! from either role is a bounds-checked `vm-memory` access, so a device
//! address outside the file becomes an error, never a stray read or write.
//!
//! The bounds are those of the mapping made at open. A peer that shrinks a
//! shared *file* afterwards would make accesses past the new end fault
//! (SIGBUS); the heap's mapping guards such files, so those pages read as
//! zeros instead, [`SharedMem::peer_truncated`] turns true, and the process
//! lives on. A memfd from iopath-heap's memfd heap is sealed against
//! shrinking, which rules the fault out ([`SharedMem::from_buffer`]).

use std::fs::OpenOptions;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use iopath_heap::{Buffer, HeapKind};
use thiserror::Error;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap, GuestRegionMmap, MmapRegion};

use crate::rsc_table::{ResourceTable, RscError, ShmLayout};

/// Largest resource table read from the shared memory.
pub const MAX_TABLE_BYTES: usize = 0x4000;

/// Why the shared memory could not be used.
#[derive(Debug, Error)]
pub enum ShmError {
    /// Opening, creating or sizing the file failed.
    #[error("Shared memory {path}: {op} failed")]
    File {
        /// The file.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// Mapping it failed.
    #[error("Mapping the shared memory failed")]
    Map(#[source] iopath_heap::Error),
    /// Building the guest-memory view failed.
    #[error("Guest memory view of the shared memory: {0}")]
    View(String),
    /// An access outside the shared memory.
    #[error("Access of {len} bytes at {addr:#x} lies outside the shared memory")]
    Outside {
        /// Device address.
        addr: u64,
        /// Length.
        len: usize,
    },
    /// The resource table is refused.
    #[error("Resource table refused")]
    Table(#[from] RscError),
}

/// The shared-memory region of one rpmsg link.
#[derive(Debug, Clone)]
pub struct SharedMem {
    // Field order matters: `mem` borrows `buf`'s mapping and drops first.
    mem: GuestMemoryMmap,
    buf: Buffer,
}

impl SharedMem {
    /// Creates (or truncates) `path`, sizes it for `layout`, and writes the
    /// resource table at offset 0 with status 0.
    ///
    /// # Errors
    /// [`ShmError::File`] or [`ShmError::Map`].
    pub fn create(path: &Path, layout: &ShmLayout) -> Result<Self, ShmError> {
        let file = |op| {
            move |source| ShmError::File {
                path: path.to_owned(),
                op,
                source,
            }
        };
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .map_err(file("create"))?;
        f.set_len(layout.shm_size).map_err(file("ftruncate"))?;
        let shm = Self::from_fd(OwnedFd::from(f), layout.shm_size as usize)?;
        shm.write(0, &layout.table())?;
        Ok(shm)
    }

    /// Opens an existing shared-memory file and maps all of it.
    ///
    /// # Errors
    /// [`ShmError::File`] or [`ShmError::Map`].
    pub fn open(path: &Path) -> Result<Self, ShmError> {
        let file = |op| {
            move |source| ShmError::File {
                path: path.to_owned(),
                op,
                source,
            }
        };
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(file("open"))?;
        let len = f.metadata().map_err(file("stat"))?.len();
        Self::from_fd(OwnedFd::from(f), len as usize)
    }

    /// Maps `len` bytes of `fd` (a shared-memory file or a memfd).
    ///
    /// # Errors
    /// [`ShmError::Map`] or [`ShmError::View`].
    pub fn from_fd(fd: OwnedFd, len: usize) -> Result<Self, ShmError> {
        let buf = Buffer::from_fd(fd, len, HeapKind::Memfd).map_err(ShmError::Map)?;
        Self::from_buffer(buf)
    }

    /// Uses an existing heap buffer as the shared memory.
    ///
    /// # Errors
    /// [`ShmError::View`] if vm-memory refuses the mapping.
    pub fn from_buffer(buf: Buffer) -> Result<Self, ShmError> {
        // SAFETY: `buf.as_ptr()..+len` is the buffer's live MAP_SHARED
        // read/write mapping (page-aligned, made by iopath-heap's Mmap); the
        // region is not owned by vm-memory (build_raw never unmaps), and
        // `SharedMem` keeps a clone of `buf` alive for as long as `mem`.
        let region = unsafe {
            MmapRegion::<()>::build_raw(
                buf.as_ptr(),
                buf.len(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
            )
        }
        .map_err(|e| ShmError::View(e.to_string()))?;
        let region = GuestRegionMmap::new(region, GuestAddress(0))
            .ok_or_else(|| ShmError::View("region wraps the address space".into()))?;
        let mem = GuestMemoryMmap::from_regions(vec![region])
            .map_err(|e| ShmError::View(e.to_string()))?;
        Ok(SharedMem { mem, buf })
    }

    /// The guest-memory view (address = offset into the file).
    pub fn mem(&self) -> &GuestMemoryMmap {
        &self.mem
    }

    /// The underlying heap buffer.
    pub fn buffer(&self) -> &Buffer {
        &self.buf
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether the peer shrank the shared file under the mapping (a SIGBUS
    /// was caught in it; the lost pages now read as zeros).
    pub fn peer_truncated(&self) -> bool {
        self.buf.peer_truncated()
    }

    /// Whether it has no bytes (never true).
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Copies bytes out of the shared memory.
    ///
    /// # Errors
    /// [`ShmError::Outside`].
    pub fn read(&self, addr: u64, dst: &mut [u8]) -> Result<(), ShmError> {
        self.mem
            .read_slice(dst, GuestAddress(addr))
            .map_err(|_| ShmError::Outside {
                addr,
                len: dst.len(),
            })
    }

    /// Copies bytes into the shared memory.
    ///
    /// # Errors
    /// [`ShmError::Outside`].
    pub fn write(&self, addr: u64, src: &[u8]) -> Result<(), ShmError> {
        self.mem
            .write_slice(src, GuestAddress(addr))
            .map_err(|_| ShmError::Outside {
                addr,
                len: src.len(),
            })
    }

    /// Reads and validates the resource table at `offset`.
    ///
    /// # Errors
    /// [`ShmError::Table`] naming the lie.
    pub fn table(&self, offset: usize) -> Result<ResourceTable, ShmError> {
        let len = self.len().saturating_sub(offset).min(MAX_TABLE_BYTES);
        let mut b = vec![0u8; len];
        self.read(offset as u64, &mut b)?;
        Ok(ResourceTable::parse(&b, offset, self.len() as u64)?)
    }

    /// Loads a byte with acquire ordering (the vdev status byte).
    ///
    /// # Errors
    /// [`ShmError::Outside`].
    pub fn load_u8(&self, addr: u64) -> Result<u8, ShmError> {
        self.mem
            .load(GuestAddress(addr), Ordering::Acquire)
            .map_err(|_| ShmError::Outside { addr, len: 1 })
    }

    /// Stores a byte with release ordering, so everything written before it
    /// (rings, feature word) is visible to whoever sees the new value.
    ///
    /// # Errors
    /// [`ShmError::Outside`].
    pub fn store_u8(&self, addr: u64, v: u8) -> Result<(), ShmError> {
        self.mem
            .store(v, GuestAddress(addr), Ordering::Release)
            .map_err(|_| ShmError::Outside { addr, len: 1 })
    }

    /// Loads a little-endian `u16` with the given ordering (ring indices).
    ///
    /// # Errors
    /// [`ShmError::Outside`] (also for a misaligned address).
    pub fn load_u16(&self, addr: u64, order: Ordering) -> Result<u16, ShmError> {
        self.mem
            .load::<u16>(GuestAddress(addr), order)
            .map(u16::from_le)
            .map_err(|_| ShmError::Outside { addr, len: 2 })
    }

    /// Stores a little-endian `u16` with the given ordering (ring indices).
    ///
    /// # Errors
    /// [`ShmError::Outside`] (also for a misaligned address).
    pub fn store_u16(&self, addr: u64, v: u16, order: Ordering) -> Result<(), ShmError> {
        self.mem
            .store(v.to_le(), GuestAddress(addr), order)
            .map_err(|_| ShmError::Outside { addr, len: 2 })
    }

    /// Reads a little-endian `u32` (plain copy).
    ///
    /// # Errors
    /// [`ShmError::Outside`].
    pub fn read_u32(&self, addr: u64) -> Result<u32, ShmError> {
        let mut b = [0u8; 4];
        self.read(addr, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    /// Writes a little-endian `u32` (plain copy).
    ///
    /// # Errors
    /// [`ShmError::Outside`].
    pub fn write_u32(&self, addr: u64, v: u32) -> Result<(), ShmError> {
        self.write(addr, &v.to_le_bytes())
    }
}

/// Path of a shared-memory file given as a bare name (`openamp.shm`) or a
/// path: bare names live in `/dev/shm`, as libmetal's `metal_shmem_open`
/// puts them.
pub fn shm_path(arg: &Path) -> PathBuf {
    if arg.components().count() == 1 && !arg.starts_with(".") {
        Path::new("/dev/shm").join(arg)
    } else {
        arg.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_open_and_bounds() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("shm");
        let shm = SharedMem::create(&p, &ShmLayout::openamp_demo()).unwrap();
        assert_eq!(shm.len(), 0x80000);
        let t = shm.table(0).unwrap();
        assert_eq!(t.vdev.vrings[0].da, 0x4000);
        let other = SharedMem::open(&p).unwrap();
        other.store_u8(t.vdev.status_offset() as u64, 4).unwrap();
        assert_eq!(shm.load_u8(t.vdev.status_offset() as u64).unwrap(), 4);
        let mut b = [0u8; 16];
        assert!(matches!(
            shm.read(0x80000 - 8, &mut b),
            Err(ShmError::Outside {
                addr: 0x7fff8,
                len: 16
            })
        ));
        assert!(shm.write(u64::MAX - 2, &b).is_err());
        shm.write(0x7fff0, &b).unwrap();
        assert_eq!(
            shm_path(Path::new("openamp.shm")),
            Path::new("/dev/shm/openamp.shm")
        );
        assert_eq!(shm_path(Path::new("/tmp/x")), Path::new("/tmp/x"));
    }
}
