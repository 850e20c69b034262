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

mod error;
mod owner;
pub(crate) mod sock_rx;

pub use error::{ShmError, ShmHolder};
pub use owner::{ShmOwner, ShmRole};

use std::fs::OpenOptions;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use iopath_heap::{Buffer, HeapKind};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap, GuestRegionMmap, MmapRegion};

use crate::rsc_table::{ResourceTable, ShmLayout};

/// Largest resource table read from the shared memory.
pub const MAX_TABLE_BYTES: usize = 0x4000;

/// How a shared-memory file is created or opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShmOptions {
    /// Permission bits of a created file: 0600 by default (every message
    /// that crosses the bus can be read from the file).
    pub mode: u32,
    /// Attach to a file that users other than its owner can write.
    pub allow_others_write: bool,
}

impl Default for ShmOptions {
    fn default() -> Self {
        ShmOptions {
            mode: 0o600,
            allow_others_write: false,
        }
    }
}

/// Refuses a file others can write, unless `allow`.
fn check_writers(path: &Path, meta: &std::fs::Metadata, allow: bool) -> Result<(), ShmError> {
    use std::os::unix::fs::MetadataExt;
    let me = rustix::process::geteuid().as_raw();
    let (mode, uid) = (meta.mode() & 0o7777, meta.uid());
    if !allow && (mode & 0o022 != 0 || (uid != me && uid != 0)) {
        return Err(ShmError::Writable {
            path: path.to_owned(),
            mode,
            uid,
        });
    }
    Ok(())
}

/// The shared-memory region of one rpmsg link.
#[derive(Debug, Clone)]
pub struct SharedMem {
    // Field order matters: `mem` borrows `buf`'s mapping and drops first.
    mem: GuestMemoryMmap,
    buf: Buffer,
    /// The remote's role on a file made by [`SharedMem::create_with`].
    owner: Option<Arc<ShmOwner>>,
}

impl SharedMem {
    /// Creates (or truncates) `path` with mode 0600, sizes it for `layout`,
    /// and writes the resource table at offset 0 with status 0.
    ///
    /// # Errors
    /// As [`SharedMem::create_with`].
    pub fn create(path: &Path, layout: &ShmLayout) -> Result<Self, ShmError> {
        Self::create_with(path, layout, &ShmOptions::default())
    }

    /// As [`SharedMem::create`], with `opts.mode`. The remote's role on the
    /// file is held while this memory (any clone) lives, so a second remote
    /// cannot truncate it under a running one, and it is truncated only
    /// while no session (a host) has it mapped: see [`ShmOwner`].
    ///
    /// # Errors
    /// [`ShmError::InUse`] if another remote holds it or a host has it
    /// mapped, [`ShmError::File`] or [`ShmError::Map`].
    pub fn create_with(
        path: &Path,
        layout: &ShmLayout,
        opts: &ShmOptions,
    ) -> Result<Self, ShmError> {
        use std::os::unix::fs::OpenOptionsExt;
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
            .truncate(false)
            .mode(opts.mode & 0o777)
            .open(path)
            .map_err(file("create"))?;
        // Owned before anything is changed: a running remote's or a mapped
        // session's file stays as it is.
        let owner =
            ShmOwner::claim_file(f.try_clone().map_err(file("dup"))?, path, ShmRole::Remote)?;
        owner.hold_for_create()?;
        // An existing file keeps its mode through open(2): set it.
        rustix::fs::fchmod(&f, rustix::fs::Mode::from_raw_mode(opts.mode & 0o777))
            .map_err(|e| file("fchmod")(e.into()))?;
        f.set_len(0).map_err(file("ftruncate"))?;
        f.set_len(layout.shm_size).map_err(file("ftruncate"))?;
        let mut shm = Self::from_fd(OwnedFd::from(f), layout.shm_size as usize)?;
        shm.write(0, &layout.table())?;
        owner.attach()?;
        shm.owner = Some(Arc::new(owner));
        Ok(shm)
    }

    /// Opens an existing shared-memory file and maps all of it; refuses a
    /// file other users can write.
    ///
    /// # Errors
    /// As [`SharedMem::open_with`].
    pub fn open(path: &Path) -> Result<Self, ShmError> {
        Self::open_with(path, &ShmOptions::default())
    }

    /// As [`SharedMem::open`]; `opts.allow_others_write` lets a file others
    /// can write in.
    ///
    /// # Errors
    /// [`ShmError::Size`] for an empty file or one whose size is not a
    /// multiple of the page size, [`ShmError::Writable`], [`ShmError::File`]
    /// or [`ShmError::Map`].
    pub fn open_with(path: &Path, opts: &ShmOptions) -> Result<Self, ShmError> {
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
        let meta = f.metadata().map_err(file("stat"))?;
        check_writers(path, &meta, opts.allow_others_write)?;
        let len = meta.len();
        let page = rustix::param::page_size();
        if len == 0 || len % page as u64 != 0 || usize::try_from(len).is_err() {
            return Err(ShmError::Size {
                path: path.to_owned(),
                len,
                page,
            });
        }
        Self::from_fd(OwnedFd::from(f), len as usize)
    }

