//! A requested stop of `rpmsg host` or `rpmsg remote` (SIGINT, SIGTERM),
//! handled as `blk serve` does: the signals wait on a thread of their own,
//! which runs the process's [`Cleanup`] (stop the bus, remove the sockets
//! and the runtime directory this process made) and exits 0. Every other
//! way out runs the same cleanup.

use anyhow::{Context, Result};
use iopath_rpmsg::tools::session::Cleanup;

/// Installs the SIGINT/SIGTERM handling and returns the cleanup its thread
/// runs. Call it before any thread is started, so every thread leaves the
/// signals to the handler's.
pub fn install(role: &'static str) -> Result<Cleanup> {
    let stop = Cleanup::new();
    let s2 = stop.clone();
    iopath_sys::signals::on_stop("rpmsg-signals", move |sig| {
        s2.stop_requested();
        eprintln!("{role}: stopped by signal {sig}");
        0
    })
    .context("cannot install the SIGINT/SIGTERM handling")?;
    Ok(stop)
}
