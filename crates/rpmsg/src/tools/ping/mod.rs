//! Echo round trips, every byte checked: a client of the endpoint service
//! ([`PingEndpoint`], [`ping`]) and OpenAMP's `rpmsg-echo-ping` on a bus
//! ([`openamp_demo`]); beside them the limit, a raw eventfd ping-pong
//! between two processes ([`RawPingPong`]), and the percentiles both are
//! read as ([`Latency`]).
//!
//! ```text
//!   ping ── payload i ──► endpoint (fd or ATTACH) ──► remote's echo service
//!        ◄── echo i ────  checked: length, every byte; round trip timed
//! ```
//!
//! The report holds every round trip's time; the caller makes them
//! percentiles and compares them with the limit.

mod limit;
mod openamp_demo;

pub use limit::{percentile, serve_partner_if_asked, Latency, RawPingPong};
pub use openamp_demo::{openamp_demo, wait_announced, DemoReport};

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use thiserror::Error;

use crate::ctrl::{proto, CtrlClient, CtrlEndpoint, CtrlError, EptFd, EptInfo};
use crate::tools::openamp;
use crate::wire::{ADDR_ANY, MAX_PAYLOAD};
use crate::BusError;

/// Why a ping stopped.
#[derive(Debug, Error)]
pub enum PingError {
    /// ATTACH to the channel failed.
    #[error("Cannot attach to {name:?} through {}", ctrl.display())]
    Attach {
        /// The channel.
        name: String,
        /// The control socket.
        ctrl: PathBuf,
        /// What failed.
        #[source]
        source: CtrlError,
    },
    /// The endpoint service could not be reached.
    #[error("Endpoint service {}", ctrl.display())]
    Connect {
        /// The control socket.
        ctrl: PathBuf,
        /// What failed.
        #[source]
        source: CtrlError,
    },
    /// The service refused to create the endpoint.
    #[error("Cannot create an endpoint {name:?}")]
    Create {
        /// The endpoint's name.
        name: String,
        /// What failed.
        #[source]
        source: CtrlError,
    },
    /// The remote never announced the channel.
    #[error(
        "{name:?} not announced by the remote within {} s (no channel to bind the endpoint to)",
        timeout.as_secs()
    )]
    NotAnnounced {
        /// The channel.
        name: String,
        /// How long it was waited for.
        timeout: Duration,
    },
    /// The endpoint or the remote went away.
    #[error("The channel was closed after {round_trips} round trips")]
    Closed {
        /// Round trips completed.
        round_trips: u64,
    },
    /// Sending a message failed.
    #[error("Sending message {index}")]
    Send {
        /// The message's number.
        index: u64,
        /// What failed.
        #[source]
        source: CtrlError,
    },
    /// Receiving an echo failed.
    #[error("Waiting for echo {index}")]
    Recv {
        /// The message's number.
        index: u64,
        /// What failed.
        #[source]
        source: CtrlError,
    },
    /// No echo came in time.
    #[error("No echo of message {index} within {} s", timeout.as_secs())]
    NoEcho {
        /// The message's number.
        index: u64,
        /// How long it was waited for.
        timeout: Duration,
    },
    /// The echo's length differs from the message's.
    #[error("Echo {index}: {got} bytes back for {sent} sent")]
    Length {
        /// The message's number.
        index: u64,
        /// Bytes received.
        got: usize,
        /// Bytes sent.
        sent: usize,
    },
    /// A byte of the echo differs from the message's.
    #[error("Echo {index} (size {size}): byte {at} differs")]
    Mismatch {
        /// The message's number.
        index: u64,
        /// The message's length.
        size: usize,
        /// The first byte that differs.
        at: usize,
    },
    /// A bus operation of [`openamp_demo`] failed.
    #[error("{what}")]
    Bus {
        /// What was being done.
        what: String,
        /// What failed.
        #[source]
        source: BusError,
    },
    /// The link went down while [`openamp_demo`] waited for the channel.
    #[error("Link down: {reason}")]
    LinkDown {
        /// Why, as the bus says.
        reason: String,
    },
    /// The raw ping-pong's partner could not be started.
    #[error("Cannot start the raw ping-pong's partner")]
    Partner(#[source] iopath_sys::process::ChildError),
    /// The raw ping-pong's notifier failed.
    #[error("Raw ping-pong: {what}")]
    Notify {
        /// What was being done.
        what: &'static str,
        /// What failed.
        #[source]
        source: crate::notify::NotifyError,
    },
}

/// The endpoint a ping talks through.
#[derive(Debug)]
pub enum PingEndpoint {
    /// A connection that became an announced endpoint (ATTACH).
    Attached(CtrlEndpoint),
    /// An endpoint fd from the endpoint service.
    Fd(EptFd),
}

