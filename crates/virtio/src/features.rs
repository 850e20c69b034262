//! Feature bits and device status (virtio 1.x §2.1, §2.2, §6) and the
//! driver's side of initialisation (§3.1.1).

//!
//! The values come from `virtio-bindings` (the kernel's uAPI headers); this
//! module turns the bit numbers into masks once, and every other module and
//! crate (the device side, iopath-blk, iopath-rpmsg) takes them from here.

use virtio_bindings::virtio_config as cfg;
use virtio_bindings::virtio_ring as ring;

use crate::{Error, Result, Transport};

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

/// The first half of driver initialisation (§3.1.1 steps 1–6): reset,
/// ACKNOWLEDGE, DRIVER, read the device's features, accept `driver & device`,
/// FEATURES_OK, and check the device kept FEATURES_OK. Returns the
/// negotiated features. The driver then sets up its queues and calls
/// [`driver_ok`].
///
/// # Errors
/// [`Error::FeaturesRejected`] when the device lacks `VIRTIO_F_VERSION_1` or
/// one of `required`, or clears FEATURES_OK (status is then set to FAILED);
/// transport errors.
pub fn negotiate(transport: &dyn Transport, driver: u64, required: u64) -> Result<u64> {
    transport.set_status(0)?;
    transport.set_status(status::ACKNOWLEDGE)?;
    transport.set_status(status::ACKNOWLEDGE | status::DRIVER)?;
    let device = transport.device_features()?;
    let required = required | VIRTIO_F_VERSION_1;
    let negotiated = device & (driver | required);
    if negotiated & required != required {
        transport.set_status(status::FAILED)?;
        return Err(Error::FeaturesRejected {
            device,
            missing: required & !negotiated,
        });
    }
    transport.set_driver_features(negotiated)?;
    let st = status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK;
    transport.set_status(st)?;
    if transport.status()? & status::FEATURES_OK == 0 {
        transport.set_status(status::FAILED)?;
        return Err(Error::FeaturesRejected { device, missing: 0 });
    }
    Ok(negotiated)
}

/// The last step of initialisation (§3.1.1 step 8): DRIVER_OK.
///
/// # Errors
/// Transport errors.
pub fn driver_ok(transport: &dyn Transport) -> Result<()> {
    let st = transport.status()?;
    transport.set_status(st | status::DRIVER_OK)
}
