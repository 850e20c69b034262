//! What an endpoint fd (an opened `/dev/rpmsgN`, or one made by
//! `RPMSG_CREATE_EPT_FD_IOCTL`) does: its ioctls, reads, writes and poll
//! events, with the errnos Linux gives, from its sources (v7.x):
//!
//! - `drivers/rpmsg/rpmsg_char.c`: read and write `EPIPE` once the
//!   endpoint is gone; poll `EPOLLERR`; `rpmsg_eptdev_ioctl` answers the
//!   flow-control requests and destroy, anything else `EINVAL` (not
//!   `ENOTTY`: the driver has an ioctl handler, and that is its default).
//!   Before the driver, `fs/ioctl.c` answers a few requests itself
//!   ([`uapi::vfs`]).
//! - `drivers/rpmsg/virtio_rpmsg_bus.c`: `EMSGSIZE` over the tx buffer
//!   size less the 16-byte header (`rpmsg_send_offchannel_raw`): 496
//!   bytes, or what the service negotiated (the endpoint's `max_payload`, as
//!   Linux's buffer-size proposal moves the same check); no `set_flow_control` op, so
//!   `rpmsg_set_flow_control` (rpmsg_core.c) answers `EOPNOTSUPP`, and the
//!   outgoing flow is never restricted (reads 0).

use std::mem::ManuallyDrop;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::atomic::Ordering;

use iopath_rpmsg::ctrl::EptFd;
use libc::{c_int, c_void, size_t, ssize_t};

use crate::fds::{self, Ept, Kind};
use crate::uapi;

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
pub(crate) fn ioctl(fd: c_int, e: &Ept, cmd: u32, arg: usize) -> Option<Result<c_int, c_int>> {
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
pub(crate) unsafe fn read(
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
pub(crate) unsafe fn write(
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
    if n > e.max_payload {
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
pub(crate) unsafe fn readv(fd: c_int, e: &Ept, iov: *const libc::iovec, n: c_int) -> ssize_t {
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
pub(crate) unsafe fn writev(fd: c_int, e: &Ept, iov: *const libc::iovec, n: c_int) -> ssize_t {
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
    if len > e.max_payload {
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
    // SAFETY: as the caller promises; MSG_NOSIGNAL as in `write`.
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
