//! Opening the rpmsg devices and what a control fd (`/dev/rpmsg_ctrl0`)
//! does, with the answers Linux gives, from its sources (v7.x unless
//! noted):
//!
//! - `drivers/rpmsg/rpmsg_ctrl.c` `rpmsg_ctrldev_ioctl`: the struct is
//!   copied in first for any request (`EFAULT`), the name cut to 31 bytes
//!   and terminated, unknown requests `EINVAL`. Before the driver,
//!   `fs/ioctl.c` answers a few requests itself ([`uapi::vfs`]).
//! - the rpmsg-next series adding `RPMSG_CREATE_EPT_FD_IOCTL`
//!   (`rpmsg_anonymous_eptdev_create`): flags outside `O_ACCMODE |
//!   O_NONBLOCK | O_CLOEXEC` are `EINVAL`; `fd` is written back.
//! - `drivers/rpmsg/rpmsg_char.c`: a second open of an open node `EBUSY`.
//! - `drivers/rpmsg/virtio_rpmsg_bus.c`: channels made with
//!   `RPMSG_CREATE_DEV_IOCTL` are refused `ENXIO` if a matching one exists
//!   (`__rpmsg_create_channel`), released ones that do not exist `EINVAL`
//!   (`rpmsg_unregister_device`).
//!
//! The endpoint fds these make are served by [`crate::ept`].

use std::mem::{offset_of, ManuallyDrop};
use std::os::fd::{FromRawFd, IntoRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

use iopath_rpmsg::ctrl::uapi::{RpmsgEndpointFdInfo, RpmsgEndpointInfo, ADDR_ANY, EPT_FD_FLAGS};
use iopath_rpmsg::ctrl::{CtrlClient, CtrlError, EptFd, EptInfo};
use iopath_sys::lock;
use libc::c_int;

use crate::fds::{self, Ctrl, Ept, Kind};
use crate::path::Dev;
use crate::uapi;

/// The endpoint service's control socket (`IOPATH_RPMSG_CTRL`), if set.
pub(crate) fn service_path() -> Option<PathBuf> {
    std::env::var_os(iopath_rpmsg::tools::exec::ENV_CTRL)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// Where the service's nodes are, as its last CREATE_EPT answer said.
static RUNDIR: Mutex<Option<PathBuf>> = Mutex::new(None);

/// A channel made with `RPMSG_CREATE_DEV_IOCTL`: `(name, src, dst)`.
type Channel = ([u8; 32], u32, u32);

/// The channels made with `RPMSG_CREATE_DEV_IOCTL` and not released, in
/// this process: one list for every control fd, as the kernel's are the
/// bus's, not the fd's.
static CHANNELS: Mutex<Vec<Channel>> = Mutex::new(Vec::new());

fn channels() -> MutexGuard<'static, Vec<Channel>> {
    lock(&CHANNELS)
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
        MutexGuard<'static, Option<PathBuf>>,
        MutexGuard<'static, Vec<Channel>>,
    );

    static HELD: Held<Guards> = Held::new();

    /// Before fork: takes the node directory and the channel list.
    fn prepare() {
        let r = lock(&RUNDIR);
        // SAFETY: called only from the prepare handler.
        unsafe { HELD.hold((r, channels())) };
    }

    /// After fork, in the parent: releases them.
    fn parent() {
        // SAFETY: called only from the parent handler.
        drop(unsafe { HELD.take() });
    }

    /// After fork, in the child: releases them.
    fn child() {
        // SAFETY: called only from the child handler.
        drop(unsafe { HELD.take() });
    }
}

/// The service's node directory: `IOPATH_RPMSG_RUNDIR`, else where its
/// answers put nodes, else its default (the socket path and `.d`).
fn rundir(ctrl: &std::path::Path) -> PathBuf {
    if let Some(d) =
        std::env::var_os(iopath_rpmsg::tools::exec::ENV_RUNDIR).filter(|v| !v.is_empty())
    {
        return PathBuf::from(d);
    }
    if let Some(d) = lock(&RUNDIR).clone() {
        return d;
    }
    iopath_rpmsg::ctrl::default_run_dir(ctrl)
}

/// The errno a client error becomes.
fn errno_of(e: &CtrlError) -> c_int {
    match e {
        CtrlError::Refused { errno } => *errno,
        CtrlError::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
        _ => libc::EIO,
    }
}

