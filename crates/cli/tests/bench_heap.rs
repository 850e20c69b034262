//! `iopath bench heap` through the real binary, on a small scratch file.

use std::process::Command;

use bench_json::{not_run, row, row_like, rows, table, value};
use serde_json::Value;

mod bench_json;

const BIN: &str = env!("CARGO_BIN_EXE_iopath");

/// The heap x method rows of the heap table `t` (not the two bounds).
fn measured(t: &Value) -> Vec<&Value> {
    let bound = |r: &&Value| r[0] == "limit" || r[0] == "limit (own)" || r[0] == "alloc only";
    rows(t).iter().filter(|r| !bound(r)).collect()
}

#[test]
fn bench_heap_json_has_rows_and_limit() {
    let out = Command::new(BIN)
        .args([
            "bench",
            "heap",
            "--size",
            "8M",
            "--buffer-size",
            "1M",
            "--runs",
            "2",
            "--heaps",
            "memfd,udmabuf",
            "--methods",
            "auto,direct,buffered",
            "--json",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ctx = &v["context"];
    assert_eq!(ctx["bytes"], 8 << 20);
    assert_eq!(ctx["buffers"], 8);
    let t = &v["tables"][0];
    let rows = measured(t);
    // The method asked for: the method cell's first word (the one that
    // ran follows in parentheses when it differs).
    let method = |r: &Value| {
        r[1].as_str()
            .unwrap()
            .split(' ')
            .next()
            .unwrap()
            .to_string()
    };
    let names: Vec<_> = rows
        .iter()
        .map(|r| format!("{}/{}", r[0].as_str().unwrap(), method(r)))
        .collect();
    let udmabuf = std::path::Path::new("/dev/udmabuf").exists();
    let mut want = vec!["memfd/auto", "memfd/direct", "memfd/buffered"];
    if udmabuf {
        want.extend(["udmabuf/auto", "udmabuf/direct", "udmabuf/buffered"]);
    } else {
        assert_eq!(t["not_run"][0]["row"], "udmabuf");
    }
    assert_eq!(names, want);
    let notes = t["notes"].as_array().unwrap();
    for r in rows {
        for k in ["alloc ms", "read ms", "total ms", "GiB/s"] {
            assert!(value(t, r, k) >= 0.0, "{k} in {r}");
        }
        assert!(value(t, r, "GiB/s") > 0.0);
        // Direct methods leave the file out of the page cache (unless a
        // request fell back to buffered: a note says so).
        let fell_back = format!("{} {}: ", r[0].as_str().unwrap(), r[1].as_str().unwrap());
        let fell_back = notes
            .iter()
            .any(|n| n.as_str().unwrap().starts_with(&fell_back));
        if method(r) != "buffered" && !fell_back {
            assert!(
                value(t, r, "page cache growth") <= ((8 << 20) / 100) as f64,
                "{r}"
            );
        }
    }
    // The limit is the best of the fio sweep (6 configurations, each
    // measured every run), or the bench's own when fio is missing.
    let limit = row_like(t, "limit").unwrap();
    assert!(value(t, limit, "GiB/s") > 0.0, "{limit}");
    if iopath_testkit::have_peer("fio", "fio") {
        assert_eq!(ctx["limit"]["source"], "fio");
        let sweep = ctx["limit"]["sweep"].as_array().unwrap();
        assert_eq!(sweep.len(), 6);
        let best = sweep
            .iter()
            .map(|c| {
                let runs: Vec<f64> = c["runs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|r| r.as_f64().unwrap())
                    .collect();
                iopath_bench::Stats::of(&runs).median
            })
            .fold(0.0, f64::max);
        assert_eq!(value(t, limit, "GiB/s"), best);
        assert_eq!(limit[0], "limit");
    } else {
        assert_eq!(ctx["limit"]["source"], "own");
        assert_eq!(limit[0], "limit (own)");
    }
}

#[test]
fn bench_heap_rejects_a_short_file() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let f = dir.path().join("short.bin");
    std::fs::write(&f, vec![7u8; 100_000]).unwrap();
    let out = Command::new(BIN)
        .args([
            "bench",
            "heap",
            "--file",
            f.to_str().unwrap(),
            "--buffers",
            "2",
            "--buffer-size",
            "64K",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("31072 bytes too short"), "{stderr}");
}

#[test]
fn bench_heap_dma_buf_table_has_the_six_rows_and_the_pool() {
    let out = Command::new(BIN)
        .args([
            "bench",
            "heap",
            "--dma-buf-table",
            "--size",
            "8M",
            "--buffer-size",
            "1M",
            "--runs",
            "1",
            "--json",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let t = table(&v, "dma-bufs filled from a file");
    for name in [
        "udmabuf buffered read",
        "udmabuf direct read",
        "udmabuf buffered sendfile",
        "udmabuf direct sendfile",
        "dmabuf buffered read",
    ] {
        // Measured, or not run with the kernel's reason.
        match (row_like(t, name), not_run(t, name)) {
            (Some(r), None) => assert!(value(t, r, "total ms") > 0.0, "{r}"),
            (None, Some(n)) => assert!(!n["why"].as_str().unwrap().is_empty(), "{n}"),
            _ => panic!("no row {name}: {t}"),
        }
    }
    let kernel_side = not_run(t, "dmabuf direct read").unwrap();
    assert!(
        kernel_side["why"]
            .as_str()
            .unwrap()
            .starts_with("DMA_BUF_IOCTL_RW_FILE (the kernel-side direct read) was not merged"),
        "{kernel_side}"
    );
    // memfd is everywhere: both pool loads are measured, and the second
    // takes the first's buffers back.
    let first = row(t, "pool memfd auto, 1st load").unwrap();
    let second = row(t, "pool memfd auto, 2nd load").unwrap();
    assert!(
        value(t, second, "alloc ms") < value(t, first, "alloc ms"),
        "{first} {second}"
    );
    assert!(value(t, row_like(t, "iopath memfd auto").unwrap(), "total ms") > 0.0);
}
