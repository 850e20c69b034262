//! `iopath blk dd` never waits forever for a vhost-user back end: with a
//! real `iopath blk serve` busy serving a first dd stopped with SIGSTOP, a
//! second dd says once that it is waiting, then fails within `--timeout`
//! naming the request left unanswered; once the first goes, dd is served.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A child killed (and continued first, if stopped) on drop.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            signal(&self.0, "CONT");
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn signal(child: &Child, sig: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(child.id().to_string())
        .status();
}

fn iopath() -> Command {
    Command::new(env!("CARGO_BIN_EXE_iopath"))
}

fn dd(socket: &Path, extra: &[&str]) -> Command {
    let mut c = iopath();
    c.args(["blk", "dd", "--socket"]).arg(socket).args(extra);
    c
}

/// `iopath blk serve` on a fresh 64 MiB `dir/disk.img`, once it listens;
/// returns it with its socket.
fn serve_image(dir: &Path) -> (Killed, PathBuf) {
    let image = dir.join("disk.img");
    std::fs::File::create(&image)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let socket = dir.join("blk.sock");
    let server = Killed(
        iopath()
            .args(["blk", "serve", "--image"])
            .arg(&image)
            .arg("--socket")
            .arg(&socket)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while !socket.exists() {
        assert!(Instant::now() < deadline, "iopath blk serve never listened");
        std::thread::sleep(Duration::from_millis(10));
    }
    (server, socket)
}

#[test]
fn second_front_end_says_it_waits_then_times_out_naming_the_request() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, socket) = serve_image(dir.path());
    let image = dir.path().join("disk.img");

    // The first front end writes for a long time; once its data reaches the
    // image it is connected and being served: stop it there.
    let first = Killed(
        dd(
            &socket,
            &["--bs", "1M", "--count", "64", "--runs", "100000"],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(&image).unwrap()) == 0 {
        assert!(Instant::now() < deadline, "the first dd never wrote");
        std::thread::sleep(Duration::from_millis(10));
    }
    signal(&first.0, "STOP");

    let started = Instant::now();
    let second = dd(&socket, &["--bs", "4K", "--count", "1", "--timeout", "2"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut second = Killed(second);
    let deadline = started + Duration::from_secs(20);
    let status = loop {
        if let Some(st) = second.0.try_wait().unwrap() {
            break st;
        }
        assert!(Instant::now() < deadline, "the second dd hangs");
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = started.elapsed();
    let mut err = String::new();
    std::io::Read::read_to_string(second.0.stderr.as_mut().unwrap(), &mut err).unwrap();
    println!("second dd, after {took:?}:\n{err}");
    assert!(!status.success(), "the second dd succeeded: {err}");
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(10),
        "gave up after {took:?}"
    );
    assert!(err.contains("GET_FEATURES"), "no request named: {err}");
    assert!(err.contains("--timeout"), "no option named: {err}");
    assert_eq!(
        err.matches("waiting for the vhost-user back end").count(),
        1,
        "not said exactly once: {err}"
    );

    // The first one gone, the back end serves the next front end.
    drop(first);
    let out = dd(&socket, &["--bs", "4K", "--count", "1", "--timeout", "5"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_back_end_stopped_mid_run_fails_dd_within_its_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let (server, socket) = serve_image(dir.path());
    let image = dir.path().join("disk.img");
    let mut dd = Killed(
        dd(
            &socket,
            &[
                "--bs",
                "1M",
                "--count",
                "64",
                "--runs",
                "100000",
                "--timeout",
                "3",
            ],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap(),
    );
    // Once data reaches the image the dd is mid-run: stop the back end.
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(&image).unwrap()) == 0 {
        assert!(Instant::now() < deadline, "the dd never wrote");
        std::thread::sleep(Duration::from_millis(10));
    }
    signal(&server.0, "STOP");
    let stopped = Instant::now();
    let status = loop {
        if let Some(st) = dd.0.try_wait().unwrap() {
            break st;
        }
        assert!(stopped.elapsed() < Duration::from_secs(20), "dd hangs");
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = stopped.elapsed();
    let mut err = String::new();
    std::io::Read::read_to_string(dd.0.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(!status.success(), "dd succeeded: {err}");
    // The default (30 s) bounded it before: now the 3 s given do.
    assert!(
        took < Duration::from_secs(8),
        "gave up after {took:?}: {err}"
    );
    assert!(err.contains("within 3 s"), "{err}");
}
