//! The endpoint service with real processes: `iopath rpmsg remote` (echo)
//! and `iopath rpmsg host --ctrl` as two processes; this test process (and
//! children it starts) as clients through `iopath_rpmsg::ctrl`.

#[allow(dead_code)]
mod common;
#[allow(dead_code)]
mod ept;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use iopath_rpmsg::ctrl::proto::{O_CLOEXEC, O_NONBLOCK, O_RDONLY, O_RDWR, O_WRONLY};
use iopath_rpmsg::ctrl::{CtrlClient, EptFd, EptInfo};
use iopath_rpmsg::wire::ADDR_ANY;
use rustix::event::PollFlags;
use rustix::io::Errno;

use common::{pair, s, BIN};
use ept::*;

#[test]
fn both_ways_fd_passed_to_another_process() {
    let st = setup();
    // The control socket and the nodes' directory are the owner's alone.
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&st.ctrl), 0o600);
    assert_eq!(mode(&st.rundir()), 0o700);
    let c = CtrlClient::connect(&st.ctrl).unwrap();
    // fd way, without O_CLOEXEC: a child inherits it and talks to the
    // remote echo through it; every byte is checked by ping.
    let ep = echo_ept(&c, O_RDWR);
    assert!(ep.info().src >= 1024);
    let v = ping_through(ep.into_fd(), "496");
    assert_eq!(v["count"], 496);
    assert_eq!(v["bytes"], 496 * 497 / 2);
    // The child held the last copy: its exit destroyed the endpoint.
    wait_stats(&c, "fd endpoint freed", |s| s.endpoints() == 0);

    // Legacy way: a node to open, once.
    let (info, path) = c.create_ept(&EptInfo::new("echo")).unwrap();
    assert!(info.src >= 1024 && info.dst != ADDR_ANY, "{info:?}");
    assert_eq!(path.parent().unwrap(), st.rundir());
    assert_eq!(mode(&path), 0o600);
    let node = EptFd::open_node(&path, O_CLOEXEC).unwrap();
    let e = EptFd::open_node(&path, O_CLOEXEC).unwrap_err();
    assert_eq!(errno(&e), Some(Errno::BUSY), "{e}");
    // Close and reopen: the endpoint stays, the node too.
    drop(node);
    let start = Instant::now();
    let node = loop {
        match EptFd::open_node(&path, 0) {
            Ok(n) => break n,
            Err(e) if errno(&e) == Some(Errno::BUSY) => {
                assert!(start.elapsed() < Duration::from_secs(5));
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("reopen: {e}"),
        }
    };
    // Round trips through the node, here and in a child that inherits a dup.
    round_trip(&node, 496, 3);
    let dup = rustix::io::dup(node.fd()).unwrap();
    let v = ping_through(dup, "100");
    assert_eq!(v["count"], 100);
    let s1 = c.stats().unwrap();
    assert_eq!((s1.legacy_endpoints, s1.open_nodes), (1, 1), "{s1:?}");
    // Destroy through the open node: the node disappears.
    node.destroy().unwrap();
    assert!(!path.exists());
    let s2 = wait_stats(&c, "legacy freed", |s| s.endpoints() == 0);
    assert!(empty_dir(&st.rundir()));
    assert_eq!(s2.created, s2.destroyed);
    assert!(st.host.stderr().contains("control client 1 connected: pid"));
}

