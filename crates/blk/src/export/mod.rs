//! Many images from one back-end process, as `qemu-storage-daemon
//! --export` gives: each [`ExportSpec`] is an image on its own socket with
//! its own settings, served by its own thread with its own front end.
//!
//! ```text
//!  ExportSpec::from_str ─► spec::check (one socket once, one image
//!     writable once) ─► Exports::open (images, then sockets)
//!     ─► Exports::serve: a thread per export, each a VhostUserServer
//!        serving its front ends one after another
//! ```
//!
//! Exports share nothing but the process: a front end that leaves, breaks
//! the protocol or panics its connection is dropped by its export alone,
//! and the others go on.

mod error;
mod spec;

use std::fmt;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::Arc;

use iopath_virtio::device::{ServerError, ServerOptions, VhostUserServer};

pub use error::ExportError;
pub use spec::{check, ExportSpec, OPTIONS};

use crate::BlkBackend;

/// Connections a socket keeps waiting while its export serves another.
const BACKLOG: i32 = 16;

/// One export, open and listening.
#[derive(Debug)]
pub struct Export {
    spec: ExportSpec,
    socket_mode: u32,
    server: VhostUserServer<BlkBackend>,
}

impl Export {
    /// What it serves and how.
    pub fn spec(&self) -> &ExportSpec {
        &self.spec
    }

    /// The device it presents.
    pub fn backend(&self) -> &BlkBackend {
        self.server.device()
    }
}

/// `IMAGE (N sectors, O_DIRECT[, read-only]) on SOCKET (mode 600) with Q
/// queue(s) (poll mode)`.
impl fmt::Display for Export {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (s, b) = (&self.spec, self.backend());
        let queues = s.options.queues;
        write!(
            f,
            "{} ({} sectors, {}{}) on {} (mode {:o}) with {queues} queue{} ({}){}",
            s.image.display(),
            b.config().capacity,
            if b.direct_io() {
                "O_DIRECT"
            } else {
                "buffered"
            },
            if s.options.readonly {
                ", read-only"
            } else {
                ""
            },
            s.socket.display(),
            self.socket_mode,
            if queues == 1 { "" } else { "s" },
            s.options.poll,
            if s.access_platform {
                ""
            } else {
                ", no ACCESS_PLATFORM"
            },
        )
    }
}

/// Every export of a process, open and listening.
#[derive(Debug)]
pub struct Exports {
    exports: Vec<Export>,
}

impl Exports {
    /// Checks the set ([`check`]), opens every image, then listens on
    /// every socket with permission bits `socket_mode` (a stale socket is
    /// replaced); nothing is left listening when one fails.
    ///
    /// # Errors
    /// [`check`]'s refusals, [`ExportError::Open`] for an image that
    /// cannot be served, [`ExportError::Listen`] for a socket.
    pub fn open(specs: Vec<ExportSpec>, socket_mode: u32) -> Result<Self, ExportError> {
        check(&specs)?;
        let mut backends = Vec::with_capacity(specs.len());
        for s in &specs {
            let b = BlkBackend::open(&s.image, s.options).map_err(|source| ExportError::Open {
                image: s.image.clone(),
                source,
            })?;
            backends.push(Arc::new(b));
        }
        let mut exports: Vec<Export> = Vec::with_capacity(specs.len());
        for (spec, backend) in specs.into_iter().zip(backends) {
            let ty = rustix::net::SocketType::STREAM;
            let fd = match iopath_sys::unix_socket::listen(&spec.socket, ty, socket_mode, BACKLOG) {
                Ok(fd) => fd,
                Err(source) => {
                    remove_sockets(exports.iter().map(|e| &e.spec.socket));
                    return Err(ExportError::Listen {
                        image: spec.image,
                        source,
                    });
                }
            };
            let server =
                VhostUserServer::new(UnixListener::from(fd), backend).with_options(ServerOptions {
                    access_platform: spec.access_platform,
                    socket_mode: Some(socket_mode),
                });
            exports.push(Export {
                spec,
                socket_mode,
                server,
            });
        }
        Ok(Self { exports })
    }

    /// The exports, in the order given.
    pub fn iter(&self) -> impl Iterator<Item = &Export> {
        self.exports.iter()
    }

    /// Every export's socket, for a stop to remove.
    pub fn sockets(&self) -> Vec<PathBuf> {
        self.exports.iter().map(|e| e.spec.socket.clone()).collect()
    }

    /// Serves every export, each on its own thread, until every listener
    /// has broken (in practice: until the process is stopped). An export
    /// whose listener breaks removes its socket and stops alone.
    ///
    /// # Errors
    /// The first export's listener failure, once all have stopped.
    pub fn serve(self) -> Result<(), ExportError> {
        let results: Vec<_> = std::thread::scope(|scope| {
            let threads: Vec<_> = self
                .exports
                .iter()
                .enumerate()
                .map(|(i, e)| {
                    std::thread::Builder::new()
                        .name(format!("export{i}"))
                        .spawn_scoped(scope, move || {
                            let r = e.server.run();
                            let _ = std::fs::remove_file(&e.spec.socket);
                            if let Err(err) = &r {
                                tracing::error!(
                                    "{}: {}",
                                    e.spec.socket.display(),
                                    iopath_sys::error_chain(err)
                                );
                            }
                            r
                        })
                })
                .collect();
            threads
                .into_iter()
                .map(|t| match t {
                    Ok(t) => t.join().unwrap_or_else(|_| Err(panicked())),
                    Err(e) => Err(ServerError::Accept(e)),
                })
                .collect()
        });
        for (e, r) in self.exports.iter().zip(results) {
            r.map_err(|source| ExportError::Stopped {
                socket: e.spec.socket.clone(),
                source,
            })?;
        }
        Ok(())
    }
}

/// The error of an export thread that panicked outside any front end's
/// connection (the server catches those).
fn panicked() -> ServerError {
    ServerError::Accept(std::io::Error::other("the export's thread panicked"))
}

/// Removes the sockets (what a stop does before the process exits).
pub fn remove_sockets<'a>(sockets: impl IntoIterator<Item = &'a PathBuf>) {
    for s in sockets {
        let _ = std::fs::remove_file(s);
    }
}
