//! The device's view of the front end's IOMMU: an IOTLB fed by vhost-user
//! `IOTLB_MSG` updates and invalidations.
//!
//! vm-memory (with its `iommu` feature) already provides the translation
//! machinery: [`Iotlb`] stores `IOVA -> address` ranges with permissions and
//! [`vm_memory::IommuMemory`] routes every access of `virtio-queue` and of
//! the device through [`Iommu::translate`]. What rust-vmm lacks is the
//! vhost-user side (rust-vmm/vhost issue 312): receiving the front end's
//! messages and refusing anything that was never mapped. This module adds
//! the message format and an [`Iommu`] that never resolves a miss by itself:
//! an access outside the IOTLB fails, and the request that made it fails
//! with it.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Condvar, Mutex, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

use vm_memory::iommu::{Error as IommuError, IotlbIterator, IovaRange};
use vm_memory::{GuestAddress, Iommu, Iotlb, Permissions};

use iopath_dma::Perm;
use iopath_sys::{lock, read_lock, wait_timeout_while, write_lock};

use super::iotlb_stats::{IotlbCounters, IotlbEvent, IotlbStats};
use super::DmaFence;

pub use crate::vhost_wire::IOTLB_MSG_SIZE;
use crate::vhost_wire::{self, Header, RawIotlb, IOTLB_INVALIDATE, IOTLB_MISS, IOTLB_UPDATE};

/// The vm-memory permission an IOTLB entry of `perm` grants.
pub(crate) fn permissions(perm: Perm) -> Permissions {
    match perm {
        Perm::ReadOnly => Permissions::Read,
        Perm::WriteOnly => Permissions::Write,
        Perm::ReadWrite => Permissions::ReadWrite,
    }
}

/// One IOTLB message from the front end, validated.
#[derive(Clone, Copy, Debug, Eq, PartialEq)]
pub enum IotlbMsg {
    /// `VHOST_IOTLB_UPDATE`: map `size` bytes at `iova` to the front
    /// end's address `uaddr`.
    Update {
        /// First I/O virtual address.
        iova: u64,
        /// Length in bytes (non-zero; `iova + size` does not overflow).
        size: u64,
        /// Front-end user address the range maps to.
        uaddr: u64,
        /// What the device may do there.
        perm: Perm,
    },
    /// `VHOST_IOTLB_INVALIDATE`: forget every mapping in the range.
    Invalidate {
        /// First I/O virtual address.
        iova: u64,
        /// Length in bytes.
        size: u64,
    },
}

/// Why an IOTLB message was refused.
#[derive(Debug, thiserror::Error, Clone, Copy, Eq, PartialEq)]
pub enum IotlbMsgError {
    /// The payload has the wrong size.
    #[error("IOTLB message payload of {len} bytes")]
    BadSize {
        /// Payload length received.
        len: usize,
    },
    /// The message type is not one a front end may send.
    #[error("IOTLB message type {kind} not accepted from the front end")]
    BadType {
        /// The `type` field.
        kind: u8,
    },
    /// The permission field is not RO, WO or RW.
    #[error("IOTLB permission {perm} is invalid")]
    BadPerm {
        /// The `perm` field.
        perm: u8,
    },
    /// The range is empty, overflows, or does not fit this address space.
    #[error("IOTLB range {iova:#x}+{size:#x} is invalid")]
    BadRange {
        /// The `iova` field.
        iova: u64,
        /// The `size` field.
        size: u64,
    },
}

impl IotlbMsg {
    /// Parses the payload of a front-end `IOTLB_MSG` (request 22).
    ///
    /// # Errors
    /// [`IotlbMsgError`] for a short or long payload, an unknown type or
    /// permission, or a range that is empty or wraps around.
    pub fn parse(payload: &[u8]) -> Result<Self, IotlbMsgError> {
        let raw = RawIotlb::decode(payload).ok_or(IotlbMsgError::BadSize { len: payload.len() })?;
        let (iova, size, uaddr) = (raw.iova, raw.size, raw.uaddr);
        let (perm, kind) = (raw.perm, raw.kind);
        let range_ok =
            size != 0 && iova.checked_add(size - 1).is_some() && usize::try_from(size).is_ok();
        match kind {
            IOTLB_UPDATE => {
                let perm = Perm::from_wire(perm).ok_or(IotlbMsgError::BadPerm { perm })?;
                if !range_ok || uaddr.checked_add(size - 1).is_none() {
                    return Err(IotlbMsgError::BadRange { iova, size });
                }
                Ok(Self::Update {
                    iova,
                    size,
                    uaddr,
                    perm,
                })
            }
            IOTLB_INVALIDATE => {
                if !range_ok {
                    return Err(IotlbMsgError::BadRange { iova, size });
                }
                Ok(Self::Invalidate { iova, size })
            }
            kind => Err(IotlbMsgError::BadType { kind }),
        }
    }

