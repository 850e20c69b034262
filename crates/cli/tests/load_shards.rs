//! `iopath load --format safetensors` of a sharded checkpoint through the
//! real binary: a directory or its index, every shard verified, per-shard
//! figures in the JSON; a missing or truncated shard is one clear line
//! naming it.

use std::path::Path;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_iopath");

fn iopath(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("run iopath")
}

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    let mut x: u32 = 0x1234_5678 ^ seed.wrapping_mul(0x9e37_79b9);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

/// Four shards of three tensors each (F32, U8 of an odd length, BF16) and
/// the index naming them; returns the tensor bytes in all.
fn write_checkpoint(dir: &Path) -> usize {
    let mut map = serde_json::Map::new();
    let mut all = 0;
    for s in 0..4u32 {
        let file = format!("model-{:05}-of-00004.safetensors", s + 1);
        let t = [
            (format!("l{s}.w"), "F32", 4, 20_000 + s as usize),
            (format!("l{s}.b"), "U8", 1, 77),
            (format!("l{s}.e"), "BF16", 2, 5_000),
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
            map.insert(name.clone(), file.clone().into());
        }
        header.push('}');
        let mut out = (header.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(&pattern(off, s));
        std::fs::write(dir.join(&file), out).unwrap();
        all += off;
    }
    let index = serde_json::json!({ "metadata": {"total_size": all}, "weight_map": map });
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    all
}

fn json(out: &Output) -> serde_json::Value {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

/// Asserts exit `code` with one line on stderr containing `needle`.
fn fails_with(args: &[&str], code: i32, needle: &str) {
    let out = iopath(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{args:?}: {stderr}");
    let lines: Vec<_> = stderr.lines().filter(|l| !l.is_empty()).collect();
    if code == 1 {
        assert_eq!(lines.len(), 1, "{args:?}: not one line: {stderr}");
    }
    assert!(stderr.contains(needle), "{args:?}: {stderr} lacks {needle}");
}

#[test]
fn a_sharded_checkpoint_loads_verified_with_per_shard_figures() {
    let d = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let bytes = write_checkpoint(d.path());
    let dir = d.path().to_str().unwrap();
    let index = d.path().join("model.safetensors.index.json");
    for (path, at_once) in [(dir, "1"), (index.to_str().unwrap(), "4")] {
        let v = json(&iopath(&[
            "load",
            path,
            "--format",
            "safetensors",
            "--buffer-size",
            "64K",
            "--shards-at-once",
            at_once,
            "--verify",
            "--json",
        ]));
        assert_eq!(v["tensors"], 12);
        assert_eq!(v["bytes"], bytes as u64);
        assert_eq!(v["verified"], true);
        let shards = v["shards"].as_array().unwrap();
        assert_eq!(shards.len(), 4);
        for (i, s) in shards.iter().enumerate() {
            let file = d
                .path()
                .join(format!("model-{:05}-of-00004.safetensors", i + 1));
            assert_eq!(s["file"], file.to_str().unwrap());
            assert_eq!(s["tensors"], 3);
            assert_eq!(s["bytes"], (4 * (20_000 + i) + 77 + 10_000) as u64);
        }
    }
    let out = iopath(&["load", dir, "--format", "safetensors"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.starts_with("loaded 12 tensors from 4 shards ("),
        "{stdout}"
    );
    fails_with(
        &[
            "load",
            dir,
            "--format",
            "safetensors",
            "--shards-at-once",
            "0",
        ],
        2,
        "0 is out of range: at least 1, at most 64",
    );
}

#[test]
fn a_missing_or_truncated_shard_is_one_line_naming_it() {
    let d = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    write_checkpoint(d.path());
    let dir = d.path().to_str().unwrap();
    let second = d.path().join("model-00002-of-00004.safetensors");
    let whole = std::fs::read(&second).unwrap();
    std::fs::write(&second, &whole[..whole.len() - 1]).unwrap();
    fails_with(
        &["load", dir, "--format", "safetensors"],
        1,
        &format!(
            "shard 2 of 4 ({}): {} is not a safetensors file iopath accepts: the tensors' data ends at byte",
            second.display(),
            second.display()
        ),
    );
    std::fs::remove_file(&second).unwrap();
    fails_with(
        &["load", dir, "--format", "safetensors"],
        1,
        "is not a checkpoint iopath accepts: the index names shard \
         model-00002-of-00004.safetensors (3 tensors), which does not exist",
    );
}

#[test]
fn method_map_views_the_cached_tensors_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let all = write_checkpoint(dir.path());
    let d = dir.path().to_str().unwrap();
    // Just written: every page is in the page cache.
    let v = json(&iopath(&[
        "load",
        d,
        "--format",
        "safetensors",
        "--method",
        "map",
        "--verify",
        "--json",
    ]));
    let (mapped, read) = (
        v["mapped_bytes"].as_u64().unwrap(),
        v["bytes"].as_u64().unwrap(),
    );
    assert!(mapped > 0, "{v}");
    assert_eq!(mapped + read, all as u64, "{v}");
    assert_eq!(v["requested_method"], "map");
    assert_eq!(v["populate"], "read faults");
    assert_eq!(v["verified"], true);
    let per_shard: u64 = v["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["mapped_bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(per_shard, mapped);
    let out = iopath(&["load", d, "--format", "safetensors", "--method", "map"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        text.contains(
            "mapped from the page cache (views of the files, made resident with read faults)"
        ),
        "{text}"
    );
    let one = dir.path().join("model-00001-of-00004.safetensors");
    fails_with(
        &["load", one.to_str().unwrap(), "--method", "map"],
        2,
        "--method map: only with --format safetensors",
    );
    fails_with(
        &["load", one.to_str().unwrap(), "--method", "mmap"],
        1,
        "map for safetensors",
    );
}

/// `n` shards of one 16-byte U8 tensor each, no index.
fn write_small_shards(dir: &Path, n: usize) {
    for i in 0..n {
        let header =
            format!("{{\"t{i}\":{{\"dtype\":\"U8\",\"shape\":[16],\"data_offsets\":[0,16]}}}}");
        let mut out = (header.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(&pattern(16, i as u32));
        std::fs::write(dir.join(format!("s{i:05}.safetensors")), out).unwrap();
    }
}

/// Runs `iopath ARGS` under `sh -c 'ulimit ...; exec ...'`.
fn iopath_under(ulimit: &str, args: &[&str]) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit {ulimit} && exec \"$0\" \"$@\""))
        .arg(BIN)
        .args(args)
        .output()
        .expect("run iopath under sh")
}

#[test]
fn many_shards_raise_the_open_file_limit_first_or_name_it_as_the_fix() {
    let hard = Command::new("sh")
        .args(["-c", "ulimit -Hn"])
        .output()
        .unwrap();
    let hard = String::from_utf8_lossy(&hard.stdout).trim().to_string();
    if hard != "unlimited" && hard.parse::<u64>().unwrap_or(0) < 5000 {
        eprintln!("skipped: the hard open-file limit ({hard}) is under 5000");
        return;
    }
    let d = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    write_small_shards(d.path(), 1100);
    let dir = d.path().to_str().unwrap();
    // 1,100 shards under a soft limit of 1,024: raised before they open.
    let out = iopath_under(
        "-Sn 1024",
        &["load", dir, "--format", "safetensors", "--verify", "--json"],
    );
    let v = json(&out);
    assert_eq!(v["tensors"], 1100);
    assert_eq!(v["bytes"], 1100 * 16);
    assert_eq!(v["verified"], true);
    // Under a hard limit of 1,500 they cannot all be open with a buffer
    // each, whatever the buffer size: the fix named is the limit.
    for size in ["32M", "1G"] {
        let out = iopath_under(
            "-n 1500",
            &[
                "load",
                dir,
                "--format",
                "safetensors",
                "--buffer-size",
                size,
            ],
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.contains(
                "the checkpoint's 1100 shards need at least 2200 more open files (a buffer of \
                 its own for each shard, and each shard's file while it loads)"
            ) && stderr
                .contains("a larger buffer size cannot help; raise the open-file limit (ulimit -n"),
            "{stderr}"
        );
        assert!(!stderr.contains("--buffer-size"), "{stderr}");
    }
}

#[test]
fn a_directory_entry_that_cannot_be_loaded_fails_the_load_naming_it() {
    let d = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    write_small_shards(d.path(), 2);
    let dir = d.path().to_str().unwrap();
    // An interrupted download: a link to a blob that never arrived.
    std::os::unix::fs::symlink("blobs/partial", d.path().join("s00002.safetensors")).unwrap();
    fails_with(
        &["load", dir, "--format", "safetensors"],
        1,
        "s00002.safetensors is a symbolic link to blobs/partial, which does not exist",
    );
    std::fs::remove_file(d.path().join("s00002.safetensors")).unwrap();
    let made = Command::new("mkfifo")
        .arg(d.path().join("s00002.safetensors"))
        .status()
        .unwrap();
    assert!(made.success());
    fails_with(
        &["load", dir, "--format", "safetensors"],
        1,
        "s00002.safetensors is not a regular file (a pipe)",
    );
}

#[test]
fn shard_names_reach_the_terminal_escaped() {
    let d = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let evil = "\u{1b}]0;owned\u{7}\u{1b}[2J.safetensors";
    let index = serde_json::json!({ "weight_map": { "x": evil } });
    std::fs::write(
        d.path().join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();
    std::fs::write(d.path().join(evil), b"not a safetensors file").unwrap();
    let out = iopath(&[
        "load",
        d.path().to_str().unwrap(),
        "--format",
        "safetensors",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        !stderr.contains('\u{1b}') && !stderr.contains('\u{7}'),
        "{stderr:?}"
    );
    assert!(
        stderr.contains(r"\u{1b}]0;owned\u{7}\u{1b}[2J.safetensors"),
        "{stderr}"
    );
}
