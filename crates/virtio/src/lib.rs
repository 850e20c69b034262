//! iopath-virtio: virtio queues and transports.
//!
//! Driver side: a split virtqueue whose every descriptor address comes from
//! `iopath-dma`. Transports: vhost-user front end and an in-process loopback.
//! Device side: vhost-user back end on rust-vmm, with IOTLB enforcement.

pub mod transport;