    /// Encodes the message as a front end sends it (32 bytes).
    pub fn to_wire(&self) -> [u8; IOTLB_MSG_SIZE] {
        let raw = match *self {
            Self::Update {
                iova,
                size,
                uaddr,
                perm,
            } => RawIotlb {
                iova,
                size,
                uaddr,
                perm: perm.to_wire(),
                kind: IOTLB_UPDATE,
            },
            Self::Invalidate { iova, size } => RawIotlb {
                iova,
                size,
                kind: IOTLB_INVALIDATE,
                ..RawIotlb::default()
            },
        };
        raw.encode()
    }
}

/// The IOMMU a vhost-user device sees: the front end's IOTLB and nothing
/// else. Translations land in the front end's user address space, which is
/// how the device's memory is keyed while `ACCESS_PLATFORM` is negotiated.
///
/// When the front end gave a back-end channel (`SET_BACKEND_REQ_FD`), a
/// miss is reported to it (`VHOST_USER_BACKEND_IOTLB_MSG`, type MISS) and the
/// access waits briefly for the update that answers it, as QEMU with a
/// virtual IOMMU expects; without one, or when no answer comes, the access
/// fails.
///
/// Each started queue translates through a view of its own
/// (`VhostIommu::queue_view`): the same IOTLB, with the hook its device
/// set to run before a miss is waited for
/// ([`QueueContext::set_before_miss_wait`](super::QueueContext::set_before_miss_wait)).
#[derive(Default)]
pub struct VhostIommu {
    shared: Arc<IommuState>,
    /// Run before this view waits for a miss to be answered.
    before_miss_wait: Mutex<Option<MissWaitHook>>,
}

/// What a queue does before it waits for the front end to answer a miss.
pub(crate) type MissWaitHook = Box<dyn FnMut() + Send>;

impl std::fmt::Debug for VhostIommu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hooked = self
            .before_miss_wait
            .lock()
            .map(|h| h.is_some())
            .unwrap_or(false);
        f.debug_struct("VhostIommu")
            .field("state", &self.shared)
            .field("before_miss_wait", &hooked)
            .finish()
    }
}

/// The IOTLB and miss channel every view of one [`VhostIommu`] shares.
#[derive(Debug, Default)]
struct IommuState {
    iotlb: RwLock<Iotlb>,
    miss: Mutex<Option<MissChannel>>,
    /// Bumped on every applied message; misses wait for it to move.
    updates: Mutex<u64>,
    updated: Condvar,
    /// Parks the waiting thread's batch while a miss is outstanding.
    fence: Option<Arc<DmaFence>>,
    /// The messages applied and the misses reported so far.
    counters: IotlbCounters,
}

/// The back-end channel misses are reported on.
#[derive(Debug)]
struct MissChannel {
    sock: UnixStream,
    reply_ack: bool,
    /// The front end refused a miss before it ever sent an IOTLB message:
    /// it acknowledged `ACCESS_PLATFORM` without running an IOMMU.
    no_iommu: bool,
}

/// How long an access waits for the front end to answer a miss (QEMU
/// answers in tens of microseconds; it cannot while it waits for a reply
/// from this back end, e.g. to `GET_VRING_BASE`).
const MISS_WAIT: Duration = Duration::from_millis(300);

impl VhostIommu {
    /// An IOMMU with an empty IOTLB (every access fails).
    pub fn new() -> Self {
        Self::default()
    }

    /// An IOMMU whose miss waits park the thread's batch on `fence`.
    pub fn with_fence(fence: Arc<DmaFence>) -> Self {
        Self {
            shared: Arc::new(IommuState {
                fence: Some(fence),
                ..IommuState::default()
            }),
            before_miss_wait: Mutex::new(None),
        }
    }