/// With polling host and remote, the bus thread also takes the clients'
/// messages (no pump thread): both ways still work and free everything.
#[test]
fn poll_mode_both_ways() {
    let st = setup_with(Some("poll"));
    let c = CtrlClient::connect(&st.ctrl).unwrap();
    let ep = echo_ept(&c, O_RDWR);
    let v = ping_through(ep.into_fd(), "496");
    assert_eq!(v["bytes"], 496 * 497 / 2);
    // The client busy-polling its fd as well: every size, every byte checked.
    let ep = echo_ept(&c, O_RDWR);
    let v = ping_through_with(ep.into_fd(), "496", &["--poll"]);
    assert_eq!(v["bytes"], 496 * 497 / 2);
    assert_eq!(v["checked"], true);
    let (_, path) = c.create_ept(&EptInfo::new("echo")).unwrap();
    let node = EptFd::open_node(&path, O_CLOEXEC).unwrap();
    let e = EptFd::open_node(&path, O_CLOEXEC).unwrap_err();
    assert_eq!(errno(&e), Some(Errno::BUSY), "{e}");
    round_trip(&node, 200, 5);
    node.destroy().unwrap();
    assert!(!path.exists());
    wait_stats(&c, "poll mode freed", |s| s.endpoints() == 0);
    assert!(empty_dir(&st.rundir()));
}

