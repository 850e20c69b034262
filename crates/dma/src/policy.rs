//! [`Policy`]: the platform hook that picks DMA ops for a device, like the
//! kernel's restricted-memory-access callback and `vring_use_dma_api()`.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use crate::{Bounce, Direct, DmaOps, Error, Iommu, Result, DEFAULT_SLOT};

/// `VIRTIO_F_ACCESS_PLATFORM` (virtio 1.x §6, bit 33).
pub const ACCESS_PLATFORM: u64 = 1 << 33;

/// How this platform lets devices reach memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Platform {
    /// Devices see driver memory as is.
    Direct,
    /// Devices go through an IOMMU (IOTLB enforced by the back end).
    Iommu,
    /// A protected guest: the host may only see a shared bounce window.
    Protected,
}

impl FromStr for Platform {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "direct" => Ok(Platform::Direct),
            "iommu" => Ok(Platform::Iommu),
            "protected" | "bounce" => Ok(Platform::Protected),
            _ => Err(Error::Policy(
                "unknown platform setting (direct, iommu, protected)",
            )),
        }
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Platform::Direct => "direct",
            Platform::Iommu => "iommu",
            Platform::Protected => "protected",
        })
    }
}

/// Which ops a device gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Choice {
    /// [`Direct`].
    Direct,
    /// [`Iommu`].
    Iommu,
    /// [`Bounce`].
    Bounce,
}

/// The platform policy: a setting plus the bounce window geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// The platform setting.
    pub platform: Platform,
    /// Bounce window size in bytes.
    pub bounce_window: usize,
    /// Bounce slot size in bytes.
    pub bounce_slot: usize,
}

impl Policy {
    /// A policy for `platform` with a 4 MiB window of 2 KiB slots.
    pub fn new(platform: Platform) -> Self {
        Policy {
            platform,
            bounce_window: 4 << 20,
            bounce_slot: DEFAULT_SLOT,
        }
    }

    /// Feature bits the driver should accept when offered: it always accepts
    /// `ACCESS_PLATFORM` (a device that needs translation must get it).
    pub fn driver_features(&self) -> u64 {
        ACCESS_PLATFORM
    }

    /// Feature bits the device must offer: a protected platform refuses a
    /// device without `ACCESS_PLATFORM`, because such a device would expect
    /// to read any guest memory (the kernel's
    /// `virtio_check_mem_acc_cb` / "device must provide
    /// VIRTIO_F_ACCESS_PLATFORM").
    pub fn required_features(&self) -> u64 {
        match self.platform {
            Platform::Protected => ACCESS_PLATFORM,
            Platform::Direct | Platform::Iommu => 0,
        }
    }

    /// Picks the ops for a device with `negotiated` features.
    ///
    /// Without `ACCESS_PLATFORM` the device uses driver addresses as they are
    /// (the legacy quirk), so it gets [`Choice::Direct`], unless the platform
    /// is protected. With it, the platform decides.
    ///
    /// # Errors
    /// [`Error::Policy`] for a protected platform and a device without
    /// `ACCESS_PLATFORM`.
    pub fn choose(&self, negotiated: u64) -> Result<Choice> {
        let translated = negotiated & ACCESS_PLATFORM != 0;
        Ok(match (self.platform, translated) {
            (Platform::Protected, false) => {
                return Err(Error::Policy(
                    "protected platform: device must offer VIRTIO_F_ACCESS_PLATFORM",
                ))
            }
            (Platform::Protected, true) => Choice::Bounce,
            (Platform::Iommu, true) => Choice::Iommu,
            (Platform::Iommu, false) => {
                tracing::warn!("device lacks ACCESS_PLATFORM: it bypasses the IOMMU (direct)");
                Choice::Direct
            }
            (Platform::Direct, _) => Choice::Direct,
        })
    }

    /// Builds the chosen ops behind the DMA API (dynamic dispatch).
    ///
    /// # Errors
    /// As [`Policy::choose`]; [`Error::Heap`] if the bounce window cannot be
    /// allocated.
    pub fn build(&self, negotiated: u64) -> Result<Arc<dyn DmaOps>> {
        Ok(match self.choose(negotiated)? {
            Choice::Direct => Arc::new(Direct::new()),
            Choice::Iommu => Arc::new(Iommu::new()),
            Choice::Bounce => Arc::new(Bounce::new(self.bounce_window, self.bounce_slot)?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices() {
        let p = |s: &str| Policy::new(s.parse().unwrap());
        assert_eq!(p("direct").choose(0).unwrap(), Choice::Direct);
        assert_eq!(p("direct").choose(ACCESS_PLATFORM).unwrap(), Choice::Direct);
        assert_eq!(p("iommu").choose(ACCESS_PLATFORM).unwrap(), Choice::Iommu);
        assert_eq!(p("iommu").choose(0).unwrap(), Choice::Direct);
        assert_eq!(
            p("protected").choose(ACCESS_PLATFORM).unwrap(),
            Choice::Bounce
        );
        assert!(matches!(p("protected").choose(0), Err(Error::Policy(_))));
        assert_eq!(p("protected").required_features(), ACCESS_PLATFORM);
        assert!("nonsense".parse::<Platform>().is_err());
        assert_eq!(
            p("protected").build(ACCESS_PLATFORM).unwrap().name(),
            "bounce"
        );
        assert_eq!(p("iommu").build(ACCESS_PLATFORM).unwrap().name(), "iommu");
        assert_eq!(p("direct").build(ACCESS_PLATFORM).unwrap().name(), "direct");
    }
}
