//! The remote's outer loop over vhost-user: wait for a driver to start the
//! device, announce the channels, serve them until the session ends, and
//! wait for the next driver once the front end reset the device or went
//! away. The vhost-user server runs beside it on a thread of its own.

use std::os::unix::net::UnixListener;
use std::sync::Arc;
use std::time::Duration;

use iopath_virtio::device::{ServerError, VhostUserServer};
use thiserror::Error;

use super::remote::serve_session;
use super::{Cleanup, RemoteEvent};
use crate::tools::channels::{AnnounceError, RemoteChannels, SessionEnd};
use crate::vhost_user::{RpmsgDevice, WaitDriverError};
use crate::{Bus, BusError};

/// What [`serve_drivers`] needs.
#[derive(Debug)]
pub struct ServeDrivers<'a> {
    /// The vhost-user socket, listening.
    pub listener: UnixListener,
    /// Give up on a driver that has not started the device within this
    /// (from when the remote starts, or the last session ended).
    pub ready_timeout: Option<Duration>,
    /// The channels announced to each driver.
    pub channels: &'a RemoteChannels,
    /// Serve one driver only: its link going down is an error.
    pub once: bool,
    /// Offer `VIRTIO_F_ACCESS_PLATFORM` (for front ends with an IOMMU; see
    /// [`RpmsgDevice::with_access_platform`]).
    pub access_platform: bool,
    /// Buffer sizes to offer and how ([`RpmsgDevice::with_buf_sizes`]);
    /// `None`: nothing offered, 512 bytes.
    pub buf_sizes: Option<(crate::Convention, crate::BufSizes)>,
}

/// Why a remote stopped serving vhost-user drivers.
#[derive(Debug, Error)]
pub enum ServeDriversError {
    /// No driver started the device.
    #[error(transparent)]
    Wait(WaitDriverError),
    /// A channel could not be announced.
    #[error(transparent)]
    Announce(AnnounceError),
    /// The one driver went away (with `once`).
    #[error("The driver went away: {reason}")]
    DriverGone {
        /// Why the link went down.
        reason: String,
    },
    /// The buffer sizes cannot be offered.
    #[error("The buffer sizes cannot be offered")]
    BufSizes(#[source] crate::bufsz::BufSizeError),
    /// The vhost-user server stopped (its listener broke).
    #[error("The vhost-user server stopped")]
    Server(#[source] ServerError),
}

/// Serves one vhost-user driver after another until a session ends on its
/// own (the driver destroyed the channel, the echo limit): then returns
/// `Ok`. `on_event` hears of each step, [`RemoteEvent::HostGone`] after a
/// reset or a front end that went away.
///
/// # Errors
/// [`ServeDriversError`].
pub fn serve_drivers(
    cfg: ServeDrivers<'_>,
    stop: &Cleanup,
    on_event: impl Fn(RemoteEvent<'_>) + Send + Sync + 'static,
) -> Result<(), ServeDriversError> {
    let mut device = RpmsgDevice::new().with_access_platform(cfg.access_platform);
    if let Some((convention, sizes)) = cfg.buf_sizes {
        device = device
            .with_buf_sizes(convention, sizes)
            .map_err(ServeDriversError::BufSizes)?;
    }
    // The socket is private (vhost_user::bind): a front end of another
    // user is refused even if its mode was changed.
    let server = VhostUserServer::new(cfg.listener, Arc::new(device.clone())).with_options(
        iopath_virtio::device::ServerOptions {
            socket_mode: Some(iopath_sys::unix_socket::PRIVATE_MODE),
            ..Default::default()
        },
    );
    let (failed_tx, failed) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("vhost-user".into())
        .spawn(move || {
            let _ = failed_tx.send(server.run());
        })
        .map_err(|e| ServeDriversError::Server(ServerError::Accept(e)))?;
    let on_event = Arc::new(on_event);
    loop {
        let (link, notifier) = loop {
            if let Ok(Err(e)) = failed.try_recv() {
                return Err(ServeDriversError::Server(e));
            }
            match device.wait_driver(Some(cfg.ready_timeout.unwrap_or(Duration::from_secs(1)))) {
                Ok(l) => break l,
                Err(WaitDriverError::Timeout { .. }) if cfg.ready_timeout.is_none() => continue,
                Err(e) => return Err(ServeDriversError::Wait(e)),
            }
        };
        let bus = Bus::start(Box::new(link), Box::new(notifier));
        let end = match serve_session(&bus, cfg.channels, stop, &on_event) {
            Ok(end) => end,
            // The driver went before the channels could be announced.
            Err(AnnounceError {
                source: BusError::LinkDown(r),
                ..
            }) => SessionEnd::LinkDown(r),
            Err(e) => return Err(ServeDriversError::Announce(e)),
        };
        let SessionEnd::LinkDown(reason) = end else {
            return Ok(());
        };
        if cfg.once {
            return Err(ServeDriversError::DriverGone { reason });
        }
        on_event(RemoteEvent::HostGone { reason: &reason });
    }
}
