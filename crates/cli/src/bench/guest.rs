//! The guest rows of `iopath bench blk --guest`: a Linux guest (QEMU, TCG,
//! booted by `scripts/guest-dd`) runs the 2018 thread's
//! `dd if=/dev/zero of=/dev/vda bs=8M count=N oflag=direct` on a
//! vhost-user-blk socket; its GNU dd summary gives the row's throughput.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

/// Where `scripts/guest-dd` is: `$IOPATH_GUEST_DD`, else the source tree
/// this binary was built from.
///
/// # Errors
/// Neither exists.
pub fn script() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("IOPATH_GUEST_DD") {
        return Ok(PathBuf::from(p));
    }
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/guest-dd");
    if p.exists() {
        Ok(p)
    } else {
        bail!(
            "scripts/guest-dd not found at {} (set IOPATH_GUEST_DD)",
            p.display()
        )
    }
}

/// Builds the guest once (`guest-dd --prepare`: kernel and initramfs in a
/// cache dir; a no-op when already built).
///
/// # Errors
/// The script is missing or fails (e.g. no qemu-system-x86_64); the error
/// carries its last line.
pub fn prepare() -> Result<PathBuf> {
    let script = script()?;
    let out = Command::new(&script)
        .arg("--prepare")
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {}", script.display()))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        bail!(
            "guest-dd --prepare failed: {}",
            err.lines().last().unwrap_or("")
        );
    }
    Ok(script)
}

/// One guest run against the back end on `socket`: `count` blocks of `bs`
/// bytes written with O_DIRECT. Returns the write's GiB/s from GNU dd's
/// summary (bytes / seconds).
///
/// # Errors
/// The guest fails or times out, or prints no figures.
pub fn dd_once(script: &Path, socket: &Path, bs: u64, count: u64) -> Result<f64> {
    // The pattern check that follows dd goes at the start of the device.
    let pattern = (bs * count).min(4 << 20) / 4096 * 4096;
    let out = Command::new(script)
        .arg("--socket")
        .arg(socket)
        .args(["--bs", &bs.to_string(), "--count", &count.to_string()])
        .args([
            "--pattern-offset",
            "0",
            "--pattern-size",
            &pattern.to_string(),
        ])
        .args(["--timeout", "1200", "--json"])
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {}", script.display()))?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    if !out.status.success() || v["result"] != "pass" {
        let reason = v["reason"].as_str().map(str::to_string).unwrap_or_else(|| {
            let err = String::from_utf8_lossy(&out.stderr);
            err.lines().last().unwrap_or("").to_string()
        });
        bail!("guest dd failed: {reason}");
    }
    let bytes = v["write"]["bytes"].as_f64().context("no write bytes")?;
    let secs = v["write"]["seconds"].as_f64().context("no write seconds")?;
    if secs <= 0.0 {
        bail!("guest dd reported {secs} s");
    }
    Ok(bytes / secs / f64::from(1u32 << 30))
}