#[test]
fn exact_errnos() {
    let st = setup();
    let c = CtrlClient::connect(&st.ctrl).unwrap();
    let ep = echo_ept(&c, O_RDWR | O_CLOEXEC);
    let taken = EptInfo {
        name: "x".into(),
        src: ep.info().src,
        dst: ADDR_ANY,
    };
    // A taken src: EBUSY, both ways.
    let e = c.create_ept_fd(&taken, O_RDWR).unwrap_err();
    assert_eq!(errno(&e), Some(Errno::BUSY), "{e}");
    let e = c.create_ept(&taken).unwrap_err();
    assert_eq!(errno(&e), Some(Errno::BUSY), "{e}");
    // A name of 32 bytes (no room for the NUL) and of 40: EINVAL.
    for len in [32, 40] {
        let e = c
            .create_ept_fd(&EptInfo::new(&"n".repeat(len)), O_RDWR)
            .unwrap_err();
        assert_eq!(errno(&e), Some(Errno::INVAL), "{e}");
        let e = c.create_ept(&EptInfo::new(&"n".repeat(len))).unwrap_err();
        assert_eq!(errno(&e), Some(Errno::INVAL), "{e}");
    }
    // 31 bytes is fine.
    drop(
        c.create_ept_fd(&EptInfo::new(&"n".repeat(31)), O_RDWR)
            .unwrap(),
    );
    // A flag outside O_ACCMODE | O_NONBLOCK | O_CLOEXEC: EINVAL.
    for bad in [
        0o2000, /* O_APPEND */
        0o100,  /* O_CREAT */
        0x8000_0000,
    ] {
        let e = c
            .create_ept_fd(&EptInfo::new("echo"), O_RDWR | bad)
            .unwrap_err();
        assert_eq!(errno(&e), Some(Errno::INVAL), "flags {bad:#o}: {e}");
    }
    // The connection still serves after refusals.
    let st0 = c.stats().unwrap();
    assert_eq!(st0.bad_clients, 0);

    // Writes over 496 bytes: EMSGSIZE from the library; 496 goes.
    let e = ep.send(&[0u8; 497]).unwrap_err();
    assert_eq!(errno(&e), Some(Errno::MSGSIZE));
    // A plain write(2) over the (smallest) send buffer: the kernel refuses.
    assert_eq!(
        rustix::io::write(ep.fd(), &vec![0u8; 1 << 16]).unwrap_err(),
        Errno::MSGSIZE
    );
    // Nothing of those came back from the echo.
    assert!(!revents(&ep, PollFlags::IN, 200).contains(PollFlags::IN));
    // poll: writable, not readable; then readable once the echo is back.
    assert_eq!(
        revents(&ep, PollFlags::IN | PollFlags::OUT, 0),
        PollFlags::OUT
    );
    let msg = pattern(100, 9);
    ep.send(&msg).unwrap();
    assert!(revents(&ep, PollFlags::IN, 10_000).contains(PollFlags::IN));
    // A short read gets the start; the rest of that message is dropped.
    let mut small = [0u8; 10];
    assert_eq!(ep.recv(&mut small).unwrap(), 10);
    assert_eq!(&small[..], &msg[..10]);
    ep.send(&msg[..50]).unwrap();
    let mut back = [0u8; 512];
    assert_eq!(
        ep.recv_timeout(&mut back, Duration::from_secs(10)).unwrap(),
        Some(50)
    );
    assert_eq!(&back[..50], &msg[..50]);
    assert_eq!(c.stats().unwrap().oversize, 0);

    // A plain write(2) of 497 bytes gets past the kernel: the service does
    // not drop it silently but ends the endpoint, so the writer's next call
    // fails and poll reports the hang-up; the other endpoints carry on.
    let raw = echo_ept(&c, O_RDWR | O_CLOEXEC);
    assert_eq!(rustix::io::write(raw.fd(), &[7u8; 497]).unwrap(), 497);
    assert!(revents(&raw, PollFlags::IN, 10_000).contains(PollFlags::HUP));
    assert_eq!(errno(&raw.recv(&mut back).unwrap_err()), Some(Errno::PIPE));
    assert_eq!(errno(&raw.send(b"x").unwrap_err()), Some(Errno::PIPE));
    assert_eq!(
        wait_stats(&c, "oversize counted", |s| s.oversize == 1).oversize,
        1
    );
    drop(raw);
    round_trip(&ep, 496, 3);

    // Non-blocking: EAGAIN with nothing queued, library and plain read.
    let nb = echo_ept(&c, O_RDWR | O_NONBLOCK | O_CLOEXEC);
    let e = nb.recv(&mut back).unwrap_err();
    assert_eq!(errno(&e), Some(Errno::AGAIN));
    assert_eq!(
        rustix::io::read(nb.fd(), &mut back).unwrap_err(),
        Errno::AGAIN
    );
    let fl = rustix::fs::fcntl_getfl(nb.fd()).unwrap();
    assert!(fl.contains(rustix::fs::OFlags::NONBLOCK));
    let fdfl = rustix::io::fcntl_getfd(nb.fd()).unwrap();
    assert!(fdfl.contains(rustix::io::FdFlags::CLOEXEC));
    let blk = echo_ept(&c, O_RDWR);
    assert!(!rustix::fs::fcntl_getfl(blk.fd())
        .unwrap()
        .contains(rustix::fs::OFlags::NONBLOCK));
    assert!(!rustix::io::fcntl_getfd(blk.fd())
        .unwrap()
        .contains(rustix::io::FdFlags::CLOEXEC));

    // Access modes: the other direction is shut (EPIPE).
    let before = c.stats().unwrap().fd_endpoints;
    let ro = echo_ept(&c, O_RDONLY | O_CLOEXEC);
    assert_eq!(errno(&ro.send(b"x").unwrap_err()), Some(Errno::PIPE));
    assert!(!revents(&ro, PollFlags::IN, 0).contains(PollFlags::HUP));
    let wo = echo_ept(&c, O_WRONLY | O_CLOEXEC);
    wo.send(b"to the remote").unwrap();
    assert_eq!(errno(&wo.recv(&mut back).unwrap_err()), Some(Errno::PIPE));
    assert_eq!(c.stats().unwrap().fd_endpoints, before + 2);
    ro.destroy().unwrap();
    wo.destroy().unwrap();
    wait_stats(&c, "access-mode endpoints freed", |s| {
        s.fd_endpoints == before
    });

    // Destroy through one copy: every copy gets EPIPE and a hang-up.
    let copy = EptFd::from_fd(rustix::io::dup(nb.fd()).unwrap());
    nb.destroy().unwrap();
    assert!(revents(&copy, PollFlags::IN, 0).contains(PollFlags::HUP));
    assert_eq!(errno(&copy.send(b"x").unwrap_err()), Some(Errno::PIPE));
    assert_eq!(errno(&copy.recv(&mut back).unwrap_err()), Some(Errno::PIPE));
    // (A plain read(2) sees end of file; a plain send EPIPE.)
    assert_eq!(rustix::io::read(copy.fd(), &mut back).unwrap(), 0);
    assert_eq!(
        rustix::net::send(copy.fd(), b"x", rustix::net::SendFlags::NOSIGNAL).unwrap_err(),
        Errno::PIPE
    );
    drop(copy);

    // The remote gone: EPIPE and a hang-up on every endpoint.
    let mut st = st;
    st.remote.kill();
    assert!(revents(&ep, PollFlags::IN, 10_000).contains(PollFlags::HUP));
    assert_eq!(errno(&ep.send(b"x").unwrap_err()), Some(Errno::PIPE));
    assert_eq!(errno(&ep.recv(&mut back).unwrap_err()), Some(Errno::PIPE));
    assert_eq!(errno(&blk.recv(&mut back).unwrap_err()), Some(Errno::PIPE));
}

