//! `iopath bench` on a machine without its peers: the binary run with a
//! `PATH` of symlinks to everything on this one except fio,
//! qemu-storage-daemon and QEMU. Every iopath row still runs, the missing
//! rows are notes with their Debian package, ratios that need them are n/a
//! (null in JSON), the limit is the bench's own, and the exit status is 0.

use std::path::Path;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_iopath");
const HIDDEN: [&str; 3] = ["fio", "qemu-storage-daemon", "qemu-system-x86_64"];

/// A directory of symlinks to every program on `PATH` but the hidden ones.
fn path_without_peers(dir: &Path) -> String {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for d in std::env::split_paths(&path) {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            let link = dir.join(&name);
            if HIDDEN.iter().any(|h| name == *h) || link.exists() {
                continue;
            }
            let _ = std::os::unix::fs::symlink(e.path(), link);
        }
    }
    for h in HIDDEN {
        assert!(!dir.join(h).exists());
    }
    dir.display().to_string()
}

fn run(path: &str, args: &[&str]) -> Output {
    let out = Command::new(BIN)
        .args(args)
        .env("PATH", path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?} failed without peers: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn bench_without_peers_drops_their_rows_only() {
    let bin = tempfile::tempdir().unwrap();
    let path = path_without_peers(bin.path());

    // heap: every row, and the own limit (O_DIRECT pread) in fio's place.
    let out = run(
        &path,
        &[
            "bench",
            "heap",
            "--size",
            "8M",
            "--buffer-size",
            "1M",
            "--runs",
            "1",
            "--heaps",
            "memfd",
            "--methods",
            "auto,direct",
            "--json",
        ],
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["rows"].as_array().unwrap().len(), 2);
    assert!(v["fio_limit"].is_null(), "{}", v["fio_limit"]);
    assert_eq!(v["limit"]["source"], "own");
    assert!(v["limit"]["gib_per_s"].as_f64().unwrap() > 0.0);
    assert_eq!(v["missing"][0]["missing"]["package"], "fio");
    for r in v["rows"].as_array().unwrap() {
        assert!(r["vs_limit"].as_f64().unwrap() > 0.0, "{r}");
    }
    let out = run(
        &path,
        &[
            "bench",
            "heap",
            "--size",
            "8M",
            "--buffer-size",
            "1M",
            "--runs",
            "1",
            "--heaps",
            "memfd",
            "--methods",
            "direct",
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(
            "fio is not installed (Debian package fio; scripts/install-deps installs it)"
        ),
        "{text}"
    );
    assert!(text.contains("limit (own)"), "{text}");

    // blk: every DMA mode; the peer row and the guest rows are notes; the
    // ratios that need them are n/a; the limit is the own O_DIRECT write.
    let out = run(
        &path,
        &[
            "bench",
            "blk",
            "--size",
            "16M",
            "--runs",
            "1",
            "--small-count",
            "0",
            "--guest",
            "--json",
        ],
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v["rows"].as_array().unwrap();
    let row = |prefix: &str| {
        rows.iter()
            .find(|r| r["name"].as_str().unwrap().starts_with(prefix))
            .unwrap_or_else(|| panic!("no row {prefix} in {rows:?}"))
    };
    assert!(
        row("own O_DIRECT write")["stats"]["median"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    for mode in ["direct", "direct-static", "iommu", "bounce"] {
        let r = row(&format!("iopath blk serve, dma {mode}"));
        assert!(r["stats"]["median"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["of_limit"].as_f64().unwrap() > 0.0, "{r}");
    }
    let peer = row("qemu-storage-daemon");
    assert!(peer["stats"]["median"].is_null(), "{peer}");
    assert_eq!(peer["missing"]["package"], "qemu-utils");
    let guest = row("guest dd (Linux, TCG) on iopath");
    assert_eq!(guest["missing"]["program"], "qemu-system-x86_64");
    let ratios = &v["ratios"];
    assert!(ratios["direct / fio limit"].is_null());
    assert!(ratios["direct / own limit"].as_f64().unwrap() > 0.0);
    assert!(ratios["iopath blk serve / qemu-storage-daemon (dma direct)"].is_null());
    assert!(ratios["bounce / direct"].as_f64().unwrap() > 0.0);
    assert_eq!(v["limit"]["source"], "own");

    let out = run(
        &path,
        &[
            "bench",
            "blk",
            "--size",
            "16M",
            "--runs",
            "1",
            "--small-count",
            "0",
            "--modes",
            "direct",
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("qemu-storage-daemon is not installed (Debian package qemu-utils; scripts/install-deps installs it)"),
        "{text}"
    );
    assert!(
        text.contains("iopath blk serve / qemu-storage-daemon (dma direct): n/a"),
        "{text}"
    );
}
