//! The host's outer loop: serve the clients until the link to the remote
//! goes down, take the control socket away, wait for a remote to listen
//! again and serve again on the same shared memory.

use std::convert::Infallible;
use std::path::Path;
use std::time::Duration;

use thiserror::Error;

use super::{reconnect_remote, Cleanup};
use crate::ctrl::CtrlError;
use crate::notify::{NotifyError, NotifySpec};
use crate::{
    Bus, BusError, CtrlOptions, CtrlServer, SharedMem, ShmError, ShmOptions, ShmOwner, Stats,
};

/// What [`serve_remotes`] needs to start the host again for the next
/// remote.
#[derive(Debug)]
pub struct ServeRemotes<'a> {
    /// Where the remote listens.
    pub notify: &'a NotifySpec,
    /// How long each try to connect (and to open the shared memory) waits.
    pub timeout: Duration,
    /// The remote's shared-memory file.
    pub shm: &'a Path,
    /// How the shared memory is opened.
    pub shm_opts: &'a ShmOptions,
    /// The features the host accepts.
    pub features: u32,
    /// How buffer sizes are negotiated.
    pub convention: crate::Convention,
    /// The sizes used under [`crate::Convention::Fixed`].
    pub fixed: crate::BufSizes,
    /// The control socket served to clients.
    pub ctrl: &'a Path,
    /// How the control socket is served.
    pub ctrl_opts: &'a CtrlOptions,
    /// Serve one remote only: the link going down is an error.
    pub once: bool,
    /// The host's role on the shared memory: detached while no remote is
    /// served, so a remote may create the file afresh, attached again after.
    pub owner: Option<&'a ShmOwner>,
}

/// What happens while a host serves remotes, in order.
#[derive(Debug)]
pub enum HostEvent<'a> {
    /// The link to the remote went down; the bus is still up.
    LinkDown {
        /// Why.
        reason: &'a str,
        /// The bus's counters.
        stats: &'a Stats,
    },
    /// The clients are hung up and the device reset; a remote is awaited.
    Waiting {
        /// Why the link went down.
        reason: &'a str,
    },
    /// A remote is back and the control socket is served again.
    RemoteBack {
        /// The control socket.
        ctrl: &'a Path,
    },
}

/// Why a host stopped serving remotes.
#[derive(Debug, Error)]
pub enum ServeRemotesError {
    /// The link to the one remote went down (with `once`).
    #[error("The link to the remote went down: {reason}")]
    LinkDown {
        /// Why.
        reason: String,
    },
    /// Connecting to the next remote failed.
    #[error("Reconnecting to the remote failed")]
    Reconnect(#[source] NotifyError),
    /// The shared memory could not be opened again.
    #[error("Opening the shared memory failed")]
    Shm(#[source] ShmError),
    /// The host could not start again.
    #[error("Restarting the host failed")]
    Bus(#[source] BusError),
    /// The control socket could not be served again.
    #[error("Serving the control socket failed")]
    Ctrl(#[source] CtrlError),
}

/// Serves `server` on `bus` and, each time the link goes down, the next
/// remote on the same shared memory, until an error (or a stop request,
/// whose thread ends the process). Each bus is registered in `stop`;
/// `on_event` hears of each step.
///
/// # Errors
/// [`ServeRemotesError`]; [`ServeRemotesError::LinkDown`] when the link
/// went down and `cfg.once` is set.
pub fn serve_remotes(
    cfg: &ServeRemotes<'_>,
    bus: Bus,
    server: CtrlServer,
    stop: &Cleanup,
    mut on_event: impl FnMut(HostEvent<'_>),
) -> Result<Infallible, ServeRemotesError> {
    let (mut bus, mut server) = (bus, server);
    loop {
        let reason = bus.wait_down(None).unwrap_or_default();
        if stop.stopping() {
            // The stop request's thread stopped the bus; it ends the process.
            stop.run();
        }
        // The session is over: a remote restarted with --create may make
        // the file afresh (this host keeps its role).
        if let Some(o) = cfg.owner {
            o.detach();
        }
        on_event(HostEvent::LinkDown {
            reason: &reason,
            stats: &bus.stats(),
        });
        if cfg.once {
            // A supervisor must tell this from a requested stop.
            return Err(ServeRemotesError::LinkDown { reason });
        }
        // The clients' endpoints died with the link: hang them up, take the
        // control socket away until a remote is back, reset the device.
        server.shutdown();
        stop.set_bus(None);
        bus.shutdown();
        on_event(HostEvent::Waiting { reason: &reason });
        let notifier =
            reconnect_remote(cfg.notify, cfg.timeout).map_err(ServeRemotesError::Reconnect)?;
        // A stop request may have come meanwhile: then its thread removes
        // the control socket and exits, and nothing is placed again.
        (bus, server) = stop.restart(|| {
            let shm = SharedMem::open_waiting(cfg.shm, cfg.shm_opts, cfg.timeout)
                .map_err(ServeRemotesError::Shm)?;
            if let Some(o) = cfg.owner {
                o.attach().map_err(ServeRemotesError::Shm)?;
            }
            let opts = crate::HostOptions {
                features: cfg.features,
                convention: cfg.convention,
                fixed: cfg.fixed,
            };
            let bus = Bus::host_with(shm, notifier, &opts).map_err(ServeRemotesError::Bus)?;
            let server = CtrlServer::start_with(bus.clone(), cfg.ctrl, cfg.ctrl_opts)
                .map_err(ServeRemotesError::Ctrl)?;
            Ok((bus, server))
        })?;
        // The old mapping's fd closed with the old bus, and with it this
        // process's classic locks: name it to a refused host again.
        if let Some(o) = cfg.owner {
            o.refresh();
        }
        on_event(HostEvent::RemoteBack {
            ctrl: server.path(),
        });
    }
}
