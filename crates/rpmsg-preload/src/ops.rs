//! What the rpmsg fds do: opening the devices, their ioctls, reads and
//! writes with rpmsg_char's errnos. Every answer here is the one Linux
//! gives, from its sources (v7.x unless noted):
//!
//! - `drivers/rpmsg/rpmsg_ctrl.c` `rpmsg_ctrldev_ioctl`: the struct is
//!   copied in first for any request (`EFAULT`), the name cut to 31 bytes
//!   and terminated, unknown requests `EINVAL`.
//! - the rpmsg-next series adding `RPMSG_CREATE_EPT_FD_IOCTL`
//!   (`rpmsg_anonymous_eptdev_create`): flags outside `O_ACCMODE |
//!   O_NONBLOCK | O_CLOEXEC` are `EINVAL`; `fd` is written back.
//! - `drivers/rpmsg/rpmsg_char.c`: a second open of an open node `EBUSY`;
//!   read and write `EPIPE` once the endpoint is gone; poll `EPOLLERR`;
//!   `rpmsg_eptdev_ioctl` answers the flow-control requests and destroy,
//!   anything else `EINVAL` (not `ENOTTY`: the driver has an ioctl
//!   handler, and that is its default). Before either driver, `fs/ioctl.c`
//!   answers a few requests itself ([`uapi::vfs`]).
//! - `drivers/rpmsg/virtio_rpmsg_bus.c`: over 496 bytes `EMSGSIZE`
//!   (`rpmsg_send_offchannel_raw`); no `set_flow_control` op, so
//!   `rpmsg_set_flow_control` (rpmsg_core.c) answers `EOPNOTSUPP`, and the
//!   outgoing flow is never restricted (reads 0); channels made with
//!   `RPMSG_CREATE_DEV_IOCTL` are refused `ENXIO` if a matching one exists
//!   (`__rpmsg_create_channel`), released ones that do not exist `EINVAL`
//!   (`rpmsg_unregister_device`).

