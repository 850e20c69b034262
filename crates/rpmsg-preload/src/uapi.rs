//! The Linux rpmsg ioctls (`include/uapi/linux/rpmsg.h`, and
//! `RPMSG_CREATE_EPT_FD_IOCTL` from the rpmsg-next series that adds it),
//! what the VFS answers before the driver, and the kernel's
//! `copy_from_user` / `copy_to_user` as seen from user space. The structs
//! the ioctls name are iopath-rpmsg's ([`iopath_rpmsg::ctrl::uapi`]).

use iopath_rpmsg::ctrl::uapi::{RpmsgEndpointFdInfo, RpmsgEndpointInfo};
use libc::c_int;
use rustix::ioctl::opcode;
use vm_memory::ByteValued;

/// The rpmsg ioctls' type (`0xb5`).
const RPMSG: u8 = 0xb5;

/// `_IOW(0xb5, 0x1, struct rpmsg_endpoint_info)`.
pub(crate) const CREATE_EPT: u32 = opcode::write::<RpmsgEndpointInfo>(RPMSG, 1);
/// `_IO(0xb5, 0x2)`.
pub(crate) const DESTROY_EPT: u32 = opcode::none(RPMSG, 2);
/// `_IOW(0xb5, 0x3, struct rpmsg_endpoint_info)`.
pub(crate) const CREATE_DEV: u32 = opcode::write::<RpmsgEndpointInfo>(RPMSG, 3);
/// `_IOW(0xb5, 0x4, struct rpmsg_endpoint_info)`.
pub(crate) const RELEASE_DEV: u32 = opcode::write::<RpmsgEndpointInfo>(RPMSG, 4);
/// `_IOR(0xb5, 0x5, int)`.
pub(crate) const GET_OUTGOING_FLOWCONTROL: u32 = opcode::read::<c_int>(RPMSG, 5);
/// `_IOR(0xb5, 0x6, int)`.
pub(crate) const SET_INCOMING_FLOWCONTROL: u32 = opcode::read::<c_int>(RPMSG, 6);
/// `_IOWR(0xb5, 0x7, struct rpmsg_endpoint_fd_info)`.
pub(crate) const CREATE_EPT_FD: u32 = opcode::read_write::<RpmsgEndpointFdInfo>(RPMSG, 7);

/// What `fs/ioctl.c` (`do_vfs_ioctl`) does with a request on an rpmsg fd
/// before the driver sees it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Vfs {
    /// Answered for any file, the same for the socket under the fd: the
    /// real `ioctl` answers it (`FIOCLEX`, `FIONCLEX`, `FIONBIO`).
    PassOn,
    /// Answered by the VFS, here (the socket would answer otherwise).
    Answer(Result<c_int, c_int>),
    /// Passed to the driver: rpmsg_ctrl's or rpmsg_char's `ioctl`.
    Driver,
}

/// How `do_vfs_ioctl` treats `cmd` (argument `arg`) on an rpmsg fd, whose
/// inode is a character device or an anonymous inode:
///
/// - `FIOASYNC`: `ioctl_fioasync` reads the flag (`EFAULT`), and turning
///   it on is `ENOTTY`: rpmsg's files have no `fasync` (so `FASYNC` is
///   never set on them; a socket would accept it).
/// - `FIOQSIZE`: only directories, regular files and links have a size
///   to report; anything else is `ENOTTY`.
///
/// Every other request (`TCGETS` from `isatty`, `FIONREAD`, ...) goes to
/// the driver, which answers `EINVAL` for what it does not know.
pub(crate) fn vfs(cmd: u32, arg: usize) -> Vfs {
    match cmd as libc::c_ulong {
        libc::FIOCLEX | libc::FIONCLEX | libc::FIONBIO => Vfs::PassOn,
        libc::FIOASYNC => {
            let mut on = [0u8; 4];
            Vfs::Answer(copy_in(arg, &mut on).and_then(|()| {
                if i32::from_ne_bytes(on) != 0 {
                    Err(libc::ENOTTY)
                } else {
                    Ok(0)
                }
            }))
        }
        libc::FIOQSIZE => Vfs::Answer(Err(libc::ENOTTY)),
        _ => Vfs::Driver,
    }
}

