//! `iopath bench heap` through the real binary, on a small scratch file.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_iopath");

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
    assert_eq!(v["bytes"], 8 << 20);
    assert_eq!(v["buffers"], 8);
    let rows = v["rows"].as_array().unwrap();
    let names: Vec<_> = rows
        .iter()
        .map(|r| {
            format!(
                "{}/{}",
                r["heap"].as_str().unwrap(),
                r["method"].as_str().unwrap()
            )
        })
        .collect();
    let udmabuf = std::path::Path::new("/dev/udmabuf").exists();
    let mut want = vec!["memfd/auto", "memfd/direct", "memfd/buffered"];
    if udmabuf {
        want.extend(["udmabuf/auto", "udmabuf/direct", "udmabuf/buffered"]);
    } else {
        assert_eq!(v["skipped"][0]["heap"], "udmabuf");
    }
    assert_eq!(names, want);
    for r in rows {
        for k in ["alloc_ms", "read_ms", "total_ms", "gib_per_s"] {
            assert!(r[k].as_f64().unwrap() >= 0.0, "{k} in {r}");
        }
        assert!(r["gib_per_s"].as_f64().unwrap() > 0.0);
        // Direct methods leave the file out of the page cache.
        if r["method"] != "buffered" && r["fallbacks"] == 0 {
            assert!(
                r["cache_growth_bytes"].as_u64().unwrap() <= (8 << 20) / 100,
                "{r}"
            );
        }
    }
    // The limit is the best of the fio sweep (6 configurations, each
    // measured every run), or the bench's own when fio is missing.
    assert!(
        v["limit"]["gib_per_s"].as_f64().unwrap() > 0.0,
        "{}",
        v["limit"]
    );
    if iopath_testkit::have_peer("fio", "fio") {
        assert_eq!(v["limit"]["source"], "fio");
        let sweep = v["limit"]["sweep"].as_array().unwrap();
        assert_eq!(sweep.len(), 6);
        let best = sweep
            .iter()
            .map(|c| c["gib_per_s"].as_f64().unwrap())
            .fold(0.0, f64::max);
        assert_eq!(v["limit"]["gib_per_s"].as_f64().unwrap(), best);
        assert_eq!(v["fio_limit"], v["limit"]);
    } else {
        assert_eq!(v["limit"]["source"], "own");
        assert!(v["fio_limit"].is_null());
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
    let rows = v["dma_buf_rows"].as_array().unwrap();
    let row = |name: &str| {
        rows.iter()
            .find(|r| r["row"].as_str().unwrap().starts_with(name))
            .unwrap_or_else(|| panic!("no row {name}: {rows:?}"))
    };
    for name in [
        "udmabuf buffered read",
        "udmabuf direct read",
        "udmabuf buffered sendfile",
        "udmabuf direct sendfile",
        "dmabuf buffered read",
    ] {
        let r = row(name);
        assert_eq!(r["kind"], "seed");
        // Measured, or missing with the kernel's reason.
        assert!(
            r["missing"].is_string() || r["total_ms"].as_f64().unwrap() > 0.0,
            "{r}"
        );
    }
    let kernel_side = row("dmabuf direct read");
    assert!(
        kernel_side["missing"]
            .as_str()
            .unwrap()
            .starts_with("DMA_BUF_IOCTL_RW_FILE (the kernel-side direct read) was not merged"),
        "{kernel_side}"
    );
    // memfd is everywhere: both pool loads are measured, and the second
    // takes the first's buffers back.
    let first = row("pool memfd auto, 1st load");
    let second = row("pool memfd auto, 2nd load");
    assert!(first["missing"].is_null() && second["missing"].is_null());
    assert!(
        second["alloc_ms"].as_f64().unwrap() < first["alloc_ms"].as_f64().unwrap(),
        "{first} {second}"
    );
    assert!(row("iopath memfd auto")["total_ms"].as_f64().unwrap() > 0.0);
}
