//! The front end's memory as the device side maps it: one [`Region`] per
//! entry of its table, sealed against shrinking where the file allows and
//! guarded against SIGBUS by the heap's mapping guard
//! ([`iopath_heap::SigbusGuard`]).

use std::fs::File;
use std::io;
use std::os::fd::{BorrowedFd, RawFd};
use std::sync::Arc;

use vhost::vhost_user::message::VhostUserMemoryRegion;
use vhost::vhost_user::{Error as VhostError, Result as VhostResult};
use vm_memory::mmap::MmapRegion;
use vm_memory::FileOffset;

use iopath_heap::SigbusGuard;

/// Memory slots offered with `CONFIGURE_MEM_SLOTS` (`ADD_MEM_REG`), as
/// QEMU's `VHOST_USER_MAX_RAM_SLOTS`.
pub(super) const MAX_MEM_SLOTS: usize = 509;

/// Seals a memory file the front end shares against shrinking
/// (`F_SEAL_SHRINK`) where it can: a front end that truncated memory this
/// back end has mapped would turn every access past the new end into
/// SIGBUS, which takes the whole back end down. QEMU's memfds come sealed
/// already (`seal=on`), iopath's heaps too; a memfd created without
/// `MFD_ALLOW_SEALING`, or a plain file (tmpfs, hugetlbfs), cannot be
/// sealed and is mapped as it is, with one log line.
fn seal_against_shrinking(file: &File, index: usize) {
    use rustix::fs::{fcntl_add_seals, fcntl_get_seals, SealFlags};
    let why = match fcntl_get_seals(file) {
        Ok(seals) if seals.contains(SealFlags::SHRINK) => return,
        Ok(_) => match fcntl_add_seals(file, SealFlags::SHRINK) {
            Ok(()) => return,
            Err(e) => format!("F_ADD_SEALS: {e}"),
        },
        Err(e) => format!("not a memfd ({e})"),
    };
    tracing::info!(
        "memory region {index}: cannot be sealed against shrinking ({why}); \
         a front end that truncates it would crash this back end"
    );
}

/// Maps one region the front end on socket `conn` shares (region `index`
/// of its table).
pub(super) fn map_region(
    r: &VhostUserMemoryRegion,
    file: File,
    index: usize,
    conn: RawFd,
) -> VhostResult<Region> {
    // Sealed before its size is checked: a file shrunk after the check
    // would fault the mapping all the same.
    seal_against_shrinking(&file, index);
    let size = usize::try_from(r.memory_size).map_err(|_| VhostError::InvalidParam)?;
    // Mapping beyond the end of the file would turn every access there into
    // SIGBUS: refuse such a region up front.
    let end = r
        .mmap_offset
        .checked_add(r.memory_size)
        .ok_or(VhostError::InvalidParam)?;
    let len = file.metadata().map_err(VhostError::ReqHandlerError)?.len();
    if size == 0
        || end > len
        || r.guest_phys_addr.checked_add(r.memory_size).is_none()
        || r.user_addr.checked_add(r.memory_size).is_none()
    {
        return Err(VhostError::InvalidParam);
    }
    let mapping = MmapRegion::from_file(FileOffset::new(file, r.mmap_offset), size)
        .map_err(|e| VhostError::ReqHandlerError(io::Error::other(e)))?;
    // Whether sealed or not: a SIGBUS in it drops this front end, not the
    // back end.
    // SAFETY: `mapping` is the live mapping of `size` bytes just made; it
    // goes into the returned `Region` behind an `Arc`, and `Region` declares
    // the guard first, so the guard is dropped before `Region`'s reference
    // and the range stays mapped for as long as the guard lives.
    let watch = unsafe { SigbusGuard::watch(mapping.as_ptr(), size) };
    match &watch {
        None => tracing::info!("memory region {index}: not guarded against SIGBUS"),
        Some(g) if conn >= 0 => {
            // SAFETY: `conn` is this front end's connection, open for as
            // long as its handler (and so this call) runs; the guard keeps a
            // duplicate of it, not the number.
            let sock = unsafe { BorrowedFd::borrow_raw(conn) };
            if let Err(e) = g.shutdown_on_fault(sock) {
                tracing::info!("memory region {index}: a SIGBUS will not disconnect: {e}");
            }
        }
        Some(_) => {}
    }
    Ok(Region {
        watch,
        guest_phys: r.guest_phys_addr,
        user_addr: r.user_addr,
        size: r.memory_size,
        mapping: Arc::new(mapping),
    })
}

/// One region of the front end's memory table.
pub(super) struct Region {
    /// Declared first, so dropped before the mapping goes.
    pub(super) watch: Option<SigbusGuard>,
    /// Guest physical address of the region's first byte.
    pub(super) guest_phys: u64,
    /// The front end's user address of it (what IOTLB entries point at).
    pub(super) user_addr: u64,
    /// Length in bytes.
    pub(super) size: u64,
    /// This process's mapping of the region.
    pub(super) mapping: Arc<MmapRegion<()>>,
}
