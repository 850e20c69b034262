//! `iopath load` through the real binary: every method verifies byte for
//! byte on ext4 and tmpfs with odd sizes, and bad input gives one clear error
//! line and a non-zero exit.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_iopath");
const METHODS: [&str; 5] = ["auto", "buffered", "direct", "sendfile", "uring"];
const TMPFS_MAGIC: i64 = 0x0102_1994;

fn iopath(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("run iopath")
}

#[allow(clippy::unnecessary_cast)] // `f_type` is i64 on x86_64, other types elsewhere
fn is_tmpfs(p: &Path) -> bool {
    rustix::fs::statfs(p)
        .map(|s| s.f_type as i64 == TMPFS_MAGIC)
        .unwrap_or(true)
}

fn disk_dir() -> Option<tempfile::TempDir> {
    for base in [
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")),
        PathBuf::from("/var/tmp"),
    ] {
        if std::fs::create_dir_all(&base).is_ok() && !is_tmpfs(&base) {
            return tempfile::tempdir_in(base).ok();
        }
    }
    println!("skipped: no disk (non-tmpfs) directory");
    None
}

fn shm_dir() -> Option<tempfile::TempDir> {
    let base = Path::new("/dev/shm");
    if base.is_dir() && is_tmpfs(base) {
        return tempfile::tempdir_in(base).ok();
    }
    println!("skipped: /dev/shm is not a tmpfs");
    None
}

fn pattern(len: usize) -> Vec<u8> {
    let mut x: u32 = 0x1234_5678;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

fn verify_all_methods(dir: &Path) {
    // Neither a page nor a 512-byte block multiple; spans several buffers.
    let size = (1 << 20) * 3 + 4096 * 5 + 333;
    let path = dir.join("odd.bin");
    std::fs::write(&path, pattern(size)).unwrap();
    let p = path.to_str().unwrap();
    for m in METHODS {
        for bs in ["1M", "64K"] {
            let out = iopath(&[
                "load",
                p,
                "--method",
                m,
                "--buffer-size",
                bs,
                "--verify",
                "--json",
            ]);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                out.status.success(),
                "{m} {bs} in {}: {stderr}",
                dir.display()
            );
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(v["bytes"], size as u64, "{m}");
            assert_eq!(v["verified"], true, "{m}");
            assert_eq!(v["requested_method"], m);
            assert!(v["seconds"].as_f64().unwrap() > 0.0);
            assert!(v["gib_per_s"].as_f64().unwrap() > 0.0);
            assert!(v["method"].is_string());
        }
    }
    // A summary line without --json.
    let out = iopath(&["load", p, "--buffer-size", "1M"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        text.starts_with("loaded ") && text.contains(&format!("({size} bytes)")),
        "{text}"
    );
}

#[test]
fn verify_passes_for_every_method_on_disk() {
    if let Some(d) = disk_dir() {
        verify_all_methods(d.path());
    }
}

#[test]
fn verify_passes_for_every_method_on_tmpfs() {
    if let Some(d) = shm_dir() {
        verify_all_methods(d.path());
    }
}

/// Asserts a failure with exactly one line on stderr containing `needle`.
fn fails_with(args: &[&str], needle: &str) {
    let out = iopath(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
    let lines: Vec<_> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{args:?}: not one line: {stderr}");
    assert!(lines[0].starts_with("iopath: error: "), "{stderr}");
    assert!(
        lines[0].contains(needle),
        "{args:?}: {stderr} lacks {needle}"
    );
    assert!(!stderr.contains("panicked"));
}

#[test]
fn bad_input_gives_one_clear_line() {
    let Some(d) = disk_dir() else { return };
    let dir = d.path().to_str().unwrap();
    let small = d.path().join("small.bin");
    std::fs::write(&small, pattern(5000)).unwrap();
    let small = small.to_str().unwrap();
    let empty = d.path().join("empty.bin");
    std::fs::write(&empty, b"").unwrap();
    let missing = d.path().join("missing.bin");

    fails_with(
        &["load", missing.to_str().unwrap()],
        "No such file or directory",
    );
    fails_with(&["load", dir], "is not a regular file (a directory)");
    fails_with(
        &["load", small, "--buffers", "2", "--buffer-size", "4096"],
        "is 3192 bytes too short",
    );
    fails_with(&["load", empty.to_str().unwrap()], "is empty");
    fails_with(
        &["load", small, "--buffer-size", "1000"],
        "buffer size 1000 is not a non-zero multiple of the page size",
    );
    fails_with(
        &["load", small, "--heap", "nosuch"],
        "unknown heap `nosuch`",
    );
    fails_with(
        &["load", small, "--method", "teleport"],
        "unknown transfer method",
    );
    if !Path::new("/dev/udmabuf").exists() {
        fails_with(
            &["load", small, "--heap", "udmabuf"],
            "/dev/udmabuf does not exist",
        );
    }
}
