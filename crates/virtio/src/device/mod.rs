//! Device side: a vhost-user back end for virtio devices, with IOTLB
//! enforcement.
//!
//! ```text
//!  front end (QEMU, iopath driver)
//!      | unix socket: vhost-user messages, memory fds, eventfds
//!      v
//!  VhostUserServer --accept--> connection loop --IOTLB_MSG--> VhostIommu
//!      |                            |
//!      |               vhost::BackendReqHandler (every other message)
//!      |                            |
//!      |                     Handler: memory table, vrings, features
//!      |                            | one thread per started vring
//!      v                            v
//!  VirtioDevice::run_queue(QueueContext)  -- virtio-queue over DeviceMemory
//! ```
//!
//! `DeviceMemory` is vm-memory's `IommuMemory`: without
//! `VIRTIO_F_ACCESS_PLATFORM` it is the front end's memory keyed by guest
//! physical address; with it, every ring and buffer address is an IOVA that
//! must be mapped by the IOTLB with the right permission, or the access
//! fails without touching memory.
//!
//! Why not `vhost-user-backend`'s `VhostUserDaemon`: its handler converts
//! ring addresses from front-end virtual to guest physical addresses and
//! ties vrings to a plain `GuestMemoryMmap`, so IOVAs cannot be expressed;
//! and the `vhost` crate's request handler drops the connection on
//! `IOTLB_MSG` (rust-vmm/vhost issue 312). So this module implements the
//! message handler (`vhost`'s `VhostUserBackendReqHandlerMut`) itself, and
//! the connection loop peeks at each header to take `IOTLB_MSG` before the
//! `vhost` crate sees it.
//!
//! One concern per file: `model` (the [`VirtioDevice`] trait a device
//! implements), `server` (the connection loop), `intercept` (the messages
//! it takes before the `vhost` crate sees them), `error` (how a front end
//! is dropped), `handler` (the requests and the queue workers),
//! `queue_context` (what a device gets to serve one queue), `access` and
//! `polling` (what a device serving from its own thread, or polling,
//! needs of it), `call` (the call eventfd), `wake` (waiting for a kick or
//! a stop), `fence` (IOTLB invalidations against accesses in flight),
//! `memory` (mapping the front end's regions, guarded against SIGBUS by
//! the heap's `SigbusGuard`), `iotlb` (the IOMMU), `inflight` (the record
//! of requests in flight that the front end keeps across a back-end
//! restart, `INFLIGHT_SHMFD`) and `chain` (the descriptor chain at a head
//! that record names); the message framing is [`crate::vhost_wire`].
//!
//! With an inflight record, a device pops chains with
//! [`QueueContext::pop_chain`] and puts them with
//! [`QueueContext::add_used`] (which keep the record), and runs
//! [`QueueContext::take_resubmits`] first: the heads a killed predecessor
//! left in flight.

mod access;
mod call;
mod chain;
mod error;
mod fence;
mod handler;
mod inflight;
mod intercept;
mod iotlb;
mod iotlb_stats;
mod memory;
mod model;
mod polling;
mod queue_context;
mod server;
mod wake;

use vm_memory::{GuestMemoryLoadGuard, GuestMemoryMmap, IommuMemory};

pub use access::{CallSignal, MemoryAccess};
pub use chain::HeadChain;
pub use error::ServerError;
pub use fence::{DmaFence, DmaTicket, Parked};
pub use inflight::InflightError;
pub use iopath_dma::Perm;
pub(crate) use iotlb::permissions;
pub use iotlb::{IotlbMsg, IotlbMsgError, VhostIommu, IOTLB_MSG_SIZE};
pub use iotlb_stats::IotlbStats;
pub use model::VirtioDevice;
pub use queue_context::QueueContext;
pub use server::{
    serve_connection, serve_connection_with, ServerOptions, VhostUserServer, IOTLB_STATS_TARGET,
    MESSAGE_TIMEOUT,
};
pub use wake::Wake;

/// Feature bits device models use, re-exported from [`crate::features`]
/// (where they are defined once); the ring bits under their
/// `VIRTIO_RING_F_*` names.
pub use crate::features::{
    VHOST_USER_F_PROTOCOL_FEATURES, VIRTIO_F_ACCESS_PLATFORM,
    VIRTIO_F_EVENT_IDX as VIRTIO_RING_F_EVENT_IDX,
    VIRTIO_F_INDIRECT_DESC as VIRTIO_RING_F_INDIRECT_DESC, VIRTIO_F_VERSION_1,
};

/// The memory a device accesses: the front end's regions behind an IOMMU
/// that is enabled exactly when `VIRTIO_F_ACCESS_PLATFORM` is negotiated.
pub type DeviceMemory = IommuMemory<GuestMemoryMmap<()>, VhostIommu>;
/// A snapshot of [`DeviceMemory`]; holding it keeps every mapping alive.
pub type DeviceMemoryGuard = GuestMemoryLoadGuard<DeviceMemory>;
