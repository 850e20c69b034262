//! `iopath load` through the real binary: every method verifies byte for
//! byte on ext4 and tmpfs with odd sizes, and bad input gives one clear error
//! line and a non-zero exit.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use iopath_testkit::Feature;

const BIN: &str = env!("CARGO_BIN_EXE_iopath");
const METHODS: [&str; 6] = ["auto", "buffered", "direct", "sendfile", "uring", "bounce"];
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
    iopath_testkit::skip(Feature::DiskDir, "no disk (non-tmpfs) directory");
    None
}

fn shm_dir() -> Option<tempfile::TempDir> {
    let base = Path::new("/dev/shm");
    if base.is_dir() && is_tmpfs(base) {
        return tempfile::tempdir_in(base).ok();
    }
    iopath_testkit::skip(Feature::ShmTmpfs, "/dev/shm is not a tmpfs");
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
    // A summary line without --json, and the heap `auto` chose, with why.
    let out = iopath(&["load", p, "--buffer-size", "1M"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        text.starts_with("loaded ") && text.contains(&format!("({size} bytes)")),
        "{text}"
    );
    let chose = text.lines().nth(1).unwrap_or_default();
    assert!(chose.starts_with("heap auto chose "), "{text}");
    if !Path::new("/dev/udmabuf").exists() && !Path::new("/dev/dma_heap").exists() {
        assert!(
            chose.starts_with("heap auto chose memfd: no dma-heap:system")
                && chose.contains("no udmabuf"),
            "{text}"
        );
    }
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
    // A /sys file says 4096 bytes and holds a line: its size is not its
    // length, and the error says so instead of contradicting itself.
    let sys = "/sys/kernel/mm/transparent_hugepage/enabled";
    if Path::new(sys).exists() {
        fails_with(
            &["load", sys],
            "/sys/kernel/mm/transparent_hugepage/enabled reports a size of 4096 bytes that is \
             not the length of its contents (a /sys file): only files whose size is known can \
             be loaded; copy it to a regular file first",
        );
    }
    fails_with(
        &["load", "/proc/self/status"],
        "/proc/self/status reports a size of 0 but has data (a /proc file): only files whose \
         size is known can be loaded",
    );
    if !Path::new("/dev/udmabuf").exists() {
        fails_with(
            &["load", small, "--heap", "udmabuf"],
            "/dev/udmabuf does not exist",
        );
    }
}

/// Runs `iopath ARGS` under `sh -c 'ulimit -n FILES; exec ...'`.
fn iopath_with_files_limit(files: u32, args: &[&str]) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -n {files} && exec \"$0\" \"$@\""))
        .arg(BIN)
        .args(args)
        .output()
        .expect("run iopath under sh")
}

