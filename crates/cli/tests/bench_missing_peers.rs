//! `iopath bench` on a machine without its peers: the binary run with a
//! `PATH` of symlinks to everything on this one except fio,
//! qemu-storage-daemon and QEMU. Every iopath row still runs, the missing
//! rows are notes with their Debian package, ratios that need them are n/a
//! (null in JSON), the limit is the bench's own, and the exit status is 0.

use std::path::Path;
use std::process::{Command, Output};

use bench_json::{not_run, row_like, rows, value};

mod bench_json;

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
    let t = &v["tables"][0];
    let (limit, ctx) = (row_like(t, "limit").unwrap(), &v["context"]["limit"]);
    let bound = |r: &serde_json::Value| r == limit || r[0] == "alloc only";
    let measured: Vec<_> = rows(t).iter().filter(|r| !bound(r)).collect();
    assert_eq!(measured.len(), 2);
    assert_eq!(limit[0], "limit (own)");
    assert_eq!(ctx["source"], "own");
    assert!(value(t, limit, "GiB/s") > 0.0);
    assert_eq!(ctx["missing"]["package"], "fio");
    for r in measured {
        assert!(value(t, r, "of limit") > 0.0, "{r}");
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

    // blk: every DMA mode; the peer row is a note; the ratios that need
    // it are n/a; the limit is the own O_DIRECT write.
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
            "--json",
        ],
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let t = &v["tables"][0];
    let gib = "GiB/s, median (min-max)";
    let own = row_like(t, "own O_DIRECT write").unwrap();
    assert!(value(t, own, gib) > 0.0);
    for mode in ["direct", "direct-static", "iommu", "bounce"] {
        let r = row_like(t, &format!("iopath blk serve, dma {mode}")).unwrap();
        assert!(value(t, r, gib) > 0.0, "{r}");
        assert!(value(t, r, "of limit") > 0.0, "{r}");
    }
    assert!(row_like(t, "qemu-storage-daemon").is_none(), "{t}");
    let peer = not_run(t, "qemu-storage-daemon").unwrap();
    assert!(
        peer["needs"]
            .as_str()
            .unwrap()
            .contains("(Debian package qemu-utils;"),
        "{peer}"
    );
    let ratios = &t["figures"];
    let null = Some(&serde_json::Value::Null);
    assert_eq!(ratios.get("direct / fio limit"), null);
    assert!(ratios["direct / own limit"]["value"].as_f64().unwrap() > 0.0);
    assert_eq!(
        ratios.get("iopath blk serve / qemu-storage-daemon (dma direct)"),
        null
    );
    assert!(ratios["bounce / direct"]["value"].as_f64().unwrap() > 0.0);
    assert_eq!(v["context"]["limit"]["source"], "own");

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
    // The ratio to the missing peer is left out with its row, not "n/a".
    assert!(
        !text.contains("iopath blk serve / qemu-storage-daemon (dma direct)"),
        "{text}"
    );
}