/// Records a new rpmsg fd, or closes it (`EMFILE`) if its number is too
/// high to track.
fn adopt(fd: OwnedFd, kind: Kind) -> Result<c_int, c_int> {
    let raw = fd.into_raw_fd();
    if fds::insert(raw, kind) {
        Ok(raw)
    } else {
        // SAFETY: `raw` is the fd just given up by `fd`, not yet anyone's.
        unsafe { crate::real::close(raw) };
        Err(libc::EMFILE)
    }
}

/// `open(2)` of an rpmsg device path, with the service at `ctrl`.
pub(crate) fn open(dev: Dev, flags: c_int, ctrl: &std::path::Path) -> Result<c_int, c_int> {
    match dev {
        Dev::Ctrl(0) => {
            // The service down or absent: as a machine without rpmsg.
            let c = CtrlClient::connect(ctrl).map_err(|_| libc::ENOENT)?;
            let fd = c.into_fd();
            if flags & libc::O_CLOEXEC == 0 {
                rustix::io::fcntl_setfd(&fd, rustix::io::FdFlags::empty())
                    .map_err(|e| e.raw_os_error())?;
            }
            // (O_NONBLOCK is not applied: the requests wait for their
            // answers, as the kernel's ioctls do on a non-blocking fd.)
            adopt(fd, Kind::Ctrl(Arc::new(Ctrl::default())))
        }
        Dev::Ctrl(_) | Dev::Absent => Err(libc::ENOENT),
        Dev::Node(n) => {
            let path = rundir(ctrl).join(format!("rpmsg{n}"));
            let keep = (flags & (libc::O_NONBLOCK | libc::O_CLOEXEC)) as u32;
            let ep = EptFd::open_node(&path, keep).map_err(|e| match errno_of(&e) {
                libc::ECONNREFUSED | libc::ENOTDIR => libc::ENOENT,
                x => x,
            })?;
            let max_payload = ep.max_payload();
            adopt(
                ep.into_fd(),
                Kind::Ept(Arc::new(Ept {
                    node: Some(n),
                    accmode: flags & libc::O_ACCMODE,
                    destroyed: false.into(),
                    max_payload,
                })),
            )
        }
    }
}

