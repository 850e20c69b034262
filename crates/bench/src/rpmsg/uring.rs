//! The kept ends of [`Pass::Uring`](super::Pass::Uring) watched, read to
//! the end of file and closed through an io_uring, as a service built on
//! an io_uring event loop would do it: limit-w's per-endpoint kernel work
//! without epoll.
//!
//! ```text
//!   add(end) --queue--> POLL_ADD (POLLIN|POLLRDHUP, single shot)
//!                          | linked: runs when the client wrote or closed
//!                          v
//!                       RECV (MSG_DONTWAIT) -- data: counted, both again
//!                          | CQE: 0, end of file
//!                          v
//!                       CLOSE --> CQE: the end is gone
//! ```
//!
//! Nothing is submitted one system call each. Per pass (one request) the
//! server reaps the completion queue (no system call) and queues what
//! follows from it, then tries the next request with `recv(MSG_DONTWAIT)`.
//! Only when none is there does it queue a `RECV` on the control
//! connection and make one `io_uring_enter` that submits everything queued
//! and waits (`submit_and_wait`); when one is there, it submits anyway
//! once [`WATCH_DRAIN`] passes went by without an enter. So nothing queued
//! waits unsubmitted while the server could block, and never longer than
//! 16 passes while it is busy: limit-w's own bound (its `epoll_wait` every
//! 16 passes). A service built this way watches a new endpoint within 16
//! passes of handing it out, reads a message on it (or its end of file)
//! at the system call after the poll sees it (the read is linked to the
//! poll: one submission), and closes an end within 16 passes of that read
//! (its `CLOSE` goes with the next submission).
//!
//! The bound matters: with every process on one CPU the server almost
//! never finds itself waiting (the client runs on the answer's wake-up and
//! has the next request queued before the server looks), so "submit only
//! before blocking" alone would let the queue fill (256 entries) before
//! anything were watched.
//!
//! The ring runs its completions' task work cooperatively
//! (`IORING_SETUP_COOP_TASKRUN`, with `IORING_SETUP_TASKRUN_FLAG` so that
//! a submission also takes pending completions): a client's close does not
//! interrupt the server, which finishes the poll at its next system call.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd};
use std::ptr::NonNull;

use io_uring::{opcode, squeue, types, IoUring};
use rustix::event::PollFlags;
use rustix::net::RecvFlags;

use super::WATCH_DRAIN;
use crate::{Error, Result};

/// Submission queue entries; the completion queue is twice that, and the
/// kernel keeps what overflows it (`IORING_FEAT_NODROP`).
const SQ_ENTRIES: u32 = 256;
/// The largest request taken from the control connection.
pub(super) const REQ: usize = 128;
/// Where a kept end's reads go: nobody looks at what they bring.
const SCRATCH: usize = 512;

/// What a completion is for: the low bits of its `user_data`, the end's
/// key above them.
const TAG_BITS: u32 = 2;
const POLL: u64 = 0;
const RECV: u64 = 1;
const CLOSE: u64 = 2;
const CTRL: u64 = 3;

/// The io_uring and the kept ends it watches.
pub(super) struct UringWatch {
    ring: IoUring,
    /// The kept ends not yet handed to a `CLOSE`, by key.
    ends: HashMap<u64, OwnedFd>,
    /// `CLOSE`s queued or in flight.
    closing: usize,
    next_key: u64,
    /// Entries queued or submitted whose completion was not reaped yet.
    inflight: usize,
    /// Reads of a kept end that brought data (none in the bench).
    messages: u64,
    /// The control connection's `RECV` result, once reaped.
    ctrl_done: Option<usize>,
    /// Passes since the last `io_uring_enter`.
    since_enter: usize,
    /// The buffer of the `RECV` on the control connection ([`REQ`]
    /// bytes), owned here; only the kernel touches it while that `RECV`
    /// is in flight.
    ctrl_buf: NonNull<[u8; REQ]>,
    /// The buffer of the kept ends' `RECV`s ([`SCRATCH`] bytes), owned
    /// here and never read.
    scratch: NonNull<[u8; SCRATCH]>,
}

