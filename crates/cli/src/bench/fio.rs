//! fio, the limit beside iopath's figures: runs `fio --output-format=json`
//! and reads the bandwidth out of it.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};

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

/// Whether `fio` is on the `PATH`.
pub fn available() -> bool {
    Command::new("fio")
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
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
/// When fio fails or prints something that is not its JSON.
pub fn seq_read(path: &Path, bytes: u64, bs: &str, iodepth: u32) -> Result<FioResult> {
    let cmd = seq_read_cmdline(path, bytes, bs, iodepth);
    let out = Command::new(&cmd[0])
        .args(&cmd[1..])
        .output()
        .context("run fio")?;
    if !out.status.success() {
        bail!(
            "fio failed: {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .next()
                .unwrap_or("")
        );
    }
    parse_read(&String::from_utf8_lossy(&out.stdout))
}

/// Reads the first job's read bandwidth from `fio --output-format=json`.
///
/// # Errors
/// When the text is not fio JSON with a read job.
pub fn parse_read(text: &str) -> Result<FioResult> {
    // fio may print notes before the JSON object.
    let start = text.find('{').context("no JSON in fio output")?;
    let v: serde_json::Value = serde_json::from_str(&text[start..]).context("parse fio JSON")?;
    let read = &v["jobs"][0]["read"];
    let bytes = read["io_bytes"]
        .as_u64()
        .context("fio JSON: no jobs[0].read.io_bytes")?;
    let bw = read["bw_bytes"]
        .as_f64()
        .context("fio JSON: no jobs[0].read.bw_bytes")?;
    let runtime_ms = read["runtime"].as_f64().unwrap_or(0.0);
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
        let r = parse_read(text).unwrap();
        assert_eq!(r.bytes, 1 << 30);
        assert_eq!(r.runtime_ms, 964.0);
        assert!((r.gib_per_s() - 1.0374).abs() < 1e-3);
        assert!(parse_read("fio: error").is_err());
        assert!(parse_read(r#"{"jobs":[]}"#).is_err());
    }
}
