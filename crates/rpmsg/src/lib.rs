//! iopath-rpmsg: rpmsg over virtio rings in shared memory, wire-compatible
//! with Linux's `virtio_rpmsg_bus` and OpenAMP, and its endpoints handed
//! to local processes as plain fds.
//!
//! ```text
//!   host (virtio driver, HostLink)             remote (virtio device, RemoteLink)
//!   owns the buffers, pre-posts rx             waits for DRIVER_OK
//!        vq1 (tx) ── avail ──────────────────►  rx: read, return used
//!        vq0 (rx) ◄── used ───────────────────  tx: fill a posted buffer
//!                 ◄──── notifier (eventfd | unix byte | poll) ────►
//!        │                                           │
//!   Bus: endpoints, name service (53), channels    Bus
//!        │
//!   CtrlServer (control socket) ── endpoint service ──► client fds (ctrl)
//! ```
//!
//! A shared-memory file ([`SharedMem`]) holds a remoteproc resource table
//! ([`rsc_table`]: one rpmsg vdev, two legacy vrings) and a pool of
//! buffers, 512 bytes each unless the remote offered other sizes per
//! direction ([`bufsz`]); device addresses are offsets into the file, as
//! in OpenAMP's Linux demo. A [`Link`] is one role over the two rings: the
//! host's rings are `iopath-virtio`'s `SplitQueue`s mapped through
//! `iopath-dma`'s `Direct` ops, the remote's rust-vmm `virtio-queue`s over
//! a `vm-memory` view of the same file. [`vhost_user`] is the remote's
//! second transport: a virtio-rpmsg device (ID 7) served to a vhost-user
//! front end, whose link and notifier implement the same traits.
//!
//! On a link, the [`Bus`] (one thread per link) parses the [`wire`] format
//! apart from executing it: endpoints with addresses from 1024, the name
//! service at 53, channels the peer announced, delivery to a queue, a
//! callback or in place ([`ZeroCopyEndpoint`]). The notifier is a trait
//! ([`Notifier`]). [`CtrlServer`] is the bus owner's endpoint service
//! behind a control socket: `/dev/rpmsg_ctrlN` for local processes,
//! whose side of it is [`ctrl`].
//!
//! What runs on all that lives apart, in [`tools`]: a remote's echo and
//! sink channels, the host's start-up and the loops that serve one peer
//! after another, echo round trips, unmodified programs on the preload
//! library, OpenAMP's demo.
//!
//! ```
//! use std::time::Duration;
//! use iopath_rpmsg::rsc_table::ShmLayout;
//! use iopath_rpmsg::tools::RemoteChannels;
//! use iopath_rpmsg::{Bus, EndpointOptions, NotifySpec, SharedMem, HOST_FEATURES};
//!
//! let t = Duration::from_secs(10);
//! let dir = tempfile::tempdir()?;
//! let path = dir.path().join("shm");
//! let notify = NotifySpec::Eventfd(dir.path().join("ev"));
//! // The remote writes the table, waits for a host and announces "echo".
//! let shm = SharedMem::create(&path, &ShmLayout::openamp_demo())?;
//! let listener = notify.bind()?;
//! let remote = std::thread::spawn(move || {
//!     let bus = Bus::remote(shm, listener.accept().unwrap(), Some(t)).unwrap();
//!     let echo = RemoteChannels { echo: vec!["echo".into()], ..Default::default() };
//!     let session = echo.announce(&bus, |_, _| {}).unwrap();
//!     (bus, session)
//! });
//! // The host maps the same file, starts the bus and talks to "echo".
//! let host = Bus::host(SharedMem::open(&path)?, notify.connect(t)?, HOST_FEATURES)?;
//! let ch = host.wait_channel("echo", t)?;
//! let ep = host.create(EndpointOptions::new("echo").dst(ch.addr))?;
//! ep.send(b"hello")?;
//! assert_eq!(ep.recv(Some(t))?.data, b"hello");
//! let (_remote, _session) = remote.join().unwrap();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod bufsz;
mod bus;
pub mod ctrl;
mod link;
pub mod notify;
mod role;
pub mod rsc_table;
mod service;
mod shm;
pub mod tools;
pub mod vhost_user;
pub mod vring;
pub mod wire;

pub use bufsz::{BufSizes, Convention};
pub use bus::{
    Bus, BusError, BusHook, Channel, Endpoint, EndpointOptions, EndpointRef, Event, HookRun,
    InPlace, KickHold, Message, RxBuffer, Stats, TxBuffer, ZeroCopyEndpoint,
};
pub use link::{
    Held, HostLink, HostOptions, Link, LinkError, LinkMemory, RemoteLink, Rx, Slot, HOST_FEATURES,
};
pub use notify::{Notifier, NotifySpec};
pub use role::Role;
pub use rsc_table::{ResourceTable, ShmLayout};
pub use service::{CtrlOptions, CtrlServer};
pub use shm::{shm_path, SharedMem, ShmError, ShmHolder, ShmOptions, ShmOwner, ShmRole};
