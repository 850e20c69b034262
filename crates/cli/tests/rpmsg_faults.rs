//! Faults and careless use of `iopath rpmsg host` / `remote`, with real
//! processes: a second server on a live socket, signals, a peer killed,
//! the shared-memory file's permissions, misleading messages.

#[allow(dead_code)]
mod common;

use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{echo_ept, pair, round_trip, s, spawn_host, spawn_remote, wait_path, Proc, BIN};
use iopath_rpmsg::ctrl::proto::{O_CLOEXEC, O_RDWR};
use iopath_rpmsg::ctrl::{CtrlClient, EptFd, EptInfo};
use iopath_rpmsg::wire::ADDR_ANY;
use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::process::Signal;

/// How long until `fd` reports a hang-up or an error (at most `limit`).
fn time_to_hangup(fd: impl AsFd, limit: Duration) -> Duration {
    let start = Instant::now();
    let mut p = [PollFd::new(&fd, PollFlags::IN)];
    let ts = Timespec {
        tv_sec: limit.as_secs() as i64,
        tv_nsec: i64::from(limit.subsec_nanos()),
    };
    loop {
        p[0].clear_revents();
        poll(&mut p, Some(&ts)).unwrap();
        let r = p[0].revents();
        if r.intersects(PollFlags::HUP | PollFlags::ERR) {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < limit,
            "no hang-up within {limit:?} (revents {r:?})"
        );
        if r.contains(PollFlags::IN) {
            // Drain a stray message so poll can block again.
            let mut b = [0u8; 600];
            let _ = rustix::io::read(&fd, &mut b);
        }
    }
}

fn stderr_of(p: &Proc) -> String {
    p.stderr()
}

#[test]
fn second_servers_are_refused_and_stale_sockets_replaced() {
    let mut p = pair("eventfd:DIR/ev", &[], &[]);
    let ep = echo_ept(&p.ctrl);
    round_trip(&ep, 1);
    let shm = p.dir.path().join("shm");
    let shm_len = std::fs::metadata(&shm).unwrap().len();
    // A second host on the live control socket: refused before it touches
    // the device; the first keeps serving the same endpoint.
    let notify = format!("eventfd:{}/ev", s(p.dir.path()));
    let o = Command::new(BIN)
        .args(["rpmsg", "host", "--shm", s(&shm), "--notify", &notify])
        .args(["--ctrl", s(&p.ctrl), "--timeout", "2"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("is in use by another server"), "{err}");
    assert!(err.contains(s(&p.ctrl)), "{err}");
    round_trip(&ep, 2);
    // A second remote on the live notify socket (with a file of its own).
    let o = Command::new(BIN)
        .args(["rpmsg", "remote", "--shm", s(&p.dir.path().join("shm2"))])
        .args(["--create", "0x80000", "--notify", &notify])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("is in use by another server"), "{err}");
    // On another notify socket, the same file: the running remote holds it,
    // so it is refused before the file is touched.
    let o = Command::new(BIN)
        .args(["rpmsg", "remote", "--shm", s(&shm), "--create", "0x100000"])
        .args(["--notify", &format!("unix:{}/other", s(p.dir.path()))])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("in use by another remote"), "{err}");
    assert_eq!(std::fs::metadata(&shm).unwrap().len(), shm_len);
    round_trip(&ep, 3);
    // Neither refused process removed the live sockets on its way out.
    assert!(p.ctrl.exists());
    assert!(p.dir.path().join("ev").exists());
    drop(ep);
    p.host.kill();
    p.remote.kill();
    // Stale sockets (their servers died) are replaced.
    let dir = tempfile::tempdir().unwrap();
    let ev = dir.path().join("ev");
    let ctrl = dir.path().join("ctrl");
    drop(UnixListener::bind(&ev).unwrap());
    drop(UnixListener::bind(&ctrl).unwrap());
    let shm = dir.path().join("shm");
    let ev = format!("unix:{}", s(&ev));
    let _remote = spawn_remote(dir.path(), s(&shm), &ev, &["--echo", "echo"]);
    let _host = spawn_host(dir.path(), s(&shm), &ev, &["--ctrl", s(&ctrl)]);
    round_trip(&echo_ept(&ctrl), 4);
}