impl std::fmt::Debug for UringWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringWatch")
            .field("ends", &self.ends.len())
            .field("closing", &self.closing)
            .field("inflight", &self.inflight)
            .field("messages", &self.messages)
            .finish_non_exhaustive()
    }
}

/// A completion's negative result as the error it is.
fn cqe_err(op: &'static str, res: i32) -> Error {
    Error::Sys {
        op,
        source: std::io::Error::from_raw_os_error(-res),
    }
}

impl UringWatch {
    /// An io_uring of [`SQ_ENTRIES`] entries with no kept end yet, its
    /// task work run cooperatively (Linux 5.19).
    ///
    /// # Errors
    /// [`Error::Sys`] when the kernel refuses the ring.
    pub(super) fn new() -> Result<UringWatch> {
        let ring = IoUring::builder()
            .setup_coop_taskrun()
            .setup_taskrun_flag()
            .build(SQ_ENTRIES)
            .map_err(Error::sys("creating the io_uring (io_uring_setup)"))?;
        Ok(UringWatch {
            ring,
            ends: HashMap::new(),
            closing: 0,
            next_key: 0,
            inflight: 0,
            messages: 0,
            ctrl_done: None,
            since_enter: 0,
            ctrl_buf: NonNull::from(Box::leak(Box::new([0u8; REQ]))),
            scratch: NonNull::from(Box::leak(Box::new([0u8; SCRATCH]))),
        })
    }

    /// Kept ends not closed yet (watched, being read, or being closed).
    pub(super) fn held(&self) -> usize {
        self.ends.len() + self.closing
    }

    /// Reads of a kept end that brought data rather than the end of file.
    pub(super) fn messages(&self) -> u64 {
        self.messages
    }

    /// Queues `sqe`, submitting what is queued first if the queue is full.
    ///
    /// # Safety
    /// Every buffer `sqe` points to must stay valid, and untouched by this
    /// process if the kernel writes it, until its completion is reaped.
    unsafe fn push(&mut self, sqe: squeue::Entry) -> Result<()> {
        // SAFETY: the caller keeps `sqe`'s buffers valid until its
        // completion (the contract of `push`).
        while unsafe { self.ring.submission().push(&sqe) }.is_err() {
            self.ring
                .submit()
                .map_err(Error::sys("submitting a full io_uring (io_uring_enter)"))?;
        }
        self.inflight += 1;
        Ok(())
    }

    /// Queues the single-shot poll that sees the client write or close,
    /// and linked to it the read that follows.
    fn arm(&mut self, key: u64) -> Result<()> {
        let Some(end) = self.ends.get(&key) else {
            return Ok(());
        };
        let fd = types::Fd(end.as_raw_fd());
        let events = (PollFlags::IN | PollFlags::RDHUP).bits();
        let poll = opcode::PollAdd::new(fd, events.into())
            .build()
            .flags(squeue::Flags::IO_LINK)
            .user_data(key << TAG_BITS | POLL);
        let flags = (RecvFlags::DONTWAIT | RecvFlags::TRUNC).bits();
        let recv = opcode::Recv::new(fd, self.scratch.as_ptr().cast::<u8>(), SCRATCH as u32)
            .flags(flags as i32)
            .build()
            .user_data(key << TAG_BITS | RECV);
        // SAFETY: a poll points to no buffer; `scratch` lives as long as
        // the ring (freed only once nothing is in flight, see Drop) and
        // this process never reads or writes it. The end stays open in
        // `ends` until its CLOSE is queued, after the read's completion.
        unsafe {
            self.push(poll)?;
            self.push(recv)
        }
    }

