//! The control socket's listener: binds the socket, starts the endpoint
//! service, and hands every accepted connection to its event loop.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rustix::net::SocketFlags;
use tracing::{info, warn};

use super::EptService;
use crate::bus::Bus;
use crate::ctrl::proto::ServiceStats;
use crate::ctrl::CtrlError;

/// How the control socket is set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CtrlOptions {
    /// Mode of the socket (and of the legacy nodes); 0600 by default.
    pub mode: u32,
    /// Where legacy nodes go; `None`: the socket path with `.d` appended.
    pub rundir: Option<PathBuf>,
    /// Endpoints one control connection may hold (more: `EMFILE`); `None`:
    /// [`CtrlOptions::DEFAULT_MAX_ENDPOINTS_PER_CLIENT`], at most the
    /// per-user bound.
    pub max_endpoints_per_client: Option<u32>,
    /// Endpoints one user may hold over all its connections (more:
    /// `ENOSPC`); `None`: [`CtrlOptions::DEFAULT_MAX_ENDPOINTS_PER_UID`], at
    /// most a quarter of the fds the service may spend on endpoints.
    pub max_endpoints_per_uid: Option<u32>,
}

impl CtrlOptions {
    /// 1024, the soft open-file limit a Linux process starts with: a client
    /// holds as many endpoints as it could hold `/dev/rpmsgN` fds of the
    /// kernel without raising its own limit.
    pub const DEFAULT_MAX_ENDPOINTS_PER_CLIENT: u32 = super::limits::DEFAULT_PER_CLIENT;
    /// 4096, four clients' worth for one user.
    pub const DEFAULT_MAX_ENDPOINTS_PER_UID: u32 = super::limits::DEFAULT_PER_UID;
}

impl Default for CtrlOptions {
    fn default() -> Self {
        CtrlOptions {
            mode: 0o600,
            rundir: None,
            max_endpoints_per_client: None,
            max_endpoints_per_uid: None,
        }
    }
}

/// The control socket server of a bus owner, with its endpoint service.
#[derive(Debug)]
pub struct CtrlServer {
    path: PathBuf,
    svc: EptService,
    listener: Arc<OwnedFd>,
    stopped: Arc<AtomicBool>,
}

impl CtrlServer {
    /// Binds `path` (replacing a stale socket, refusing a live one; mode
    /// 0600) and serves clients
    /// of `bus` on background threads.
    ///
    /// # Errors
    /// [`CtrlError::Io`] if the socket cannot be bound.
    pub fn start(bus: Bus, path: &Path) -> Result<Self, CtrlError> {
        Self::start_with(bus, path, &CtrlOptions::default())
    }

    /// Whether `path` may be bound: free, or a stale socket (removed here).
    /// Lets a bus owner refuse before it touches the device.
    ///
    /// # Errors
    /// [`CtrlError::InUse`] if another server listens there,
    /// [`CtrlError::NotSocket`] for another kind of file.
    pub fn check_free(path: &Path) -> Result<(), CtrlError> {
        iopath_sys::unix_socket::claim(path, rustix::net::SocketType::SEQPACKET)
            .map_err(CtrlError::from_claim)
    }

    /// As [`CtrlServer::start`], with a socket mode and runtime directory.
    ///
    /// # Errors
    /// [`CtrlError::InUse`] if another server listens on `path` (a stale
    /// socket is replaced), [`CtrlError::Io`] if the socket or the
    /// directory cannot be made.
    pub fn start_with(bus: Bus, path: &Path, opts: &CtrlOptions) -> Result<Self, CtrlError> {
        // Before anything is made: a live server's socket stays its own.
        Self::check_free(path)?;
        let rundir = opts
            .rundir
            .clone()
            .unwrap_or_else(|| crate::ctrl::default_run_dir(path));
        let svc = EptService::start(bus.clone(), &rundir, opts)?;
        // Bound under a temporary name with its mode, listening, then
        // renamed into place: once `path` exists, a client's connect
        // succeeds.
        let fd = iopath_sys::unix_socket::bind_listener(
            path,
            rustix::net::SocketType::SEQPACKET,
            opts.mode,
            64,
        )
        .map_err(|(op, source)| CtrlError::Io { op, source })?;
        let svc2 = svc.clone();
        let listener = Arc::new(fd);
        let fd = Arc::clone(&listener);
        let stopped = Arc::new(AtomicBool::new(false));
        let stop2 = Arc::clone(&stopped);
        let mode = opts.mode;
        std::thread::Builder::new()
            .name("rpmsg-ctrl".into())
            .spawn(move || {
                let mut conn = 0u64;
                loop {
                    if stop2.load(Ordering::SeqCst) {
                        return; // dropping `fd` closes the listener
                    }
                    match rustix::net::accept_with(&*fd, SocketFlags::CLOEXEC) {
                        Ok(c) => {
                            conn += 1;
                            let peer = match iopath_sys::unix_socket::admit(&c, mode) {
                                Ok(peer) => peer,
                                Err(peer) => {
                                    warn!(target: "iopath_rpmsg", "control client {conn} refused: {peer} is another user and the socket is private (mode {mode:o})");
                                    continue;
                                }
                            };
                            info!(target: "iopath_rpmsg", "control client {conn} connected: {peer}");
                            // From here on the service's event loop reads
                            // the connection's requests.
                            if let Err(e) = svc2.add_client(conn, c, peer) {
                                warn!(target: "iopath_rpmsg", "control client {conn} dropped: {e}");
                            }
                        }
                        Err(rustix::io::Errno::INTR) => {}
                        // shutdown() woke the accept: not a failure.
                        Err(_) if stop2.load(Ordering::SeqCst) => return,
                        Err(e) => {
                            warn!(target: "iopath_rpmsg", "control socket accept failed: {e}");
                            std::thread::sleep(Duration::from_millis(10));
                        }
                    }
                }
            })
            .map_err(|source| CtrlError::Io {
                op: "spawn",
                source,
            })?;
        Ok(CtrlServer {
            path: path.to_owned(),
            svc,
            listener,
            stopped,
        })
    }

    /// Stops serving: the socket path is removed (new clients get ENOENT,
    /// as with no `/dev/rpmsg_ctrlN`), every control connection is hung up
    /// and every endpoint destroyed (their clients see the hang-up), the
    /// runtime directory is emptied and removed. The bus stays as it is.
    /// Lets a bus owner serve a new bus (a restarted remote) on the same
    /// path. Idempotent.
    pub fn shutdown(&self) {
        if self.stopped.swap(true, Ordering::SeqCst) {
            return;
        }
        let _ = std::fs::remove_file(&self.path);
        // Wakes the accept thread, which sees `stopped` and closes it.
        let _ = rustix::net::shutdown(&*self.listener, rustix::net::Shutdown::Both);
        self.svc.stop();
        let _ = std::fs::remove_dir(self.svc.rundir());
    }

    /// Removes what a service that did not shut down (its process ended
    /// by a signal) left in its runtime directory `dir`: the legacy nodes
    /// (`rpmsgN`), then the directory if nothing else is in it, so a
    /// directory shared with other files keeps them.
    pub fn remove_run_dir(dir: &Path) {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                if super::legacy::is_node_name(&e.file_name().to_string_lossy()) {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        let _ = std::fs::remove_dir(dir);
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The runtime directory of legacy nodes.
    pub fn rundir(&self) -> &Path {
        self.svc.rundir()
    }

    /// The endpoint service's counters.
    pub fn stats(&self) -> ServiceStats {
        self.svc.stats()
    }
}
