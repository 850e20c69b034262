//! Unmodified Linux rpmsg programs on iopath: C programs built here with
//! the system's `cc` against the system's `<linux/rpmsg.h>`, run under
//! `LD_PRELOAD` of `libiopath_rpmsg_preload.so` (directly and through
//! `iopath rpmsg exec`) against `iopath rpmsg host` with an echo remote,
//! both real processes. Assertions are on the programs' checked output.

#[allow(dead_code)]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use iopath_rpmsg::ctrl::proto::O_RDWR;
use iopath_rpmsg::ctrl::{CtrlClient, EptInfo};
use iopath_rpmsg::wire::ADDR_ANY;

use common::{pair, s, wait_path, Proc, BIN};

const SO: &str = "libiopath_rpmsg_preload.so";

/// The C compiler (and `nm`, to look into a build): skipped off CI when
/// missing, a failure under CI (iopath-testkit).
fn have_cc() -> bool {
    iopath_testkit::have_peers(&[("cc", "gcc"), ("nm", "binutils")])
}

/// The preload library cargo built for this test (a dev-dependency: in
/// `deps/` beside the test binary, or uplifted one level up).
fn preload_so() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    for dir in [deps, deps.parent().unwrap()] {
        let p = dir.join(SO);
        if p.is_file() {
            return p;
        }
    }
    panic!(
        "{SO} not found beside {} (cargo builds it as a dev-dependency of iopath)",
        exe.display()
    );
}

/// Builds `tests/c/NAME.c` of the preload crate with `cc` into `dir`.
fn build_c(dir: &Path, name: &str, extra: &[&str]) -> PathBuf {
    build_c_as(dir, name, name, extra)
}

