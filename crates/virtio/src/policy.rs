//! [`Policy`]: the platform hook that picks a device's DMA ops after
//! feature negotiation, like the kernel's `vring_use_dma_api()` and its
//! restricted-memory-access callback (`virtio_check_mem_acc_cb`).
//!
//! ```text
//!  Policy { platform, bounce geometry, override }
//!     ├─ driver_features() / required_features()  ─► feature negotiation
//!     └─ choose(negotiated) ─► Choice ─► build() ─► Arc<dyn DmaOps>
//!          no ACCESS_PLATFORM            → Direct (legacy: device uses addresses as is)
//!          ACCESS_PLATFORM, iommu        → Iommu (IOVAs, IOTLB updates)
//!          protected                     → Bounce (only the window is shared),
//!                                          refused without ACCESS_PLATFORM
//! ```
//!
//! Every driver gets its ops here: a driver asks for `Arc<dyn DmaOps>` (the
//! DMA API, chosen at run time) or for a concrete type through
//! [`PolicyOps`] (`Direct`: the monomorphised path, for the dyn-vs-static
//! comparison; refused when the policy would choose other ops).

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use iopath_dma::{Bounce, Direct, DmaOps, Iommu, DEFAULT_SLOT};

use crate::features::VIRTIO_F_ACCESS_PLATFORM as ACCESS_PLATFORM;

/// How this platform lets devices reach memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Platform {
    /// Devices see driver memory as is; there is no IOMMU to program.
    Direct,
    /// Devices go through an IOMMU (an IOTLB the back end enforces).
    Iommu,
    /// A protected guest: the host may only see a shared bounce window.
    Protected,
}

impl Platform {
    /// Every setting, in order.
    pub const ALL: [Platform; 3] = [Platform::Direct, Platform::Iommu, Platform::Protected];

    /// The name used on command lines and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Platform::Direct => "direct",
            Platform::Iommu => "iommu",
            Platform::Protected => "protected",
        }
    }
}

impl FromStr for Platform {
    type Err = PolicyError;

    fn from_str(s: &str) -> Result<Self, PolicyError> {
        Platform::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| PolicyError::UnknownPlatform { got: s.to_string() })
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
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

impl Choice {
    /// The ops' name, as [`DmaOps::name`] reports it.
    pub fn name(self) -> &'static str {
        match self {
            Choice::Direct => "direct",
            Choice::Iommu => "iommu",
            Choice::Bounce => "bounce",
        }
    }
}

impl fmt::Display for Choice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The bounce window: its size and the size of the slots it is cut into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BounceGeometry {
    /// Window size in bytes (rounded up to pages by [`Bounce::new`]).
    pub window: usize,
    /// Slot size in bytes, a power of two.
    pub slot: usize,
}

impl BounceGeometry {
    /// The default: swiotlb's, 64 MiB of 2 KiB slots (`IO_TLB_SIZE`), the
    /// window a protected Linux guest bounces through unless told otherwise
    /// (`swiotlb=`).
    pub const DEFAULT: BounceGeometry = BounceGeometry {
        window: 64 << 20,
        slot: DEFAULT_SLOT,
    };
}

impl Default for BounceGeometry {
    fn default() -> Self {
        BounceGeometry::DEFAULT
    }
}

/// Errors of the platform policy.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// A platform name that is none of the settings.
    #[error("Unknown platform {got:?} (accepted: direct, iommu, protected)")]
    UnknownPlatform {
        /// The name given.
        got: String,
    },
    /// A protected platform and a device without `ACCESS_PLATFORM`: such a
    /// device expects to reach any memory, which a protected guest cannot
    /// allow.
    #[error("Protected platform: the device does not offer VIRTIO_F_ACCESS_PLATFORM, so it would expect to read all of memory; refused")]
    ProtectedNeedsAccessPlatform,
    /// An override to IOMMU ops and a device without `ACCESS_PLATFORM`: it
    /// would take IOVAs for addresses.
    #[error("IOMMU ops need VIRTIO_F_ACCESS_PLATFORM, which the device does not offer (it cannot enforce an IOTLB)")]
    IommuNeedsAccessPlatform,
    /// A driver asked for a concrete ops type the policy does not choose.
    #[error("The policy chooses {chosen} ops; this driver was built for {wanted} ops")]
    Mismatch {
        /// What the policy chose.
        chosen: Choice,
        /// The concrete type the driver was built for.
        wanted: Choice,
    },
    /// The chosen ops could not be made (the bounce window's memory, a bad
    /// geometry).
    #[error("Cannot set up {choice} ops")]
    Build {
        /// The ops.
        choice: Choice,
        /// Why.
        #[source]
        source: iopath_dma::Error,
    },
}

