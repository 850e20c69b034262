//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use iopath_testkit::Feature;

/// Deterministic pseudo-random bytes (xorshift64*).
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    out.truncate(len);
    out
}

const TMPFS_MAGIC: i64 = 0x0102_1994;

#[allow(clippy::unnecessary_cast)] // `f_type` is i64 on x86_64, other types elsewhere
fn is_tmpfs(p: &std::path::Path) -> bool {
    rustix::fs::statfs(p)
        .map(|s| s.f_type as i64 == TMPFS_MAGIC)
        .unwrap_or(true)
}

/// A directory on a disk file system (not tmpfs): the crate's target tmpdir,
/// else /var/tmp.
pub fn disk_dir() -> Option<tempfile::TempDir> {
    for base in [
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")),
        PathBuf::from("/var/tmp"),
    ] {
        if std::fs::create_dir_all(&base).is_ok() && !is_tmpfs(&base) {
            return tempfile::tempdir_in(base).ok();
        }
    }
    iopath_testkit::skip(
        Feature::DiskDir,
        "no disk (non-tmpfs) directory for test files",
    );
    None
}

/// A directory on tmpfs (/dev/shm).
pub fn shm_dir() -> Option<tempfile::TempDir> {
    let base = PathBuf::from("/dev/shm");
    if base.is_dir() && is_tmpfs(&base) {
        return tempfile::tempdir_in(base).ok();
    }
    iopath_testkit::skip(Feature::ShmTmpfs, "/dev/shm is not a tmpfs here");
    None
}

/// Writes a safetensors file by hand: `tensors` as (name, dtype, shape,
/// bytes) at consecutive offsets in the given order, the header padded
/// with spaces to a multiple of 8.
pub fn write_safetensors<N: AsRef<str>>(path: &Path, tensors: &[(N, &str, Vec<usize>, Vec<u8>)]) {
    let mut header = String::from("{");
    let mut off = 0;
    for (i, (name, dtype, shape, data)) in tensors.iter().enumerate() {
        if i > 0 {
            header.push(',');
        }
        header.push_str(&format!(
            "\"{}\":{{\"dtype\":\"{dtype}\",\"shape\":{shape:?},\"data_offsets\":[{off},{}]}}",
            name.as_ref(),
            off + data.len()
        ));
        off += data.len();
    }
    header.push_str(",\"__metadata__\":{\"format\":\"pt\"}}");
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    for (_, _, _, data) in tensors {
        out.extend_from_slice(data);
    }
    std::fs::write(path, out).unwrap();
}

/// The byte a buffer is filled with before a read, to see where it wrote.
pub const POISON: u8 = 0xAA;

/// Asserts that `got` (a buffer's bytes) holds `data[file_off..][..len]`
/// at `buf_off` and still [`POISON`] everywhere else.
#[track_caller]
pub fn assert_placed(
    what: &str,
    got: &[u8],
    data: &[u8],
    file_off: u64,
    buf_off: usize,
    len: usize,
) {
    let fo = file_off as usize;
    assert!(
        got[buf_off..buf_off + len] == data[fo..fo + len],
        "{what}: bytes differ for read {file_off}/{buf_off}/{len}"
    );
    assert!(
        got[..buf_off].iter().all(|&b| b == POISON)
            && got[buf_off + len..].iter().all(|&b| b == POISON),
        "{what}: read {file_off}/{buf_off}/{len} wrote outside its range"
    );
}
