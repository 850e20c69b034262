//! Endpoint-service clients that misbehave, with real processes: clients
//! that die holding endpoints or send garbage, a client that never reads,
//! and a stuck remote; none may stall the others or leak an endpoint.

#[allow(dead_code)]
mod common;
#[allow(dead_code)]
mod ept;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use iopath_rpmsg::ctrl::proto::{O_CLOEXEC, O_NONBLOCK, O_RDWR};
use iopath_rpmsg::ctrl::{CtrlClient, EptFd, EptInfo};
use rustix::io::Errno;

use common::pair;
use ept::*;

/// Helper run as a child process (this test binary re-executed): creates
/// endpoints, never destroys them, and exits (or dies).
#[test]
#[ignore = "run by run_helper in a child process"]
fn helper_client() {
    let what = std::env::var("IOPATH_EPT_HELPER").expect("run by run_helper");
    let ctrl = PathBuf::from(std::env::var("IOPATH_EPT_CTRL").unwrap());
    let c = CtrlClient::connect(&ctrl).unwrap();
    let mut keep = Vec::new();
    match what.as_str() {
        "many" => {
            for i in 0..10_000 {
                keep.push(
                    c.create_ept_fd(&EptInfo::new("echo"), O_RDWR | O_CLOEXEC)
                        .unwrap(),
                );
                if i < 1000 {
                    let (_, p) = c.create_ept(&EptInfo::new("echo")).unwrap();
                    if i < 100 {
                        keep.push(EptFd::open_node(&p, O_CLOEXEC).unwrap());
                    }
                }
            }
            let s = c.stats().unwrap();
            // (The parent holds one more fd endpoint.)
            assert!(s.fd_endpoints >= 10_000, "{s:?}");
            assert_eq!((s.legacy_endpoints, s.open_nodes), (1000, 100));
            println!("created");
        }
        "midrequest" => {
            // Legacy endpoints, then a CREATE_EPT_FD whose answer (and fd)
            // is never read: exit at once.
            for _ in 0..10 {
                c.create_ept(&EptInfo::new("echo")).unwrap();
            }
            let req = iopath_rpmsg::ctrl::proto::Request::CreateEptFd(EptInfo::new("echo"), O_RDWR)
                .encode()
                .unwrap();
            rustix::net::send(c.fd(), &req, rustix::net::SendFlags::empty()).unwrap();
            std::process::exit(0);
        }
        other => panic!("unknown helper {other}"),
    }
    std::process::exit(0);
}

fn run_helper(ctrl: &Path, what: &str) -> std::process::Output {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "helper_client",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env("IOPATH_EPT_HELPER", what)
        .env("IOPATH_EPT_CTRL", ctrl)
        .output()
        .unwrap()
}

#[test]
fn dead_clients_and_garbage_are_freed() {
    // One client holds 11,000: past the default bounds, so raised here.
    let st = pair(
        "eventfd:DIR/ev",
        &[],
        &[
            "--max-endpoints-per-client",
            "20000",
            "--max-endpoints-per-uid",
            "20000",
        ],
    );
    let c = CtrlClient::connect(&st.ctrl).unwrap();
    let live = echo_ept(&c, O_RDWR | O_CLOEXEC);

    // 10,000 fd endpoints, 1,000 legacy ones (100 of them open) created and
    // never destroyed before the client exits.
    let o = run_helper(&st.ctrl, "many");
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("created"),
        "helper: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let s = wait_stats(&c, "10,000 + 1,000 freed", |s| {
        s.endpoints() == 1 && s.open_nodes == 0
    });
    assert_eq!(s.created - s.destroyed, 1);
    assert!(empty_dir(&st.rundir()));

    // A client that dies mid-request.
    let o = run_helper(&st.ctrl, "midrequest");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    wait_stats(&c, "mid-request client freed", |s| s.endpoints() == 1);
    assert!(empty_dir(&st.rundir()));

    // Garbage on a control connection holding legacy endpoints: it is
    // closed, what it held is freed, one line is logged.
    let g = CtrlClient::connect(&st.ctrl).unwrap();
    for _ in 0..5 {
        g.create_ept(&EptInfo::new("echo")).unwrap();
    }
    let mut raw = UnixStream::from(rustix::io::dup(g.fd()).unwrap());
    drop(g);
    raw.write_all(b"\x00garbage, not a request\xff").unwrap();
    let mut b = [0u8; 64];
    let _ = raw.read(&mut b); // the refusal
    assert_eq!(raw.read(&mut b).unwrap(), 0, "connection not closed");
    let s = wait_stats(&c, "garbage client freed", |s| s.endpoints() == 1);
    assert_eq!(s.bad_clients, 1);
    assert!(empty_dir(&st.rundir()));
    let log = st.host.stderr();
    assert_eq!(
        log.lines()
            .filter(|l| l.contains("malformed request"))
            .count(),
        1,
        "{log}"
    );
    assert!(log.contains("5 legacy endpoints freed"), "{log}");

    // Fifty more garbage packets of every length, each on its own
    // connection: each is refused and its connection closed.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for len in 0..50usize {
        let mut pkt = vec![0u8; len];
        for b in &mut pkt {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        if len >= 4 && len % 2 == 0 {
            pkt[..4].copy_from_slice(b"IOPR"); // a header, then nonsense
        }
        let g = CtrlClient::connect(&st.ctrl).unwrap();
        let raw = UnixStream::from(rustix::io::dup(g.fd()).unwrap());
        drop(g);
        rustix::net::send(&raw, &pkt, rustix::net::SendFlags::empty()).unwrap();
        let mut b = [0u8; 256];
        let start = Instant::now();
        // The refusal, then end of file (a zero-length packet gets no answer
        // but also closes nothing: skip waiting for it).
        if len > 0 {
            while rustix::net::recv(&raw, &mut b, rustix::net::RecvFlags::empty())
                .unwrap()
                .0
                != 0
            {
                assert!(start.elapsed() < Duration::from_secs(10));
            }
        }
    }
    let s = wait_stats(&c, "garbage clients counted", |s| s.bad_clients == 50);
    assert_eq!(s.endpoints(), 1);

    // Meanwhile the service kept serving: the first endpoint still echoes.
    round_trip(&live, 300, 1);
    drop(live);
    wait_stats(&c, "all freed", |s| s.endpoints() == 0);
}

