//! Several messages off an endpoint's socket in one `recvmmsg(2)`: a
//! client's burst costs one system call, and a lone message no second
//! call that finds nothing (the call stops at the first `EAGAIN`).

use std::os::fd::BorrowedFd;

use crate::shm::sock_rx::{recv_iovecs, MAX_RANGES};

/// Messages per call.
pub(super) const BATCH: usize = MAX_RANGES;

/// Buffers for [`BATCH`] messages, reused call after call.
pub(super) struct RecvBatch {
    /// BATCH slots of `slot` bytes each, one after the other.
    bufs: Box<[u8]>,
    /// One slot: the largest payload and one byte more (anything longer
    /// is cut, and its full length reported).
    slot: usize,
    /// Full length of each message of the last call (`MSG_TRUNC`).
    lens: [usize; BATCH],
}

impl RecvBatch {
    /// Slots for messages of up to `max_payload` bytes.
    pub(super) fn new(max_payload: usize) -> Self {
        let slot = max_payload + 1;
        RecvBatch {
            bufs: vec![0u8; slot * BATCH].into_boxed_slice(),
            slot,
            lens: [0; BATCH],
        }
    }

    /// A buffer for one packet of another kind (a control request).
    pub(super) fn scratch(&mut self) -> &mut [u8] {
        &mut self.bufs[..self.slot]
    }

    /// Takes up to `max` (at most [`BATCH`]) messages from `fd` without waiting
    /// ([recvmmsg(2)](https://man7.org/linux/man-pages/man2/recvmmsg.2.html)
    /// with `MSG_DONTWAIT | MSG_TRUNC`; one message with
    /// [recv(2)](https://man7.org/linux/man-pages/man2/recv.2.html), which
    /// costs the kernel less); returns how many. Fewer than `max` means
    /// the socket had no more (or an error is pending, reported by the
    /// next call). End of file reads as one empty message.
    ///
    /// # Errors
    /// The call's errno when it took nothing (`EAGAIN`: none queued).
    pub(super) fn recv(
        &mut self,
        fd: BorrowedFd<'_>,
        max: usize,
    ) -> Result<usize, rustix::io::Errno> {
        let max = max.clamp(1, BATCH);
        // SAFETY: iovec is a plain C struct for which all zero bytes is a
        // valid value (null pointer, zero length).
        let mut iov: [libc::iovec; BATCH] = unsafe { std::mem::zeroed() };
        for (v, buf) in iov.iter_mut().zip(self.bufs.chunks_exact_mut(self.slot)) {
            v.iov_base = buf.as_mut_ptr().cast();
            v.iov_len = buf.len();
        }
        // SAFETY: each iovec names one `slot`-byte chunk of `self.bufs`,
        // exclusively borrowed for the call; no Rust reference to it is
        // used while the kernel writes.
        unsafe { recv_iovecs(fd, &mut iov[..max], &mut self.lens) }
    }

    /// Message `i` of the last call: its bytes (cut to the slot) and its
    /// full length.
    pub(super) fn get(&self, i: usize) -> (&[u8], usize) {
        let full = self.lens[i];
        let at = i * self.slot;
        (&self.bufs[at..at + full.min(self.slot)], full)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::net::{AddressFamily, SendFlags, SocketFlags, SocketType};
    use std::os::fd::AsFd;

    #[test]
    fn takes_a_burst_in_one_call_and_reports_lengths() {
        let (a, b) = rustix::net::socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )
        .unwrap();
        let mut batch = RecvBatch::new(crate::wire::MAX_PAYLOAD);
        assert_eq!(batch.recv(b.as_fd(), BATCH), Err(rustix::io::Errno::AGAIN));
        let big = vec![7u8; 600];
        for m in [&b"one"[..], &b""[..], &[9u8; 496][..], &big[..]] {
            rustix::net::send(&a, m, SendFlags::empty()).unwrap();
        }
        assert_eq!(batch.recv(b.as_fd(), BATCH), Ok(4));
        assert_eq!(batch.get(0), (&b"one"[..], 3));
        assert_eq!(batch.get(1), (&b""[..], 0));
        assert_eq!(batch.get(2), (&[9u8; 496][..], 496));
        let (cut, full) = batch.get(3);
        assert_eq!((cut.len(), full), (497, 600));
        assert!(cut.iter().all(|&x| x == 7));
        assert_eq!(batch.recv(b.as_fd(), BATCH), Err(rustix::io::Errno::AGAIN));
        for i in 0..(BATCH + 3) {
            rustix::net::send(&a, &[i as u8], SendFlags::empty()).unwrap();
        }
        assert_eq!(batch.recv(b.as_fd(), BATCH), Ok(BATCH));
        assert_eq!(batch.get(BATCH - 1), (&[(BATCH - 1) as u8][..], 1));
        assert_eq!(batch.recv(b.as_fd(), 1), Ok(1));
        assert_eq!(batch.get(0), (&[BATCH as u8][..], 1));
        assert_eq!(batch.recv(b.as_fd(), BATCH), Ok(2));
        assert_eq!(batch.get(1), (&[(BATCH + 2) as u8][..], 1));
        // One at a time: the same cut, lengths and end of file.
        assert_eq!(batch.recv(b.as_fd(), 1), Err(rustix::io::Errno::AGAIN));
        for m in [&big[..], &b""[..], &b"two"[..]] {
            rustix::net::send(&a, m, SendFlags::empty()).unwrap();
        }
        assert_eq!(batch.recv(b.as_fd(), 1), Ok(1));
        let (cut, full) = batch.get(0);
        assert_eq!((cut.len(), full), (497, 600));
        assert!(cut.iter().all(|&x| x == 7));
        assert_eq!(batch.recv(b.as_fd(), 1), Ok(1));
        assert_eq!(batch.get(0), (&b""[..], 0));
        drop(a);
        assert_eq!(batch.recv(b.as_fd(), 1), Ok(1));
        assert_eq!(batch.get(0), (&b"two"[..], 3));
        assert_eq!(batch.recv(b.as_fd(), 1), Ok(1));
        assert_eq!(batch.get(0), (&b""[..], 0));
    }
}
