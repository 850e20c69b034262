//! The guest rows of `iopath bench blk --guest`: a Linux guest (QEMU, TCG,
//! booted by `scripts/guest-dd`) runs `dd if=/dev/zero of=/dev/vda bs=8M
//! count=N oflag=direct` on a vhost-user-blk socket, its virtio bypassing
//! the DMA API or mapping every buffer through it with `swiotlb=force`
//! behind the vIOMMU; its GNU dd summary gives the row's throughput.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::{Error, Result};

fn failed(reason: String) -> Error {
    let program = "scripts/guest-dd".into();
    Error::Peer { program, reason }
}

/// Where `scripts/guest-dd` is: `$IOPATH_GUEST_DD`, else the source tree
/// this binary was built from.
fn script() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("IOPATH_GUEST_DD") {
        return Ok(PathBuf::from(p));
    }
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/guest-dd");
    if !p.exists() {
        crate::error::invalid!(
            "IOPATH_GUEST_DD",
            "scripts/guest-dd not found at {}",
            p.display()
        );
    }
    Ok(p)
}

/// Builds the guest once (`guest-dd --prepare`: kernel and initramfs in a
/// cache dir; a no-op when already built).
pub(crate) fn prepare() -> Result<PathBuf> {
    if let Some(m) = crate::Missing::QEMU.check() {
        return Err(Error::MissingPeer(m));
    }
    let script = script()?;
    let out = run_script(Command::new(&script).arg("--prepare"), &script)?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(failed(format!(
            "--prepare: {}",
            err.lines().last().unwrap_or("")
        )));
    }
    Ok(script)
}

/// How the guest's virtio-blk driver maps its buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GuestDma {
    /// No `VIRTIO_F_ACCESS_PLATFORM`: virtio bypasses the DMA API and
    /// hands the device guest-physical addresses.
    Direct,
    /// `ACCESS_PLATFORM` behind QEMU's intel-iommu, the guest booted with
    /// `swiotlb=force iommu=pt`: Linux's DMA layer copies every block
    /// through its bounce buffer, and the back end resolves every address
    /// through vhost-user IOTLB misses (`guest-dd --iommu --swiotlb`, which
    /// fails unless the guest shows the bounce buffer in use).
    SwiotlbIommu,
}

impl GuestDma {
    /// The arguments of `scripts/guest-dd` that set it up.
    fn args(self) -> &'static [&'static str] {
        match self {
            GuestDma::Direct => &[],
            GuestDma::SwiotlbIommu => &["--iommu", "--swiotlb"],
        }
    }
}

/// One guest run against the back end on `socket`: `count` blocks of `bs`
/// bytes written with O_DIRECT, the buffers mapped as `dma` says. Returns
/// the write's GiB/s from GNU dd's summary (bytes / seconds).
pub(crate) fn dd_once(
    script: &Path,
    socket: &Path,
    bs: u64,
    count: u64,
    dma: GuestDma,
) -> Result<f64> {
    // The pattern check that follows dd goes at the start of the device.
    let pattern = (bs * count).min(4 << 20) / 4096 * 4096;
    let [bs, count, pattern] = [bs, count, pattern].map(|n| n.to_string());
    let mut cmd = Command::new(script);
    cmd.arg("--socket")
        .arg(socket)
        .args(["--bs", &bs, "--count", &count]);
    cmd.args(["--pattern-offset", "0", "--pattern-size", &pattern]);
    cmd.args(dma.args()).args(["--timeout", "1200", "--json"]);
    let out = run_script(&mut cmd, script)?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    if !out.status.success() || v["result"] != "pass" {
        let reason = v["reason"].as_str().map(str::to_string).unwrap_or_else(|| {
            let err = String::from_utf8_lossy(&out.stderr);
            err.lines().last().unwrap_or("").to_string()
        });
        return Err(failed(format!("guest dd: {reason}")));
    }
    let figure = |k: &str| {
        v["write"][k]
            .as_f64()
            .ok_or_else(|| failed(format!("no write {k} in its JSON")))
    };
    let (bytes, secs) = (figure("bytes")?, figure("seconds")?);
    if secs <= 0.0 {
        return Err(failed(format!("guest dd reported {secs} s")));
    }
    Ok(bytes / secs / f64::from(1u32 << 30))
}

/// Runs the guest script to its end, collecting its output. It leads a
/// process group of its own, recorded for [`crate::cleanup`]: a signal to
/// the bench then stops QEMU with it, not only the shell.
fn run_script(cmd: &mut Command, script: &Path) -> Result<std::process::Output> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = crate::cleanup::spawn(cmd, true);
    let out = child.and_then(std::process::Child::wait_with_output);
    out.map_err(Error::spawn(script.display().to_string()))
}