/// One event loop serves every control connection: a client that sends
/// requests and never reads the answers must not stall the others. Once
/// its queue is full it is disconnected (not silently skipped: it would
/// wait for an answer that never comes): it reads what was queued, then end
/// of file, and nothing it was answered with is left behind.
#[test]
fn client_that_never_reads_is_disconnected_and_stalls_no_one() {
    let st = setup();
    let c = CtrlClient::connect(&st.ctrl).unwrap();
    let hog = CtrlClient::connect(&st.ctrl).unwrap();
    let req = iopath_rpmsg::ctrl::proto::Request::CreateEptFd(EptInfo::new("hog"), O_RDWR)
        .encode()
        .unwrap();
    // Far more answers (each with an fd) than its receive queue holds: the
    // service hangs up on it, and its sends start failing.
    let mut sent = 0;
    let cut_off = loop {
        match rustix::net::send(hog.fd(), &req, rustix::net::SendFlags::DONTWAIT) {
            Ok(_) => sent += 1,
            Err(Errno::AGAIN) => std::thread::sleep(Duration::from_millis(1)),
            Err(Errno::PIPE | Errno::CONNRESET) => break true,
            Err(e) => panic!("send: {e}"),
        }
        if sent >= 20_000 {
            break false;
        }
    };
    assert!(cut_off, "{sent} requests and still connected");
    // Meanwhile another client is served at once, both ways.
    let start = Instant::now();
    let ep = echo_ept(&c, O_RDWR | O_CLOEXEC);
    round_trip(&ep, 100, 3);
    let (_, path) = c.create_ept(&EptInfo::new("echo")).unwrap();
    let node = EptFd::open_node(&path, O_CLOEXEC).unwrap();
    round_trip(&node, 200, 4);
    node.destroy().unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "served only after {:?}",
        start.elapsed()
    );
    // The hog reads the answers queued before the hang-up, then end of file
    // (their fds are closed by the kernel: no control buffer given).
    let mut b = [0u8; 256];
    let mut answers = 0;
    loop {
        match rustix::net::recv(hog.fd(), &mut b, rustix::net::RecvFlags::empty()) {
            Ok((0, _)) => break,
            Ok(_) => answers += 1,
            Err(e) => panic!("recv: {e}"),
        }
    }
    assert!(answers > 0 && answers < sent, "{answers} answers to {sent}");
    drop(hog);
    drop(ep);
    let s = wait_stats(&c, "the hog's endpoints freed", |s| s.endpoints() == 0);
    assert!(s.created >= answers as u64, "{s:?}");
    assert!(empty_dir(&st.rundir()));
    assert!(
        st.host
            .stderr()
            .contains("does not read its answers: disconnected"),
        "{}",
        st.host.stderr()
    );
}

/// A remote that stops taking buffers (frozen with SIGSTOP) must not stall
/// the event loop every client shares: the endpoint's next message waits
/// for a buffer with its socket out of the loop, control requests are
/// answered at once meanwhile, and once the remote runs again every
/// message goes and comes back, in order.
#[test]
fn stuck_remote_stalls_no_control_request() {
    // 16-entry rings: the host runs out of buffers after 16 messages.
    let st = pair("eventfd:DIR/ev", &["--ring", "16"], &[]);
    let c = CtrlClient::connect(&st.ctrl).unwrap();
    let ep = echo_ept(&c, O_RDWR | O_CLOEXEC | O_NONBLOCK);
    st.remote.signal(rustix::process::Signal::STOP);
    let mut sent = 0u8;
    loop {
        match ep.send(&[sent; 24]) {
            Ok(()) => sent += 1,
            Err(e) if errno(&e) == Some(Errno::AGAIN) => break,
            Err(e) => panic!("send: {e}"),
        }
        assert!(sent < 200, "the service never stopped taking messages");
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(sent > 16, "only {sent} messages taken");
    let start = Instant::now();
    let s = c.stats().unwrap();
    let other = c
        .create_ept_fd(&EptInfo::new("other"), O_RDWR | O_CLOEXEC)
        .unwrap();
    drop(other);
    let (_, path) = c.create_ept(&EptInfo::new("other")).unwrap();
    let node = EptFd::open_node(&path, O_CLOEXEC).unwrap();
    node.destroy().unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "control requests waited {:?} behind a stuck remote",
        start.elapsed()
    );
    assert_eq!(s.dropped, 0, "{s:?}");
    st.remote.signal(rustix::process::Signal::CONT);
    let mut back = [0u8; 64];
    for i in 0..sent {
        let n = loop {
            match ep.recv_timeout(&mut back, Duration::from_secs(10)) {
                Ok(Some(n)) => break n,
                Ok(None) => panic!("echo {i} of {sent} never came"),
                Err(e) if errno(&e) == Some(Errno::AGAIN) => {}
                Err(e) => panic!("recv: {e}"),
            }
        };
        assert_eq!(&back[..n], &[i; 24][..], "echo {i}");
    }
    let s = c.stats().unwrap();
    assert_eq!(s.dropped, 0, "{s:?}");
}
