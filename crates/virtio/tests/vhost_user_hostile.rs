//! The vhost-user front end against hostile or broken back ends (a unix
//! socket server in a thread that answers with garbage): every case is an
//! error value from `connect`, never a panic or a hang: a back end that
//! never answers, announces a 4 GiB reply, or is busy with another front
//! end fails the request it left unanswered within the reply timeout.

use std::io::{Read, Write};
use std::os::unix::net::UnixListener;
use std::sync::Arc;
use std::time::Duration;

use iopath_virtio::device::{QueueContext, VhostUserServer, VirtioDevice};
use iopath_virtio::features;
use iopath_virtio::transport::vhost_user::{Timeouts, VhostUser, VhostUserError};

/// Serves one connection: reads `skip` request headers (with their
/// bodies), then writes `reply` and closes.
fn serve(reply: Vec<u8>, skip: usize) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("evil.sock");
    let l = UnixListener::bind(&path).unwrap();
    std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        for _ in 0..skip {
            let mut hdr = [0u8; 12];
            if s.read_exact(&mut hdr).is_err() {
                return;
            }
            let size = u32::from_le_bytes(hdr[8..12].try_into().unwrap()) as usize;
            let mut body = vec![0u8; size];
            let _ = s.read_exact(&mut body);
        }
        let _ = s.write_all(&reply);
    });
    (dir, path)
}

fn hdr(code: u32, flags: u32, size: u32) -> Vec<u8> {
    [code.to_le_bytes(), flags.to_le_bytes(), size.to_le_bytes()].concat()
}

fn connect_err(reply: Vec<u8>, skip: usize) -> VhostUserError {
    let (_dir, path) = serve(reply, skip);
    VhostUser::connect(&path, 2, Duration::from_secs(5)).unwrap_err()
}