fn json(out: &Output) -> serde_json::Value {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

/// A buffer is never larger than what it holds, and a load that cannot fit
/// in memory is refused before anything is allocated.
#[test]
fn buffer_size_larger_than_the_file_and_memory() {
    let Some(d) = disk_dir() else { return };
    let path = d.path().join("100m.bin");
    let size = 100usize << 20;
    let mut data = pattern(1 << 20);
    data.resize(size, 0);
    data[size - 1] = 0x5a;
    std::fs::write(&path, &data).unwrap();
    let p = path.to_str().unwrap();
    // One buffer of the file's size, not of 100 GiB.
    let v = json(&iopath(&[
        "load",
        p,
        "--buffer-size",
        "100G",
        "--verify",
        "--json",
    ]));
    assert_eq!(v["buffers"], 1);
    assert_eq!(v["buffer_size"], size as u64);
    assert_eq!(v["bytes"], size as u64);
    assert_eq!(v["verified"], true);
    // Odd sizes round up to a page only.
    let odd = d.path().join("odd.bin");
    std::fs::write(&odd, pattern(10_000)).unwrap();
    let v = json(&iopath(&[
        "load",
        odd.to_str().unwrap(),
        "--buffer-size",
        "1G",
        "--json",
        "--verify",
    ]));
    assert_eq!(v["buffer_size"], 12_288);

    // A (sparse) file larger than this machine's memory is refused up
    // front, naming the file and the limit.
    let huge = d.path().join("huge.bin");
    let f = std::fs::File::create(&huge).unwrap();
    f.set_len(1 << 40).unwrap();
    fails_with(
        &["load", huge.to_str().unwrap(), "--method", "buffered"],
        "huge.bin: loading needs 1099511627776 bytes of buffers, but only",
    );
    fails_with(&["load", huge.to_str().unwrap()], "can be allocated now (");
}

/// Each error names the option or input at fault and what is accepted.
#[test]
fn errors_name_the_option_at_fault() {
    let Some(d) = disk_dir() else { return };
    let small = d.path().join("small.bin");
    std::fs::write(&small, pattern(5000)).unwrap();
    let small = small.to_str().unwrap();
    for method in ["uring", "auto"] {
        fails_with(
            &["load", small, "--queue-depth", "0", "--method", method],
            "--queue-depth 0: io_uring queue depth 0 is out of range: use 1 to 4096",
        );
    }
    fails_with(
        &["load", small, "--queue-depth", "5000", "--method", "uring"],
        "--queue-depth 5000: io_uring queue depth 5000 is out of range",
    );
    fails_with(
        &["load", small, "--buffers", "0"],
        "--buffers 0: 0 buffers asked for: ask for at least 1",
    );
    fails_with(
        &["load", small, "--buffer-size", "1000"],
        "--buffer-size 1000: buffer size 1000 is not a non-zero multiple of the page size",
    );
    fails_with(
        &["load", "/proc/self/status"],
        "/proc/self/status reports a size of 0 but has data",
    );
    fails_with(
        &["load", small, "--heap", "nosuch"],
        "--heap nosuch: unknown heap",
    );
}

/// Many small buffers past the open-file limit are refused up front with
/// the smallest buffer size that would fit; under the limit they load (the
/// soft limit is raised to the hard one).
#[test]
fn too_many_buffers_for_the_open_file_limit_says_what_fits() {
    let Some(d) = disk_dir() else { return };
    let path = d.path().join("20m.bin");
    std::fs::write(&path, pattern(20 << 20)).unwrap();
    let p = path.to_str().unwrap();
    let out = iopath_with_files_limit(1024, &["load", p, "--buffer-size", "4K"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.starts_with("iopath: error: --buffer-size 4096: 5120 buffers of 4096 bytes")
            && stderr.contains("open files (RLIMIT_NOFILE, ulimit -n)")
            && stderr.contains("use a buffer size of at least"),
        "{stderr}"
    );
    assert!(!stderr.contains("Too many open files"), "{stderr}");
    // The size it suggests works under the same limit.
    let min = stderr
        .split("at least ")
        .nth(1)
        .and_then(|s| s.trim().parse::<u64>().ok())
        .expect("a suggested size");
    let out = iopath_with_files_limit(
        1024,
        &[
            "load",
            p,
            "--buffer-size",
            &min.to_string(),
            "--verify",
            "--json",
        ],
    );
    assert_eq!(json(&out)["verified"], true);
}

/// A safetensors file written by hand: F32, U8 (odd length), I64 tensors.
fn write_safetensors(path: &Path) -> usize {
    let t: [(&str, &str, usize, usize); 4] = [
        ("w.0", "F32", 4, 25_000),
        ("b.0", "U8", 1, 333),
        ("w.1", "I64", 8, 70_001),
        ("w.2", "F32", 4, 10),
    ];
    let mut header = String::from("{");
    let mut off = 0;
    for (i, (name, dtype, size, n)) in t.iter().enumerate() {
        let len = size * n;
        if i > 0 {
            header.push(',');
        }
        header.push_str(&format!(
            "\"{name}\":{{\"dtype\":\"{dtype}\",\"shape\":[{n}],\"data_offsets\":[{off},{}]}}",
            off + len
        ));
        off += len;
    }
    header.push('}');
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(&pattern(off));
    std::fs::write(path, out).unwrap();
    off
}

#[test]
fn safetensors_loads_and_verifies_every_tensor() {
    let Some(d) = disk_dir() else { return };
    let path = d.path().join("m.safetensors");
    let bytes = write_safetensors(&path);
    let p = path.to_str().unwrap();
    for m in METHODS {
        let v = json(&iopath(&[
            "load",
            p,
            "--format",
            "safetensors",
            "--method",
            m,
            "--buffer-size",
            "256K",
            "--verify",
            "--json",
        ]));
        assert_eq!(v["tensors"], 4, "{m}");
        assert_eq!(v["bytes"], bytes as u64, "{m}");
        assert_eq!(v["verified"], true, "{m}");
        assert!(
            v["buffers"].as_u64().unwrap() >= 2,
            "{m}: w.1 has its own buffer"
        );
    }
    let out = iopath(&["load", p, "--format", "safetensors"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.starts_with("loaded 4 tensors ("), "{stdout}");
    assert!(stdout.contains(" GiB/s, method "), "{stdout}");

    // A hostile header: one clear line.
    let bad = d.path().join("bad.safetensors");
    let mut b = 1u64.to_le_bytes().to_vec();
    b[7] = 0x40;
    b.extend_from_slice(b"{}");
    std::fs::write(&bad, b).unwrap();
    fails_with(
        &["load", bad.to_str().unwrap(), "--format", "safetensors"],
        "is not a safetensors file iopath accepts: header length 4611686018427387905 is over the limit",
    );
}

#[test]
fn alloc_threads_out_of_range_is_a_usage_error_naming_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("f");
    std::fs::write(&f, b"x").unwrap();
    for n in ["0", "65", "10000"] {
        let out = iopath(&["load", "--alloc-threads", n, f.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "--alloc-threads {n}: {err}");
        assert!(err.contains("--alloc-threads"), "{err}");
        assert!(err.contains("at most 64"), "{err}");
    }
    let out = iopath(&[
        "load",
        "--alloc-threads",
        "64",
        "--verify",
        f.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn auto_reads_a_file_of_100000_small_tensors_buffered() {
    let Some(d) = disk_dir() else { return };
    let path = d.path().join("many.safetensors");
    // Mixed dtypes of 1 to 40 elements: most tensors start off their
    // dtype's alignment in the file, so each is a read of its own.
    let dtypes = [("F32", 4), ("F16", 2), ("U8", 1), ("I64", 8), ("BF16", 2)];
    let mut header = String::from("{");
    let mut off = 0usize;
    for i in 0..100_000usize {
        let (dtype, size) = dtypes[i * 7 % dtypes.len()];
        let n = 1 + i * 13 % 40;
        if i > 0 {
            header.push(',');
        }
        header.push_str(&format!(
            "\"t{i}\":{{\"dtype\":\"{dtype}\",\"shape\":[{n}],\"data_offsets\":[{off},{}]}}",
            off + n * size
        ));
        off += n * size;
    }
    header.push('}');
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(&pattern(off));
    std::fs::write(&path, out).unwrap();
    let v = json(&iopath(&[
        "load",
        path.to_str().unwrap(),
        "--format",
        "safetensors",
        "--verify",
        "--json",
    ]));
    assert_eq!(v["tensors"], 100_000);
    assert_eq!(v["verified"], true);
    assert_eq!(v["requested_method"], "auto");
    // io_uring took 6 to 14 s on such a file where buffered took 2 to 4.
    assert_eq!(v["method"], "buffered", "{v}");
}