use std::mem::{offset_of, ManuallyDrop};
use std::os::fd::{FromRawFd, IntoRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

use iopath_rpmsg::ctrl::uapi::{RpmsgEndpointFdInfo, RpmsgEndpointInfo, ADDR_ANY, EPT_FD_FLAGS};
use iopath_rpmsg::ctrl::{CtrlClient, CtrlError, EptFd, EptInfo};
use iopath_rpmsg::wire::MAX_PAYLOAD;
use libc::{c_int, c_void, size_t, ssize_t};

use crate::fds::{self, Ctrl, Ept, Kind};
use crate::path::Dev;
use crate::uapi;

/// The endpoint service's control socket (`IOPATH_RPMSG_CTRL`), if set.
pub(crate) fn ctrl_path() -> Option<PathBuf> {
    std::env::var_os("IOPATH_RPMSG_CTRL")
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
    CHANNELS.lock().unwrap_or_else(|e| e.into_inner())
}

/// The fork handlers for this module's locks (see [`crate::fork`]).
pub(crate) mod fork {
    use super::*;
    use crate::fork::Held;

    type Guards = (
        MutexGuard<'static, Option<PathBuf>>,
        MutexGuard<'static, Vec<Channel>>,
    );

    static HELD: Held<Guards> = Held::new();

    /// Before fork: takes the node directory and the channel list.
    pub(crate) fn prepare() {
        let r = RUNDIR.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: called only from the prepare handler.
        unsafe { HELD.hold((r, channels())) };
    }

    /// After fork, in the parent: releases them.
    pub(crate) fn parent() {
        // SAFETY: called only from the parent handler.
        drop(unsafe { HELD.take() });
    }

    /// After fork, in the child: releases them.
    pub(crate) fn child() {
        // SAFETY: called only from the child handler.
        drop(unsafe { HELD.take() });
    }
}

/// The service's node directory: `IOPATH_RPMSG_RUNDIR`, else where its
/// answers put nodes, else its default (the socket path and `.d`).
fn rundir(ctrl: &std::path::Path) -> PathBuf {
    if let Some(d) = std::env::var_os("IOPATH_RPMSG_RUNDIR").filter(|v| !v.is_empty()) {
        return PathBuf::from(d);
    }
    if let Some(d) = RUNDIR.lock().unwrap_or_else(|e| e.into_inner()).clone() {
        return d;
    }
    let mut p = ctrl.as_os_str().to_owned();
    p.push(".d");
    PathBuf::from(p)
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
            adopt(
                ep.into_fd(),
                Kind::Ept(Arc::new(Ept {
                    node: Some(n),
                    accmode: flags & libc::O_ACCMODE,
                    destroyed: false.into(),
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

/// The program's endpoint `fd` as an [`EptFd`], never closed here.
fn ept(fd: c_int, node: bool) -> ManuallyDrop<EptFd> {
    // SAFETY: as in `client`, for an endpoint fd.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    ManuallyDrop::new(if node {
        EptFd::from_node_fd(owned)
    } else {
        EptFd::from_fd(owned)
    })
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
pub(crate) fn ctrl_ioctl(
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
    let Some(path) = ctrl_path() else {
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
        let plain = RpmsgEndpointInfo {
            name: f.name,
            src: f.src,
            dst: f.dst,
        };
        (plain, f.flags)
    } else {
        (uapi::copy_in_value::<RpmsgEndpointInfo>(arg)?, 0)
    };
    let (info, name) = ept_info(&raw)?;
    let _one_at_a_time = c.lock.lock().unwrap_or_else(|e| e.into_inner());
    if c.inherited.load(Ordering::Relaxed) {
        reconnect(c)?;
    }
    match cmd {
        uapi::CREATE_EPT => {
            let (_, node) = client(fd).create_ept(&info).map_err(|e| errno_of(&e))?;
            // (A service started with a relative --ctrl answers paths
            // relative to its own directory: not ours to resolve.)
            if let Some(dir) = node.parent().filter(|d| d.is_absolute()) {
                *RUNDIR.lock().unwrap_or_else(|e| e.into_inner()) = Some(dir.to_owned());
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
            let new = adopt(
                ep.into_fd(),
                Kind::Ept(Arc::new(Ept {
                    node: None,
                    accmode: flags as c_int & libc::O_ACCMODE,
                    destroyed: false.into(),
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

/// Whether the service side of endpoint `fd` is gone (a hang-up).
fn hung_up(fd: c_int) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN | libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one pollfd, ours; no wait.
    let n = unsafe { crate::real::poll(&mut p, 1, 0) };
    n == 1 && p.revents & (libc::POLLHUP | libc::POLLRDHUP | libc::POLLERR) != 0
}

/// Whether the endpoint is gone: destroyed through the preload, or its
/// service side hung up (the remote or the service gone).
fn gone(fd: c_int, e: &Ept) -> bool {
    e.destroyed.load(Ordering::Relaxed) || hung_up(fd)
}

/// An ioctl on endpoint fd `fd`; `None`: the real ioctl answers it.
pub(crate) fn ept_ioctl(fd: c_int, e: &Ept, cmd: u32, arg: usize) -> Option<Result<c_int, c_int>> {
    match uapi::vfs(cmd, arg) {
        uapi::Vfs::PassOn => return None,
        uapi::Vfs::Answer(r) => return Some(r),
        uapi::Vfs::Driver => {}
    }
    Some(match cmd {
        uapi::DESTROY_EPT => {
            // Destroying an endpoint already gone answers 0, as
            // rpmsg_chrdev_eptdev_destroy does.
            if !e.destroyed.swap(true, Ordering::Relaxed) {
                let _ = ept(fd, e.node.is_some()).shut();
                if let Some(n) = e.node {
                    fds::legacy_destroyed(n);
                }
            }
            Ok(0)
        }
        // put_user(eptdev->remote_flow_restricted): virtio never restricts.
        uapi::GET_OUTGOING_FLOWCONTROL => uapi::copy_out(arg, &0i32.to_ne_bytes()).map(|()| 0),
        uapi::SET_INCOMING_FLOWCONTROL if arg > 1 => Err(libc::EINVAL),
        // rpmsg_set_flow_control: WARN_ON(!ept) -> EINVAL, then no op.
        uapi::SET_INCOMING_FLOWCONTROL if gone(fd, e) => Err(libc::EINVAL),
        uapi::SET_INCOMING_FLOWCONTROL => Err(libc::EOPNOTSUPP),
        _ => Err(libc::EINVAL),
    })
}

/// `-1` with `errno`.
fn fail(errno: c_int) -> ssize_t {
    crate::set_errno(errno);
    -1
}

/// `read(2)` / `recv(2)` on endpoint fd `fd`.
///
/// # Safety
/// `buf` is valid for `n` bytes of writes, as for `read(2)`.
pub(crate) unsafe fn ept_read(
    fd: c_int,
    e: &Ept,
    buf: *mut c_void,
    n: size_t,
    flags: c_int,
) -> ssize_t {
    if e.accmode == libc::O_WRONLY {
        return fail(libc::EBADF);
    }
    if e.destroyed.load(Ordering::Relaxed) {
        return fail(libc::EPIPE);
    }
    // SAFETY: as the caller promises.
    let got = unsafe { crate::real::recv(fd, buf, n, flags) };
    if got == 0 && n > 0 && hung_up(fd) {
        // End of file: the endpoint is gone (an empty message leaves the
        // socket up).
        return fail(libc::EPIPE);
    }
    if got < 0 && crate::errno() == libc::ECONNRESET {
        return fail(libc::EPIPE);
    }
    got
}

/// `write(2)` / `send(2)` on endpoint fd `fd`.
///
/// # Safety
/// `buf` is valid for `n` bytes of reads, as for `write(2)`.
pub(crate) unsafe fn ept_write(
    fd: c_int,
    e: &Ept,
    buf: *const c_void,
    n: size_t,
    flags: c_int,
) -> ssize_t {
    if e.accmode == libc::O_RDONLY {
        return fail(libc::EBADF);
    }
    if e.destroyed.load(Ordering::Relaxed) {
        return fail(libc::EPIPE);
    }
    if n > MAX_PAYLOAD {
        // rpmsg_eptdev_write_iter checks for the endpoint first.
        return fail(if hung_up(fd) {
            libc::EPIPE
        } else {
            libc::EMSGSIZE
        });
    }
    // SAFETY: as the caller promises. MSG_NOSIGNAL: the kernel's rpmsg
    // write answers EPIPE and raises no SIGPIPE.
    let sent = unsafe { crate::real::send(fd, buf, n, flags | libc::MSG_NOSIGNAL) };
    if sent < 0 && crate::errno() == libc::ECONNRESET {
        return fail(libc::EPIPE);
    }
    sent
}

/// `readv(2)` on endpoint fd `fd`: one message scattered over the
/// buffers, as rpmsg_char's `read_iter` fills them.
///
/// # Safety
/// `iov` points to `n` iovecs valid for writes, as for `readv(2)`.
pub(crate) unsafe fn ept_readv(fd: c_int, e: &Ept, iov: *const libc::iovec, n: c_int) -> ssize_t {
    if e.accmode == libc::O_WRONLY {
        return fail(libc::EBADF);
    }
    if e.destroyed.load(Ordering::Relaxed) {
        return fail(libc::EPIPE);
    }
    // SAFETY: as the caller promises.
    let got = unsafe { crate::real::readv(fd, iov, n) };
    // SAFETY: as the caller promises (only the lengths are read).
    let room = unsafe { iov_len(iov, n) };
    if got == 0 && room.is_some_and(|r| r > 0) && hung_up(fd) {
        return fail(libc::EPIPE);
    }
    if got < 0 && crate::errno() == libc::ECONNRESET {
        return fail(libc::EPIPE);
    }
    got
}

/// `writev(2)` on endpoint fd `fd`: the buffers make one message, as
/// rpmsg_char's `write_iter` sends them.
///
/// # Safety
/// `iov` points to `n` iovecs valid for reads, as for `writev(2)`.
pub(crate) unsafe fn ept_writev(fd: c_int, e: &Ept, iov: *const libc::iovec, n: c_int) -> ssize_t {
    if e.accmode == libc::O_RDONLY {
        return fail(libc::EBADF);
    }
    if e.destroyed.load(Ordering::Relaxed) {
        return fail(libc::EPIPE);
    }
    // SAFETY: as the caller promises (only the lengths are read).
    let Some(len) = (unsafe { iov_len(iov, n) }) else {
        return fail(libc::EINVAL);
    };
    if len > MAX_PAYLOAD {
        return fail(if hung_up(fd) {
            libc::EPIPE
        } else {
            libc::EMSGSIZE
        });
    }
    // SAFETY: a zeroed msghdr is valid; it carries only the program's
    // iovecs.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov as *mut libc::iovec;
    msg.msg_iovlen = n as _;
    // SAFETY: as the caller promises; MSG_NOSIGNAL as in `ept_write`.
    let sent = unsafe { crate::real::sendmsg(fd, &msg, libc::MSG_NOSIGNAL) };
    if sent < 0 && crate::errno() == libc::ECONNRESET {
        return fail(libc::EPIPE);
    }
    sent
}

/// The total length of `n` iovecs; `None` if `n` is out of range or the
/// sum overflows (the kernel's `EINVAL`).
///
/// # Safety
/// `iov` points to `n` readable iovecs.
unsafe fn iov_len(iov: *const libc::iovec, n: c_int) -> Option<usize> {
    if !(0..=libc::UIO_MAXIOV).contains(&n) || (n > 0 && iov.is_null()) {
        return None;
    }
    let mut total = 0usize;
    for i in 0..n as usize {
        // SAFETY: within the `n` iovecs the caller vouches for.
        total = total.checked_add(unsafe { (*iov.add(i)).iov_len })?;
    }
    (total <= isize::MAX as usize).then_some(total)
}

/// After `poll`: endpoint fds that are gone report `POLLERR` with the
/// hang-up (rpmsg_eptdev_poll answers `EPOLLERR` once the endpoint is
/// gone; the socket alone reports only the hang-up).
pub(crate) fn fix_revents(fds_: &mut [libc::pollfd]) {
    for p in fds_.iter_mut() {
        if !fds::is_ours(p.fd) {
            continue;
        }
        if let Some(Kind::Ept(e)) = fds::get(p.fd) {
            if p.revents & libc::POLLHUP != 0 || e.destroyed.load(Ordering::Relaxed) {
                p.revents |= libc::POLLHUP | libc::POLLERR;
            }
        }
    }
}