/// `iopath rpmsg ept create --ctrl CTRL --name echo`.
fn ept_create(ctrl: &Path) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args([
        "rpmsg",
        "ept",
        "create",
        "--ctrl",
        s(ctrl),
        "--name",
        "echo",
    ]);
    cmd
}

#[test]
fn ept_create_cli_both_ways() {
    let st = setup();
    let c = CtrlClient::connect(&st.ctrl).unwrap();
    echo_ept(&c, O_RDWR); // the remote has announced "echo"
    let inner = format!("exec {BIN} rpmsg ping --fd $IOPATH_RPMSG_FD --count 50 --json");
    for legacy in [false, true] {
        let mut cmd = ept_create(&st.ctrl);
        if legacy {
            cmd.arg("--legacy");
        }
        let o = cmd.args(["--", "sh", "-c", &inner]).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["count"], 50);
    }
    wait_stats(&c, "cli endpoints freed", |s| s.endpoints() == 0);
    let o = Command::new(BIN)
        .args(["rpmsg", "ept", "stats", "--ctrl", s(&st.ctrl), "--json"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let now = c.stats().unwrap();
    assert_eq!(v["fd_endpoints"], 0);
    assert_eq!(v["created"], now.created);
    assert_eq!(v["destroyed"], now.destroyed);
    assert!(v["msgs"].as_u64().unwrap() >= 200, "{v}");
    // Legacy without a command prints the node and stays until destroyed.
    let mut child = ept_create(&st.ctrl)
        .arg("--legacy")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    let mut out = child.stdout.take().unwrap();
    let mut b = [0u8; 1];
    while out.read(&mut b).unwrap() == 1 && b[0] != b'\n' {
        line.push(b[0] as char);
    }
    let path = PathBuf::from(line);
    assert!(path.exists(), "{}", path.display());
    EptFd::open_node(&path, O_CLOEXEC)
        .unwrap()
        .destroy()
        .unwrap();
    assert!(child.wait().unwrap().success());
    assert!(empty_dir(&st.rundir()));
    // Bad input: one line, non-zero exit.
    let o = ept_create(&st.ctrl).output().unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("needs a command"));
}

#[test]
fn sink_counts_a_stream_and_answers_sync() {
    let p = pair("eventfd:DIR/ev", &["--sink", "sink", "--event-idx"], &[]);
    let c = CtrlClient::connect(&p.ctrl).unwrap();
    let start = Instant::now();
    let ep = loop {
        let ep = c.create_ept_fd(&EptInfo::new("sink"), O_RDWR).unwrap();
        if ep.info().dst != ADDR_ANY {
            break ep;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "sink never announced"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut back = [0u8; 64];
    // More messages than the ring has buffers: some wait for the remote.
    for round in 1..=2u64 {
        for i in 0..1000usize {
            ep.send(&pattern(1 + i % 496, i as u8)).unwrap();
        }
        ep.send(b"SYNC").unwrap();
        let n = ep
            .recv_timeout(&mut back, Duration::from_secs(20))
            .unwrap()
            .expect("the sink answers SYNC");
        assert_eq!(n, 8);
        assert_eq!(back[..8], (round * 1001).to_le_bytes());
    }
    // Anything but SYNC gets no answer.
    ep.send(b"SYNX").unwrap();
    assert_eq!(
        ep.recv_timeout(&mut back, Duration::from_millis(300))
            .unwrap(),
        None
    );
}
