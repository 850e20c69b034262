//! The steps that start a long-running host or remote and let it serve
//! one peer after another on the same shared memory: [`HostSession`]
//! starts a host and serves one remote after another, [`RemoteShm`]
//! readies a remote's shared memory and [`serve_hosts`] serves one host
//! after another on it, [`serve_drivers`] is the remote's loop over
//! vhost-user, where drivers come through the front end. [`Cleanup`]
//! stops the bus and removes what the process placed, whether the process
//! ends on its own or a signal stops it; each loop tells its caller of
//! each step through an event callback.

use std::time::Duration;

use thiserror::Error;

mod cleanup;
mod host;
mod remote;
mod vhost_user;

pub use cleanup::Cleanup;
pub use host::{HostConfig, HostEvent, HostSession, HostStartError, ServeRemotesError};
pub use remote::{
    serve_hosts, RemoteEvent, RemoteShm, RemoteShmConfig, RemoteStartError, ServeHosts,
    ServeHostsError,
};
pub use vhost_user::{serve_drivers, ServeDrivers, ServeDriversError};

use crate::notify::{NotifyError, NotifyListener, NotifySpec};
use crate::{Bus, BusError, LinkError, Notifier, SharedMem};

/// The names of the rpmsg and ring feature bits set in `features` (as a
/// host negotiated them), comma-separated: `NS, BUFSZ (nuttx), EVENT_IDX`;
/// `none` without any.
pub fn feature_names(features: u32) -> String {
    use crate::bufsz::{NUTTX_RPMSG_F_BUFSZ, VIRTIO_RPMSG_F_BUFSZ};
    let names: Vec<&str> = [
        (crate::wire::VIRTIO_RPMSG_F_NS, "NS"),
        (VIRTIO_RPMSG_F_BUFSZ, "BUFSZ"),
        (NUTTX_RPMSG_F_BUFSZ, "BUFSZ (nuttx)"),
        (crate::vring::VIRTIO_RING_F_EVENT_IDX, "EVENT_IDX"),
    ]
    .into_iter()
    .filter(|(bit, _)| features & (1 << bit) != 0)
    .map(|(_, n)| n)
    .collect();
    if names.is_empty() {
        return "none".into();
    }
    names.join(", ")
}

#[cfg(test)]
#[test]
fn features_by_name() {
    assert_eq!(feature_names(0), "none");
    assert_eq!(feature_names(1 | 1 << 29), "NS, EVENT_IDX");
    assert_eq!(feature_names(1 << 2), "BUFSZ (nuttx)");
}

/// A connection on the remote's notify socket that it passed over, to wait
/// for the next one.
#[derive(Debug)]
pub enum Skipped {
    /// The peer spoke no notifier handshake: no host.
    NotAHost(NotifyError),
    /// The host's connection closed before it set DRIVER_OK.
    ClosedBeforeReady(NotifyError),
}

/// `a connection that is no host (why)`, or `the connection closed
/// before DRIVER_OK (why)`.
impl std::fmt::Display for Skipped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Skipped::NotAHost(e) => write!(f, "a connection that is no host ({e})"),
            Skipped::ClosedBeforeReady(e) => {
                write!(f, "the connection closed before DRIVER_OK ({e})")
            }
        }
    }
}

/// Why a remote stopped waiting for hosts.
#[derive(Debug, Error)]
pub enum AcceptError {
    /// The notify socket itself failed.
    #[error("Waiting for the host failed")]
    Accept(#[source] NotifyError),
    /// A host connected but the device never became ready.
    #[error("Waiting for DRIVER_OK failed")]
    Ready(#[source] BusError),
}

/// Accepts hosts on `listener` until one sets DRIVER_OK, and returns the
/// remote's bus on `shm` for it. A connection that is no host, or that
/// closes before DRIVER_OK, is handed to `skipped` and the wait goes on.
///
/// # Errors
/// [`AcceptError::Accept`] when the socket cannot accept or no host
/// connects within `ready_timeout`;
/// [`AcceptError::Ready`] when the device does not become ready (e.g.
/// `ready_timeout` passed). `fixed` is as for [`Bus::remote_with`].
pub fn accept_host(
    listener: &NotifyListener,
    shm: &SharedMem,
    ready_timeout: Option<Duration>,
    fixed: Option<crate::BufSizes>,
    mut skipped: impl FnMut(Skipped),
) -> Result<Bus, AcceptError> {
    // `ready_timeout` bounds the wait for a host to connect too.
    let deadline = ready_timeout.map(|t| (std::time::Instant::now() + t, t));
    loop {
        let accepted = match deadline {
            Some((at, given)) => listener.accept_until(at, given),
            None => listener.accept(),
        };
        let notifier = match accepted {
            Ok(n) => n,
            Err(e @ (NotifyError::Io { op: "accept", .. } | NotifyError::Timeout { .. })) => {
                return Err(AcceptError::Accept(e))
            }
            Err(e) => {
                skipped(Skipped::NotAHost(e));
                continue;
            }
        };
        match Bus::remote_with(shm.clone(), notifier, ready_timeout, fixed) {
            Ok(b) => return Ok(b),
            Err(BusError::Link(LinkError::Notify(e))) => skipped(Skipped::ClosedBeforeReady(e)),
            Err(e) => return Err(AcceptError::Ready(e)),
        }
    }
}

/// Connects to the remote's notify socket, waiting as long as it takes for
/// a remote to listen there again (each try gives up after `timeout`).
///
/// # Errors
/// Any [`NotifyError`] but a timeout.
pub fn reconnect_remote(
    notify: &NotifySpec,
    timeout: Duration,
) -> Result<Box<dyn Notifier>, NotifyError> {
    loop {
        match notify.connect(timeout) {
            Ok(n) => return Ok(n),
            Err(NotifyError::Timeout { .. } | NotifyError::Busy { .. }) => continue,
            Err(e) => return Err(e),
        }
    }
}
