//! Helpers shared by the endpoint-service tests (`rpmsg_ept.rs`,
//! `rpmsg_ept_clients.rs`): a remote/host pair, an echo endpoint, waiting
//! for the service's counters, a ping process driving a passed fd.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use iopath_rpmsg::ctrl::{CtrlClient, CtrlError, EptFd, EptInfo, ServiceStats};
use iopath_rpmsg::wire::ADDR_ANY;
use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::io::Errno;

use crate::common::{pair, Pair, BIN};

/// A remote echoing service "echo" and a host serving endpoints.
pub fn setup() -> Pair {
    setup_with(None)
}

/// As [`setup`]; `notify`: e.g. `Some("poll")` instead of an eventfd pair.
pub fn setup_with(notify: Option<&str>) -> Pair {
    pair(notify.unwrap_or("eventfd:DIR/ev"), &[], &[])
}

/// An endpoint bound to the remote's "echo" (retrying until announced).
pub fn echo_ept(c: &CtrlClient, flags: u32) -> EptFd {
    let start = Instant::now();
    loop {
        let ep = c.create_ept_fd(&EptInfo::new("echo"), flags).unwrap();
        if ep.info().dst != ADDR_ANY {
            return ep;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "echo never announced"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn errno(e: &CtrlError) -> Option<Errno> {
    match e {
        CtrlError::Refused { errno } => Some(Errno::from_raw_os_error(*errno)),
        CtrlError::Io { source, .. } => source.raw_os_error().map(Errno::from_raw_os_error),
        _ => None,
    }
}

pub fn wait_stats(c: &CtrlClient, what: &str, ok: impl Fn(&ServiceStats) -> bool) -> ServiceStats {
    let start = Instant::now();
    loop {
        let st = c.stats().unwrap();
        if ok(&st) {
            return st;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{what}: stats stuck at {st:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn empty_dir(p: &Path) -> bool {
    std::fs::read_dir(p)
        .map(|d| d.count() == 0)
        .unwrap_or(false)
}

pub fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(7) ^ seed).collect()
}

/// Sends `pattern(len, seed)` through `ep` and checks the echo comes back
/// whole within 10 s.
pub fn round_trip(ep: &EptFd, len: usize, seed: u8) {
    let msg = pattern(len, seed);
    ep.send(&msg).unwrap();
    let mut back = [0u8; 600];
    let n = ep.recv_timeout(&mut back, Duration::from_secs(10)).unwrap();
    assert_eq!(n, Some(len));
    assert_eq!(&back[..len], &msg[..]);
}

pub fn revents(fd: impl AsFd, want: PollFlags, ms: i64) -> PollFlags {
    let mut p = [PollFd::new(&fd, want)];
    let ts = Timespec {
        tv_sec: ms / 1000,
        tv_nsec: (ms % 1000) * 1_000_000,
    };
    poll(&mut p, Some(&ts)).unwrap();
    p[0].revents()
}

/// Runs `iopath rpmsg ping --fd N` as a second process that inherited `fd`.
pub fn ping_through(fd: OwnedFd, count: &str) -> serde_json::Value {
    ping_through_with(fd, count, &[])
}

pub fn ping_through_with(fd: OwnedFd, count: &str, extra: &[&str]) -> serde_json::Value {
    let raw = fd.as_raw_fd();
    let o = Command::new(BIN)
        .args([
            "rpmsg",
            "ping",
            "--fd",
            &raw.to_string(),
            "--count",
            count,
            "--json",
        ])
        .args(extra)
        .output()
        .unwrap();
    drop(fd);
    assert!(
        o.status.success(),
        "ping --fd failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}