    /// Watches `end` (its peer was just passed to the client) until the
    /// client closes it; then reads it to the end of file and closes it.
    /// Queued only: submitted when the server next waits.
    ///
    /// # Errors
    /// [`Error::Sys`] when a full queue cannot be submitted.
    pub(super) fn add(&mut self, end: OwnedFd) -> Result<()> {
        let key = self.next_key;
        self.next_key += 1;
        self.ends.insert(key, end);
        self.arm(key)
    }

    /// Takes every completion there is (no system call) and queues what
    /// follows from each.
    fn reap(&mut self) -> Result<()> {
        loop {
            let Some(cqe) = self.ring.completion().next() else {
                return Ok(());
            };
            self.inflight -= 1;
            let (key, res) = (cqe.user_data() >> TAG_BITS, cqe.result());
            match cqe.user_data() & ((1 << TAG_BITS) - 1) {
                // The linked read follows (or, if the poll failed, comes
                // back cancelled and says so).
                POLL if res >= 0 => {}
                POLL => return Err(cqe_err("watching a kept end (io_uring POLL_ADD)", res)),
                RECV => match res {
                    0 => {
                        let Some(end) = self.ends.remove(&key) else {
                            continue;
                        };
                        let sqe = opcode::Close::new(types::Fd(end.into_raw_fd()))
                            .build()
                            .user_data(key << TAG_BITS | CLOSE);
                        self.closing += 1;
                        // SAFETY: a close points to no buffer; the fd was
                        // taken out of its OwnedFd, so only the CLOSE will
                        // close it.
                        unsafe { self.push(sqe)? };
                    }
                    n if n > 0 => {
                        self.messages += 1;
                        self.arm(key)?;
                    }
                    n if -n == rustix::io::Errno::AGAIN.raw_os_error() => self.arm(key)?,
                    n => return Err(cqe_err("reading a kept end (io_uring RECV)", n)),
                },
                CLOSE => {
                    self.closing -= 1;
                    if res < 0 {
                        return Err(cqe_err("closing a kept end (io_uring CLOSE)", res));
                    }
                }
                _ => {
                    if res < 0 {
                        return Err(cqe_err(
                            "receiving a request (io_uring RECV on the control connection)",
                            res,
                        ));
                    }
                    self.ctrl_done = Some(res as usize);
                }
            }
        }
    }

    /// Submits what is queued and takes the completions whose task work
    /// is pending, without waiting; no system call when there is neither.
    fn submit(&mut self) -> Result<()> {
        let due = {
            let sq = self.ring.submission();
            !sq.is_empty() || sq.taskrun()
        };
        if due {
            self.since_enter = 0;
            self.ring
                .submit()
                .map_err(Error::sys("submitting to the io_uring (io_uring_enter)"))?;
        }
        Ok(())
    }

    /// Reaps, then submits what is queued without waiting: for a server
    /// about to block elsewhere.
    ///
    /// # Errors
    /// [`Error::Sys`] when a completion is an error or the submission
    /// fails.
    pub(super) fn flush(&mut self) -> Result<()> {
        self.reap()?;
        self.submit()
    }

