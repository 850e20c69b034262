//! `iopath blk dd` through the binary against qemu-storage-daemon: every
//! mode the peer supports writes the `seq` pattern and verifies it, the
//! JSON report says so, and the image file holds the pattern afterwards.
//! `--dma iommu` fails with a one-line error (the peer has no IOTLB).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use iopath_sys::process::Supervised;

/// A vhost-user-blk peer (qemu-storage-daemon or `iopath blk serve`) on a
/// fresh image; killed on drop.
struct Peer {
    _child: Supervised,
    socket: PathBuf,
    image: PathBuf,
    _dir: tempfile::TempDir,
}

/// Creates a `len`-byte image `disk.img` in a fresh directory, starts the
/// command `peer(image, socket)` builds and waits for it to listen on
/// `blk.sock`; `what` names it in failures.
fn start_peer(what: &str, len: u64, peer: impl FnOnce(&Path, &Path) -> Command) -> Peer {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("disk.img");
    std::fs::File::create(&image).unwrap().set_len(len).unwrap();
    let socket = dir.path().join("blk.sock");
    let mut child = Supervised::spawn(what, peer(&image, &socket).stdout(Stdio::null())).unwrap();
    let limit = Duration::from_secs(20);
    child
        .wait_for("its socket", limit, || socket.exists())
        .unwrap();
    Peer {
        _child: child,
        socket,
        image,
        _dir: dir,
    }
}

fn qsd(len: u64) -> Option<Peer> {
    if !iopath_testkit::have_peer("qemu-storage-daemon", "qemu-utils") {
        return None;
    }
    Some(start_peer("qemu-storage-daemon", len, |image, socket| {
        let mut c = Command::new("qemu-storage-daemon");
        c.arg("--blockdev")
            .arg(format!(
                "driver=file,node-name=disk,filename={},cache.direct=on",
                image.display()
            ))
            .arg("--export")
            .arg(format!(
                "type=vhost-user-blk,id=exp,node-name=disk,addr.type=unix,addr.path={},writable=on,num-queues=2",
                socket.display()
            ));
        c
    }))
}

/// `iopath blk serve` on a fresh image; killed on drop.
fn serve(len: u64) -> Peer {
    start_peer("iopath blk serve", len, |image, socket| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_iopath"));
        c.args(["blk", "serve", "--queues", "2", "--image"])
            .arg(image)
            .arg("--socket")
            .arg(socket);
        c
    })
}

fn dd(socket: &Path, extra: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_iopath"))
        .args(["blk", "dd", "--socket"])
        .arg(socket)
        .args(extra)
        .output()
        .unwrap()
}

