//! In-flight I/O tracking in shared memory
//! (`VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD`, the vhost-user specification's
//! "Inflight I/O tracking" for split virtqueues), so that a back end can be
//! killed and started again under a running guest without losing requests.
//!
//! ```text
//!  GET_INFLIGHT_FD: the back end makes a memfd, one region per queue:
//!    QueueRegionSplit { features u64, version u16, desc_num u16,
//!                       last_batch_head u16, used_idx u16 }    16 bytes
//!    DescStateSplit   { inflight u8, padding [u8; 5], next u16,
//!                       counter u64 } x queue size             16 bytes each
//!    (each region padded to 64 bytes, as QEMU and DPDK lay it out)
//!  the front end keeps the fd; after a reconnect SET_INFLIGHT_FD gives it
//!  to the new back end, which resubmits what was in flight.
//! ```
//!
//! The order of writes is the one libvhost-user uses, so that a crash
//! between any two of them is recoverable:
//!
//! - pop: `desc[head].counter = counter++`, then `desc[head].inflight = 1`
//!   (a head popped but not yet marked is not counted, and is popped again
//!   from the available ring, since the new available index is the used
//!   index plus the heads marked);
//! - put: `last_batch_head = head`; the used element and the used index
//!   (virtio-queue's `add_used`); `desc[head].inflight = 0`;
//!   `used_idx = the new used index`;
//! - recovery: when the region's `used_idx` differs from the used ring's,
//!   the crash came after the used index moved: `last_batch_head` is
//!   cleared and `used_idx` brought up to date; every head still marked is
//!   resubmitted, lowest counter first, and the next available index is the
//!   used index plus their number.
//!
//! The region is the front end's memory as much as the back end's: every
//! field is read with bounds checks and atomics, a head out of range is
//! ignored, and the mapping is guarded against a front end that truncates
//! the file (the heap's `SigbusGuard`).

use std::fs::File;
use std::io;
use std::mem::{offset_of, size_of};
use std::sync::Arc;

use iopath_heap::SigbusGuard;
use vhost::vhost_user::message::{DescStateSplit, QueueRegionSplit, VhostUserInflight};
use vm_memory::mmap::MmapRegion;
use vm_memory::FileOffset;

mod queue;

pub(crate) use queue::InflightQueue;

/// Each queue's region starts at a multiple of this (QEMU's and DPDK's
/// `INFLIGHT_ALIGNMENT`).
const ALIGN: u64 = 64;
/// Bytes of one descriptor's state.
const DESC_BYTES: u64 = size_of::<DescStateSplit>() as u64;
/// Bytes of a queue region's header: the states start where the `vhost`
/// crate's struct puts its `desc` placeholder.
const HEADER_BYTES: u64 = offset_of!(QueueRegionSplit, desc) as u64;
/// The region's layout version; 0 means "fresh" (a new region, or one the
/// front end cleared when the guest reset the device).
const VERSION: u16 = 1;
/// Largest split queue (virtio 1.2, 2.7).
const MAX_QUEUE_SIZE: u16 = 32768;

const OFF_VERSION: usize = offset_of!(QueueRegionSplit, version);
const OFF_DESC_NUM: usize = offset_of!(QueueRegionSplit, desc_num);
const OFF_LAST_BATCH_HEAD: usize = offset_of!(QueueRegionSplit, last_batch_head);
const OFF_USED_IDX: usize = offset_of!(QueueRegionSplit, used_idx);
const OFF_INFLIGHT: usize = offset_of!(DescStateSplit, inflight);
const OFF_COUNTER: usize = offset_of!(DescStateSplit, counter);

/// Bytes of one queue's region for a queue of `queue_size` descriptors.
pub(crate) fn queue_region_size(queue_size: u16) -> u64 {
    (HEADER_BYTES + DESC_BYTES * u64::from(queue_size)).next_multiple_of(ALIGN)
}

/// Errors of the inflight region.
#[derive(Debug, thiserror::Error)]
pub enum InflightError {
    /// The queue count or size is out of range for this device.
    #[error(
        "Inflight region for {num_queues} queues of {queue_size} descriptors refused \
         (accepted: 1..={max_queues} queues of 1..={max_queue_size})"
    )]
    Shape {
        /// Queues asked for.
        num_queues: u16,
        /// Descriptors per queue asked for.
        queue_size: u16,
        /// Most queues accepted.
        max_queues: u16,
        /// Largest queue accepted.
        max_queue_size: u16,
    },
    /// The fd given back does not hold the region its message describes.
    #[error(
        "Inflight fd of {file_len} bytes cannot hold {needed} bytes at offset {mmap_offset} \
         (mmap_size {mmap_size})"
    )]
    TooSmall {
        /// Bytes the layout needs.
        needed: u64,
        /// `mmap_offset` of the message.
        mmap_offset: u64,
        /// `mmap_size` of the message.
        mmap_size: u64,
        /// Length of the file.
        file_len: u64,
    },
    /// Creating, sizing, sealing or mapping the memory failed.
    #[error("Inflight memory: {what} failed")]
    Sys {
        /// The operation.
        what: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

fn sys(what: &'static str) -> impl FnOnce(rustix::io::Errno) -> InflightError {
    move |e| InflightError::Sys {
        what,
        source: e.into(),
    }
}

/// The inflight memory one front end shares: one region per queue.
pub(crate) struct InflightRegion {
    /// Declared first, so dropped before the mapping goes.
    watch: Option<SigbusGuard>,
    mapping: MmapRegion<()>,
    num_queues: u16,
    /// Descriptors of each queue's region.
    queue_size: u16,
}

impl std::fmt::Debug for InflightRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InflightRegion")
            .field("num_queues", &self.num_queues)
            .field("queue_size", &self.queue_size)
            .field("guarded", &self.watch.is_some())
            .finish()
    }
}