    /// The next request on `ctrl`, into `req`: its length (0: the client
    /// hung up). Reaps first; tries `recv(MSG_DONTWAIT)` (and if that
    /// finds one, submits what is queued only when [`WATCH_DRAIN`] passes
    /// went by without an enter); when nothing is there, queues a `RECV`
    /// on `ctrl` and submits everything with one `io_uring_enter` that
    /// also waits, reaping and entering again until that `RECV` completes.
    ///
    /// # Errors
    /// [`Error::Sys`] when a receive, a submission or a completion fails.
    pub(super) fn next_request(&mut self, ctrl: &OwnedFd, req: &mut [u8; REQ]) -> Result<usize> {
        self.reap()?;
        match rustix::net::recv(ctrl, &mut *req, RecvFlags::DONTWAIT) {
            Ok((n, _)) => {
                self.since_enter += 1;
                if self.since_enter >= WATCH_DRAIN {
                    self.submit()?;
                }
                return Ok(n);
            }
            Err(rustix::io::Errno::AGAIN) => {}
            Err(e) => return Err(Error::sys("receiving a request")(e)),
        }
        let sqe = opcode::Recv::new(
            types::Fd(ctrl.as_raw_fd()),
            self.ctrl_buf.as_ptr().cast::<u8>(),
            REQ as u32,
        )
        .build()
        .user_data(CTRL);
        // SAFETY: `ctrl_buf` lives as long as the ring (see Drop) and is
        // read only below, once this RECV's completion is reaped.
        unsafe { self.push(sqe)? };
        let n = loop {
            self.since_enter = 0;
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                // A signal, or completions the kernel holds back until
                // the queue has room: reap, then enter again.
                Err(e)
                    if e.kind() == std::io::ErrorKind::Interrupted
                        || e.raw_os_error() == Some(rustix::io::Errno::BUSY.raw_os_error()) => {}
                Err(e) => return Err(Error::sys("waiting on the io_uring (io_uring_enter)")(e)),
            }
            self.reap()?;
            if let Some(n) = self.ctrl_done.take() {
                break n;
            }
        };
        // SAFETY: the control RECV completed (reaped above), so the kernel
        // no longer writes `ctrl_buf`; `n` is at most the REQ bytes given.
        let got = unsafe { &self.ctrl_buf.as_ref()[..n.min(REQ)] };
        req[..got.len()].copy_from_slice(got);
        Ok(got.len())
    }
}

impl Drop for UringWatch {
    /// Cancels whatever is in flight and waits for it, so that the kernel
    /// writes no buffer after it is freed; if that fails, the buffers are
    /// left allocated.
    fn drop(&mut self) {
        let drained = (|| -> std::io::Result<bool> {
            if self.inflight == 0 {
                return Ok(true);
            }
            let cancel = opcode::AsyncCancel2::new(types::CancelBuilder::any())
                .build()
                .user_data(u64::MAX);
            // SAFETY: a cancel points to no buffer.
            if unsafe { self.ring.submission().push(&cancel) }.is_err() {
                self.ring.submit()?;
                // SAFETY: as above.
                if unsafe { self.ring.submission().push(&cancel) }.is_err() {
                    return Ok(false);
                }
            }
            self.inflight += 1;
            for _ in 0..1000 {
                self.ring.submit_and_wait(1)?;
                while self.ring.completion().next().is_some() {
                    self.inflight -= 1;
                }
                if self.inflight == 0 {
                    return Ok(true);
                }
            }
            Ok(false)
        })();
        if matches!(drained, Ok(true)) {
            // SAFETY: both came from Box::leak in `new`, and nothing is in
            // flight, so the kernel writes neither any more.
            unsafe {
                drop(Box::from_raw(self.ctrl_buf.as_ptr()));
                drop(Box::from_raw(self.scratch.as_ptr()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use rustix::net::{AddressFamily, SendFlags, SocketFlags, SocketType};

    use super::*;

    fn pair() -> (OwnedFd, OwnedFd) {
        rustix::net::socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )
        .unwrap()
    }

    fn inode(fd: &OwnedFd) -> u64 {
        rustix::fs::fstat(fd).unwrap().st_ino
    }

    /// The inodes of the sockets open in this process (socket inodes are
    /// numbered from a counter, never reused while the test runs).
    fn open_sockets() -> HashSet<u64> {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter_map(|l| {
                let l = l.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?;
                l.parse().ok()
            })
            .collect()
    }

    /// A client on `ctrl`'s peer sending a one-byte request every
    /// millisecond until told to stop, so that the watch finds none
    /// waiting and enters the ring between them.
    fn requester(client: OwnedFd) -> (Arc<AtomicBool>, std::thread::JoinHandle<()>) {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let t = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(1));
                if rustix::net::send(&client, b"r", SendFlags::NOSIGNAL).is_err() {
                    return;
                }
            }
        });
        (stop, t)
    }

