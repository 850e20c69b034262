//! What runs on the transport, whatever carries the bus (shared memory or
//! vhost-user): the programs `iopath rpmsg` is made of, as a library.
//!
//! ```text
//!   remote: RemoteChannels ── echo and sink channels, announced per host
//!           session::serve_hosts / serve_drivers ── one host after another
//!   host:   session::HostSession ── start (checks, owner, bus, control
//!           socket), then serve one remote after another
//!   client: ping ── echo round trips through the endpoint service
//!           exec ── an unmodified program on the preload library (elf:
//!           its ELF check)
//!   openamp ── OpenAMP's Linux demo: names, payloads, shutdown word
//! ```

mod channels;
pub mod elf;
pub mod exec;
pub mod openamp;
pub mod ping;
pub mod session;

pub use channels::{AnnounceError, ChannelSession, RemoteChannels, SessionEnd, SINK_SYNC};
