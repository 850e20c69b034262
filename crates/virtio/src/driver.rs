//! The driver's side of device initialisation (virtio 1.x §3.1.1) over
//! any [`Transport`]: reset, feature negotiation, then DRIVER_OK once the
//! queues are set up.
//!
//! ```text
//!  negotiate: reset ─► ACKNOWLEDGE ─► DRIVER ─► features ─► FEATURES_OK?
//!  (the driver sets up its queues and shares memory)
//!  driver_ok: DRIVER_OK
//! ```

use crate::features::{status, VIRTIO_F_VERSION_1};
use crate::{Error, Result, Transport};

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