#[test]
fn sigterm_cleans_up_and_exits_0() {
    let mut p = pair("unix:DIR/ev", &[], &[]);
    let ep = echo_ept(&p.ctrl);
    round_trip(&ep, 1);
    // A legacy node too, so the runtime directory is not empty.
    let c = CtrlClient::connect(&p.ctrl).unwrap();
    let (_, node) = c.create_ept(&EptInfo::new("echo")).unwrap();
    assert!(node.exists());
    let rundir = p.rundir();
    p.host.signal(Signal::TERM);
    assert_eq!(p.host.wait(Duration::from_secs(10)).code(), Some(0));
    assert!(stderr_of(&p.host).contains("stopped by signal"));
    assert!(!p.ctrl.exists(), "control socket left behind");
    assert!(!rundir.exists(), "runtime directory left behind");
    // The client's endpoint is gone with the host.
    time_to_hangup(ep.fd(), Duration::from_secs(1));
    // The remote outlives its host and waits for the next; SIGINT stops it.
    let notify = p.dir.path().join("ev");
    assert!(notify.exists());
    p.remote.signal(Signal::INT);
    assert_eq!(p.remote.wait(Duration::from_secs(10)).code(), Some(0));
    assert!(!notify.exists(), "notify socket left behind");
}

#[test]
fn remote_killed_then_host_killed() {
    let mut p = pair("eventfd:DIR/ev", &[], &[]);
    let eps: Vec<EptFd> = (0..3).map(|_| echo_ept(&p.ctrl)).collect();
    for (i, ep) in eps.iter().enumerate() {
        round_trip(ep, i as u8);
    }
    // The remote dies: every endpoint fd hangs up within a second.
    p.remote.kill();
    for ep in &eps {
        let t = time_to_hangup(ep.fd(), Duration::from_secs(1));
        assert!(t <= Duration::from_secs(1), "{t:?}");
    }
    drop(eps);
    // A remote started again on the same shared memory is picked up by the
    // running host (reset, handshake, name service again): new endpoints
    // through the same control socket work.
    let dir = p.dir.path();
    let shm = dir.join("shm");
    let ev = format!("eventfd:{}/ev", s(dir));
    let remote = spawn_remote(dir, s(&shm), &ev, &["--echo", "echo"]);
    let ep = echo_ept(&p.ctrl);
    for i in 0..10 {
        round_trip(&ep, i);
    }
    // The host says so after the socket is back: a fast client can be
    // done before the line is written.
    let err = p.host.wait_for_line("remote back");
    assert!(err.contains("waiting for a remote"), "{err}");
    // The host dies: the client's endpoint hangs up at once; the remote
    // waits for the next host, and a restarted host serves new clients.
    p.host.kill();
    let t = time_to_hangup(ep.fd(), Duration::from_secs(1));
    assert!(t < Duration::from_millis(500), "{t:?}");
    let _host = spawn_host(dir, s(&shm), &ev, &["--ctrl", s(&p.ctrl)]);
    let ep = echo_ept(&p.ctrl);
    for i in 0..10 {
        round_trip(&ep, i);
    }
    remote.wait_for_line("waiting for the next host");
}

#[test]
fn once_means_a_dead_peer_is_status_1() {
    // --once host: the remote's death ends it with status 1 (not 0, which a
    // supervisor reads as a requested stop).
    let mut p = pair("unix:DIR/ev", &[], &["--once"]);
    round_trip(&echo_ept(&p.ctrl), 1);
    p.remote.kill();
    assert_eq!(p.host.wait(Duration::from_secs(10)).code(), Some(1));
    let err = p.host.stderr();
    assert!(err.contains("the link to the remote went down"), "{err}");
    assert!(!p.ctrl.exists(), "control socket left behind");
    // --once remote: its host's death is status 1.
    let dir = tempfile::tempdir().unwrap();
    let shm = dir.path().join("shm");
    let ev = format!("unix:{}/ev", s(dir.path()));
    let ctrl = dir.path().join("ctrl");
    let mut remote = spawn_remote(dir.path(), s(&shm), &ev, &["--echo", "echo", "--once"]);
    let mut host = spawn_host(dir.path(), s(&shm), &ev, &["--ctrl", s(&ctrl)]);
    round_trip(&echo_ept(&ctrl), 9);
    host.kill();
    assert_eq!(remote.wait(Duration::from_secs(10)).code(), Some(1));
    assert!(
        remote.stderr().contains("the host went away"),
        "{}",
        remote.stderr()
    );
    assert!(!dir.path().join("ev").exists(), "notify socket left behind");
}

/// Runs `argv` as user nobody; returns whether it succeeded.
fn as_nobody(argv: &[&str]) -> bool {
    Command::new("runuser")
        .args(["-u", "nobody", "--"])
        .args(argv)
        .output()
        .expect("runuser (util-linux) is needed")
        .status
        .success()
}