/// The program's control connection `fd` as a client, never closed here.
fn client(fd: c_int) -> ManuallyDrop<CtrlClient> {
    // SAFETY: `fd` is an open control connection (the table says so) that
    // stays open for this call; ManuallyDrop never closes it.
    ManuallyDrop::new(CtrlClient::from_fd(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// `{name[32], src, dst}` as the kernel takes it: the name cut to 31
/// bytes and terminated (`chinfo.name[RPMSG_NAME_SIZE - 1] = '\0'`).
fn ept_info(raw: &RpmsgEndpointInfo) -> Result<(EptInfo, [u8; 32]), c_int> {
    let mut name = raw.name;
    name[31] = 0;
    let len = name.iter().position(|&c| c == 0).unwrap_or(31);
    // The service takes names as UTF-8; a kernel would take any bytes.
    let s = std::str::from_utf8(&name[..len]).map_err(|_| libc::EINVAL)?;
    Ok((
        EptInfo {
            name: s.to_owned(),
            src: raw.src,
            dst: raw.dst,
        },
        name,
    ))
}

/// An ioctl on control fd `fd`; `None`: the real ioctl answers it.
pub(crate) fn ioctl(
    fd: c_int,
    c: &Arc<Ctrl>,
    cmd: u32,
    arg: usize,
) -> Option<Result<c_int, c_int>> {
    match uapi::vfs(cmd, arg) {
        uapi::Vfs::PassOn => None,
        uapi::Vfs::Answer(r) => Some(r),
        uapi::Vfs::Driver => Some(ctrl_request(fd, c, cmd, arg)),
    }
}

/// A forked child's first request on a control fd it inherited: that
/// connection is its parent's too, and two processes' requests on one
/// connection could read each other's answers (fds included), so the child
/// connects anew and puts its connection in place of every fd number of
/// this control fd (with each one's close-on-exec flag). Without the
/// service's path (the child unset it) the shared connection stays.
fn reconnect(c: &Arc<Ctrl>) -> Result<(), c_int> {
    let Some(path) = service_path() else {
        c.inherited.store(false, Ordering::Relaxed);
        return Ok(());
    };
    let new = CtrlClient::connect(&path)
        .map_err(|e| errno_of(&e))?
        .into_fd();
    for n in fds::numbers_of(c) {
        // SAFETY: `n` is one of the program's open control fds (the table
        // says so); ManuallyDrop never closes it, dup3 replaces it.
        let mut old = ManuallyDrop::new(unsafe { OwnedFd::from_raw_fd(n) });
        let cloexec = rustix::io::fcntl_getfd(&*old)
            .map_or(true, |f| f.contains(rustix::io::FdFlags::CLOEXEC));
        let flags = if cloexec {
            rustix::io::DupFlags::CLOEXEC
        } else {
            rustix::io::DupFlags::empty()
        };
        // (rustix's system call, not the interposed dup3.)
        rustix::io::dup3(&new, &mut old, flags).map_err(|e| e.raw_os_error())?;
    }
    c.id.store(fds::next_id(), Ordering::Relaxed);
    c.inherited.store(false, Ordering::Relaxed);
    Ok(())
}

fn ctrl_request(fd: c_int, c: &Arc<Ctrl>, cmd: u32, arg: usize) -> Result<c_int, c_int> {
    // The fd variant is the plain struct's fields, then `flags` and `fd`.
    let (raw, flags) = if cmd == uapi::CREATE_EPT_FD {
        let f = uapi::copy_in_value::<RpmsgEndpointFdInfo>(arg)?;
        (f.info(), f.flags)
    } else {
        (uapi::copy_in_value::<RpmsgEndpointInfo>(arg)?, 0)
    };
    let (info, name) = ept_info(&raw)?;
    let _one_at_a_time = lock(&c.lock);
    if c.inherited.load(Ordering::Relaxed) {
        reconnect(c)?;
    }
    match cmd {
        uapi::CREATE_EPT => {
            let (_, node) = client(fd).create_ept(&info).map_err(|e| errno_of(&e))?;
            // (A service started with a relative --ctrl answers paths
            // relative to its own directory: not ours to resolve.)
            if let Some(dir) = node.parent().filter(|d| d.is_absolute()) {
                *lock(&RUNDIR) = Some(dir.to_owned());
            }
            // The node's N, to close a kept connection once its last
            // endpoint is destroyed (one named otherwise is kept for good).
            let n = node
                .file_name()
                .and_then(|f| f.to_str())
                .and_then(|f| f.strip_prefix("rpmsg"))
                .and_then(|n| n.parse().ok())
                .unwrap_or(u32::MAX);
            fds::legacy_created(c, n);
            Ok(0)
        }
        uapi::CREATE_EPT_FD => {
            if flags & !EPT_FD_FLAGS != 0 {
                return Err(libc::EINVAL);
            }
            let ep = client(fd)
                .create_ept_fd(&info, flags)
                .map_err(|e| errno_of(&e))?;
            let max_payload = ep.max_payload();
            let new = adopt(
                ep.into_fd(),
                Kind::Ept(Arc::new(Ept {
                    node: None,
                    accmode: flags as c_int & libc::O_ACCMODE,
                    destroyed: false.into(),
                    max_payload,
                })),
            )?;
            if let Err(e) = uapi::copy_out(
                arg + offset_of!(RpmsgEndpointFdInfo, fd),
                &new.to_ne_bytes(),
            ) {
                fds::forget(new);
                // SAFETY: the fd made just now, never seen by the program.
                unsafe { crate::real::close(new) };
                return Err(e);
            }
            Ok(0)
        }
        uapi::CREATE_DEV => {
            let mut ch = channels();
            if ch.iter().any(|d| matches(d, &name, info.src, info.dst)) {
                return Err(libc::ENXIO);
            }
            ch.push((name, info.src, info.dst));
            Ok(0)
        }
        uapi::RELEASE_DEV => {
            let mut ch = channels();
            let i = ch
                .iter()
                .position(|d| matches(d, &name, info.src, info.dst))
                .ok_or(libc::EINVAL)?;
            ch.remove(i);
            Ok(0)
        }
        _ => Err(libc::EINVAL),
    }
}

/// `rpmsg_device_match` (rpmsg_core.c): any address matches `ADDR_ANY`.
fn matches(dev: &Channel, name: &[u8; 32], src: u32, dst: u32) -> bool {
    (src == ADDR_ANY || src == dev.1) && (dst == ADDR_ANY || dst == dev.2) && dev.0 == *name
}