/// `dd` writing the `seq` pattern with `--verify` through `mode` (4 blocks
/// of 1 MiB at `offset`, 3 in flight, two queues, `extra` arguments); the
/// JSON report of a run that must succeed.
fn dd_seq(socket: &Path, mode: &str, offset: u64, extra: &[&str]) -> serde_json::Value {
    let offset = offset.to_string();
    let mut args = vec![
        "--bs",
        "1M",
        "--count",
        "4",
        "--pattern",
        "seq",
        "--verify",
        "--dma",
        mode,
        "--queue-depth",
        "3",
        "--queues",
        "2",
    ];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--json", "--offset", &offset]);
    let out = dd(socket, &args);
    assert!(
        out.status.success(),
        "{mode}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn check_seq(image: &Path, from: u64, len: u64) {
    let data = std::fs::read(image).unwrap();
    for at in (from..from + len).step_by(8) {
        let w = u64::from_le_bytes(data[at as usize..at as usize + 8].try_into().unwrap());
        assert_eq!(w, at, "image word at byte {at}");
    }
    assert!(data[..from as usize].iter().all(|&b| b == 0));
    assert!(data[(from + len) as usize..].iter().all(|&b| b == 0));
}

#[test]
fn dd_writes_and_verifies_seq_in_every_mode_the_peer_supports() {
    let Some(q) = qsd(32 << 20) else { return };
    for (i, mode) in ["direct", "direct-static", "bounce"].iter().enumerate() {
        // Each mode writes its own 4 MiB range (blocks of 1 MiB, 3 in flight,
        // two queues) after the previous one, so the image shows them all.
        let offset = (4 << 20) * (i as u64 + 1);
        let v = dd_seq(&q.socket, mode, offset, &["--runs", "2"]);
        assert_eq!(v["bytes"], 4 << 20);
        assert_eq!(v["dma"], *mode);
        assert_eq!(v["verified"], true);
        assert_eq!(v["queues"], 2);
        assert_eq!(v["runs"].as_array().unwrap().len(), 2);
        assert!(v["median_gib_per_s"].as_f64().unwrap() > 0.0);
        assert!(v["runs"][0]["seconds"].as_f64().unwrap() > 0.0);
    }
    check_seq(&q.image, 4 << 20, 12 << 20);

    // A read of a range that holds zeros fails --verify against seq.
    let out = dd(
        &q.socket,
        &[
            "--bs",
            "1M",
            "--count",
            "2",
            "--op",
            "read",
            "--pattern",
            "seq",
            "--verify",
            "--offset",
            "20M",
        ],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("verify failed: the device's byte 20971520"),
        "{err}"
    );
}

#[test]
fn dd_refuses_iommu_mode_without_access_platform_and_bad_arguments() {
    let Some(q) = qsd(8 << 20) else { return };
    let out = dd(&q.socket, &["--bs", "1M", "--count", "1", "--dma", "iommu"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("VIRTIO_F_ACCESS_PLATFORM"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one-line error: {err}");

    let out = dd(&q.socket, &["--bs", "1M", "--count", "9"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("past the device's end"));

    let out = dd(&q.socket, &["--bs", "1000"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("multiple of 512"));
}

#[test]
fn dd_usage_errors_exit_2_and_a_regular_file_is_not_a_socket() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-socket");
    std::fs::write(&file, b"x").unwrap();
    // Refused before any connect: the path is a regular file.
    let out = dd(&file, &["--count", "1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("not a socket (a regular file)"), "{err}");
    assert!(!err.contains("Connection refused"), "{err}");
    // The options the workload refuses are usage errors too, like clap's.
    let sock = dir.path().join("none.sock");
    for (args, says) in [
        (&["--bs", "1000"][..], "multiple of 512"),
        (
            &["--queues", "2", "--queue-depth", "1"][..],
            "--queue-depth (1)",
        ),
        (&["--bs", "bogus"][..], "--bs"),
    ] {
        let out = dd(&sock, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

#[test]
fn dd_verifies_every_mode_against_iopath_blk_serve() {
    let s = serve(40 << 20);
    for (i, mode) in ["direct", "direct-static", "iommu", "bounce"]
        .iter()
        .enumerate()
    {
        let offset = (4 << 20) * (i as u64 + 1);
        let v = dd_seq(&s.socket, mode, offset, &[]);
        assert_eq!(v["dma"], *mode);
        assert_eq!(v["verified"], true);
    }
    check_seq(&s.image, 4 << 20, 16 << 20);
}

#[test]
fn dd_random_4k_blocks_verify_and_fill_the_range() {
    let s = serve(8 << 20);
    let out = dd(
        &s.socket,
        &[
            "--bs",
            "4K",
            "--count",
            "256",
            "--access",
            "rand",
            "--seed",
            "9",
            "--pattern",
            "seq",
            "--verify",
            "--queues",
            "2",
            "--queue-depth",
            "8",
            "--offset",
            "1M",
            "--json",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["access"], "rand");
    assert_eq!(v["seed"], 9);
    assert_eq!(v["verified"], true);
    assert_eq!(v["bytes"], 256 * 4096);
    check_seq(&s.image, 1 << 20, 256 * 4096);

    let out = dd(&s.socket, &["--access", "sideways"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--access") && err.contains("rand"), "{err}");
}

/// `--platform` against both peers: the policy's outcome is in the JSON
/// report (`ops`), the data in the image.
fn dd_platform(socket: &Path, platform: &str, offset: &str) -> std::process::Output {
    dd(
        socket,
        &[
            "--platform",
            platform,
            "--bs",
            "1M",
            "--count",
            "2",
            "--pattern",
            "seq",
            "--verify",
            "--offset",
            offset,
            "--json",
        ],
    )
}

#[test]
fn dd_platform_policy_against_iopath_blk_serve() {
    let s = serve(8 << 20);
    for (i, (platform, ops)) in [
        ("direct", "direct"),
        ("iommu", "iommu"),
        ("protected", "bounce"),
    ]
    .into_iter()
    .enumerate()
    {
        let out = dd_platform(&s.socket, platform, &format!("{}M", 2 * i + 1));
        assert!(
            out.status.success(),
            "{platform}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["platform"], platform);
        assert_eq!(v["ops"], ops, "{platform}");
        assert_eq!(v["dispatch"], "dyn");
        assert_eq!(v["dma"], serde_json::Value::Null);
        assert_eq!(v["verified"], true);
    }
    check_seq(&s.image, 1 << 20, 6 << 20);
}

#[test]
fn dd_platform_policy_against_qemu_storage_daemon() {
    let Some(q) = qsd(8 << 20) else { return };
    // An IOMMU platform: the device bypasses the IOMMU, so direct ops and
    // a warning saying why.
    let out = dd_platform(&q.socket, "iommu", "1M");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ops"], "direct");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("WARN") && err.contains("does not offer VIRTIO_F_ACCESS_PLATFORM"),
        "{err}"
    );
    check_seq(&q.image, 1 << 20, 2 << 20);

    // A protected platform refuses it, in one line that says why.
    let out = dd_platform(&q.socket, "protected", "4M");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("Protected platform")
            && err.contains("does not offer VIRTIO_F_ACCESS_PLATFORM")
            && err.contains("refused"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "one-line error: {err}");
    check_seq(&q.image, 1 << 20, 2 << 20);
}

/// Small blocks work (the block buffers are rounded up to pages, not
/// refused with a page-size error about an option nobody gave), and each
/// bad argument is named with what it accepts.
#[test]
fn dd_small_blocks_work_and_errors_name_the_option() {
    let s = serve(1 << 20);
    let out = dd(
        &s.socket,
        &["--bs", "512", "--count", "1", "--offset", "512", "--json"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = dd(
        &s.socket,
        &[
            "--bs",
            "512",
            "--count",
            "8",
            "--pattern",
            "seq",
            "--verify",
            "--offset",
            "4096",
            "--queue-depth",
            "3",
            "--json",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["verified"], true);
    check_seq(&s.image, 4096, 8 * 512);
    // Sizes in hexadecimal, as every size option takes them.
    let out = dd(
        &s.socket,
        &[
            "--bs",
            "0x400",
            "--count",
            "2",
            "--pattern",
            "seq",
            "--verify",
            "--offset",
            "0x2000",
            "--json",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (v["bs"].as_u64(), v["verified"].as_bool()),
        (Some(1024), Some(true))
    );
    let image = std::fs::read(&s.image).unwrap();
    for at in (0x2000..0x2800).step_by(8) {
        let w = u64::from_le_bytes(image[at..at + 8].try_into().unwrap());
        assert_eq!(w, at as u64, "image word at byte {at}");
    }

    for (args, wants) in [
        (
            &["--offset", "18446744073709551104"][..],
            &[
                "--offset + --bs x --count overflows",
                "at most 18446744073709551615",
            ][..],
        ),
        (
            &["--bs", "1000"],
            &["--bs 1000", "a positive multiple of 512 bytes"],
        ),
        (
            &["--offset", "100"],
            &["--offset 100", "a multiple of 512 bytes"],
        ),
        (&["--count", "0"], &["--count 0", "at least 1"]),
        (
            &["--queue-depth", "300"],
            &["--queue-depth 300", "1 to 256"],
        ),
        (
            &["--queues", "2", "--queue-depth", "1"],
            &["--queue-depth (1)", "at least --queues (2)"],
        ),
    ] {
        let out = dd(&s.socket, args);
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("page size"), "{args:?}: {err}");
        for w in wants {
            assert!(err.contains(w), "{args:?}: {err:?} lacks {w:?}");
        }
    }
}

#[test]
fn dd_prints_each_run_as_it_completes() {
    use std::io::{BufRead, BufReader};
    let peer = serve(16 << 20);
    let mut child = Command::new(env!("CARGO_BIN_EXE_iopath"))
        .args(["blk", "dd", "--socket"])
        .arg(&peer.socket)
        .args(["--bs", "1M", "--count", "4", "--runs", "100000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Two runs' lines arrive while the dd is still running (it would take
    // far longer than this test for 100,000 runs): then it is killed, and
    // what it printed is kept.
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut lines = Vec::new();
    for want in ["run 1: 4194304 bytes in ", "run 2: 4194304 bytes in "] {
        let mut line = String::new();
        assert!(out.read_line(&mut line).unwrap() > 0, "dd ended: {lines:?}");
        assert!(line.starts_with(want), "{line:?}");
        assert!(line.trim_end().ends_with(" GiB/s"), "{line:?}");
        lines.push(line);
    }
    assert!(child.try_wait().unwrap().is_none(), "dd already ended");
    child.kill().unwrap();
    child.wait().unwrap();
}

/// More queues than the device offers run on what it offers, and dd says
/// so: `--queues 4` against a back end of 2.
#[test]
fn dd_says_when_the_device_offers_fewer_queues_than_asked() {
    let peer = serve(1 << 20);
    let args = [
        "--bs",
        "4K",
        "--count",
        "64",
        "--queues",
        "4",
        "--queue-depth",
        "8",
    ];
    let out = dd(&peer.socket, &args);
    assert!(out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("4 queues asked, but the device offers 2: running 2"),
        "{err}"
    );
    let json = dd(&peer.socket, &[&args[..], &["--json"]].concat());
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(v["queues"], 2, "{v}");
}