    /// Takes requests until `done` holds of the watch, at most `max`.
    fn serve_until(
        u: &mut UringWatch,
        ctrl: &OwnedFd,
        max: usize,
        mut done: impl FnMut(&UringWatch) -> bool,
    ) -> bool {
        let mut req = [0u8; REQ];
        for _ in 0..max {
            assert_eq!(u.next_request(ctrl, &mut req).unwrap(), 1);
            assert_eq!(req[0], b'r');
            if done(u) {
                return true;
            }
        }
        false
    }

    #[test]
    fn kept_ends_are_read_and_closed_once_their_peers_close() {
        let mut u = UringWatch::new().unwrap();
        let (ctrl, client) = pair();
        let (stop, t) = requester(client);
        let (mut peers, mut inodes) = (Vec::new(), Vec::new());
        for _ in 0..40 {
            let (ours, theirs) = pair();
            inodes.push(inode(&ours));
            u.add(ours).unwrap();
            peers.push(theirs);
        }
        // Peers alive and silent: every end stays open, nothing is read.
        assert!(!serve_until(&mut u, &ctrl, 3, |u| u.held() != 40 || u.messages() != 0));
        let open = open_sockets();
        assert!(inodes.iter().all(|i| open.contains(i)));
        // A message on one is read, and its end watched again.
        assert_eq!(
            rustix::net::send(&peers[7], &[9u8; 16], SendFlags::NOSIGNAL),
            Ok(16)
        );
        assert!(serve_until(&mut u, &ctrl, 2000, |u| u.messages() == 1));
        assert_eq!(u.held(), 40);
        // The clients close: every end is read to the end of file and
        // closed through the ring, really gone from the process.
        drop(peers);
        assert!(serve_until(&mut u, &ctrl, 2000, |u| u.held() == 0), "{u:?}");
        assert_eq!(u.messages(), 1);
        let open = open_sockets();
        assert!(inodes.iter().all(|i| !open.contains(i)));
        assert_eq!(u.inflight, 0);
        stop.store(true, Ordering::Relaxed);
        t.join().unwrap();
    }

    #[test]
    fn a_busy_server_still_closes_its_ends_within_the_bound() {
        let mut u = UringWatch::new().unwrap();
        let (ctrl, client) = pair();
        let mut inodes = Vec::new();
        for _ in 0..10 {
            let (ours, theirs) = pair();
            inodes.push(inode(&ours));
            u.add(ours).unwrap();
            drop(theirs);
        }
        // Every request already waiting: the server never has to wait, so
        // only the every-16-passes submission gets the ends watched, read
        // and closed (one pass each: poll and read, then the close).
        for _ in 0..4 * WATCH_DRAIN {
            assert_eq!(rustix::net::send(&client, b"r", SendFlags::NOSIGNAL), Ok(1));
        }
        let mut passes = 0;
        assert!(serve_until(&mut u, &ctrl, 4 * WATCH_DRAIN, |u| {
            passes += 1;
            u.held() == 0
        }));
        assert!(passes <= 2 * WATCH_DRAIN + 1, "{passes} passes");
        let open = open_sockets();
        assert!(inodes.iter().all(|i| !open.contains(i)));
    }

    #[test]
    fn a_watch_dropped_with_polls_in_flight_cancels_them_and_closes_its_ends() {
        let mut u = UringWatch::new().unwrap();
        let mut peers = Vec::new();
        let mut inodes = Vec::new();
        for _ in 0..300 {
            let (ours, theirs) = pair();
            inodes.push(inode(&ours));
            u.add(ours).unwrap();
            peers.push(theirs);
        }
        u.flush().unwrap();
        assert_eq!((u.held(), u.inflight), (300, 600));
        drop(u);
        let open = open_sockets();
        assert!(inodes.iter().all(|i| !open.contains(i)));
        // The peers see their far ends gone.
        let mut b = [0u8; 8];
        assert_eq!(
            rustix::net::recv(&peers[0], &mut b, RecvFlags::DONTWAIT).map(|r| r.0),
            Ok(0)
        );
    }
}
