//! iopath-rpmsg: rpmsg over virtio rings in shared memory, wire-compatible
//! with Linux's `virtio_rpmsg_bus` and OpenAMP.
//!
//! A shared-memory file holds a remoteproc resource table (one rpmsg vdev,
//! two legacy vrings) and a pool of buffers, 512 bytes each unless the
//! remote offered other sizes per direction ([`bufsz`]: Linux's proposed
//! `VIRTIO_RPMSG_F_BUFSZ`, or NuttX's); device addresses are offsets into
//! the file, as in OpenAMP's Linux demo.
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
//! is a trait ([`notify::Notifier`]). The shared memory is one heap
//! `Buffer` ([`SharedMem`]). The host's rings are `iopath-virtio`'s
//! `SplitQueue`s placed where the table says, every buffer mapped through
//! `iopath-dma`'s `Direct` ops (device address = offset); the remote's are
//! rust-vmm `virtio-queue` over a `vm-memory` view of the same file.
//!
//! The remote has a second transport, [`vhost_user`]: a virtio-rpmsg
//! device (ID 7) served by `iopath-virtio`'s vhost-user device side, whose
//! rings and buffers are in the front end's memory (Linux's
//! `virtio_rpmsg_bus` in User-Mode Linux is then the host). Its link and
//! notifier implement the same [`Link`] and [`Notifier`], so the bus and
//! the services below run unchanged; [`session::serve_drivers`] is its
//! outer loop.
//!
//! On top, the [`Bus`] (one service thread per link): endpoints with
//! addresses from 1024, the name service at 53 (announce and destroy both
//! ways), channels the peer announced, delivery to a queue
//! ([`Endpoint::recv`]), a callback, or in place ([`ZeroCopyEndpoint`],
//! [`TxBuffer`]); sends that block or fail at once. [`CtrlServer`] is the
//! bus owner's control socket for local clients, [`ctrl`] their side of it.
//!
//! What runs on those, whatever carries the bus: a remote's echo and sink
//! services ([`RemoteServices`]), echo round trips with every byte checked
//! ([`ping`], OpenAMP's demo payloads from [`openamp`]), and unmodified
//! programs on the endpoint service through the preload library ([`exec`],
//! its ELF check in [`elf`]). A host or remote that outlives its peer
//! finds the next one with [`session`].
//!
//! ```no_run
//! use std::time::Duration;
//! use iopath_rpmsg::{Bus, EndpointOptions, NotifySpec, SharedMem, HOST_FEATURES};
//!
//! // Host side of a file a remote created (`iopath rpmsg remote --create`).
//! let notify: NotifySpec = "eventfd:/tmp/rp.ev".parse()?;
//! let n = notify.connect(Duration::from_secs(10))?;
//! let bus = Bus::host(SharedMem::open("/dev/shm/rp".as_ref())?, n, HOST_FEATURES)?;
//! let ch = bus.wait_channel("echo", Duration::from_secs(10))?;
//! let ep = bus.create(EndpointOptions::new("echo").dst(ch.addr))?;
//! ep.send(b"hello")?;
//! assert_eq!(ep.recv(Some(Duration::from_secs(5)))?.data, b"hello");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod bufsz;
mod bus;
pub mod ctrl;
pub mod elf;
pub mod exec;
mod host;
mod link;
pub mod notify;
pub mod openamp;
pub mod ping;
mod remote;
mod remote_services;
mod role;
pub mod rsc_table;
mod service;
pub mod session;
mod shm;
pub mod vhost_user;
pub mod vring;
pub mod wire;

pub use bufsz::{BufSizes, Convention};
pub use bus::{
    Bus, BusError, Channel, Endpoint, EndpointOptions, EndpointRef, Event, HookRun, InPlace,
    KickHold, Message, RxBuffer, ServiceHook, Stats, TxBuffer, ZeroCopyEndpoint,
};
pub use host::{HostLink, HostOptions, HOST_FEATURES};
pub use link::{Held, Link, LinkError, LinkMemory, Rx, Slot};
pub use notify::{Notifier, NotifySpec};
pub use remote::RemoteLink;
pub use remote_services::{AnnounceError, RemoteServices, ServiceSession, SessionEnd, SINK_SYNC};
pub use role::Role;
pub use rsc_table::{ResourceTable, ShmLayout};
pub use service::{CtrlOptions, CtrlServer};
pub use shm::{shm_path, SharedMem, ShmError, ShmHolder, ShmOptions, ShmOwner, ShmRole};