impl InflightRegion {
    fn check_shape(
        num_queues: u16,
        queue_size: u16,
        max_queues: u16,
        max_queue_size: u16,
    ) -> Result<u64, InflightError> {
        let max_queue_size = max_queue_size.min(MAX_QUEUE_SIZE);
        if num_queues == 0 || num_queues > max_queues || queue_size == 0 {
            return Err(InflightError::Shape {
                num_queues,
                queue_size,
                max_queues,
                max_queue_size,
            });
        }
        if queue_size > max_queue_size {
            return Err(InflightError::Shape {
                num_queues,
                queue_size,
                max_queues,
                max_queue_size,
            });
        }
        Ok(u64::from(num_queues) * queue_region_size(queue_size))
    }

    /// Makes a zeroed region for `num_queues` queues of `queue_size`
    /// descriptors in a new memfd, sealed against resizing; returns it and
    /// the reply to `GET_INFLIGHT_FD` (the fd to send is the region's file).
    pub(crate) fn create(
        num_queues: u16,
        queue_size: u16,
        max_queues: u16,
        max_queue_size: u16,
    ) -> Result<(Self, File, VhostUserInflight), InflightError> {
        use rustix::fs::{fcntl_add_seals, ftruncate, memfd_create, MemfdFlags, SealFlags};
        let size = Self::check_shape(num_queues, queue_size, max_queues, max_queue_size)?;
        let fd = memfd_create(
            "iopath-inflight",
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )
        .map_err(sys("memfd_create"))?;
        ftruncate(&fd, size).map_err(sys("ftruncate"))?;
        fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
            .map_err(sys("F_ADD_SEALS"))?;
        let file = File::from(fd);
        let send = file.try_clone().map_err(|source| InflightError::Sys {
            what: "dup",
            source,
        })?;
        let region = Self::map(file, 0, size, num_queues, queue_size)?;
        let reply = VhostUserInflight::new(size, 0, num_queues, queue_size);
        Ok((region, send, reply))
    }

    /// Maps the region a front end gives back (`SET_INFLIGHT_FD`), after
    /// checking that the file holds what the message describes.
    pub(crate) fn open(
        msg: &VhostUserInflight,
        file: File,
        max_queues: u16,
        max_queue_size: u16,
    ) -> Result<Self, InflightError> {
        let (num_queues, queue_size) = (msg.num_queues, msg.queue_size);
        let needed = Self::check_shape(num_queues, queue_size, max_queues, max_queue_size)?;
        // Sealed (where the file allows) before its size is checked; a
        // file that cannot be sealed is still guarded against SIGBUS.
        let _ = rustix::fs::fcntl_add_seals(&file, rustix::fs::SealFlags::SHRINK);
        let file_len = file
            .metadata()
            .map_err(|source| InflightError::Sys {
                what: "fstat",
                source,
            })?
            .len();
        let too_small = InflightError::TooSmall {
            needed,
            mmap_offset: msg.mmap_offset,
            mmap_size: msg.mmap_size,
            file_len,
        };
        match msg.mmap_offset.checked_add(needed) {
            Some(end) if end <= file_len && needed <= msg.mmap_size => {}
            _ => return Err(too_small),
        }
        Self::map(file, msg.mmap_offset, needed, num_queues, queue_size)
    }

    fn map(
        file: File,
        offset: u64,
        size: u64,
        num_queues: u16,
        queue_size: u16,
    ) -> Result<Self, InflightError> {
        let len = usize::try_from(size).map_err(|_| InflightError::Sys {
            what: "mmap",
            source: io::Error::from(io::ErrorKind::InvalidInput),
        })?;
        let mapping = MmapRegion::from_file(FileOffset::new(file, offset), len).map_err(|e| {
            InflightError::Sys {
                what: "mmap",
                source: io::Error::other(e),
            }
        })?;
        // SAFETY: `mapping` is the live mapping of `len` bytes just made; it
        // goes into the returned region, which declares the guard first, so
        // the guard is dropped before the mapping is.
        let watch = unsafe { SigbusGuard::watch(mapping.as_ptr(), len) };
        Ok(Self {
            watch,
            mapping,
            num_queues,
            queue_size,
        })
    }

    /// Whether the front end truncated the file under the mapping.
    pub(crate) fn truncated(&self) -> bool {
        self.watch.as_ref().is_some_and(SigbusGuard::peer_truncated)
    }

    /// On a SIGBUS in the region, also shut the front end's connection
    /// `conn` down (as for its memory regions).
    pub(crate) fn shutdown_on_fault(&self, conn: std::os::fd::BorrowedFd<'_>) {
        match &self.watch {
            None => tracing::info!("inflight region: not guarded against SIGBUS"),
            Some(g) => {
                if let Err(e) = g.shutdown_on_fault(conn) {
                    tracing::info!("inflight region: a SIGBUS will not disconnect: {e}");
                }
            }
        }
    }

    /// The tracker of queue `index` for a ring of `ring_size` descriptors;
    /// `None` when the region has no such queue or its queues are smaller.
    pub(crate) fn queue(self: &Arc<Self>, index: usize, ring_size: u16) -> Option<InflightQueue> {
        if index >= usize::from(self.num_queues) || ring_size > self.queue_size || ring_size == 0 {
            return None;
        }
        let base = usize::try_from(index as u64 * queue_region_size(self.queue_size)).ok()?;
        Some(InflightQueue::new(Arc::clone(self), base, ring_size))
    }
}
