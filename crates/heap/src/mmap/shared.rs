//! [`SharedMapping`]: a shared mapping of a file that a peer may shrink,
//! for whoever maps another process's memory (a vhost-user front end's
//! regions, an rpmsg shared-memory file).

use std::os::fd::BorrowedFd;

use super::mapping::Mmap;
use crate::Result;

/// A shared read/write mapping of part of a file that a peer may shrink (a
/// vhost-user front end's memory region, an rpmsg shared-memory file),
/// guarded against SIGBUS and unmapped on drop.
///
/// If the peer truncates the file, the next access past its new end would
/// raise SIGBUS and kill the process. While the mapping lives, such a fault
/// is caught instead: the faulting page is replaced by a private zero page
/// (the access completes on zeros, and writes reach no one else),
/// [`SharedMapping::peer_truncated`] turns true, and the socket given to
/// [`SharedMapping::shutdown_on_fault`] (the peer's connection) is shut
/// down, so its owner drops that peer. A SIGBUS anywhere else gets the
/// disposition that was in place before.
#[derive(Debug)]
pub struct SharedMapping {
    map: Mmap,
}

impl SharedMapping {
    /// Maps `len` bytes of `fd` from `offset` (a multiple of the page size)
    /// and guards them. Check that the file holds the range first: a mapping
    /// past the end of a file faults at once.
    ///
    /// # Errors
    /// [`crate::Error::BadSize`] for a zero length, [`crate::Error::Sys`] if `mmap` fails,
    /// [`crate::Error::Unguarded`] if it cannot be guarded.
    pub fn new(fd: BorrowedFd<'_>, offset: u64, len: usize) -> Result<Self> {
        Ok(SharedMapping {
            map: Mmap::map(fd, offset, len, true)?,
        })
    }

    /// Start of the mapping. Dereferencing it is up to the caller (e.g. to
    /// build a `vm-memory` region over it); it stays valid while `self` does.
    pub fn as_ptr(&self) -> *mut u8 {
        self.map.as_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether it has no bytes (never true).
    pub fn is_empty(&self) -> bool {
        self.map.len() == 0
    }

    /// Whether a SIGBUS in it is caught (always: a mapping that cannot be
    /// guarded is refused).
    pub fn is_guarded(&self) -> bool {
        self.map.is_guarded()
    }

    /// Whether a SIGBUS was caught in it: the peer shrank the file.
    pub fn peer_truncated(&self) -> bool {
        self.map.faulted()
    }

    /// On a caught SIGBUS, also shut the socket `sock` down (for both
    /// directions), so whoever serves that peer sees it disconnect. A
    /// duplicate of the descriptor is kept while the mapping lives.
    ///
    /// # Errors
    /// [`crate::Error::Sys`] if the descriptor cannot be duplicated.
    pub fn shutdown_on_fault(&self, sock: BorrowedFd<'_>) -> Result<()> {
        self.map.shutdown_on_fault(sock)
    }
}
