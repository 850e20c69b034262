//! Which fds are rpmsg fds: a count of them and one bit per fd for the
//! fast path (in a process with none open, every call pays one relaxed
//! load of the count; with some open, a load of the fd's bitmap word too),
//! and behind a lock, for the rpmsg fds only, what each one is.
//!
//! A bit is set only while its entry exists (both change under the lock),
//! so a clear bit means "not ours" without taking it. Several fd numbers
//! share one state when the program dups an rpmsg fd.
//!
//! fork(2) copies the locks as they are: this module's fork handlers
//! ([`fork::HANDLERS`], registered with [`crate::fork`]) take them before
//! and release them after, in parent and child, so a child never inherits
//! one held by a thread it does not have.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use iopath_sys::lock;
use libc::c_int;

/// fds at or above this number cannot be rpmsg fds (one is moved below it
/// or refused with `EMFILE`).
pub(crate) const MAX_FDS: usize = 1 << 16;

static BITS: [AtomicU64; MAX_FDS / 64] = [const { AtomicU64::new(0) }; MAX_FDS / 64];

/// Whether `fd` is an rpmsg fd: the one check every interposed call makes.
/// With no rpmsg fd open (the count is 0) it reads nothing else.
#[inline(always)]
pub(crate) fn is_ours(fd: c_int) -> bool {
    any() && bit(fd)
}

/// `fd`'s bit.
#[inline(always)]
fn bit(fd: c_int) -> bool {
    let i = fd as u32 as usize;
    // (A negative fd becomes a huge index and fails the bound check.)
    i < MAX_FDS && BITS[i / 64].load(Ordering::Relaxed) & (1 << (i % 64)) != 0
}

fn set_bit(fd: usize, on: bool) {
    let m = 1u64 << (fd % 64);
    if on {
        BITS[fd / 64].fetch_or(m, Ordering::Relaxed);
    } else {
        BITS[fd / 64].fetch_and(!m, Ordering::Relaxed);
    }
}

/// An open `/dev/rpmsg_ctrl0`: a connection to the endpoint service.
#[derive(Debug)]
pub(crate) struct Ctrl {
    /// Held for the whole of one request and its answer (the kernel's
    /// `ctrl_lock`): two threads' requests on one fd never interleave.
    /// Not taken by the fork handlers (a request waits for the service):
    /// a child whose fork found it held gets a fresh state instead.
    pub(crate) lock: Mutex<()>,
    /// The connection's number in [`LEGACY`] and [`KEPT`] (a new one when
    /// a forked child makes its own connection).
    pub(crate) id: AtomicU64,
    /// Inherited through fork(2): the connection is the parent's too, and
    /// their answers could cross, so the child's first request makes one
    /// of its own (the control fd's `reconnect`).
    pub(crate) inherited: AtomicBool,
}

/// A connection number never used before.
pub(crate) fn next_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl Default for Ctrl {
    fn default() -> Self {
        Ctrl {
            lock: Mutex::new(()),
            id: AtomicU64::new(next_id()),
            inherited: AtomicBool::new(false),
        }
    }
}

/// The fd numbers that are control fd `c` (the program's dups of it).
pub(crate) fn numbers_of(c: &Arc<Ctrl>) -> Vec<c_int> {
    table()
        .iter()
        .filter(|(_, k)| matches!(k, Kind::Ctrl(x) if Arc::ptr_eq(x, c)))
        .map(|(&fd, _)| fd)
        .collect()
}

/// An endpoint fd: an opened node or an fd from `RPMSG_CREATE_EPT_FD_IOCTL`.
#[derive(Debug)]
pub(crate) struct Ept {
    /// An opened legacy node, `/dev/rpmsgN`: `Some(N)` (its destroy is
    /// the node's).
    pub(crate) node: Option<u32>,
    /// `O_RDONLY`, `O_WRONLY` or `O_RDWR`, as opened.
    pub(crate) accmode: c_int,
    /// `RPMSG_DESTROY_EPT_IOCTL` was issued on it (or a copy).
    pub(crate) destroyed: AtomicBool,
    /// Writes over this many bytes fail with `EMSGSIZE`, as the kernel's
    /// do over the buffer size less the header: what the service says
    /// was negotiated (496 without negotiation).
    pub(crate) max_payload: usize,
}