    /// Another view of the same IOTLB, with no miss-wait hook of its own
    /// yet (one per started queue).
    pub(crate) fn queue_view(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
            before_miss_wait: Mutex::new(None),
        }
    }

    /// Sets (`None`: clears) what this view runs before it waits for the
    /// front end to answer a miss.
    pub(crate) fn set_before_miss_wait(&self, hook: Option<MissWaitHook>) {
        *lock(&self.before_miss_wait) = hook;
    }

    /// Runs this view's miss-wait hook, if any (not re-entrantly: a miss
    /// taken inside the hook runs none).
    fn run_before_miss_wait(&self) {
        let slot = || lock(&self.before_miss_wait);
        let Some(mut hook) = slot().take() else {
            return;
        };
        hook();
        let mut slot = slot();
        if slot.is_none() {
            *slot = Some(hook);
        }
    }

    /// Applies one message from the front end. Returns whether it removed
    /// or changed a translation that existed (then accesses already under
    /// way through it must end before the front end is told it is done).
    pub fn apply(&self, msg: &IotlbMsg) -> bool {
        tracing::trace!("IOTLB {msg:x?}");
        let (iova, size) = match *msg {
            IotlbMsg::Update { iova, size, .. } | IotlbMsg::Invalidate { iova, size } => {
                (iova, size)
            }
        };
        // `IotlbMsg::parse` guarantees `size` fits usize and the range does
        // not wrap; a range ending exactly at 2^64 cannot be stored in
        // rangemap's half-open ranges, so it loses its last byte.
        let len = if iova.checked_add(size).is_none() {
            size - 1
        } else {
            size
        } as usize;
        // A poisoned lock only means a panic elsewhere; the map itself is
        // always consistent, so keep using it.
        let mut tlb = write_lock(&self.shared.iotlb);
        if len == 0 {
            return false;
        }
        let replaced = match Iotlb::lookup(&*tlb, GuestAddress(iova), len, Permissions::No) {
            Ok(_) => true,
            Err(f) => {
                let unmapped: usize = f.misses.iter().map(|m| m.length).sum();
                unmapped < len || !f.access_fails.is_empty()
            }
        };
        match *msg {
            IotlbMsg::Update { uaddr, perm, .. } => {
                self.shared.counters.count(IotlbEvent::Update);
                let _ = tlb.set_mapping(
                    GuestAddress(iova),
                    GuestAddress(uaddr),
                    len,
                    permissions(perm),
                );
            }
            IotlbMsg::Invalidate { .. } => {
                self.shared.counters.count(IotlbEvent::Invalidation);
                tlb.invalidate_mapping(GuestAddress(iova), len);
            }
        }
        drop(tlb);
        *lock(&self.shared.updates) += 1;
        self.shared.updated.notify_all();
        replaced
    }

    /// Reports misses on `sock` from now on (`None`: fail them at once).
    /// With `reply_ack` the front end acknowledges each report.
    pub fn set_miss_channel(&self, sock: Option<UnixStream>, reply_ack: bool) {
        let ch = sock.map(|sock| {
            // A front end that never answers must not hang a queue.
            let _ = sock.set_read_timeout(Some(MISS_WAIT));
            let _ = sock.set_write_timeout(Some(MISS_WAIT));
            MissChannel {
                sock,
                reply_ack,
                no_iommu: false,
            }
        });
        *lock(&self.shared.miss) = ch;
    }

    /// Sends one miss report; false when there is no channel or it failed.
    fn report_miss(&self, iova: u64, size: u64, access: Permissions) -> bool {
        let mut guard = lock(&self.shared.miss);
        let Some(ch) = guard.as_mut() else {
            return false;
        };
        tracing::debug!("IOTLB miss {iova:#x}+{size:#x} {access:?}");
        let perm = match access {
            Permissions::Write => Perm::WriteOnly,
            Permissions::ReadWrite => Perm::ReadWrite,
            _ => Perm::ReadOnly,
        }
        .to_wire();
        let payload = RawIotlb {
            iova,
            size,
            perm,
            kind: IOTLB_MISS,
            ..RawIotlb::default()
        }
        .encode();
        let header = Header::request(vhost_wire::BACKEND_IOTLB_MSG, payload.len(), ch.reply_ack);
        let msg = vhost_wire::message(header, &payload);
        let sent = ch.sock.write_all(&msg).and_then(|()| {
            if ch.reply_ack {
                // Whatever the front end answers, the update (if any) is
                // what the access waits for.
                let mut reply = [0u8; vhost_wire::U64_REPLY_SIZE];
                ch.sock.read_exact(&mut reply)?;
                let refused = !matches!(
                    vhost_wire::parse_u64_reply(vhost_wire::BACKEND_IOTLB_MSG, &reply),
                    Ok(0)
                );
                if refused && !ch.no_iommu && self.updates_seen() == 0 {
                    ch.no_iommu = true;
                    tracing::warn!(
                        "the front end refused an IOTLB miss and has sent no IOTLB update: \
                         it acknowledged VIRTIO_F_ACCESS_PLATFORM without running an IOMMU \
                         (Linux's virtio_uml does); serve it without offering the feature \
                         (iopath blk serve --no-access-platform)"
                    );
                }
            }
            Ok(())
        });
        if let Err(e) = sent {
            // A front end too busy to answer in time only fails this access;
            // a closed or broken channel fails every later miss at once.
            if !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) {
                tracing::warn!("IOTLB miss channel broken ({e}): misses now fail at once");
                *guard = None;
            }
            return false;
        }
        true
    }

    /// The IOTLB traffic of this front end so far (every view's).
    pub fn stats(&self) -> IotlbStats {
        self.shared.counters.snapshot()
    }

    /// IOTLB messages applied so far.
    fn updates_seen(&self) -> u64 {
        *lock(&self.shared.updates)
    }

    /// Whether the front end refused a miss before it sent any IOTLB
    /// message (it runs no IOMMU).
    #[cfg(test)]
    fn front_end_runs_no_iommu(&self) -> bool {
        lock(&self.shared.miss)
            .as_ref()
            .is_some_and(|ch| ch.no_iommu)
    }

    /// Forgets every mapping (a new front end, a device reset).
    pub fn clear(&self) {
        write_lock(&self.shared.iotlb).invalidate_all();
    }
}

