//! libblkio's `virtio-blk-vhost-user` driver beside iopath's: `blkio-dd`,
//! a helper built from the test-only crate `iopath-blk-peers` (libblkio is
//! never a dependency of this binary), run like fio: found, spawned on the
//! driver's CPU, its JSON read.
//!
//! Where it is looked for: `$IOPATH_BLKIO_DD`, else `examples/blkio-dd`
//! beside this executable (cargo's layout: `cargo build --release -p
//! iopath-blk-peers --example blkio-dd` puts it beside
//! `target/release/iopath`), else `blkio-dd` on the `PATH`.

use std::path::{Path, PathBuf};
use std::process::Command;

use iopath_blk::workload::Op;

use crate::{Error, Result};

const PROGRAM: &str = "blkio-dd";
/// How to build it, for the note of a row that did not run.
pub(super) const BUILD: &str =
    "blkio-dd is not built (cargo build --release -p iopath-blk-peers --example blkio-dd)";

/// The helper, if it is anywhere it is looked for.
pub(super) fn program() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("IOPATH_BLKIO_DD") {
        return Some(PathBuf::from(p)).filter(|p| p.is_file());
    }
    let beside = std::env::current_exe()
        .ok()
        .map(|e| e.with_file_name("examples"));
    let path = std::env::var_os("PATH");
    let on_path = path.iter().flat_map(std::env::split_paths);
    let dirs = beside.into_iter().chain(on_path);
    dirs.map(|d| d.join(PROGRAM)).find(|p| p.is_file())
}

/// One run: `count` 4 KiB random requests, `qd` in flight, on a poll
/// queue with `poll`, pinned to `cpu`. IOPS, p50 and p99 latency (us), and
/// the helper's CPU time (ns).
pub(super) fn run(
    helper: &Path,
    socket: &Path,
    (op, qd, count, seed): (Op, usize, u64, u64),
    poll: bool,
    cpu: Option<usize>,
) -> Result<(f64, f64, f64, f64)> {
    let (count, qd, seed) = (count.to_string(), qd.to_string(), seed.to_string());
    let mut cmd = Command::new(helper);
    cmd.arg("--socket").arg(socket);
    cmd.args(["--bs", "4096", "--access", "rand", "--op", op.name()]);
    cmd.args(["--count", &count, "--queue-depth", &qd, "--seed", &seed]);
    if poll {
        cmd.arg("--poll");
    }
    let out = crate::place::output(PROGRAM, &mut cmd, cpu)?;
    let failed = |reason: String| Error::Peer {
        program: PROGRAM.into(),
        reason,
    };
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(failed(format!("{}: {}", out.status, err.trim())));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| failed(format!("its output is not one JSON line: {e}")))?;
    let f = |k: &str| {
        v[k].as_f64()
            .ok_or_else(|| failed(format!("its JSON has no {k}")))
    };
    Ok((f("iops")?, f("p50_us")?, f("p99_us")?, f("cpu_ns")?))
}
