//! Feature bits and device status (virtio 1.x §2.1, §2.2, §6); the
//! driver's side of initialisation that negotiates them is in
//! [`crate::driver`].
//!
//! The values come from `virtio-bindings` (the kernel's uAPI headers); this
//! module turns the bit numbers into masks once, and every other module and
//! crate (the device side, iopath-blk, iopath-rpmsg) takes them from here.

use virtio_bindings::virtio_config as cfg;
use virtio_bindings::virtio_ring as ring;

/// `VIRTIO_F_INDIRECT_DESC` (§2.7.5.3, `VIRTIO_RING_F_INDIRECT_DESC`):
/// descriptors may point at indirect tables.
pub const VIRTIO_F_INDIRECT_DESC: u64 = 1 << ring::VIRTIO_RING_F_INDIRECT_DESC;
/// `VIRTIO_F_EVENT_IDX` (§2.7.7, §2.7.10, `VIRTIO_RING_F_EVENT_IDX`):
/// `used_event` / `avail_event` notification suppression.
pub const VIRTIO_F_EVENT_IDX: u64 = 1 << ring::VIRTIO_RING_F_EVENT_IDX;
/// `VIRTIO_F_VERSION_1` (§6): a virtio 1.x device (little-endian rings).
pub const VIRTIO_F_VERSION_1: u64 = 1 << cfg::VIRTIO_F_VERSION_1;
/// `VIRTIO_F_ACCESS_PLATFORM` (§6): the device reaches memory through the
/// platform's DMA translation (IOMMU, bounce buffers), not raw addresses.
pub const VIRTIO_F_ACCESS_PLATFORM: u64 = 1 << cfg::VIRTIO_F_ACCESS_PLATFORM;
/// `VHOST_USER_F_PROTOCOL_FEATURES` (bit 30, vhost-user only): the back end
/// speaks protocol features (from the `vhost` crate).
pub const VHOST_USER_F_PROTOCOL_FEATURES: u64 =
    vhost::vhost_user::message::VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();

/// Device status bits (§2.1).
pub mod status {
    use virtio_bindings::virtio_config as cfg;

    /// The driver has noticed the device.
    pub const ACKNOWLEDGE: u8 = cfg::VIRTIO_CONFIG_S_ACKNOWLEDGE as u8;
    /// The driver knows how to drive it.
    pub const DRIVER: u8 = cfg::VIRTIO_CONFIG_S_DRIVER as u8;
    /// The driver is set up and ready to drive the device.
    pub const DRIVER_OK: u8 = cfg::VIRTIO_CONFIG_S_DRIVER_OK as u8;
    /// Feature negotiation is complete.
    pub const FEATURES_OK: u8 = cfg::VIRTIO_CONFIG_S_FEATURES_OK as u8;
    /// The device hit an error it cannot recover from.
    pub const DEVICE_NEEDS_RESET: u8 = cfg::VIRTIO_CONFIG_S_NEEDS_RESET as u8;
    /// The driver gave up on the device.
    pub const FAILED: u8 = cfg::VIRTIO_CONFIG_S_FAILED as u8;
}

/// What the driver's queues use of a negotiated feature set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QueueFeatures {
    /// `VIRTIO_F_EVENT_IDX` was negotiated.
    pub event_idx: bool,
    /// `VIRTIO_F_INDIRECT_DESC` was negotiated.
    pub indirect: bool,
}

impl QueueFeatures {
    /// Extracts the queue-relevant bits of `negotiated`.
    pub fn from_bits(negotiated: u64) -> Self {
        QueueFeatures {
            event_idx: negotiated & VIRTIO_F_EVENT_IDX != 0,
            indirect: negotiated & VIRTIO_F_INDIRECT_DESC != 0,
        }
    }
}
