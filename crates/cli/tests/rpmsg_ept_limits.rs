//! One client cannot starve the endpoint service: a hog, run as another
//! user (uid 65534 through `setpriv`), creates endpoints and keeps them
//! until refused with its own errno (EMFILE for its connection, ENOSPC for
//! its user), while a client of another user still creates endpoints and
//! exchanges messages, and STATS is still answered: real processes, a real
//! remote and host.

#[allow(dead_code)]
mod common;

use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{echo_ept, round_trip, s, wait_path, Proc, BIN};
use iopath_rpmsg::ctrl::proto::{O_CLOEXEC, O_RDWR};
use iopath_rpmsg::ctrl::{CtrlClient, CtrlError, EptInfo};

/// Where the hog finds the control socket; set only when this binary runs
/// as the hog.
const HOG: &str = "IOPATH_TEST_HOG_CTRL";

const EMFILE: i64 = rustix::io::Errno::MFILE.raw_os_error() as i64;
const ENOSPC: i64 = rustix::io::Errno::NOSPC.raw_os_error() as i64;

/// Not a test of its own: the hog, when [`spawn_hog`] runs this binary
/// again as another user. On each of two connections it creates fd
/// endpoints until refused, prints `HOG N1 ERRNO1 N2 ERRNO2`, and holds
/// everything until its stdin closes.
#[test]
#[ignore = "run by spawn_hog in a child process"]
fn hog_when_run_as_one() {
    let ctrl = std::env::var(HOG).expect("run by spawn_hog");
    let mut conns = Vec::new();
    let mut held = Vec::new();
    let mut line = String::from("HOG");
    for _ in 0..2 {
        let c = CtrlClient::connect(Path::new(&ctrl)).unwrap();
        let mut n = 0;
        let errno = loop {
            match c.create_ept_fd(&EptInfo::new("hog"), O_RDWR | O_CLOEXEC) {
                Ok(ep) => {
                    held.push(ep);
                    n += 1;
                }
                Err(CtrlError::Refused { errno }) => break errno,
                Err(e) => panic!("hog: {e}"),
            }
        };
        line += &format!(" {n} {errno}");
        conns.push(c);
    }
    println!("{line}");
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
}

/// The hog as uid/gid 65534; returns it and what it could take.
fn spawn_hog(ctrl: &Path) -> (Child, [i64; 4]) {
    let me = std::env::current_exe().unwrap();
    let mut hog = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(me)
        .args([
            "--ignored",
            "--exact",
            "hog_when_run_as_one",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(HOG, ctrl)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("setpriv (util-linux) is needed");
    let mut out = BufReader::new(hog.stdout.take().unwrap());
    let mut line = String::new();
    // libtest's "test NAME ... " comes first on the same line.
    while !line.contains("HOG ") {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the hog said nothing"
        );
    }
    let (_, said) = line.split_once("HOG ").unwrap();
    let v: Vec<i64> = said
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect();
    // The rest of libtest's report, so the hog never writes to a closed pipe.
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    (hog, [v[0], v[1], v[2], v[3]])
}

fn root_or_skip() -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    iopath_testkit::skip(
        iopath_testkit::Feature::Root,
        "acting as another user needs root (setpriv)",
    );
    false
}

/// A remote with "echo" and a host whose control socket everyone may use,
/// the host started by `sh -c PRELUDE; exec iopath ...`.
fn pair(dir: &Path, prelude: &str, host_extra: &[&str]) -> (Proc, Proc, std::path::PathBuf) {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let shm = dir.join("shm");
    let ev = format!("eventfd:{}", s(&dir.join("ev")));
    let remote = common::spawn_remote(dir, s(&shm), &ev, &["--echo", "echo"]);
    let ctrl = dir.join("ctrl");
    let script = format!("{prelude}; exec \"$0\" \"$@\"");
    let mut argv = vec!["-c", &script, BIN, "rpmsg", "host", "--shm", s(&shm)];
    argv.extend_from_slice(&["--notify", &ev, "--ctrl", s(&ctrl), "--ctrl-mode", "666"]);
    argv.extend_from_slice(host_extra);
    let host = Proc::spawn_program(dir, "host", Path::new("/bin/sh"), &argv);
    wait_path(&ctrl);
    (remote, host, ctrl)
}

/// What another user's client still gets while the hog holds its share.
fn others_unaffected(ctrl: &Path, n: usize) {
    let ep = echo_ept(ctrl);
    round_trip(&ep, 7);
    let c = CtrlClient::connect(ctrl).unwrap();
    let mine: Vec<_> = (0..n)
        .map(|i| {
            c.create_ept_fd(&EptInfo::new("mine"), O_RDWR | O_CLOEXEC)
                .unwrap_or_else(|e| panic!("endpoint {i} of another user refused: {e}"))
        })
        .collect();
    assert_eq!(mine.len(), n);
    round_trip(&ep, 8);
    let st = c.stats().unwrap();
    assert!(st.fd_endpoints as usize > n, "{st:?}");
}

#[test]
fn a_hog_is_refused_with_its_own_errno_and_nobody_else_notices() {
    if !root_or_skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_remote, host, ctrl) = pair(
        dir.path(),
        "true",
        &[
            "--max-endpoints-per-client",
            "40",
            "--max-endpoints-per-uid",
            "60",
        ],
    );
    let (mut hog, took) = spawn_hog(&ctrl);
    // Its first connection stops at its own bound, its second at its
    // user's: 40 + 20.
    assert_eq!(took, [40, EMFILE, 20, ENOSPC]);
    // Another user gets its own bounds in full: 40 on a connection (and
    // the echo endpoint on another).
    others_unaffected(&ctrl, 40);
    // Its endpoints go with it, and its user may create again.
    drop(hog.stdin.take());
    assert!(hog.wait().unwrap().success());
    let c = CtrlClient::connect(&ctrl).unwrap();
    let start = std::time::Instant::now();
    while c.stats().unwrap().fd_endpoints > 0 {
        assert!(start.elapsed() < Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(20));
    }
    let (mut again, took) = spawn_hog(&ctrl);
    assert_eq!(took[0], 40);
    drop(again.stdin.take());
    assert!(again.wait().unwrap().success());
    drop(host);
}

#[test]
fn under_ulimit_1024_a_hog_takes_a_share_not_all() {
    if !root_or_skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Soft and hard limit 1024, defaults for the bounds: the service
    // keeps a reserve and gives one user a quarter of what is left, and
    // one connection a quarter of its user's share.
    let (_remote, host, ctrl) = pair(dir.path(), "ulimit -n 1024", &[]);
    let (mut hog, took) = spawn_hog(&ctrl);
    assert_eq!(took[1], EMFILE, "{took:?}");
    assert!((25..=64).contains(&took[0]), "{took:?}");
    // The same user's next client is not starved by the first: it gets
    // a connection's share of its own.
    assert_eq!(took[2..], [took[0], EMFILE], "{took:?}");
    // The other user has the same share (less its echo endpoint).
    others_unaffected(&ctrl, took[0] as usize - 1);
    assert!(
        host.stderr().contains("endpoints per client"),
        "{}",
        host.stderr()
    );
    drop(hog.stdin.take());
    assert!(hog.wait().unwrap().success());
}