impl From<EptFd> for PingEndpoint {
    fn from(ep: EptFd) -> Self {
        PingEndpoint::Fd(ep)
    }
}

/// Whether `e` is `EPIPE`: the endpoint or the remote is gone.
fn is_pipe(e: &CtrlError) -> bool {
    matches!(e, CtrlError::Io { source, .. }
        if source.raw_os_error() == Some(rustix::io::Errno::PIPE.raw_os_error()))
}

impl PingEndpoint {
    /// Attaches to channel `name` through the control socket `ctrl`,
    /// waiting up to `timeout` for the remote to announce it.
    ///
    /// # Errors
    /// [`PingError::Attach`].
    pub fn attach(ctrl: &Path, name: &str, timeout: Duration) -> Result<Self, PingError> {
        CtrlEndpoint::attach(ctrl, name, timeout)
            .map(PingEndpoint::Attached)
            .map_err(|source| PingError::Attach {
                name: name.to_owned(),
                ctrl: ctrl.to_owned(),
                source,
            })
    }

    /// Creates an endpoint fd named `name` at the endpoint service on
    /// `ctrl`, bound to the remote's channel of that name
    /// ([`bound_ept_fd`]).
    ///
    /// # Errors
    /// [`PingError::Connect`], [`PingError::Create`],
    /// [`PingError::NotAnnounced`].
    pub fn create(ctrl: &Path, name: &str, timeout: Duration) -> Result<Self, PingError> {
        let c = CtrlClient::connect(ctrl).map_err(|source| PingError::Connect {
            ctrl: ctrl.to_owned(),
            source,
        })?;
        bound_ept_fd(&c, name, timeout).map(PingEndpoint::Fd)
    }

    fn send(&self, data: &[u8]) -> Result<(), CtrlError> {
        match self {
            PingEndpoint::Attached(e) => e.send(data),
            PingEndpoint::Fd(e) => e.send(data),
        }
    }

    /// One message into `buf`; `Ok(Some(0))`: the channel is closed.
    /// `busy`: busy-poll an fd instead of sleeping in `poll(2)`.
    fn recv(
        &self,
        buf: &mut [u8],
        timeout: Duration,
        busy: bool,
    ) -> Result<Option<usize>, CtrlError> {
        let r = match self {
            PingEndpoint::Attached(e) => return e.recv(buf, timeout),
            PingEndpoint::Fd(e) if busy => e.recv_busy(buf, timeout),
            PingEndpoint::Fd(e) => e.recv_timeout(buf, timeout),
        };
        match r {
            Err(e) if is_pipe(&e) => Ok(Some(0)),
            r => r,
        }
    }
}