impl Iommu for VhostIommu {
    type IotlbGuard<'a> = RwLockReadGuard<'a, Iotlb>;

    fn translate(
        &self,
        iova: GuestAddress,
        length: usize,
        access: Permissions,
    ) -> Result<IotlbIterator<Self::IotlbGuard<'_>>, IommuError> {
        let fail = |reason: &str| IommuError::CannotResolve {
            iova_range: IovaRange { base: iova, length },
            reason: reason.into(),
        };
        // `Iotlb::lookup` adds `iova + length` unchecked: a hostile
        // descriptor near the top of the address space must fail here.
        if iova.0.checked_add(length as u64).is_none() {
            return Err(fail("range wraps around the address space"));
        }
        // Each answered miss maps at least one page, but the front end may
        // invalidate pages resolved a moment ago (a guest flushing its IOTLB
        // lazily drops everything now and then): bound the round trips
        // generously, and the time.
        let mut reports = (length / 4096 + 4) * 4;
        let deadline = Instant::now() + MISS_WAIT * 4;
        let mut last_denied: Option<GuestAddress> = None;
        loop {
            let seen = *lock(&self.shared.updates);
            let tlb = read_lock(&self.shared.iotlb);
            let fails = match Iotlb::lookup(tlb, iova, length, access) {
                Ok(it) => return Ok(it),
                Err(f) => f,
            };
            // A mapping without the needed permission may be stale (the
            // driver remapped the page and the invalidation is still on its
            // way): ask once, like a miss; if the answer does not grant the
            // access, it is refused.
            let (first, denied) = match (fails.misses.first(), fails.access_fails.first()) {
                (Some(m), _) => (m.clone(), false),
                (None, Some(a)) => (a.clone(), true),
                (None, None) => return Err(fail("not mapped in the IOTLB")),
            };
            if denied && last_denied == Some(first.base) {
                return Err(fail("access not permitted"));
            }
            if reports == 0 || Instant::now() > deadline {
                return Err(fail(if denied {
                    "access not permitted"
                } else {
                    "not mapped in the IOTLB"
                }));
            }
            reports -= 1;
            last_denied = denied.then_some(first.base);
            // Hold up no invalidation while waiting: the front end may need
            // its acknowledgement before it can answer.
            let _parked = self.shared.fence.as_ref().map(|f| f.park());
            self.run_before_miss_wait();
            if !self.report_miss(first.base.0, first.length as u64, access) {
                return Err(fail(if denied {
                    "access not permitted"
                } else {
                    "not mapped in the IOTLB"
                }));
            }
            self.shared.counters.count(IotlbEvent::Miss);
            let updates = lock(&self.shared.updates);
            let (updates, wait) =
                wait_timeout_while(&self.shared.updated, updates, MISS_WAIT, |n| *n == seen);
            drop(updates);
            if wait.timed_out() {
                self.shared.counters.count(IotlbEvent::Unanswered);
                return Err(fail("IOTLB miss not answered"));
            }
        }
    }
}

#[cfg(test)]
mod tests;
