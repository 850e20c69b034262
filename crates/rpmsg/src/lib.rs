//! iopath-rpmsg: rpmsg over virtio rings in shared memory, wire-compatible
//! with Linux's `virtio_rpmsg_bus` and OpenAMP.
//!
//! A shared-memory file holds a remoteproc resource table (one rpmsg vdev,
//! two legacy vrings) and a pool of 512-byte buffers; device addresses are
//! offsets into the file, as in OpenAMP's Linux demo.
//!
//! ```text
//!   host (virtio driver)                       remote (virtio device)
//!   owns the buffers, pre-posts rx             waits for DRIVER_OK
//!        vq1 (tx) ── avail ──────────────────►  rx: read, return used
//!        vq0 (rx) ◄── used ───────────────────  tx: fill a posted buffer
//!                 ◄──── notifier (eventfd | unix byte | poll) ────►
//! ```
//!
//! Parsing ([`wire`], [`rsc_table`]) is apart from execution; the notifier
//! is a trait ([`notify::Notifier`]).

mod bus;
pub mod ctrl;
mod host;
mod link;
pub mod notify;
mod remote;
pub mod rsc_table;
mod service;
mod shm;
pub mod vring;
pub mod wire;

pub use bus::{
    Bus, BusError, Channel, Endpoint, EndpointOptions, EndpointRef, Event, Message, RxBuffer,
    Stats, TxBuffer, ZeroCopyEndpoint,
};
pub use host::{HostLink, HOST_FEATURES};
pub use link::{Held, Link, LinkError, Role, Rx, Slot};
pub use notify::{Notifier, NotifySpec};
pub use remote::RemoteLink;
pub use rsc_table::{ResourceTable, ShmLayout};
pub use shm::{shm_path, SharedMem, ShmError};
