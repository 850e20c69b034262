//! The host: its start-up (the checks, the host's role on the shared
//! memory, the bus, the control socket, each registered in the
//! [`Cleanup`] as it is made) and its outer loop: serve the clients until
//! the link to the remote goes down, take the control socket away, wait
//! for a remote to listen again and serve again on the same shared memory.
//!
//! ```text
//!   HostSession::start ── control socket free? ── no other host? ── connect
//!        ── open the shared memory (waiting) ── take the host's role
//!        ── Bus::host_with ── CtrlServer (the endpoint service)
//!   HostSession::serve ── link down ── clients hung up, device reset
//!        ── next remote ── bus and control socket again ── ...
//! ```

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::time::Duration;

use thiserror::Error;

use super::{reconnect_remote, Cleanup};
use crate::ctrl::CtrlError;
use crate::notify::{NotifyError, NotifySpec};
use crate::{
    Bus, BusError, CtrlOptions, CtrlServer, HostOptions, SharedMem, ShmError, ShmOptions, ShmOwner,
    ShmRole, Stats,
};

/// What a host connects to and what it serves.
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// The remote's shared-memory file ([`crate::shm_path`] reads a bare
    /// name).
    pub shm: PathBuf,
    /// How the shared memory is opened.
    pub shm_opts: ShmOptions,
    /// Where the remote listens.
    pub notify: NotifySpec,
    /// How long each try to connect (and to open the shared memory) waits.
    pub timeout: Duration,
    /// The features the host accepts, and how buffer sizes are negotiated.
    pub host: HostOptions,
    /// The control socket served to local clients; `None`: the bus only.
    pub ctrl: Option<PathBuf>,
    /// How the control socket is served.
    pub ctrl_opts: CtrlOptions,
    /// Serve one remote only: the link going down is an error.
    pub once: bool,
}

