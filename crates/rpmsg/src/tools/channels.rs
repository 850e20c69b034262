//! What a remote serves on its bus, whatever carries the bus: echo
//! channels (every message sent back to its sender), sink channels
//! (messages counted and dropped), and when a session with a host ends.
//!
//! ```text
//!   RemoteChannels::announce(bus) ── name-service CREATE per channel ──► host
//!   echo:  message ──► same bytes back to its source
//!   sink:  message ──► counted; "SYNC" ──► the count so far (u64 LE)
//!   ChannelSession::wait ── unbind | echo limit | shutdown word | link down
//!   ChannelSession::close ── name-service DESTROY per channel ──► host
//! ```

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use thiserror::Error;

use super::openamp;
use crate::{Bus, BusError, Endpoint, EndpointOptions, Event, InPlace};

/// The message a sink answers with its count so far (u64, little-endian;
/// the `SYNC` itself included), so a sender can tell when a stream has
/// arrived.
pub const SINK_SYNC: &[u8; 4] = b"SYNC";

/// How long an echo or a sink answer may wait for a free buffer.
const ANSWER_WAIT: Duration = Duration::from_secs(5);

/// A channel could not be announced.
#[derive(Debug, Error)]
#[error("Cannot announce {name:?}")]
pub struct AnnounceError {
    /// The channel's name.
    pub name: String,
    /// What failed.
    #[source]
    pub source: BusError,
}

/// The channels a remote announces to each host, and what ends a session.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RemoteChannels {
    /// Echo channels: every message goes back to its sender.
    pub echo: Vec<String>,
    /// Sink channels: messages are counted and dropped, except
    /// [`SINK_SYNC`], answered with the count.
    pub sink: Vec<String>,
    /// Behave like OpenAMP's `rpmsg-echo`: the shutdown word
    /// ([`openamp::SHUTDOWN`]) ends the session, and so does the host
    /// destroying a channel.
    pub openamp: bool,
    /// End the session once the host destroys a channel.
    pub exit_on_unbind: bool,
    /// End the session after echoing this many messages (later ones are
    /// dropped).
    pub echo_limit: Option<u64>,
}

/// Why a session with a host ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionEnd {
    /// The host destroyed this channel (with `exit_on_unbind` or `openamp`).
    Unbound(String),
    /// The echo limit was reached.
    Limit,
    /// The OpenAMP shutdown word came.
    Shutdown,
    /// The link went down: the host went away, reset the device, or broke
    /// the rings.
    LinkDown(String),
}

impl fmt::Display for SessionEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SessionEnd::Unbound(r) => write!(f, "channel closed ({r})"),
            SessionEnd::Limit => f.write_str("echo limit reached, destroying the services"),
            SessionEnd::Shutdown => f.write_str("shutdown word received"),
            SessionEnd::LinkDown(r) => write!(f, "link down ({r})"),
        }
    }
}

/// The channels announced on one bus, serving until the session ends.
#[derive(Debug)]
pub struct ChannelSession {
    bus: Bus,
    eps: Vec<Endpoint>,
    ends: mpsc::Receiver<SessionEnd>,
    echoed: Arc<AtomicU64>,
}

impl RemoteChannels {
    /// Announces every channel on `bus` and starts serving them (on the
    /// bus thread). `on_unbound(name, addr)` hears of each
    /// endpoint the host destroys on a channel.
    ///
    /// # Errors
    /// [`AnnounceError`] naming the channel that could not be created.
    pub fn announce(
        &self,
        bus: &Bus,
        on_unbound: impl Fn(&str, u32) + Send + Sync + 'static,
    ) -> Result<ChannelSession, AnnounceError> {
        let (end_tx, ends) = mpsc::channel::<SessionEnd>();
        let on_unbound = Arc::new(on_unbound);
        let exit_on_unbind = self.exit_on_unbind || self.openamp;
        let echoed = Arc::new(AtomicU64::new(0));
        let mut eps = Vec::new();
        let announce = |name: &str, ep: Result<Endpoint, BusError>| {
            ep.map_err(|source| AnnounceError {
                name: name.to_owned(),
                source,
            })
        };
        for name in &self.echo {
            let tx = end_tx.clone();
            let name2 = name.clone();
            let echoed = Arc::clone(&echoed);
            let on_unbound = Arc::clone(&on_unbound);
            let (limit, demo) = (self.echo_limit, self.openamp);
            let ep = bus.create_with_callback(EndpointOptions::new(name), move |ep, ev| match ev {
                Event::Message(m) => {
                    if demo && openamp::is_shutdown(&m.data) {
                        let _ = tx.send(SessionEnd::Shutdown);
                        return;
                    }
                    let n = echoed.fetch_add(1, Ordering::Relaxed) + 1;
                    if limit.is_some_and(|l| n > l) {
                        return; // past the limit: about to destroy the channel
                    }
                    if let Err(e) = ep.send_to(m.src, &m.data, Some(ANSWER_WAIT)) {
                        tracing::warn!("echo to {} failed: {e}", m.src);
                    }
                    if limit == Some(n) {
                        let _ = tx.send(SessionEnd::Limit);
                    }
                }
                Event::Unbound { addr } => {
                    on_unbound(&name2, addr);
                    if exit_on_unbind {
                        let _ = tx.send(SessionEnd::Unbound(name2.clone()));
                    }
                }
                Event::LinkDown(_) => {}
            });
            eps.push(announce(name, ep)?);
        }
        for name in &self.sink {
            let mut count = 0u64;
            // In place: a message is counted without being copied out; only
            // one of SYNC's length is read.
            let ep = bus.create_in_place(EndpointOptions::new(name), move |ep, m| {
                let InPlace::Message(m) = m else { return };
                count += 1;
                let mut head = [0u8; SINK_SYNC.len()];
                if m.len() == head.len() && m.read(0, &mut head).is_ok() && head == *SINK_SYNC {
                    if let Err(e) = ep.send_to(m.src(), &count.to_le_bytes(), Some(ANSWER_WAIT)) {
                        tracing::warn!("sink answer to {} failed: {e}", m.src());
                    }
                }
            });
            eps.push(announce(name, ep)?);
        }
        let b2 = bus.clone();
        std::thread::spawn(move || {
            let r = b2.wait_down(None).unwrap_or_default();
            let _ = end_tx.send(SessionEnd::LinkDown(r));
        });
        Ok(ChannelSession {
            bus: bus.clone(),
            eps,
            ends,
            echoed,
        })
    }
}

impl ChannelSession {
    /// Waits until the session ends, and says why.
    pub fn wait(&self) -> SessionEnd {
        self.ends.recv().unwrap_or(SessionEnd::Shutdown)
    }

    /// Destroys the channels (name-service DESTROY records); after
    /// [`SessionEnd::Limit`], gives the host a moment to take them.
    /// Returns how many messages were echoed.
    pub fn close(self, end: &SessionEnd) -> u64 {
        drop(self.eps);
        if matches!(end, SessionEnd::Limit) {
            let _ = self.bus.wait_down(Some(Duration::from_millis(500)));
        }
        self.echoed.load(Ordering::Relaxed)
    }
}