/// As [`build_c`], into `dir/OUT`.
fn build_c_as(dir: &Path, name: &str, out: &str, extra: &[&str]) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../rpmsg-preload/tests/c")
        .join(format!("{name}.c"));
    let out = dir.join(out);
    let o = Command::new("cc")
        .args(["-O2", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&out)
        .arg(&src)
        .args(extra)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "cc {}: {}",
        src.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// Waits until the remote's "echo" is announced (an endpoint bound to it).
fn wait_echo(ctrl: &Path) {
    let c = CtrlClient::connect(ctrl).unwrap();
    let start = Instant::now();
    loop {
        let ep = c.create_ept_fd(&EptInfo::new("echo"), O_RDWR).unwrap();
        if ep.info().dst != ADDR_ANY {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "echo never announced"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Asserts the program passed every check and printed each of `want`.
fn assert_passed(o: &Output, want: &[&str]) {
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success() && !out.contains("FAIL"),
        "status {:?}\nstdout:\n{out}\nstderr:\n{err}",
        o.status
    );
    for w in want {
        assert!(
            out.lines().any(|l| l == format!("ok {w}")),
            "missing \"ok {w}\" in:\n{out}"
        );
    }
}

/// The checks every full run must have made (a program that stops early
/// or skips one fails).
const FULL: &[&str] = &[
    "open /dev/rpmsg_ctrl0",
    "open with run-time flags",
    "openat /dev/rpmsg_ctrl0",
    "RPMSG_CREATE_EPT_IOCTL",
    "unknown ioctl on the control fd is EINVAL",
    "TCGETS on the control fd is EINVAL",
    "FIOQSIZE on the control fd is ENOTTY",
    "FIOASYNC on the control fd is ENOTTY",
    "open /dev/rpmsg0",
    "second open of /dev/rpmsg0 is EBUSY",
    "legacy: write",
    "echo bytes match",
    "legacy: write 497 bytes is EMSGSIZE",
    "legacy: RPMSG_DESTROY_EPT_IOCTL",
    "legacy: read after destroy is EPIPE",
    "legacy: poll after destroy reports POLLHUP|POLLERR",
    "legacy copy: read after destroy is EPIPE",
    "legacy: the node is gone after destroy",
    "legacy: close",
    "RPMSG_CREATE_EPT_FD_IOCTL with O_APPEND is EINVAL",
    "RPMSG_CREATE_EPT_FD_IOCTL",
    "fd: write",
    "fd: write 497 bytes is EMSGSIZE",
    "fd: readv gets the one message back",
    "fd: writev of 497 bytes is EMSGSIZE",
    "fd: RPMSG_DESTROY_EPT_IOCTL",
    "fd: read after destroy is EPIPE",
    "fd: close",
    "200 legacy endpoints on fresh control fds leave no fd open",
    "RPMSG_GET_OUTGOING_FLOWCONTROL answers 0 (virtio)",
    "RPMSG_SET_INCOMING_FLOWCONTROL is EOPNOTSUPP (virtio)",
    "unknown ioctl on an endpoint is EINVAL",
    "FIOQSIZE on an endpoint is ENOTTY",
    "FIOASYNC on an endpoint is ENOTTY",
    "RPMSG_CREATE_DEV_IOCTL twice is ENXIO",
    "RPMSG_RELEASE_DEV_IOCTL twice is EINVAL",
    "close /dev/rpmsg_ctrl0",
];

#[test]
fn linux_uapi_program_runs_unmodified() {
    if !have_cc() {
        return;
    }
    let st = pair("eventfd:DIR/ev", &[], &[]);
    let so = preload_so();
    let prog = build_c(st.dir.path(), "rpmsg_uapi", &[]);
    wait_echo(&st.ctrl);

    // Under LD_PRELOAD directly.
    let o = Command::new(&prog)
        .env("LD_PRELOAD", &so)
        .env("IOPATH_RPMSG_CTRL", &st.ctrl)
        .output()
        .unwrap();
    assert_passed(&o, FULL);

    // Through `iopath rpmsg exec`, from another directory (the paths it
    // passes on are absolute).
    let o = Command::new(BIN)
        .current_dir("/")
        .args(["rpmsg", "exec", "--ctrl", s(&st.ctrl), "--preload"])
        .arg(&so)
        .arg("--")
        .arg(&prog)
        .output()
        .unwrap();
    assert_passed(&o, FULL);

    // Built with _FORTIFY_SOURCE and 64-bit offsets, its opens with
    // run-time flags are glibc's fortified variants: interposed too.
    let fortified = build_c_as(
        st.dir.path(),
        "rpmsg_uapi",
        "rpmsg_uapi_fortified",
        &["-D_FORTIFY_SOURCE=2", "-D_FILE_OFFSET_BITS=64"],
    );
    let syms = Command::new("nm")
        .arg("-D")
        .arg(&fortified)
        .output()
        .unwrap();
    let syms = String::from_utf8_lossy(&syms.stdout);
    for f in ["open", "read", "poll"] {
        assert!(
            syms.contains(&format!("__{f}_2"))
                || syms.contains(&format!("__{f}64_2"))
                || syms.contains(&format!("__{f}_chk")),
            "no fortified {f} in the build: {syms}"
        );
    }
    let o = Command::new(&fortified)
        .env("LD_PRELOAD", &so)
        .env("IOPATH_RPMSG_CTRL", &st.ctrl)
        .output()
        .unwrap();
    assert_passed(&o, FULL);

    // Every run left nothing behind in the service.
    let c = CtrlClient::connect(&st.ctrl).unwrap();
    let start = Instant::now();
    loop {
        let s = c.stats().unwrap();
        if s.endpoints() == 0 && std::fs::read_dir(st.rundir()).unwrap().count() == 0 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "endpoints left: {s:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(c.stats().unwrap().oversize, 0, "a 497-byte write got out");
}

/// fork(2) at any moment, while another thread opens and closes rpmsg
/// fds: no child inherits a lock held by a thread it does not have (the
/// library before its fork handlers hung about 1 child in 150 here).
/// On a bus whose remote offered 4 KiB buffers, the uAPI's limit moves
/// with them: 4080 bytes cross both ways through an fd endpoint and a
/// legacy one, 4081 are `EMSGSIZE`.
#[test]
fn negotiated_buffers_move_emsgsize() {
    if !have_cc() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (shm, ctrl) = (dir.path().join("shm"), dir.path().join("ctrl"));
    let ev = format!("eventfd:{}", s(&dir.path().join("ev")));
    let _remote = Proc::spawn(
        dir.path(),
        "remote",
        &[
            "rpmsg",
            "remote",
            "--shm",
            s(&shm),
            "--create",
            "2M",
            "--ring",
            "64",
            "--buf-size",
            "4K",
            "--notify",
            &ev,
            "--echo",
            "echo",
        ],
    );
    let _host = Proc::spawn(
        dir.path(),
        "host",
        &[
            "rpmsg",
            "host",
            "--shm",
            s(&shm),
            "--notify",
            &ev,
            "--ctrl",
            s(&ctrl),
        ],
    );
    wait_path(&ctrl);
    wait_echo(&ctrl);
    let prog = build_c(dir.path(), "rpmsg_bufsz", &[]);
    let o = Command::new(&prog)
        .arg("4080")
        .env("LD_PRELOAD", preload_so())
        .env("IOPATH_RPMSG_CTRL", &ctrl)
        .output()
        .unwrap();
    assert_passed(
        &o,
        &[
            "fd: 4080 bytes echoed byte for byte",
            "fd: write 4081 bytes is EMSGSIZE",
            "legacy: 4080 bytes echoed byte for byte",
            "legacy: write 4081 bytes is EMSGSIZE",
        ],
    );
}

#[test]
fn fork_while_another_thread_churns_never_hangs_a_child() {
    if !have_cc() {
        return;
    }
    let st = pair("eventfd:DIR/ev", &[], &[]);
    let so = preload_so();
    let prog = build_c(st.dir.path(), "rpmsg_fork", &["-pthread"]);
    wait_echo(&st.ctrl);
    let o = Command::new(&prog)
        .arg("1000")
        .env("LD_PRELOAD", &so)
        .env("IOPATH_RPMSG_CTRL", &st.ctrl)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && !out.contains("FAIL"),
        "status {:?}\n{out}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("ok 1000 forks while another thread made")),
        "{out}"
    );
}

#[test]
fn without_the_service_nothing_changes() {
    if !have_cc() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let so = preload_so();
    let prog = build_c(dir.path(), "rpmsg_uapi", &[]);
    let absent = [
        "no rpmsg: open /dev/rpmsg_ctrl0 is ENOENT",
        "no rpmsg: open /dev/rpmsg0 is ENOENT",
        "no rpmsg: ordinary files still open and read",
    ];
    // No IOPATH_RPMSG_CTRL: everything goes to libc.
    let o = Command::new(&prog)
        .arg("--absent")
        .env("LD_PRELOAD", &so)
        .env_remove("IOPATH_RPMSG_CTRL")
        .output()
        .unwrap();
    assert_passed(&o, &absent);
    // The service down (no socket there): as a machine without rpmsg.
    let o = Command::new(&prog)
        .arg("--absent")
        .env("LD_PRELOAD", &so)
        .env("IOPATH_RPMSG_CTRL", dir.path().join("no-such-ctrl"))
        .output()
        .unwrap();
    assert_passed(&o, &absent);
}

#[test]
fn remote_gone_is_epipe_under_the_preload() {
    if !have_cc() {
        return;
    }
    let mut st = pair("eventfd:DIR/ev", &[], &[]);
    let so = preload_so();
    let prog = build_c(st.dir.path(), "rpmsg_uapi", &[]);
    wait_echo(&st.ctrl);
    let mut child = Command::new(&prog)
        .arg("--until-gone")
        .env("LD_PRELOAD", &so)
        .env("IOPATH_RPMSG_CTRL", &st.ctrl)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The program says when its endpoints are up; then the remote dies.
    use std::io::BufRead;
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    for l in lines.by_ref() {
        let l = l.unwrap();
        seen.push(l.clone());
        if l == "ok endpoints up" {
            break;
        }
        assert!(!l.starts_with("FAIL"), "{seen:?}");
    }
    st.remote.kill();
    for l in lines {
        seen.push(l.unwrap());
    }
    let status = child.wait().unwrap();
    let out = seen.join("\n");
    assert!(
        status.success() && !out.contains("FAIL"),
        "{status:?}:\n{out}"
    );
    for w in [
        "legacy: remote gone: poll reports POLLHUP|POLLERR",
        "legacy: remote gone: read is EPIPE",
        "legacy: remote gone: write is EPIPE",
        "fd: remote gone: poll reports POLLHUP|POLLERR",
        "fd: remote gone: read is EPIPE",
        "fd: remote gone: write is EPIPE",
    ] {
        assert!(
            seen.iter().any(|l| *l == format!("ok {w}")),
            "missing {w}:\n{out}"
        );
    }
}

#[test]
fn exec_refuses_a_static_program_and_a_missing_library() {
    if !have_cc() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // A socket at --ctrl, so exec gets past its check of the service and
    // to the program's and the preload's own checks.
    let ctrl = dir.path().join("x.ctrl");
    let _listener = std::os::unix::net::UnixListener::bind(&ctrl).unwrap();
    let src = dir.path().join("hello.c");
    std::fs::write(&src, "int main(void) { return 0; }\n").unwrap();
    let prog = dir.path().join("hello-static");
    let built = Command::new("cc")
        .args(["-static", "-o"])
        .arg(&prog)
        .arg(&src)
        .status()
        .unwrap()
        .success();
    let so = preload_so();
    if built {
        let o = Command::new(BIN)
            .args(["rpmsg", "exec", "--ctrl"])
            .arg(&ctrl)
            .arg("--preload")
            .arg(&so)
            .arg("--")
            .arg(&prog)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success());
        assert!(err.contains("statically linked"), "{err}");
    } else {
        // A libc without its static archive: the check above cannot be
        // made here (the dynamic case is covered by the other tests).
        iopath_testkit::skip(
            iopath_testkit::Feature::Package("libc6-dev"),
            "the static case: cc -static failed (no libc.a)",
        );
    }
    let o = Command::new(BIN)
        .args(["rpmsg", "exec", "--ctrl"])
        .arg(&ctrl)
        .arg("--preload")
        .arg(dir.path().join("nope.so"))
        .args(["--", "true"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("--preload") && err.contains("no such file"),
        "{err}"
    );
}

/// The same semantics without the preload, through `EptFd`: what the C
/// program checks, from Rust.
#[test]
fn ept_fd_has_the_same_semantics() {
    use iopath_rpmsg::ctrl::CtrlError;
    use rustix::event::PollFlags;
    let errno = |e: CtrlError| match e {
        CtrlError::Io { source, .. } => source.raw_os_error(),
        CtrlError::Refused { errno } => Some(errno),
        _ => None,
    };
    let mut st = pair("eventfd:DIR/ev", &[], &[]);
    wait_echo(&st.ctrl);
    let c = CtrlClient::connect(&st.ctrl).unwrap();
    let ep = c.create_ept_fd(&EptInfo::new("echo"), O_RDWR).unwrap();
    let (info, node) = c.create_ept(&EptInfo::new("echo")).unwrap();
    assert_ne!(info.dst, ADDR_ANY);
    let legacy = iopath_rpmsg::ctrl::EptFd::open_node(&node, 0).unwrap();
    let again = iopath_rpmsg::ctrl::EptFd::open_node(&node, 0).unwrap_err();
    assert_eq!(errno(again), Some(libc_ebusy()));
    for e in [&ep, &legacy] {
        e.send(b"ping").unwrap();
        let mut b = [0u8; 16];
        assert_eq!(
            e.recv_timeout(&mut b, Duration::from_secs(10)).unwrap(),
            Some(4)
        );
        assert_eq!(&b[..4], b"ping");
        assert_eq!(
            errno(e.send(&[0u8; 497]).unwrap_err()),
            Some(libc_emsgsize())
        );
        assert_eq!(
            e.poll(PollFlags::IN, Some(Duration::from_millis(100)))
                .unwrap(),
            PollFlags::empty()
        );
    }
    st.remote.kill();
    for e in [&ep, &legacy] {
        let r = e
            .poll(PollFlags::IN, Some(Duration::from_secs(10)))
            .unwrap();
        assert!(r.contains(PollFlags::HUP | PollFlags::ERR), "{r:?}");
        let mut b = [0u8; 16];
        assert_eq!(errno(e.recv(&mut b).unwrap_err()), Some(libc_epipe()));
        assert_eq!(errno(e.send(b"x").unwrap_err()), Some(libc_epipe()));
    }
}

fn libc_ebusy() -> i32 {
    rustix::io::Errno::BUSY.raw_os_error()
}

fn libc_emsgsize() -> i32 {
    rustix::io::Errno::MSGSIZE.raw_os_error()
}

fn libc_epipe() -> i32 {
    rustix::io::Errno::PIPE.raw_os_error()
}

#[test]
fn exec_with_a_missing_ctrl_socket_does_not_run_the_program() {
    let dir = tempfile::tempdir().unwrap();
    let ran = dir.path().join("ran");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_iopath"))
        .args(["rpmsg", "exec", "--ctrl"])
        .arg(dir.path().join("missing.ctrl"))
        .args(["--", "sh", "-c", "touch \"$0\""])
        .arg(&ran)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("--ctrl") && err.contains("no endpoint service there"),
        "{err}"
    );
    assert!(err.contains("No such file or directory"), "{err}");
    assert!(!ran.exists(), "the program ran");
}