/// The platform policy: a platform setting, the bounce geometry, and an
/// optional explicit choice (an experiment's override) that still goes
/// through the same feature checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// The platform setting.
    pub platform: Platform,
    /// Geometry of the bounce window, when bounce ops are chosen.
    pub bounce: BounceGeometry,
    /// Ops chosen by hand instead of by the platform.
    pub force: Option<Choice>,
}

impl Policy {
    /// A policy for `platform` with the default bounce geometry
    /// ([`BounceGeometry::DEFAULT`]) and no override.
    pub fn new(platform: Platform) -> Self {
        Policy {
            platform,
            bounce: BounceGeometry::DEFAULT,
            force: None,
        }
    }

    /// The same policy with another bounce geometry.
    pub fn with_bounce(self, bounce: BounceGeometry) -> Self {
        Policy { bounce, ..self }
    }

    /// The same policy with the ops chosen by hand (`None`: by the
    /// platform).
    pub fn with_override(self, force: Option<Choice>) -> Self {
        Policy { force, ..self }
    }

    /// Feature bits the driver accepts when offered: `ACCESS_PLATFORM` when
    /// the ops will be able to serve a translating device (IOMMU ops, or a
    /// protected platform's bounce window mapped in the device's IOTLB).
    /// Direct ops never accept it: there is no IOMMU to program, and a
    /// device that negotiated it would take addresses for IOVAs.
    pub fn driver_features(&self) -> u64 {
        match (self.force, self.platform) {
            (Some(Choice::Iommu), _) | (None, Platform::Iommu | Platform::Protected) => {
                ACCESS_PLATFORM
            }
            (Some(Choice::Direct | Choice::Bounce), _) | (None, Platform::Direct) => 0,
        }
    }

    /// Feature bits the device must offer: a protected platform refuses a
    /// device without `ACCESS_PLATFORM` (the kernel's "device must provide
    /// VIRTIO_F_ACCESS_PLATFORM"), and so do IOMMU ops chosen by hand.
    pub fn required_features(&self) -> u64 {
        match (self.force, self.platform) {
            (Some(Choice::Iommu), _) | (None, Platform::Protected) => ACCESS_PLATFORM,
            _ => 0,
        }
    }

    /// Picks the ops for a device with `negotiated` features (or, before
    /// negotiation, with the features it would negotiate).
    ///
    /// Without `ACCESS_PLATFORM` the device uses driver addresses as they
    /// are (the legacy quirk), so it gets [`Choice::Direct`], with a warning
    /// on an IOMMU platform (the device bypasses the IOMMU); a protected
    /// platform refuses it. With it, the platform decides. An override is
    /// taken as it is, except IOMMU ops for a device that cannot translate.
    ///
    /// # Errors
    /// [`PolicyError::ProtectedNeedsAccessPlatform`],
    /// [`PolicyError::IommuNeedsAccessPlatform`].
    pub fn choose(&self, negotiated: u64) -> Result<Choice, PolicyError> {
        let translated = negotiated & ACCESS_PLATFORM != 0;
        if let Some(choice) = self.force {
            if choice == Choice::Iommu && !translated {
                return Err(PolicyError::IommuNeedsAccessPlatform);
            }
            return Ok(choice);
        }
        Ok(match (self.platform, translated) {
            (Platform::Protected, false) => return Err(PolicyError::ProtectedNeedsAccessPlatform),
            (Platform::Protected, true) => Choice::Bounce,
            (Platform::Iommu, true) => Choice::Iommu,
            (Platform::Iommu, false) => {
                tracing::warn!(
                    "the device does not offer VIRTIO_F_ACCESS_PLATFORM: it bypasses the IOMMU, \
                     so it gets direct ops"
                );
                Choice::Direct
            }
            (Platform::Direct, _) => Choice::Direct,
        })
    }

    /// Builds the chosen ops behind the DMA API (dynamic dispatch).
    ///
    /// # Errors
    /// As [`Policy::choose`]; [`PolicyError::Build`] if the bounce window
    /// cannot be set up.
    pub fn build(&self, negotiated: u64) -> Result<Arc<dyn DmaOps>, PolicyError> {
        let choice = self.choose(negotiated)?;
        let build = |source| PolicyError::Build { choice, source };
        Ok(match choice {
            Choice::Direct => Arc::new(Direct::new()),
            Choice::Iommu => Arc::new(Iommu::new()),
            Choice::Bounce => {
                Arc::new(Bounce::new(self.bounce.window, self.bounce.slot).map_err(build)?)
            }
        })
    }
}

/// An ops type a driver can be built for: `dyn DmaOps` (whatever the
/// policy chooses) or one concrete type (the policy must choose it).
pub trait PolicyOps: DmaOps {
    /// The ops `policy` gives a device with `negotiated` features.
    ///
    /// # Errors
    /// As [`Policy::build`]; [`PolicyError::Mismatch`] when the policy
    /// chooses other ops than `Self`.
    fn from_policy(policy: &Policy, negotiated: u64) -> Result<Arc<Self>, PolicyError>;
}