/// Why a host could not start. Each variant is one step of
/// [`HostSession::start`], in order.
#[derive(Debug, Error)]
pub enum HostStartError {
    /// Another server listens on the control socket (or it is no socket):
    /// refused before the device is touched, as a second host would reset
    /// the running one's device.
    #[error("Control socket refused")]
    CtrlInUse(#[source] CtrlError),
    /// Another host holds the shared memory, or its role cannot be taken.
    #[error("Shared memory refused")]
    Owner(#[source] ShmError),
    /// No remote could be connected to.
    #[error("Connecting to the remote failed")]
    Connect(#[source] NotifyError),
    /// The remote's shared memory could not be opened.
    #[error("Opening the shared memory failed")]
    Shm(#[source] ShmError),
    /// The bus did not start.
    #[error("Starting the host failed")]
    Bus(#[source] BusError),
    /// The control socket could not be served.
    #[error("Serving the control socket failed")]
    Ctrl(#[source] CtrlError),
}

/// A running host: its bus, its control socket, and its role on the
/// shared memory for the process's life (across remotes).
#[derive(Debug)]
pub struct HostSession {
    cfg: HostConfig,
    bus: Bus,
    server: Option<CtrlServer>,
    owner: ShmOwner,
}

impl HostSession {
    /// Starts a host: checks that the control socket is free and that no
    /// other host holds the shared memory (before the remote's notify
    /// socket is touched: a busy remote would keep this one waiting),
    /// connects to the remote, opens its shared memory (waiting while it
    /// is being created), takes the host's role on it, starts the bus and
    /// serves the control socket. The bus, the socket and the endpoint
    /// service's runtime directory are registered in `stop` as they are
    /// made, so a stop (or an error) removes them; what is not made is
    /// not removed, another server's socket included.
    ///
    /// # Errors
    /// [`HostStartError`], naming the step that failed.
    pub fn start(cfg: HostConfig, stop: &Cleanup) -> Result<Self, HostStartError> {
        if let Some(ctrl) = &cfg.ctrl {
            CtrlServer::check_free(ctrl).map_err(HostStartError::CtrlInUse)?;
        }
        ShmOwner::check(&cfg.shm, ShmRole::Host).map_err(HostStartError::Owner)?;
        let notifier = cfg
            .notify
            .connect(cfg.timeout)
            .map_err(HostStartError::Connect)?;
        let shm = SharedMem::open_waiting(&cfg.shm, &cfg.shm_opts, cfg.timeout)
            .map_err(HostStartError::Shm)?;
        // The host's role for this process's life, across remotes; the
        // session lock while the link is up (see ShmOwner).
        let owner = ShmOwner::claim(&cfg.shm, ShmRole::Host)
            .and_then(|o| o.attach().map(|()| o))
            .map_err(HostStartError::Owner)?;
        let bus = Bus::host_with(shm, notifier, &cfg.host).map_err(HostStartError::Bus)?;
        stop.set_bus(Some(bus.clone()));
        let server = match &cfg.ctrl {
            Some(ctrl) => Some(start_ctrl(&bus, ctrl, &cfg.ctrl_opts, stop)?),
            None => None,
        };
        Ok(HostSession {
            cfg,
            bus,
            server,
            owner,
        })
    }

    /// The bus to the remote.
    pub fn bus(&self) -> &Bus {
        &self.bus
    }

    /// The control socket's server, if one was asked for.
    pub fn server(&self) -> Option<&CtrlServer> {
        self.server.as_ref()
    }

    /// Serves the clients and, each time the link goes down, the next
    /// remote on the same shared memory, until an error (or a stop
    /// request, whose thread ends the process). Each bus is registered in
    /// `stop`; `on_event` hears of each step.
    ///
    /// # Errors
    /// [`ServeRemotesError`]; [`ServeRemotesError::LinkDown`] when the link
    /// went down and the configuration serves one remote only.
    pub fn serve(
        self,
        stop: &Cleanup,
        mut on_event: impl FnMut(HostEvent<'_>),
    ) -> Result<Infallible, ServeRemotesError> {
        let HostSession {
            cfg,
            mut bus,
            mut server,
            owner,
        } = self;
        loop {
            let reason = bus.wait_down(None).unwrap_or_default();
            if stop.stopping() {
                // The stop request's thread stopped the bus; it ends the
                // process.
                stop.run();
            }
            // The session is over: a remote restarted with --create may
            // make the file afresh (this host keeps its role).
            owner.detach();
            on_event(HostEvent::LinkDown {
                reason: &reason,
                stats: &bus.stats(),
            });
            if cfg.once {
                // A supervisor must tell this from a requested stop.
                return Err(ServeRemotesError::LinkDown { reason });
            }
            // The clients' endpoints died with the link: hang them up, take
            // the control socket away until a remote is back, reset the
            // device.
            if let Some(s) = &server {
                s.shutdown();
            }
            stop.set_bus(None);
            bus.shutdown();
            on_event(HostEvent::Waiting { reason: &reason });
            let notifier =
                reconnect_remote(&cfg.notify, cfg.timeout).map_err(ServeRemotesError::Reconnect)?;
            // A stop request may have come meanwhile: then its thread
            // removes the control socket and exits, and nothing is placed
            // again.
            (bus, server) = stop.restart(|| {
                let shm = SharedMem::open_waiting(&cfg.shm, &cfg.shm_opts, cfg.timeout)
                    .map_err(ServeRemotesError::Shm)?;
                owner.attach().map_err(ServeRemotesError::Shm)?;
                let bus =
                    Bus::host_with(shm, notifier, &cfg.host).map_err(ServeRemotesError::Bus)?;
                let server = match &cfg.ctrl {
                    Some(ctrl) => Some(
                        CtrlServer::start_with(bus.clone(), ctrl, &cfg.ctrl_opts)
                            .map_err(ServeRemotesError::Ctrl)?,
                    ),
                    None => None,
                };
                Ok((bus, server))
            })?;
            // The old mapping's fd closed with the old bus, and with it
            // this process's classic locks: name it to a refused host
            // again.
            owner.refresh();
            on_event(HostEvent::RemoteBack {
                ctrl: server.as_ref().map(CtrlServer::path),
            });
        }
    }
}

/// Serves the control socket `ctrl` on `bus`, registering the socket and
/// the runtime directory in `stop` before they appear (a signal that comes
/// as soon as a client could connect still finds them to remove); a socket
/// found to be another server's is left alone.
fn start_ctrl(
    bus: &Bus,
    ctrl: &Path,
    opts: &CtrlOptions,
    stop: &Cleanup,
) -> Result<CtrlServer, HostStartError> {
    stop.add_file(ctrl);
    let rundir = opts
        .rundir
        .clone()
        .unwrap_or_else(|| crate::ctrl::default_run_dir(ctrl));
    stop.set_rundir(Some(&rundir));
    match CtrlServer::start_with(bus.clone(), ctrl, opts) {
        Ok(server) => {
            stop.set_rundir(Some(server.rundir()));
            Ok(server)
        }
        Err(e) => {
            if matches!(e, CtrlError::InUse { .. } | CtrlError::NotSocket { .. }) {
                stop.forget_file(ctrl); // someone else's
                stop.set_rundir(None);
            }
            Err(HostStartError::Ctrl(e))
        }
    }
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
    /// A remote is back and the control socket (if any) is served again.
    RemoteBack {
        /// The control socket.
        ctrl: Option<&'a Path>,
    },
}

/// What happened, in words: `REASON; rx N tx N ...`, `the link to the
/// remote went down (REASON)`, `remote back, serving on CTRL again`.
impl std::fmt::Display for HostEvent<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HostEvent::LinkDown { reason, stats } => write!(f, "{reason}; {stats}"),
            HostEvent::Waiting { reason } => {
                write!(f, "the link to the remote went down ({reason})")
            }
            HostEvent::RemoteBack { ctrl: Some(c) } => {
                write!(f, "remote back, serving on {} again", c.display())
            }
            HostEvent::RemoteBack { ctrl: None } => f.write_str("remote back"),
        }
    }
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
