//! Buffer sizes beyond 512 bytes with real processes: `iopath rpmsg remote
//! --buf-size` offers them, `iopath rpmsg host` takes them, pings carry
//! the largest payloads byte for byte, `ept stats` names them; sizes no
//! buffer can have are usage errors naming the option.

#[allow(dead_code)]
mod common;

use std::path::PathBuf;
use std::process::Command;

use common::{s, wait_path, Proc, BIN};

struct Bus {
    _dir: tempfile::TempDir,
    remote: Proc,
    host: Proc,
    ctrl: PathBuf,
}

/// A remote (echo service "echo") created with `remote_extra`, and a host
/// with a control socket and `host_extra`.
fn bus(remote_extra: &[&str], host_extra: &[&str]) -> Bus {
    let dir = tempfile::tempdir().unwrap();
    let (shm, ctrl) = (dir.path().join("shm"), dir.path().join("ctrl"));
    let ev = format!("eventfd:{}", s(&dir.path().join("ev")));
    let mut ra = vec![
        "rpmsg",
        "remote",
        "--shm",
        s(&shm),
        "--notify",
        &ev,
        "--echo",
        "echo",
    ];
    ra.extend_from_slice(remote_extra);
    let remote = Proc::spawn(dir.path(), "remote", &ra);
    let mut ha = vec![
        "rpmsg",
        "host",
        "--shm",
        s(&shm),
        "--notify",
        &ev,
        "--ctrl",
        s(&ctrl),
    ];
    ha.extend_from_slice(host_extra);
    let host = Proc::spawn(dir.path(), "host", &ha);
    wait_path(&ctrl);
    Bus {
        _dir: dir,
        remote,
        host,
        ctrl,
    }
}

fn run_json(args: &[&str]) -> serde_json::Value {
    let o = Command::new(BIN).args(args).output().unwrap();
    assert!(
        o.status.success(),
        "{args:?}: {}\n{}",
        String::from_utf8_lossy(&o.stderr),
        String::from_utf8_lossy(&o.stdout)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

/// Pings of `size` bytes, every echo compared by ping, and the service's
/// sizes.
fn check(b: &Bus, size: usize, out: usize, inn: usize) {
    let ctrl = s(&b.ctrl);
    let v = run_json(&[
        "rpmsg",
        "ping",
        "--ctrl",
        ctrl,
        "--name",
        "echo",
        "--count",
        "50",
        "--size",
        &size.to_string(),
        "--json",
    ]);
    assert_eq!(v["count"], 50);
    assert_eq!(v["bytes"], 50 * size as u64);
    assert_eq!(v["checked"], true);
    let v = run_json(&["rpmsg", "ept", "stats", "--ctrl", ctrl, "--json"]);
    assert_eq!(v["max_payload"], out as u64);
    assert_eq!(v["max_rx_payload"], inn as u64);
}

#[test]
fn linux_64k() {
    let b = bus(
        &["--create", "4M", "--ring", "16", "--buf-size", "64K"],
        &[],
    );
    check(&b, 65520, 65520, 65520);
    assert!(b.remote.stderr().contains("BUFSZ"), "{}", b.remote.stderr());
    let h = b.host.stderr();
    assert!(
        h.contains("payloads up to 65520 bytes to the remote, 65520 from it"),
        "{h}"
    );
}

#[test]
fn nuttx_per_direction() {
    let b = bus(
        &[
            "--create",
            "4M",
            "--ring",
            "64",
            "--tx-buf-size",
            "2K",
            "--rx-buf-size",
            "4K",
            "--buf-size-convention",
            "nuttx",
        ],
        &["--buf-size-convention", "nuttx"],
    );
    // The echo of 2032 bytes fits the remote's 2 KiB buffers.
    check(&b, 2032, 4080, 2032);
}

/// A host that declines: 512 bytes both ways, as without the option.
#[test]
fn declined_is_496() {
    let b = bus(
        &["--create", "4M", "--ring", "64", "--buf-size", "4K"],
        &["--no-buf-size"],
    );
    check(&b, 496, 496, 496);
}

#[test]
fn sizes_no_buffer_has_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let shm = dir.path().join("shm");
    let ev = format!("eventfd:{}", s(&dir.path().join("ev")));
    for (extra, code, want) in [
        (
            &["--buf-size", "256"][..],
            2,
            "--buf-size 256: a buffer is 512 to 65536",
        ),
        (&["--buf-size", "1001"][..], 2, "--buf-size 1001"),
        (&["--tx-buf-size", "128K"][..], 2, "--tx-buf-size 131072"),
        (&["--rx-buf-size", "0"][..], 2, "--rx-buf-size 0"),
        // Buffers that do not fit the shared memory: the size that would.
        (&["--buf-size", "64K"][..], 1, "--create 0x"),
    ] {
        let o = Command::new(BIN)
            .args(["rpmsg", "remote", "--shm", s(&shm), "--notify", &ev])
            .args(["--create", "0x80000", "--ready-timeout", "1", "--once"])
            .args(extra)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(code), "{extra:?}: {err}");
        assert!(err.contains(want), "{extra:?}: {err}");
    }
    // Without --create there is no table to offer them in.
    let o = Command::new(BIN)
        .args([
            "rpmsg",
            "remote",
            "--shm",
            s(&shm),
            "--notify",
            &ev,
            "--buf-size",
            "4K",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
}