/// Reads `out.len()` bytes of the program's memory at `addr`: `EFAULT` if
/// any of it is not readable, as the kernel's `copy_from_user`.
pub(crate) fn copy_in(addr: usize, out: &mut [u8]) -> Result<(), c_int> {
    if addr == 0 {
        return Err(libc::EFAULT);
    }
    let local = libc::iovec {
        iov_base: out.as_mut_ptr().cast(),
        iov_len: out.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: out.len(),
    };
    // SAFETY: `local` is our buffer of that length; `remote` is only read
    // by the kernel, which checks it (process_vm_readv(2) on ourselves).
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    if n == out.len() as isize {
        return Ok(());
    }
    match crate::errno() {
        // A sandbox that forbids process_vm_readv: trust the pointer as
        // the program's own code would.
        libc::EPERM | libc::ENOSYS => {
            // SAFETY: not null; the program passed it as a pointer to this
            // struct, whose size the ioctl number names.
            unsafe {
                std::ptr::copy_nonoverlapping(addr as *const u8, out.as_mut_ptr(), out.len())
            };
            Ok(())
        }
        _ => Err(libc::EFAULT),
    }
}

/// Reads the `T` at `addr` in the program's memory (the struct an ioctl
/// number names), as [`copy_in`].
pub(crate) fn copy_in_value<T: ByteValued + Default>(addr: usize) -> Result<T, c_int> {
    let mut v = T::default();
    copy_in(addr, v.as_mut_slice())?;
    Ok(v)
}

/// Writes `data` to the program's memory at `addr`: `EFAULT` if it is not
/// writable, as the kernel's `copy_to_user` / `put_user`.
pub(crate) fn copy_out(addr: usize, data: &[u8]) -> Result<(), c_int> {
    if addr == 0 {
        return Err(libc::EFAULT);
    }
    let local = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: `local` is only read; `remote` is checked by the kernel
    // (process_vm_writev(2) on ourselves).
    let n = unsafe { libc::process_vm_writev(libc::getpid(), &local, 1, &remote, 1, 0) };
    if n == data.len() as isize {
        return Ok(());
    }
    match crate::errno() {
        libc::EPERM | libc::ENOSYS => {
            // SAFETY: as in `copy_in`, the program's pointer to the struct.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), addr as *mut u8, data.len()) };
            Ok(())
        }
        _ => Err(libc::EFAULT),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_linux_s() {
        // The values in DESIGN.md "Facts" and the kernel's headers.
        assert_eq!(CREATE_EPT, 0x4028_B501);
        assert_eq!(DESTROY_EPT, 0xB502);
        assert_eq!(CREATE_DEV, 0x4028_B503);
        assert_eq!(RELEASE_DEV, 0x4028_B504);
        assert_eq!(GET_OUTGOING_FLOWCONTROL, 0x8004_B505);
        assert_eq!(SET_INCOMING_FLOWCONTROL, 0x8004_B506);
        assert_eq!(CREATE_EPT_FD, 0xC030_B507);
    }

    #[test]
    fn the_vfs_answers_before_the_driver() {
        let (on, off) = (1i32, 0i32);
        assert_eq!(vfs(libc::FIOCLEX as u32, 0), Vfs::PassOn);
        assert_eq!(vfs(libc::FIONBIO as u32, 0), Vfs::PassOn);
        let fioasync = libc::FIOASYNC as u32;
        assert_eq!(
            vfs(fioasync, &on as *const i32 as usize),
            Vfs::Answer(Err(libc::ENOTTY))
        );
        assert_eq!(
            vfs(fioasync, &off as *const i32 as usize),
            Vfs::Answer(Ok(0))
        );
        assert_eq!(vfs(fioasync, 0), Vfs::Answer(Err(libc::EFAULT)));
        assert_eq!(
            vfs(libc::FIOQSIZE as u32, 0),
            Vfs::Answer(Err(libc::ENOTTY))
        );
        for driver in [libc::TCGETS, libc::FIONREAD, 0xb542] {
            assert_eq!(vfs(driver as u32, 0), Vfs::Driver);
        }
        assert_eq!(vfs(CREATE_EPT, 0), Vfs::Driver);
    }

    #[test]
    fn user_copies_fault_like_the_kernel() {
        let src = *b"0123456789";
        let mut got = [0u8; 10];
        copy_in(src.as_ptr() as usize, &mut got).unwrap();
        assert_eq!(got, src);
        assert_eq!(copy_in(0, &mut got), Err(libc::EFAULT));
        // An address no process maps (the top of the canonical low half).
        assert_eq!(copy_in(0x7fff_ffff_f000, &mut got), Err(libc::EFAULT));
        let mut dst = [0u8; 4];
        copy_out(dst.as_mut_ptr() as usize, b"abcd").unwrap();
        assert_eq!(&dst, b"abcd");
        assert_eq!(copy_out(8, b"abcd"), Err(libc::EFAULT));
    }
}
