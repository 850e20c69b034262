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
use std::process::{Command, Stdio};

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
        .and_then(|e| Some(e.parent()?.join("examples").join(PROGRAM)));
    if let Some(p) = beside.filter(|p| p.is_file()) {
        return Some(p);
    }
    on_path(PROGRAM)
}

/// `program` on the `PATH`.
fn on_path(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(program))
        .find(|p| p.is_file())
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
    let mut cmd = Command::new(helper);
    cmd.arg("--socket")
        .arg(socket)
        .args(["--bs", "4096", "--access", "rand"])
        .arg("--op")
        .arg(if op == Op::Read { "read" } else { "write" })
        .arg("--count")
        .arg(count.to_string())
        .arg("--queue-depth")
        .arg(qd.to_string())
        .arg("--seed")
        .arg(seed.to_string());
    if poll {
        cmd.arg("--poll");
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let out = crate::place::spawn_on(cpu, &mut cmd)
        .and_then(std::process::Child::wait_with_output)
        .map_err(Error::spawn(PROGRAM))?;
    let failed = |reason: String| Error::Peer {
        program: PROGRAM.into(),
        reason,
    };
    if !out.status.success() {
        return Err(failed(format!(
            "{}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| failed(format!("its output is not one JSON line: {e}")))?;
    let f = |k: &str| {
        v[k].as_f64()
            .ok_or_else(|| failed(format!("its JSON has no {k}")))
    };
    Ok((f("iops")?, f("p50_us")?, f("p99_us")?, f("cpu_ns")?))
}