/// What an rpmsg fd is.
#[derive(Debug, Clone)]
pub(crate) enum Kind {
    /// A control fd.
    Ctrl(Arc<Ctrl>),
    /// An endpoint fd.
    Ept(Arc<Ept>),
}

static TABLE: Mutex<BTreeMap<c_int, Kind>> = Mutex::new(BTreeMap::new());

/// How many entries the table holds.
static COUNT: AtomicUsize = AtomicUsize::new(0);

/// The legacy endpoints alive: `(N of /dev/rpmsgN, id of the connection
/// that created it)`. The service ends a legacy endpoint with the
/// connection that created it; Linux keeps `/dev/rpmsgN` until destroyed.
static LEGACY: Mutex<Vec<(u32, u64)>> = Mutex::new(Vec::new());

/// Control connections the program closed while legacy endpoints created
/// through them were alive: `(id, a copy of the fd)`, each closed once the
/// last of its endpoints is destroyed.
static KEPT: Mutex<Vec<(u64, OwnedFd)>> = Mutex::new(Vec::new());

fn legacy() -> MutexGuard<'static, Vec<(u32, u64)>> {
    lock(&LEGACY)
}

fn kept() -> MutexGuard<'static, Vec<(u64, OwnedFd)>> {
    lock(&KEPT)
}

/// Forgets the legacy endpoint of `/dev/rpmsg<node>`, and returns the
/// kept connections left with no legacy endpoint, to be closed (after the
/// locks are released). Lock order: `LEGACY`, then `KEPT`.
fn drop_legacy(l: &mut Vec<(u32, u64)>, node: u32) -> Vec<OwnedFd> {
    let mut ids = Vec::new();
    l.retain(|&(n, id)| {
        if n == node {
            ids.push(id);
        }
        n != node
    });
    ids.retain(|id| !l.iter().any(|&(_, x)| x == *id));
    if ids.is_empty() {
        return Vec::new();
    }
    let mut k = kept();
    let mut done = Vec::new();
    let mut i = 0;
    while i < k.len() {
        if ids.contains(&k[i].0) {
            done.push(k.swap_remove(i).1);
        } else {
            i += 1;
        }
    }
    done
}

/// `RPMSG_CREATE_EPT_IOCTL` on `c` made `/dev/rpmsg<node>`. An entry left
/// for the same number is stale (that endpoint went with its remote, its
/// number is free again): it is dropped first.
pub(crate) fn legacy_created(c: &Ctrl, node: u32) {
    let mut l = legacy();
    let stale = drop_legacy(&mut l, node);
    l.push((node, c.id.load(Ordering::Relaxed)));
    drop(l);
    drop(stale);
}

/// The legacy endpoint of `/dev/rpmsg<node>` was destroyed: a kept
/// connection it was the last of is closed.
pub(crate) fn legacy_destroyed(node: u32) {
    let mut l = legacy();
    let done = drop_legacy(&mut l, node);
    drop(l);
    drop(done);
}

fn table() -> MutexGuard<'static, BTreeMap<c_int, Kind>> {
    lock(&TABLE)
}

/// Records `fd` as `kind`; false if its number is too high to track.
pub(crate) fn insert(fd: c_int, kind: Kind) -> bool {
    let Ok(i) = usize::try_from(fd) else {
        return false;
    };
    if i >= MAX_FDS {
        return false;
    }
    let mut t = table();
    if t.insert(fd, kind).is_none() {
        COUNT.fetch_add(1, Ordering::Relaxed);
    }
    set_bit(i, true);
    true
}

/// What `fd` is, if it is ours.
pub(crate) fn get(fd: c_int) -> Option<Kind> {
    if !is_ours(fd) {
        return None;
    }
    table().get(&fd).cloned()
}