impl PolicyOps for dyn DmaOps {
    fn from_policy(policy: &Policy, negotiated: u64) -> Result<Arc<Self>, PolicyError> {
        policy.build(negotiated)
    }
}

impl PolicyOps for Direct {
    fn from_policy(policy: &Policy, negotiated: u64) -> Result<Arc<Self>, PolicyError> {
        match policy.choose(negotiated)? {
            Choice::Direct => Ok(Arc::new(Direct::new())),
            chosen => Err(PolicyError::Mismatch {
                chosen,
                wanted: Choice::Direct,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Policy {
        Policy::new(s.parse().unwrap())
    }

    #[test]
    fn choices_follow_the_platform_and_access_platform() {
        assert_eq!(p("direct").choose(0).unwrap(), Choice::Direct);
        assert_eq!(p("direct").choose(ACCESS_PLATFORM).unwrap(), Choice::Direct);
        assert_eq!(p("iommu").choose(ACCESS_PLATFORM).unwrap(), Choice::Iommu);
        assert_eq!(p("iommu").choose(0).unwrap(), Choice::Direct);
        assert_eq!(
            p("protected").choose(ACCESS_PLATFORM).unwrap(),
            Choice::Bounce
        );
        assert!(matches!(
            p("protected").choose(0),
            Err(PolicyError::ProtectedNeedsAccessPlatform)
        ));
        assert!(matches!(
            "nonsense".parse::<Platform>(),
            Err(PolicyError::UnknownPlatform { got }) if got == "nonsense"
        ));
        for platform in Platform::ALL {
            assert_eq!(platform.name().parse::<Platform>().unwrap(), platform);
        }
    }

    #[test]
    fn features_asked_and_required() {
        assert_eq!(p("direct").driver_features(), 0);
        assert_eq!(p("iommu").driver_features(), ACCESS_PLATFORM);
        assert_eq!(p("protected").driver_features(), ACCESS_PLATFORM);
        assert_eq!(p("direct").required_features(), 0);
        assert_eq!(p("iommu").required_features(), 0);
        assert_eq!(p("protected").required_features(), ACCESS_PLATFORM);
        let forced = |c| p("protected").with_override(Some(c));
        assert_eq!(forced(Choice::Iommu).required_features(), ACCESS_PLATFORM);
        assert_eq!(forced(Choice::Bounce).required_features(), 0);
        assert_eq!(forced(Choice::Bounce).driver_features(), 0);
        assert_eq!(forced(Choice::Direct).driver_features(), 0);
    }

    #[test]
    fn an_override_wins_but_iommu_needs_access_platform() {
        let forced = |c| p("direct").with_override(Some(c));
        assert_eq!(forced(Choice::Bounce).choose(0).unwrap(), Choice::Bounce);
        assert_eq!(
            forced(Choice::Iommu).choose(ACCESS_PLATFORM).unwrap(),
            Choice::Iommu
        );
        assert!(matches!(
            forced(Choice::Iommu).choose(0),
            Err(PolicyError::IommuNeedsAccessPlatform)
        ));
        assert_eq!(
            p("protected")
                .with_override(Some(Choice::Direct))
                .choose(0)
                .unwrap(),
            Choice::Direct
        );
    }

    #[test]
    fn builds_the_chosen_ops_with_the_geometry() {
        assert_eq!(
            p("protected").build(ACCESS_PLATFORM).unwrap().name(),
            "bounce"
        );
        assert_eq!(p("iommu").build(ACCESS_PLATFORM).unwrap().name(), "iommu");
        assert_eq!(p("direct").build(ACCESS_PLATFORM).unwrap().name(), "direct");
        assert_eq!(
            Policy::new(Platform::Direct).bounce,
            BounceGeometry::DEFAULT
        );
        assert_eq!(
            (BounceGeometry::DEFAULT.window, BounceGeometry::DEFAULT.slot),
            (64 << 20, 2048)
        );
        let bad = p("protected").with_bounce(BounceGeometry {
            window: 1 << 20,
            slot: 3000,
        });
        assert!(matches!(
            bad.build(ACCESS_PLATFORM),
            Err(PolicyError::Build {
                choice: Choice::Bounce,
                ..
            })
        ));
    }

    #[test]
    fn a_static_driver_gets_direct_ops_only_when_chosen() {
        assert!(<Direct as PolicyOps>::from_policy(&p("iommu"), 0).is_ok());
        assert!(matches!(
            <Direct as PolicyOps>::from_policy(&p("iommu"), ACCESS_PLATFORM),
            Err(PolicyError::Mismatch {
                chosen: Choice::Iommu,
                wanted: Choice::Direct
            })
        ));
        assert_eq!(
            <dyn DmaOps as PolicyOps>::from_policy(&p("iommu"), ACCESS_PLATFORM)
                .unwrap()
                .name(),
            "iommu"
        );
    }
}
