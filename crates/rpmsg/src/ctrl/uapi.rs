//! The Linux rpmsg uAPI structs (`include/uapi/linux/rpmsg.h`, with
//! `struct rpmsg_endpoint_fd_info` from the rpmsg-next series that adds
//! `RPMSG_CREATE_EPT_FD_IOCTL`) and the open flags that ioctl accepts.
//!
//! These are the one definition of the structs' layouts and sizes: the
//! endpoint service's requests ([`super::proto`]) mirror them, and the
//! `LD_PRELOAD` library reads and writes them in a program's memory and
//! builds its ioctl numbers from them.

use std::mem::size_of;

use vm_memory::ByteValued;

use crate::wire::NAME_SIZE;

/// `RPMSG_ADDR_ANY`: let the bus pick the source, or bind the destination
/// later (`include/linux/rpmsg.h`).
pub use crate::wire::ADDR_ANY;

/// `struct rpmsg_endpoint_info`: what `RPMSG_CREATE_EPT_IOCTL`,
/// `RPMSG_CREATE_DEV_IOCTL` and `RPMSG_RELEASE_DEV_IOCTL` take.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RpmsgEndpointInfo {
    /// Endpoint name; the kernel cuts it to 31 bytes and a NUL.
    pub name: [u8; NAME_SIZE],
    /// Local address, or [`ADDR_ANY`].
    pub src: u32,
    /// Peer address, or [`ADDR_ANY`].
    pub dst: u32,
}

// SAFETY: `repr(C)` of a byte array and two `u32`s (40 bytes, no padding, as
// asserted below): every bit pattern is a valid value.
unsafe impl ByteValued for RpmsgEndpointInfo {}

/// `struct rpmsg_endpoint_fd_info`: what `RPMSG_CREATE_EPT_FD_IOCTL` takes,
/// and where it returns the new endpoint's fd.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RpmsgEndpointFdInfo {
    /// Endpoint name; the kernel cuts it to 31 bytes and a NUL.
    pub name: [u8; NAME_SIZE],
    /// Local address, or [`ADDR_ANY`].
    pub src: u32,
    /// Peer address, or [`ADDR_ANY`].
    pub dst: u32,
    /// Open flags of the new fd, within [`EPT_FD_FLAGS`].
    pub flags: u32,
    /// The new endpoint's fd (written back by the ioctl).
    pub fd: i32,
}

// SAFETY: `repr(C)` of a byte array and four 32-bit integers (48 bytes, no
// padding, as asserted below): every bit pattern is a valid value.
unsafe impl ByteValued for RpmsgEndpointFdInfo {}

impl RpmsgEndpointFdInfo {
    /// `info`'s fields, then `flags` and `fd`.
    pub fn new(info: RpmsgEndpointInfo, flags: u32, fd: i32) -> Self {
        RpmsgEndpointFdInfo {
            name: info.name,
            src: info.src,
            dst: info.dst,
            flags,
            fd,
        }
    }

    /// The fields it shares with `struct rpmsg_endpoint_info`.
    pub fn info(&self) -> RpmsgEndpointInfo {
        RpmsgEndpointInfo {
            name: self.name,
            src: self.src,
            dst: self.dst,
        }
    }
}

/// `sizeof(struct rpmsg_endpoint_info)`.
pub const EPT_INFO_LEN: usize = size_of::<RpmsgEndpointInfo>();
/// `sizeof(struct rpmsg_endpoint_fd_info)`.
pub const EPT_FD_INFO_LEN: usize = size_of::<RpmsgEndpointFdInfo>();

const _: () = assert!(EPT_INFO_LEN == 40);
const _: () = assert!(EPT_FD_INFO_LEN == 48);

/// The open flags `RPMSG_CREATE_EPT_FD_IOCTL` accepts: `O_ACCMODE |
/// O_NONBLOCK | O_CLOEXEC`; any other bit is `EINVAL`.
pub const EPT_FD_FLAGS: u32 = (libc::O_ACCMODE | libc::O_NONBLOCK | libc::O_CLOEXEC) as u32;

#[cfg(test)]
mod tests {
    use std::mem::offset_of;

    use super::*;

    #[test]
    fn layouts_are_the_kernel_s() {
        assert_eq!(offset_of!(RpmsgEndpointInfo, src), 32);
        assert_eq!(offset_of!(RpmsgEndpointInfo, dst), 36);
        assert_eq!(offset_of!(RpmsgEndpointFdInfo, src), 32);
        assert_eq!(offset_of!(RpmsgEndpointFdInfo, dst), 36);
        assert_eq!(offset_of!(RpmsgEndpointFdInfo, flags), 40);
        assert_eq!(offset_of!(RpmsgEndpointFdInfo, fd), 44);
        assert_eq!(ADDR_ANY, 0xFFFF_FFFF);
        assert_eq!(EPT_FD_FLAGS, 0o2_004_003);
    }

    #[test]
    fn structs_read_and_write_whole() {
        let mut info = RpmsgEndpointFdInfo {
            src: 1024,
            dst: ADDR_ANY,
            flags: libc::O_RDWR as u32,
            fd: -1,
            ..Default::default()
        };
        info.name[..4].copy_from_slice(b"echo");
        let bytes = info.as_slice().to_vec();
        assert_eq!(bytes.len(), EPT_FD_INFO_LEN);
        assert_eq!(&bytes[..5], b"echo\0");
        assert_eq!(bytes[44..], (-1i32).to_ne_bytes());
        let mut back = RpmsgEndpointFdInfo::default();
        back.as_mut_slice().copy_from_slice(&bytes);
        assert_eq!(back, info);
        assert_eq!(
            RpmsgEndpointFdInfo::new(info.info(), info.flags, info.fd),
            info
        );
        assert_eq!(info.info().as_slice(), &bytes[..EPT_INFO_LEN]);
    }
}