#[test]
fn peer_that_closes_at_once() {
    let e = connect_err(Vec::new(), 0);
    assert!(
        matches!(
            e,
            VhostUserError::Request {
                request: "GET_FEATURES" | "SET_OWNER",
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn reply_with_a_huge_size() {
    // SET_OWNER has no reply; GET_FEATURES (1) gets a header claiming 256 MiB.
    let e = connect_err(hdr(1, 0x5, 256 << 20), 2);
    assert!(
        matches!(
            e,
            VhostUserError::Request {
                request: "GET_FEATURES",
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn reply_to_the_wrong_request() {
    let mut r = hdr(3, 0x5, 8);
    r.extend_from_slice(&u64::MAX.to_le_bytes());
    let e = connect_err(r, 2);
    assert!(
        matches!(
            e,
            VhostUserError::Request {
                request: "GET_FEATURES",
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn truncated_reply() {
    let mut r = hdr(1, 0x5, 8);
    r.extend_from_slice(&[1, 2, 3]);
    let e = connect_err(r, 2);
    assert!(
        matches!(
            e,
            VhostUserError::Request {
                request: "GET_FEATURES",
                ..
            }
        ),
        "{e:?}"
    );
}

/// Runs `f` in a thread and fails the test (instead of hanging it) when it
/// takes longer than `limit`.
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("still waiting after {limit:?}: the front end hangs"))
}

/// A back end that accepts, reads the requests, writes `reply` (perhaps
/// nothing) and then never answers again nor closes.
fn silent(reply: Vec<u8>) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("silent.sock");
    let l = UnixListener::bind(&path).unwrap();
    std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut first = [0u8; 12];
        if s.read_exact(&mut first).is_ok() {
            let _ = s.write_all(&reply);
        }
        // Swallow whatever comes, answer nothing, keep the socket open.
        let mut sink = [0u8; 4096];
        while matches!(s.read(&mut sink), Ok(n) if n > 0) {}
    });
    (dir, path)
}

fn timeouts(reply: Duration) -> Timeouts {
    Timeouts {
        connect: Duration::from_secs(5),
        reply,
    }
}

fn assert_timeout(e: VhostUserError, want: &'static str) {
    match e {
        VhostUserError::Timeout { request, after, .. } => {
            assert_eq!(request, want);
            assert_eq!(after, Duration::from_millis(500));
        }
        other => panic!("expected a timeout of {want}, got {other:?}"),
    }
}

#[test]
fn back_end_that_never_answers_times_out_naming_the_request() {
    let (_dir, path) = silent(Vec::new());
    let started = std::time::Instant::now();
    let e = within(Duration::from_secs(10), move || {
        VhostUser::connect_with(&path, 2, timeouts(Duration::from_millis(500))).unwrap_err()
    });
    assert!(started.elapsed() >= Duration::from_millis(500));
    assert!(e.to_string().contains("GET_FEATURES"), "{e}");
    assert_timeout(e, "GET_FEATURES");
}

#[test]
fn header_announcing_four_gib_times_out_without_allocating_it() {
    // GET_FEATURES' "reply" announces 0xfffffff0 bytes and sends none.
    let (_dir, path) = silent(hdr(1, 0x5, 0xffff_fff0));
    let e = within(Duration::from_secs(10), move || {
        VhostUser::connect_with(&path, 2, timeouts(Duration::from_millis(500))).unwrap_err()
    });
    assert_timeout(e, "GET_FEATURES");
}

/// A device that does nothing: enough for a server to accept front ends.
struct Idle;

impl VirtioDevice for Idle {
    fn features(&self) -> u64 {
        features::VIRTIO_F_VERSION_1
    }
    fn num_queues(&self) -> usize {
        1
    }
    fn max_queue_size(&self) -> u16 {
        64
    }
    fn read_config(&self, _offset: u32, len: u32) -> Vec<u8> {
        vec![0; len as usize]
    }
    fn run_queue(&self, ctx: QueueContext) -> virtio_queue::Queue {
        while !ctx.wait(None).map(|w| w.stop).unwrap_or(true) {}
        ctx.into_queue()
    }
}

#[test]
fn second_front_end_waits_for_its_turn_then_times_out() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("busy.sock");
    let server = VhostUserServer::new(UnixListener::bind(&path).unwrap(), Arc::new(Idle));
    std::thread::spawn(move || server.run());
    // The first front end connects and then stays quiet (as one stopped
    // with SIGSTOP would): the server keeps serving it.
    let first = VhostUser::connect_with(&path, 2, timeouts(Duration::from_secs(5))).unwrap();
    assert_eq!(
        first.raw_device_features() & features::VIRTIO_F_VERSION_1,
        features::VIRTIO_F_VERSION_1
    );
    let p = path.clone();
    let e = within(Duration::from_secs(10), move || {
        VhostUser::connect_with(&p, 2, timeouts(Duration::from_millis(500))).unwrap_err()
    });
    assert_timeout(e, "GET_FEATURES");
    // Once the first goes, the next front end is served.
    drop(first);
    let p = path.clone();
    let third = within(Duration::from_secs(10), move || {
        VhostUser::connect_with(&p, 2, timeouts(Duration::from_secs(5)))
    })
    .unwrap();
    assert_eq!(
        third.raw_device_features() & features::VIRTIO_F_VERSION_1,
        features::VIRTIO_F_VERSION_1
    );
}

/// A driver sleeping on a queue's interrupt polls that eventfd alone: its
/// timeout (long ones kept by the connection's watcher thread, short ones
/// by the kernel's timer) and the back end hanging up still end the sleep,
/// each in time.
#[test]
fn a_sleeper_wakes_at_its_timeout_and_when_the_back_end_hangs_up() {
    use iopath_virtio::transport::Transport;
    use std::time::Instant;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idle.sock");
    let l = UnixListener::bind(&path).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        tx.send(s.try_clone().unwrap()).unwrap();
        let _ = iopath_virtio::device::serve_connection(s, Arc::new(Idle));
    });
    let fe = VhostUser::connect_with(&path, 2, timeouts(Duration::from_secs(5))).unwrap();
    let fe = Arc::new(fe);
    let back_end = rx.recv().unwrap();
    for t in [Duration::from_millis(20), Duration::from_millis(300)] {
        let f = Arc::clone(&fe);
        let (r, took) = within(Duration::from_secs(10), move || {
            let t0 = Instant::now();
            (f.wait_interrupt(0, Some(t)), t0.elapsed())
        });
        assert!(!r.unwrap(), "no interrupt came");
        assert!(
            took >= t && took < t + Duration::from_secs(1),
            "{t:?}: {took:?}"
        );
    }
    assert!(!fe.wait_interrupt(0, Some(Duration::ZERO)).unwrap());
    let sleeper = {
        let fe = Arc::clone(&fe);
        std::thread::spawn(move || {
            let t0 = Instant::now();
            (fe.wait_interrupt(0, None), t0.elapsed())
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    rustix::net::shutdown(&back_end, rustix::net::Shutdown::Both).unwrap();
    let (r, took) = within(Duration::from_secs(10), move || sleeper.join().unwrap());
    // Woken by the hang-up (the eventfd may be counted once first).
    let r = match r {
        Ok(true) => fe.wait_interrupt(0, None),
        other => other,
    };
    assert!(matches!(r, Err(iopath_virtio::Error::Closed)), "{r:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
}

/// A sleep that leaves its interrupt pending ends as the interrupt comes,
/// and every later one ends at once until the interrupt is taken; then a
/// sleep lasts its timeout again (kernel timer and watcher alike).
#[test]
fn an_interrupt_left_pending_ends_every_sleep_until_it_is_taken() {
    use iopath_virtio::transport::Transport;
    use std::time::Instant;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idle.sock");
    let l = UnixListener::bind(&path).unwrap();
    std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        let _ = iopath_virtio::device::serve_connection(s, Arc::new(Idle));
    });
    let fe = VhostUser::connect_with(&path, 2, timeouts(Duration::from_secs(5))).unwrap();
    // What the back end does to interrupt: count one on the call eventfd.
    let signal = |fe: &VhostUser| {
        let fd = fe.interrupt_fd(0).unwrap();
        assert_eq!(rustix::io::write(fd, &1u64.to_ne_bytes()).unwrap(), 8);
    };
    for t in [Duration::from_millis(20), Duration::from_millis(300)] {
        assert!(!fe.take_interrupt(0).unwrap(), "nothing pending yet");
        signal(&fe);
        for _ in 0..3 {
            let t0 = Instant::now();
            assert!(fe.wait_interrupt_pending(0, Some(t)).unwrap());
            assert!(t0.elapsed() < t, "{t:?}: woke at once");
        }
        assert!(fe.take_interrupt(0).unwrap());
        assert!(!fe.take_interrupt(0).unwrap(), "taken once");
        let t0 = Instant::now();
        assert!(!fe.wait_interrupt_pending(0, Some(t)).unwrap());
        let took = t0.elapsed();
        assert!(
            took >= t && took < t + Duration::from_secs(1),
            "{t:?}: {took:?}"
        );
    }
}