/// An endpoint fd from `c` named `name`, bound to the remote's channel of
/// that name. An endpoint created before the remote announced the name
/// stays unbound (as rpmsg_char's do): this retries until it binds, for up
/// to `timeout`.
///
/// # Errors
/// [`PingError::Create`], [`PingError::NotAnnounced`].
pub fn bound_ept_fd(c: &CtrlClient, name: &str, timeout: Duration) -> Result<EptFd, PingError> {
    let start = Instant::now();
    loop {
        let ep = c
            .create_ept_fd(&EptInfo::new(name), proto::O_RDWR | proto::O_CLOEXEC)
            .map_err(|source| PingError::Create {
                name: name.to_owned(),
                source,
            })?;
        if ep.info().dst != ADDR_ANY {
            return Ok(ep);
        }
        drop(ep);
        if start.elapsed() >= timeout {
            return Err(PingError::NotAnnounced {
                name: name.to_owned(),
                timeout,
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What a ping sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Payloads {
    /// Sizes 1..=496 in turn, each message's bytes a function of its number.
    Cycle,
    /// Every message this size (1 up to the largest payload negotiated,
    /// [`MAX_FIXED`] at most), bytes as [`Payloads::Cycle`]'s.
    Fixed(usize),
    /// OpenAMP's demo payloads ([`openamp::write_payload`]) with data
    /// sizes 1..=480 in turn.
    OpenAmp,
}

/// Largest fixed payload: a 64 KiB buffer less the header.
pub const MAX_FIXED: usize = crate::bufsz::MAX_BUF_SIZE as usize - crate::wire::HDR_LEN;

impl Payloads {
    /// Bytes the largest message takes.
    fn max_len(self) -> usize {
        match self {
            Payloads::Fixed(s) => s.clamp(1, MAX_FIXED).max(MAX_PAYLOAD),
            _ => MAX_PAYLOAD,
        }
    }

    /// Writes message `i` into `out` (at least [`Payloads::max_len`]
    /// bytes); its length.
    fn write(self, out: &mut [u8], i: u64) -> usize {
        match self {
            Payloads::OpenAmp => {
                let size = 1 + (i % openamp::MAX_DATA as u64) as usize;
                openamp::write_payload(out, i, size)
            }
            Payloads::Cycle | Payloads::Fixed(_) => {
                let size = match self {
                    Payloads::Fixed(s) => s.clamp(1, MAX_FIXED),
                    _ => 1 + (i % MAX_PAYLOAD as u64) as usize,
                };
                fill(&mut out[..size], i);
                size
            }
        }
    }
}

/// Message `seq`'s bytes: distinct per position and per message, so a
/// stale or shifted echo is caught.
fn fill(buf: &mut [u8], seq: u64) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = (seq as usize).wrapping_mul(31).wrapping_add(i * 7) as u8;
    }
}

/// How a ping runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PingOptions {
    /// Round trips.
    pub count: u64,
    /// What is sent.
    pub payloads: Payloads,
    /// How long to wait for each echo.
    pub timeout: Duration,
    /// Busy-poll an endpoint fd for each echo instead of sleeping in
    /// `poll(2)`: no wake-up on the way back, one core spinning.
    pub busy: bool,
}

/// What a ping measured.
#[derive(Debug, Clone, PartialEq)]
pub struct PingReport {
    /// Round trips, every echo checked byte for byte.
    pub count: u64,
    /// Smallest message sent (0 if none).
    pub min_size: usize,
    /// Largest message sent.
    pub max_size: usize,
    /// Bytes sent (and received back).
    pub bytes: u64,
    /// Each round trip's time, in microseconds, in order.
    pub round_trips_us: Vec<f64>,
    /// Wall time of the whole series.
    pub elapsed: Duration,
}

/// Sends `opts.count` messages through `ep`, one at a time, and checks
/// that each comes back whole and unchanged. `progress` is called after
/// each round trip.
///
/// # Errors
/// [`PingError::Closed`] once the endpoint or the remote is gone,
/// [`PingError::NoEcho`] on a timeout, [`PingError::Length`] or
/// [`PingError::Mismatch`] for a wrong echo, [`PingError::Send`] or
/// [`PingError::Recv`] for another failure.
pub fn ping(
    ep: &PingEndpoint,
    opts: &PingOptions,
    mut progress: impl FnMut(),
) -> Result<PingReport, PingError> {
    let mut lat = Vec::with_capacity(opts.count.min(1 << 24) as usize);
    let mut out = vec![0u8; opts.payloads.max_len()];
    let mut back = vec![0u8; opts.payloads.max_len() + 64];
    let (mut min_size, mut max_size, mut bytes) = (usize::MAX, 0usize, 0u64);
    let t0 = Instant::now();
    for i in 0..opts.count {
        let size = opts.payloads.write(&mut out, i);
        let msg = &out[..size];
        let t = Instant::now();
        match ep.send(msg) {
            Err(e) if is_pipe(&e) => return Err(PingError::Closed { round_trips: i }),
            r => r.map_err(|source| PingError::Send { index: i, source })?,
        }
        let n = ep
            .recv(&mut back, opts.timeout, opts.busy)
            .map_err(|source| PingError::Recv { index: i, source })?
            .ok_or(PingError::NoEcho {
                index: i,
                timeout: opts.timeout,
            })?;
        lat.push(t.elapsed().as_secs_f64() * 1e6);
        if n == 0 {
            return Err(PingError::Closed { round_trips: i });
        }
        if n != size {
            return Err(PingError::Length {
                index: i,
                got: n,
                sent: size,
            });
        }
        if let Some(at) = back[..n].iter().zip(msg).position(|(x, y)| x != y) {
            return Err(PingError::Mismatch { index: i, size, at });
        }
        min_size = min_size.min(size);
        max_size = max_size.max(size);
        bytes += size as u64;
        progress();
    }
    Ok(PingReport {
        count: opts.count,
        min_size: if opts.count == 0 { 0 } else { min_size },
        max_size,
        bytes,
        round_trips_us: lat,
        elapsed: t0.elapsed(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_sizes_and_bytes() {
        let mut b = [0u8; MAX_PAYLOAD];
        assert_eq!(Payloads::Cycle.write(&mut b, 0), 1);
        assert_eq!(Payloads::Cycle.write(&mut b, 495), 496);
        assert_eq!(Payloads::Cycle.write(&mut b, 496), 1);
        assert_eq!(Payloads::Fixed(40).write(&mut b, 3), 40);
        assert_eq!(b[1], (3usize * 31 + 7) as u8);
        assert_eq!(Payloads::OpenAmp.write(&mut b, 0), 17);
        assert!(openamp::is_payload(&b[..17], 0, 1));
        assert_eq!(Payloads::OpenAmp.write(&mut b, 479), 496);
    }
}
