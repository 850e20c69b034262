//! The back ends the rows drive, as child processes: `iopath blk serve`
//! and `qemu-storage-daemon`, each pinned, listening before a row starts,
//! and stopped (SIGTERM, then SIGKILL) when dropped.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::place::Logged;
use crate::{Error, Missing, Result};

/// Starts `cmd` (`name` in messages) on `cpu`, its log beside `socket`, and
/// waits (20 s at most) until it listens there.
fn start(
    name: &'static str,
    socket: &Path,
    cpu: Option<usize>,
    cmd: &mut Command,
) -> Result<Logged> {
    let _ = std::fs::remove_file(socket);
    let mut c = Logged::spawn(socket.with_extension("log"), name, cpu, cmd)?.term_first();
    c.wait_for("its socket", Duration::from_secs(20), || socket.exists())?;
    Ok(c)
}

/// Starts `iopath blk serve` on `image` with `extra` arguments, pinned
/// to `cpu`.
pub(super) fn start_iopath_serve_on(
    exe: &Path,
    image: &Path,
    socket: &Path,
    cpu: Option<usize>,
    extra: &[&str],
) -> Result<Logged> {
    let mut cmd = Command::new(exe);
    cmd.args(["blk", "serve", "--image"])
        .arg(image)
        .arg("--socket")
        .arg(socket)
        .args(extra);
    start("iopath blk serve", socket, cpu, &mut cmd)
}

/// Starts `qemu-storage-daemon` exporting `image` as vhost-user-blk with
/// direct I/O, pinned to `cpu`.
pub(super) fn start_qsd_on(image: &Path, socket: &Path, cpu: Option<usize>) -> Result<Logged> {
    if let Some(m) = Missing::QSD.check() {
        return Err(Error::MissingPeer {
            program: m.program,
            package: m.package,
        });
    }
    let mut cmd = Command::new(Missing::QSD.program);
    cmd.arg("--blockdev")
        .arg(format!(
            "driver=file,node-name=disk,filename={},cache.direct=on,aio=io_uring",
            image.display()
        ))
        .arg("--export")
        .arg(format!(
            "type=vhost-user-blk,id=exp,node-name=disk,addr.type=unix,addr.path={},writable=on",
            socket.display()
        ));
    start(Missing::QSD.program, socket, cpu, &mut cmd)
}
