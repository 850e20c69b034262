//! fio, the limit beside iopath's figures: runs `fio --output-format=json`
//! and reads the bandwidth out of it.

use std::path::Path;
use std::process::Command;

use crate::{Error, Result};

/// One fio job's result.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FioResult {
    /// Bytes moved.
    pub bytes: u64,
    /// Bandwidth, bytes per second.
    pub bytes_per_s: f64,
    /// Job run time, milliseconds.
    pub runtime_ms: f64,
}

impl FioResult {
    /// Bandwidth in GiB/s.
    pub fn gib_per_s(&self) -> f64 {
        self.bytes_per_s / (1u64 << 30) as f64
    }
}

/// The program name.
pub const PROGRAM: &str = "fio";
/// The Debian package that brings it.
pub const PACKAGE: &str = "fio";

/// Whether `fio` is on the `PATH`.
pub fn available() -> bool {
    Command::new(PROGRAM)
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// [`Error::MissingPeer`] for fio.
pub fn missing() -> Error {
    Error::MissingPeer {
        program: PROGRAM,
        package: PACKAGE,
    }
}

/// The command line of [`seq_read`], for reports.
pub fn seq_read_cmdline(path: &Path, bytes: u64, bs: &str, iodepth: u32) -> Vec<String> {
    vec![
        "fio".into(),
        "--name=limit".into(),
        format!("--filename={}", path.display()),
        "--readonly".into(),
        "--rw=read".into(),
        format!("--bs={bs}"),
        format!("--iodepth={iodepth}"),
        "--ioengine=io_uring".into(),
        "--direct=1".into(),
        format!("--size={bytes}"),
        "--output-format=json".into(),
    ]
}

/// fio's O_DIRECT io_uring sequential read of the first `bytes` of `path`.
///
/// # Errors
/// [`Error::Spawn`] when fio cannot start, [`Error::Peer`] when it fails or
/// prints something that is not its JSON.
pub fn seq_read(path: &Path, bytes: u64, bs: &str, iodepth: u32) -> Result<FioResult> {
    let cmd = seq_read_cmdline(path, bytes, bs, iodepth);
    let out = Command::new(&cmd[0])
        .args(&cmd[1..])
        .output()
        .map_err(Error::spawn(PROGRAM))?;
    if !out.status.success() {
        return Err(failed(format!(
            "{}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .next()
                .unwrap_or("")
        )));
    }
    parse(&String::from_utf8_lossy(&out.stdout), "read")
}

fn failed(reason: String) -> Error {
    Error::Peer {
        program: PROGRAM.into(),
        reason,
    }
}

/// Reads the first job's bandwidth in direction `dir` (`read` or `write`)
/// from `fio --output-format=json`.
///
/// # Errors
/// [`Error::Peer`] when the text is not fio JSON with such a job.
pub fn parse(text: &str, dir: &str) -> Result<FioResult> {
    // fio may print notes before the JSON object.
    let start = text
        .find('{')
        .ok_or_else(|| failed("no JSON in its output".into()))?;
    let v: serde_json::Value = serde_json::from_str(&text[start..])
        .map_err(|e| failed(format!("its JSON does not parse: {e}")))?;
    let job = &v["jobs"][0][dir];
    let bytes = job["io_bytes"]
        .as_u64()
        .ok_or_else(|| failed(format!("its JSON has no jobs[0].{dir}.io_bytes")))?;
    let bw = job["bw_bytes"]
        .as_f64()
        .ok_or_else(|| failed(format!("its JSON has no jobs[0].{dir}.bw_bytes")))?;
    let runtime_ms = job["runtime"].as_f64().unwrap_or(0.0);
    Ok(FioResult {
        bytes,
        bytes_per_s: bw,
        runtime_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fio_json() {
        let text = r#"note: both iodepth >= 1 and synchronous I/O engine
{"fio version":"fio-3.33","jobs":[{"jobname":"limit","read":{"io_bytes":1073741824,"bw_bytes":1113868341,"runtime":964}}]}"#;
        let r = parse(text, "read").unwrap();
        assert_eq!(r.bytes, 1 << 30);
        assert_eq!(r.runtime_ms, 964.0);
        assert!((r.gib_per_s() - 1.0374).abs() < 1e-3);
        assert!(matches!(
            parse("fio: error", "read"),
            Err(Error::Peer { .. })
        ));
        assert!(parse(r#"{"jobs":[]}"#, "read").is_err());
        assert!(parse(text, "write").is_err());
    }
}
