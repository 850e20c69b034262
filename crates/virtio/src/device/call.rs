//! A vring's call eventfd: how the device tells the driver that used
//! buffers are there.

use std::fs::File;
use std::sync::Mutex;

use iopath_sys::lock;

/// The call eventfd of a vring; the front end may replace it at any time.
#[derive(Debug, Default)]
pub(crate) struct CallFd {
    fd: Mutex<Option<File>>,
}

impl CallFd {
    /// Replaces the fd (`SET_VRING_CALL`); `None` leaves the vring
    /// without one.
    pub(super) fn set(&self, fd: Option<File>) {
        *lock(&self.fd) = fd;
    }

    /// Signals the driver through the current fd, if there is one.
    pub(super) fn signal(&self) {
        let guard = lock(&self.fd);
        if let Some(fd) = guard.as_ref() {
            // An eventfd write only fails when the counter would overflow,
            // in which case the front end has a wake-up pending anyway.
            let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
        }
    }
}