/// Forgets `fd` (it is being closed); a control connection with legacy
/// endpoints alive and no other fd is kept open (a copy of it) until they
/// are destroyed.
pub(crate) fn forget(fd: c_int) {
    if !is_ours(fd) {
        return;
    }
    let gone = {
        let mut t = table();
        set_bit(fd as usize, false);
        let gone = t.remove(&fd);
        if gone.is_some() {
            COUNT.fetch_sub(1, Ordering::Relaxed);
        }
        gone
    };
    if let Some(Kind::Ctrl(c)) = gone {
        if Arc::strong_count(&c) > 1 {
            return;
        }
        let l = legacy();
        let id = c.id.load(Ordering::Relaxed);
        if l.iter().any(|&(_, x)| x == id) {
            // SAFETY: `fd` is the program's open control fd (it is closing
            // it right after this); the copy is ours.
            let b = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
            if let Ok(copy) = rustix::io::fcntl_dupfd_cloexec(b, 0) {
                // (LEGACY, then KEPT: the order `drop_legacy` takes them.)
                kept().push((id, copy));
            }
        }
        drop(l);
    }
}

/// Drops a stale entry for `fd` (its number was closed behind the
/// library's back, e.g. by a raw system call, and reused): no copy kept.
pub(crate) fn discard(fd: c_int) {
    if !is_ours(fd) {
        return;
    }
    let mut t = table();
    set_bit(fd as usize, false);
    if t.remove(&fd).is_some() {
        COUNT.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Whether any rpmsg fd exists (lets `poll` skip its scan).
#[inline(always)]
pub(crate) fn any() -> bool {
    COUNT.load(Ordering::Relaxed) != 0
}

/// Forgets every fd in `first..=last` (`close_range`).
pub(crate) fn forget_range(first: u32, last: u32) {
    let (first, last) = (first.min(c_int::MAX as u32), last.min(c_int::MAX as u32));
    let ours: Vec<c_int> = table()
        .range(first as c_int..=last as c_int)
        .map(|(&fd, _)| fd)
        .collect();
    for fd in ours {
        forget(fd);
    }
}

/// `new` is a copy of `old` (dup): the same state.
pub(crate) fn copy(old: c_int, new: c_int) -> bool {
    match get(old) {
        Some(k) => insert(new, k),
        None => true,
    }
}

/// The fork handlers for this module's locks (see [`crate::fork`]).
pub(crate) mod fork {
    use super::*;
    use crate::fork::{Handlers, Held};

    /// What this module registers with [`crate::fork`].
    pub(crate) const HANDLERS: Handlers = Handlers {
        prepare,
        parent,
        child,
    };

    type Guards = (
        MutexGuard<'static, BTreeMap<c_int, Kind>>,
        MutexGuard<'static, Vec<(u32, u64)>>,
        MutexGuard<'static, Vec<(u64, OwnedFd)>>,
    );

    static HELD: Held<Guards> = Held::new();

    /// Before fork: takes the table, the legacy endpoints and the kept
    /// connections, in the order the rest of the module takes them (each
    /// is held only briefly, never while waiting for the service).
    fn prepare() {
        let t = table();
        let l = legacy();
        let k = kept();
        // SAFETY: called only from the prepare handler.
        unsafe { HELD.hold((t, l, k)) };
    }

    /// After fork, in the parent: releases them.
    fn parent() {
        // SAFETY: called only from the parent handler.
        drop(unsafe { HELD.take() });
    }

    /// After fork, in the child (its only thread): every control fd is
    /// marked inherited; one whose request lock a thread of the parent
    /// held gets a fresh state (that thread is not here to release it);
    /// then the locks are released.
    fn child() {
        // SAFETY: called only from the child handler.
        let Some((mut t, l, k)) = (unsafe { HELD.take() }) else {
            return;
        };
        // (old, new): every fd number sharing a state gets the same new one.
        let mut fresh: Vec<(Arc<Ctrl>, Arc<Ctrl>)> = Vec::new();
        for kind in t.values_mut() {
            let Kind::Ctrl(c) = kind else { continue };
            c.inherited.store(true, Ordering::Relaxed);
            if !matches!(c.lock.try_lock(), Err(std::sync::TryLockError::WouldBlock)) {
                continue;
            }
            let new = match fresh.iter().find(|(old, _)| Arc::ptr_eq(old, c)) {
                Some((_, new)) => new.clone(),
                None => {
                    let new = Arc::new(Ctrl {
                        lock: Mutex::new(()),
                        id: AtomicU64::new(c.id.load(Ordering::Relaxed)),
                        inherited: AtomicBool::new(true),
                    });
                    fresh.push((c.clone(), new.clone()));
                    new
                }
            };
            // (The old state is still counted by the parent's thread that
            // held it, so it is never freed here with its lock taken.)
            *c = new;
        }
        drop(fresh);
        drop((t, l, k));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ept() -> Kind {
        Kind::Ept(Arc::new(Ept {
            node: None,
            accmode: libc::O_RDWR,
            destroyed: false.into(),
            max_payload: iopath_rpmsg::wire::MAX_PAYLOAD,
        }))
    }

    #[test]
    fn bits_follow_the_table() {
        // Numbers no test opens.
        let (a, b) = (60_001, 60_002);
        assert!(!is_ours(a) && !is_ours(-1) && !is_ours(MAX_FDS as c_int));
        assert!(insert(a, ept()));
        assert!(is_ours(a) && !is_ours(b) && any());
        // A dup shares the state.
        assert!(copy(a, b));
        let (Some(Kind::Ept(x)), Some(Kind::Ept(y))) = (get(a), get(b)) else {
            panic!("not endpoints");
        };
        x.destroyed.store(true, Ordering::Relaxed);
        assert!(y.destroyed.load(Ordering::Relaxed));
        forget(a);
        assert!(!is_ours(a) && get(a).is_none() && is_ours(b));
        forget_range(b as u32, u32::MAX);
        assert!(!is_ours(b));
        // Too high to track, or negative: refused.
        assert!(!insert(MAX_FDS as c_int, ept()));
        assert!(!insert(-3, ept()));
        // Not ours: a copy of it is nothing to record.
        assert!(copy(a, b) && !is_ours(b));
    }

    #[test]
    fn a_closed_control_fd_is_kept_while_its_legacy_endpoints_live() {
        let kept_of = |id: u64| kept().iter().filter(|(x, _)| *x == id).count();
        let (r, _w) = rustix::pipe::pipe().unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&r);
        let c = Arc::new(Ctrl::default());
        // Two endpoints, nodes 60001 and 60002 (numbers no other test uses).
        assert!(insert(fd, Kind::Ctrl(c.clone())));
        legacy_created(&c, 60_001);
        legacy_created(&c, 60_002);
        let id = c.id.load(Ordering::Relaxed);
        drop(c);
        forget(fd);
        assert_eq!(kept_of(id), 1, "closed with endpoints alive: kept");
        legacy_destroyed(60_001);
        assert_eq!(kept_of(id), 1, "one endpoint still alive");
        // Node 60002 made anew by another connection: the old entry was
        // stale (its endpoint went with the remote), so nothing keeps the
        // first connection any more.
        let other = Ctrl::default();
        legacy_created(&other, 60_002);
        assert_eq!(kept_of(id), 0);
        legacy_destroyed(60_002);
        assert!(legacy().iter().all(|&(n, _)| n != 60_002));
        // A control fd closed with no endpoint alive is not kept.
        let c = Arc::new(Ctrl::default());
        assert!(insert(fd, Kind::Ctrl(c.clone())));
        assert_eq!(numbers_of(&c), vec![fd]);
        let id = c.id.load(Ordering::Relaxed);
        drop(c);
        forget(fd);
        assert_eq!(kept_of(id), 0);
    }
}