#[test]
fn shared_memory_is_private_to_its_user() {
    if !rustix::process::geteuid().is_root() {
        iopath_testkit::skip(
            iopath_testkit::Feature::Root,
            "reading as another user needs root (runuser)",
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Let everyone through the directory: only the file's mode may stop
    // another user.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let shm = dir.path().join("shm");
    let ev = format!("unix:{}/ev", s(dir.path()));
    let mut remote = spawn_remote(dir.path(), s(&shm), &ev, &["--echo", "echo"]);
    wait_path(&dir.path().join("ev"));
    let mode = std::fs::metadata(&shm).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert!(!as_nobody(&["cat", s(&shm)]), "another user read the bus");
    remote.kill();
    // Widened on request (as --ctrl-mode does): then the same read works,
    // so the refusal above was the mode's doing.
    let mut remote = spawn_remote(
        dir.path(),
        s(&shm),
        &ev,
        &["--echo", "echo", "--shm-mode", "644"],
    );
    wait_path(&dir.path().join("ev"));
    let start = Instant::now();
    while std::fs::metadata(&shm).unwrap().permissions().mode() & 0o777 != 0o644 {
        assert!(start.elapsed() < Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(as_nobody(&["cat", s(&shm)]));
    // A file other users can write: the host refuses it, unless told.
    std::fs::set_permissions(&shm, std::fs::Permissions::from_mode(0o666)).unwrap();
    let ctrl = dir.path().join("ctrl");
    let mut host = spawn_host(
        dir.path(),
        s(&shm),
        &ev,
        &["--ctrl", s(&ctrl), "--timeout", "5"],
    );
    assert_eq!(host.wait(Duration::from_secs(10)).code(), Some(1));
    let err = host.stderr();
    assert!(err.contains("can be written by other users"), "{err}");
    assert!(err.contains("--allow-writable-shm"), "{err}");
    // The refused host never reached the remote's device: it is still
    // waiting for its first host, and one told to allow it works.
    let _host = spawn_host(
        dir.path(),
        s(&shm),
        &ev,
        &["--ctrl", s(&ctrl), "--allow-writable-shm"],
    );
    round_trip(&echo_ept(&ctrl), 5);
    remote.kill();
}

#[test]
fn messages_name_the_input_at_fault() {
    let dir = tempfile::tempdir().unwrap();
    // An empty file is no remote's shared memory.
    let empty = dir.path().join("empty");
    std::fs::write(&empty, b"").unwrap();
    std::fs::set_permissions(&empty, std::fs::Permissions::from_mode(0o600)).unwrap();
    let o = Command::new(BIN)
        .args(["rpmsg", "host", "--shm", s(&empty), "--notify", "poll"])
        .args(["--ctrl", s(&dir.path().join("c")), "--timeout", "1"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--shm"), "{err}");
    assert!(err.contains("is 0 bytes"), "{err}");
    assert!(err.contains("--create SIZE"), "{err}");
    assert!(!err.contains("buffer size"), "{err}");
    // A 40-byte endpoint name.
    let name = "n".repeat(40);
    let o = Command::new(BIN)
        .args(["rpmsg", "ept", "create", "--ctrl", s(&dir.path().join("c"))])
        .args(["--name", &name])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--name"), "{err}");
    assert!(err.contains("40 bytes: a name is 1 to 31 bytes"), "{err}");
    assert!(!err.contains("Invalid argument"), "{err}");
}

fn threads_of(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .count()
}

#[test]
fn attach_waits_end_with_their_clients() {
    use iopath_rpmsg::ctrl::AttachRequest;
    use rustix::net::{AddressFamily, SendFlags, SocketAddrUnix, SocketFlags, SocketType};
    let p = pair("eventfd:DIR/ev", &[], &[]);
    round_trip(&echo_ept(&p.ctrl), 1);
    let pid = p.host.pid();
    let base = threads_of(pid);
    // 20 clients each ask to wait a minute for a channel nobody announces.
    let req = AttachRequest {
        name: "nobody-announces-this".into(),
        src: ADDR_ANY,
        dst: ADDR_ANY,
        timeout_ms: 60_000,
    }
    .encode()
    .unwrap();
    let conns: Vec<_> = (0..20)
        .map(|_| {
            let c = rustix::net::socket_with(
                AddressFamily::UNIX,
                SocketType::SEQPACKET,
                SocketFlags::CLOEXEC,
                None,
            )
            .unwrap();
            rustix::net::connect(&c, &SocketAddrUnix::new(&p.ctrl).unwrap()).unwrap();
            rustix::net::send(&c, &req, SendFlags::NOSIGNAL).unwrap();
            c
        })
        .collect();
    let start = Instant::now();
    while threads_of(pid) < base + 20 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no ATTACH threads"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // They hang up: their waits (and threads) end within a second, not a
    // minute later.
    drop(conns);
    let start = Instant::now();
    while threads_of(pid) > base {
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "{} ATTACH threads outlive their clients",
            threads_of(pid) - base
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    round_trip(&echo_ept(&p.ctrl), 2);
}

#[test]
fn a_shared_runtime_directory_keeps_each_hosts_nodes() {
    let a = pair("eventfd:DIR/ev", &[], &[]);
    let rundir = a.rundir();
    let ca = CtrlClient::connect(&a.ctrl).unwrap();
    echo_ept(&a.ctrl);
    let (_, node_a) = ca.create_ept(&EptInfo::new("echo")).unwrap();
    assert_eq!(node_a, rundir.join("rpmsg0"));
    // A second host with its own remote and control socket, told to put its
    // nodes in the same directory: it must not take over rpmsg0.
    let dir = tempfile::tempdir().unwrap();
    let shm = dir.path().join("shm");
    let ev = format!("unix:{}/ev", s(dir.path()));
    let ctrl_b = dir.path().join("ctrl");
    let _remote = spawn_remote(dir.path(), s(&shm), &ev, &["--echo", "echo"]);
    let _host = spawn_host(
        dir.path(),
        s(&shm),
        &ev,
        &["--ctrl", s(&ctrl_b), "--rundir", s(&rundir)],
    );
    echo_ept(&ctrl_b);
    let cb = CtrlClient::connect(&ctrl_b).unwrap();
    let (_, node_b) = cb.create_ept(&EptInfo::new("echo")).unwrap();
    assert_eq!(node_b, rundir.join("rpmsg1"));
    // Each node still reaches its own host's remote.
    for node in [&node_a, &node_b] {
        let ep = EptFd::open_node(node, O_RDWR | O_CLOEXEC).unwrap();
        round_trip(&ep, 3);
    }
}

#[test]
fn ping_count_0_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let ctrl = dir.path().join("ctrl");
    let out = Command::new(BIN)
        .args(["rpmsg", "ping", "--ctrl", s(&ctrl), "--count", "0"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--count"), "{err}");
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn host_timeout_message_states_the_value_given() {
    let dir = tempfile::tempdir().unwrap();
    let notify = format!("unix:{}", s(&dir.path().join("nobody")));
    let start = Instant::now();
    let out = Command::new(BIN)
        .args(["rpmsg", "host", "--shm", s(&dir.path().join("shm"))])
        .args(["--notify", &notify, "--ctrl", s(&dir.path().join("ctrl"))])
        .args(["--timeout", "1"])
        .output()
        .unwrap();
    let took = start.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("within 1 s"), "{err}");
    assert!(took < Duration::from_secs(3), "{took:?}");
}

#[test]
fn a_second_host_on_a_busy_remote_says_so_within_its_timeout() {
    let p = pair("eventfd:DIR/ev", &[], &[]);
    drop(echo_ept(&p.ctrl));
    let dir = p.dir.path();
    let start = Instant::now();
    // Named by another path than the first host's file (on the same file
    // the first host's role refuses it at once: tests/shm_owner.rs), it
    // reaches the busy remote's notify socket.
    let out = Command::new(BIN)
        .args(["rpmsg", "host", "--shm", s(&dir.join("elsewhere"))])
        .args(["--notify", &format!("eventfd:{}", s(&dir.join("ev")))])
        .args(["--ctrl", s(&dir.join("ctrl2")), "--timeout", "3"])
        .output()
        .unwrap();
    let took = start.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("serving another host"), "{err}");
    assert!(err.contains("within 3 s"), "{err}");
    assert!(took < Duration::from_secs(6), "{took:?}");
    // The first host still serves.
    drop(echo_ept(&p.ctrl));
}

#[test]
fn remote_ready_timeout_bounds_the_wait_for_a_host_on_every_notifier() {
    for kind in ["eventfd", "unix", "poll"] {
        let dir = tempfile::tempdir().unwrap();
        let notify = match kind {
            "poll" => "poll".to_string(),
            k => format!("{k}:{}", s(&dir.path().join("n"))),
        };
        let start = Instant::now();
        let out = Command::new(BIN)
            .args(["rpmsg", "remote", "--shm", s(&dir.path().join("shm"))])
            .args(["--create", "0x80000", "--notify", &notify, "--echo", "echo"])
            .args(["--ready-timeout", "2"])
            .output()
            .unwrap();
        let took = start.elapsed();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{kind}: {err}");
        assert!(err.contains("within 2 s"), "{kind}: {err}");
        assert!(took >= Duration::from_secs(2), "{kind}: {took:?}");
        assert!(took < Duration::from_secs(4), "{kind}: {took:?}");
    }
}
