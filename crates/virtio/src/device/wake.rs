//! Waking a queue's thread: the driver's kick, the server's stop, or one
//! more descriptor the device waits on (an io_uring completion eventfd).

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

/// What woke [`QueueContext::wait`](super::QueueContext::wait).
#[derive(Clone, Copy, Debug, Default, Eq, PartialEq)]
pub struct Wake {
    /// The driver kicked the queue.
    pub kick: bool,
    /// The server asks the queue to stop.
    pub stop: bool,
    /// The extra descriptor passed to `wait` is readable.
    pub extra: bool,
}

/// Blocks until `kick`, `stop` or `extra` becomes readable; a kick is
/// consumed.
///
/// # Errors
/// The `poll(2)` error, other than `EINTR`.
pub(super) fn wait(kick: &File, stop: &OwnedFd, extra: Option<BorrowedFd<'_>>) -> io::Result<Wake> {
    use rustix::event::{poll, PollFd, PollFlags};
    loop {
        let mut fds = vec![
            PollFd::new(kick, PollFlags::IN),
            PollFd::new(stop, PollFlags::IN),
        ];
        if let Some(fd) = extra.as_ref() {
            fds.push(PollFd::from_borrowed_fd(fd.as_fd(), PollFlags::IN));
        }
        match poll(&mut fds, None) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
        let ready = |i: usize| fds.get(i).is_some_and(|f| !f.revents().is_empty());
        let wake = Wake {
            kick: ready(0),
            stop: ready(1),
            extra: ready(2),
        };
        drop(fds);
        if wake.kick {
            let mut buf = [0u8; 8];
            // A kick fd that is not an eventfd may fail to read; the
            // wake-up still counts as a kick.
            let _ = rustix::io::read(kick, &mut buf);
        }
        return Ok(wake);
    }
}
