//! The back ends the rows drive, as child processes: `iopath blk serve`
//! and `qemu-storage-daemon`, each pinned, listening before a row starts,
//! and stopped (SIGTERM, then SIGKILL) when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::check_failed;
use crate::place::spawn_on;
use crate::{Error, Missing, Result};

/// A child process killed (and reaped) on drop.
pub(super) struct Reaped(pub(super) Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        // SIGTERM first so `iopath blk serve` removes its socket.
        let pid = rustix::process::Pid::from_child(&self.0);
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The first error line of a log file (else its last line), for messages.
fn last_line(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    lines
        .iter()
        .find(|l| l.contains("error"))
        .or(lines.last())
        .copied()
        .unwrap_or("")
        .to_string()
}

/// A log file beside the socket for a child's stderr.
fn log_for(socket: &Path) -> Result<(PathBuf, std::fs::File)> {
    let log = socket.with_extension("log");
    let f = std::fs::File::create(&log).map_err(Error::io(&log))?;
    Ok((log, f))
}

/// Waits until `path` exists (the back end listens) or the child exits.
fn wait_for_socket(child: &mut Reaped, path: &Path, what: &str, log: &Path) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !path.exists() {
        if let Some(st) = child
            .0
            .try_wait()
            .map_err(Error::sys("waiting for a child"))?
        {
            return Err(Error::Peer {
                program: what.into(),
                reason: format!("exited before listening ({st}): {}", last_line(log)),
            });
        }
        if Instant::now() > deadline {
            check_failed!("{what} did not create {} within 20 s", path.display());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// Starts `iopath blk serve` on `image` with `extra` arguments, pinned
/// to `cpu`.
pub(super) fn start_iopath_serve_on(
    exe: &Path,
    image: &Path,
    socket: &Path,
    cpu: Option<usize>,
    extra: &[&str],
) -> Result<Reaped> {
    let _ = std::fs::remove_file(socket);
    let (log, err) = log_for(socket)?;
    let child = spawn_on(
        cpu,
        Command::new(exe)
            .args(["blk", "serve", "--image"])
            .arg(image)
            .arg("--socket")
            .arg(socket)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err),
    )?;
    let mut c = Reaped(child);
    wait_for_socket(&mut c, socket, "iopath blk serve", &log)?;
    Ok(c)
}

/// Starts `qemu-storage-daemon` exporting `image` as vhost-user-blk with
/// direct I/O, pinned to `cpu`.
pub(super) fn start_qsd_on(image: &Path, socket: &Path, cpu: Option<usize>) -> Result<Reaped> {
    if let Some(m) = Missing::QSD.check() {
        return Err(Error::MissingPeer {
            program: m.program,
            package: m.package,
        });
    }
    let _ = std::fs::remove_file(socket);
    let (log, err) = log_for(socket)?;
    let child = spawn_on(
        cpu,
        Command::new(Missing::QSD.program)
            .arg("--blockdev")
            .arg(format!(
                "driver=file,node-name=disk,filename={},cache.direct=on,aio=io_uring",
                image.display()
            ))
            .arg("--export")
            .arg(format!(
                "type=vhost-user-blk,id=exp,node-name=disk,addr.type=unix,addr.path={},writable=on",
                socket.display()
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err),
    )?;
    let mut c = Reaped(child);
    wait_for_socket(&mut c, socket, Missing::QSD.program, &log)?;
    Ok(c)
}