    /// As [`SharedMem::open_with`], for a host that may start before its
    /// remote has made the file: retries every 20 ms while opening the file
    /// or reading its resource table fails, until `timeout` has passed. A
    /// file other users can write is refused at once, as waiting does not
    /// change who can write it.
    ///
    /// # Errors
    /// [`ShmError::Writable`] at once; otherwise the last error once
    /// `timeout` has passed.
    pub fn open_waiting(
        path: &Path,
        opts: &ShmOptions,
        timeout: Duration,
    ) -> Result<Self, ShmError> {
        let start = Instant::now();
        loop {
            match Self::open_with(path, opts).and_then(|s| s.table(0).map(|_| s)) {
                Ok(s) => return Ok(s),
                Err(e @ ShmError::Writable { .. }) => return Err(e),
                Err(e) if start.elapsed() >= timeout => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
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
        let whole = buf.range(0, buf.len()).map_err(ShmError::Map)?;
        let raw = whole.ptr_guard();
        // SAFETY: `raw` is the buffer's whole live MAP_SHARED read/write
        // mapping (page-aligned, made by iopath-heap's Mmap); the region is
        // not owned by vm-memory (build_raw never unmaps), and `SharedMem`
        // keeps a clone of `buf` alive for as long as `mem`.
        let region = unsafe {
            MmapRegion::<()>::build_raw(
                raw.as_ptr(),
                raw.len(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
            )
        }
        .map_err(|e| ShmError::View(e.to_string()))?;
        let region = GuestRegionMmap::new(region, GuestAddress(0))
            .ok_or_else(|| ShmError::View("region wraps the address space".into()))?;
        let mem = GuestMemoryMmap::from_regions(vec![region])
            .map_err(|e| ShmError::View(e.to_string()))?;
        Ok(SharedMem {
            mem,
            buf,
            owner: None,
        })
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
    use std::os::unix::fs::PermissionsExt;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn lock_leaves_libmetal_flock_alone() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("shm");
        let shm = SharedMem::create(&p, &ShmLayout::openamp_demo()).unwrap();
        // OpenAMP's driver maps the remote's file under flock(LOCK_EX): it
        // must get it while the remote lives (non-blocking here, so that a
        // regression fails instead of hanging).
        let other = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&p)
            .unwrap();
        rustix::fs::flock(&other, rustix::fs::FlockOperation::NonBlockingLockExclusive)
            .expect("a remote's lock blocks libmetal's flock");
        // A second remote is still refused while the flock is held.
        let e = SharedMem::create(&p, &ShmLayout::openamp_demo()).unwrap_err();
        assert!(matches!(e, ShmError::InUse { .. }), "{e}");
        drop(other);
        drop(shm);
        assert!(SharedMem::create(&p, &ShmLayout::openamp_demo()).is_ok());
    }

    #[test]
    fn private_locked_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("shm");
        // An old world-readable file is made private, not kept 0644.
        std::fs::write(&p, b"old").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o666)).unwrap();
        let shm = SharedMem::create(&p, &ShmLayout::openamp_demo()).unwrap();
        assert_eq!(mode(&p), 0o600);
        // A second remote cannot take (and truncate) a live remote's file.
        let e = SharedMem::create(&p, &ShmLayout::openamp_demo()).unwrap_err();
        assert!(matches!(e, ShmError::InUse { .. }), "{e}");
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 0x80000);
        assert!(shm.table(0).is_ok());
        drop(shm);
        let opts = ShmOptions {
            mode: 0o640,
            ..ShmOptions::default()
        };
        let shm = SharedMem::create_with(&p, &ShmLayout::openamp_demo(), &opts).unwrap();
        assert_eq!(mode(&p), 0o640);
        drop(shm);
        // Others may write it: refused unless allowed.
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o662)).unwrap();
        let e = SharedMem::open(&p).unwrap_err();
        assert!(matches!(e, ShmError::Writable { mode: 0o662, .. }), "{e}");
        let allow = ShmOptions {
            allow_others_write: true,
            ..ShmOptions::default()
        };
        assert_eq!(SharedMem::open_with(&p, &allow).unwrap().len(), 0x80000);
        // Sizes no shared memory has.
        let empty = dir.path().join("empty");
        std::fs::write(&empty, b"").unwrap();
        std::fs::set_permissions(&empty, std::fs::Permissions::from_mode(0o600)).unwrap();
        let e = SharedMem::open(&empty).unwrap_err();
        assert!(matches!(e, ShmError::Size { len: 0, .. }), "{e}");
        assert!(
            e.to_string().contains("empty") || e.to_string().contains("0 bytes"),
            "{e}"
        );
    }

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
