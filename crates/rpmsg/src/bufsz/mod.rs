//! Buffer sizes per direction, and the two conventions that negotiate
//! them through the rpmsg vdev's feature word and config space.
//!
//! Without negotiation every buffer is [`BUF_SIZE`] (512) bytes, as Linux's
//! `virtio_rpmsg_bus` fixes them. Two conventions let the remote (the
//! device, which writes the resource table or answers `GET_CONFIG`) offer
//! other sizes:
//!
//! ```text
//!  Linux (default)                      NuttX's OpenAMP
//!  feature bit 1 (VIRTIO_RPMSG_F_BUFSZ) bit 2 (bit 1 is its ACK)
//!  config, packed, 13 bytes:            config, 64 bytes:
//!   0  version u8 (= 1)                  0  h2r_buf_size u32
//!   1  size u16 (= 13)                   4  r2h_buf_size u32
//!   3  rpmsg_buf_align u16 (0 or 2^n)    8  reserved[14] u32
//!   5  txbuf_size u32 (remote → host)
//!   9  rxbuf_size u32 (host → remote)
//! ```
//!
//! Linux's layout is `struct virtio_rpmsg_config` of "Enhance RPMsg buffer
//! management" v5 (July 2026, applied to rpmsg-next in September 2026).
//! A third convention, `fixed`, negotiates nothing, as upstream OpenAMP
//! (2026.04) does: no feature bit, no config space, each side uses the
//! sizes it was given and both must be given the same.
//!
//! Linux's fields are named from the remote's view (its tx is the host's
//! rx); NuttX's name the direction. Both are little-endian here (virtio 1
//! and the resource table's order on the machines iopath supports).
//!
//! A bit that means one thing in one convention and another in the other
//! is never guessed at: a host reads the config only under the convention
//! it was told, and under Linux's it refuses a device that offers bit 2
//! beside bit 1 (NuttX's ACK and BUFSZ). A Linux config is checked as
//! Linux's driver checks it (version 1, size 13, an alignment of 0 or a
//! power of two), and its sizes against iopath's own bound, 512 to 64 KiB
//! (Linux takes anything from 16 bytes up); each refusal names the field.

use std::fmt;
use std::str::FromStr;

use thiserror::Error;
use vm_memory::ByteValued;

use crate::role::Role;
use crate::wire::{BUF_SIZE, HDR_LEN};

/// Linux: the device takes its buffer sizes from config space.
pub const VIRTIO_RPMSG_F_BUFSZ: u32 = 1;
/// NuttX: the name-service acknowledgement (never accepted by iopath).
pub const NUTTX_RPMSG_F_ACK: u32 = 1;
/// NuttX: buffer sizes in the first 8 bytes of config space.
pub const NUTTX_RPMSG_F_BUFSZ: u32 = 2;
/// The one version of Linux's config (`RPMSG_VDEV_CONFIG_V1`).
pub const LINUX_CONFIG_VERSION: u8 = 1;
/// The size of Linux's config, which its `size` field must hold.
pub const LINUX_CONFIG_SIZE: u16 = 13;
/// Smallest buffer iopath offers or takes (Linux's fixed size).
pub const MIN_OFFER: u32 = BUF_SIZE as u32;
/// Largest buffer: a header's `len` is a `u16`, so a larger buffer could
/// not be filled.
pub const MAX_BUF_SIZE: u32 = 64 * 1024;

/// Linux's config space (`struct virtio_rpmsg_config`, packed; v5 of
/// "Enhance RPMsg buffer management"). Fields are little-endian.
#[repr(C, packed)]
#[derive(Debug, Clone, Copy, Default)]
pub struct LinuxConfig {
    /// Layout version: [`LINUX_CONFIG_VERSION`].
    pub version: u8,
    /// Size of this struct: [`LINUX_CONFIG_SIZE`].
    pub size: u16,
    /// Alignment of the driver's buffers in its memory: 0 (none) or a
    /// power of two. It spaces the buffers only, never their sizes.
    pub rpmsg_buf_align: u16,
    /// Remote → host buffer size (the remote's tx).
    pub txbuf_size: u32,
    /// Host → remote buffer size (the remote's rx).
    pub rxbuf_size: u32,
}

// SAFETY: `repr(C, packed)` of integers only (13 bytes, no padding): every
// bit pattern is a valid value.
unsafe impl ByteValued for LinuxConfig {}

/// NuttX's config space (`struct fw_rsc_config` without its CPU names).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct NuttxConfig {
    /// Host → remote buffer size.
    pub h2r_buf_size: u32,
    /// Remote → host buffer size.
    pub r2h_buf_size: u32,
    /// Reserved, written as 0.
    pub reserved: [u32; 14],
}

// SAFETY: `repr(C)` of `u32`s only (64 bytes, no padding): every bit
// pattern is a valid value.
unsafe impl ByteValued for NuttxConfig {}

const _: () = assert!(std::mem::size_of::<LinuxConfig>() == LINUX_CONFIG_SIZE as usize);
const _: () = assert!(std::mem::size_of::<NuttxConfig>() == 64);

/// Bytes of a NuttX config iopath reads: the two sizes.
const NUTTX_NEED: usize = 8;

impl LinuxConfig {
    /// The config a remote offering `sizes` writes: version 1, size 13,
    /// no alignment.
    pub fn new(sizes: BufSizes) -> Self {
        LinuxConfig {
            version: LINUX_CONFIG_VERSION,
            size: LINUX_CONFIG_SIZE.to_le(),
            rpmsg_buf_align: 0,
            txbuf_size: sizes.to_host.to_le(),
            rxbuf_size: sizes.to_remote.to_le(),
        }
    }

    /// Reads the config from the first 13 bytes of `config`.
    ///
    /// # Errors
    /// [`BufSizeError::ConfigShort`] when `config` is shorter.
    pub fn from_bytes(config: &[u8]) -> Result<Self, BufSizeError> {
        let need = std::mem::size_of::<Self>();
        let bytes = config.get(..need).ok_or(BufSizeError::ConfigShort {
            len: config.len(),
            need,
            convention: Convention::Linux,
        })?;
        let mut c = LinuxConfig::default();
        c.as_mut_slice().copy_from_slice(bytes);
        Ok(c)
    }

    /// Checks the config as Linux's `rpmsg_probe` does, field by field in
    /// its order (version, size, alignment, then the sizes), the sizes
    /// against iopath's own bound, and returns them.
    ///
    /// # Errors
    /// [`BufSizeError::Version`], [`BufSizeError::ConfigSize`],
    /// [`BufSizeError::Align`], [`BufSizeError::Field`].
    pub fn sizes(&self) -> Result<BufSizes, BufSizeError> {
        if self.version != LINUX_CONFIG_VERSION {
            return Err(BufSizeError::Version {
                version: self.version,
            });
        }
        let size = u16::from_le(self.size);
        if size != LINUX_CONFIG_SIZE {
            return Err(BufSizeError::ConfigSize { size });
        }
        let align = u16::from_le(self.rpmsg_buf_align);
        if align != 0 && !align.is_power_of_two() {
            return Err(BufSizeError::Align { align });
        }
        let sizes = BufSizes {
            to_host: u32::from_le(self.txbuf_size),
            to_remote: u32::from_le(self.rxbuf_size),
        };
        for (field, dir, size) in [
            ("txbuf_size", Dir::ToHost, sizes.to_host),
            ("rxbuf_size", Dir::ToRemote, sizes.to_remote),
        ] {
            if let Some(why) = outside_bound(size) {
                return Err(BufSizeError::Field {
                    field,
                    dir,
                    size,
                    why,
                });
            }
        }
        Ok(sizes)
    }
}

/// Why `size` is outside iopath's bound for an offered buffer (512 to
/// 64 KiB, a multiple of 4), if it is.
fn outside_bound(size: u32) -> Option<&'static str> {
    if size < MIN_OFFER {
        Some("below 512, iopath's own bound (Linux's driver takes 16 and up)")
    } else if size > MAX_BUF_SIZE {
        Some("above 65536 (64K), iopath's own bound: a header's len is 16 bits")
    } else if size % 4 != 0 {
        Some("not a multiple of 4 (iopath keeps every buffer's header aligned)")
    } else {
        None
    }
}

/// Why a buffer-size offer was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum BufSizeError {
    /// A Linux config version iopath does not know.
    #[error("rpmsg config version {version} is not {LINUX_CONFIG_VERSION} (RPMSG_VDEV_CONFIG_V1)")]
    Version {
        /// The version found.
        version: u8,
    },
    /// A Linux config whose `size` field is not the struct's size.
    #[error("rpmsg config size field {size} is not {LINUX_CONFIG_SIZE} (the size of struct virtio_rpmsg_config)")]
    ConfigSize {
        /// The size field found.
        size: u16,
    },
    /// A Linux config whose alignment is not a power of two.
    #[error("rpmsg config rpmsg_buf_align {align} is not 0 or a power of two")]
    Align {
        /// The alignment found.
        align: u16,
    },
    /// A size in a Linux config outside iopath's bound.
    #[error("rpmsg config {field} {size} ({dir}) is {why}")]
    Field {
        /// `txbuf_size` or `rxbuf_size`.
        field: &'static str,
        /// Which direction it sizes.
        dir: Dir,
        /// The size found.
        size: u32,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A config space too short for the fields.
    #[error("rpmsg config space of {len} bytes is shorter than the {need} bytes of the {convention} layout")]
    ConfigShort {
        /// Bytes present.
        len: usize,
        /// Bytes needed.
        need: usize,
        /// The convention read.
        convention: Convention,
    },
    /// Bit 1 and bit 2 offered together under Linux's convention.
    #[error("the device offers feature bits 1 and 2 (NuttX's ACK and BUFSZ), not Linux's BUFSZ alone; use the nuttx convention")]
    Conflict,
    /// A size no buffer can have.
    #[error("{dir} buffer size {size} is {why}")]
    Size {
        /// Which direction.
        dir: Dir,
        /// The size given.
        size: u32,
        /// What is wrong with it.
        why: &'static str,
    },
    /// Buffers that do not fit the shared memory.
    #[error("buffers of {to_remote} (host → remote) and {to_host} (remote → host) bytes need {need} bytes from {start:#x}; the shared memory has {shm_len}")]
    NoRoom {
        /// Host → remote size.
        to_remote: u32,
        /// Remote → host size.
        to_host: u32,
        /// Pool bytes needed.
        need: u64,
        /// Where the pool starts.
        start: u64,
        /// Shared-memory size.
        shm_len: u64,
    },
}

/// A direction of the link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// Host → remote (the host's tx, vq1).
    ToRemote,
    /// Remote → host (the host's rx, vq0).
    ToHost,
}

impl fmt::Display for Dir {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Dir::ToRemote => "host → remote",
            Dir::ToHost => "remote → host",
        })
    }
}

/// The size of one buffer each way, header included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufSizes {
    /// Host → remote (vq1, the host's tx buffers).
    pub to_remote: u32,
    /// Remote → host (vq0, the host's rx buffers).
    pub to_host: u32,
}

impl Default for BufSizes {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl BufSizes {
    /// Linux's fixed 512 bytes both ways: what applies without negotiation.
    pub const DEFAULT: BufSizes = BufSizes {
        to_remote: BUF_SIZE as u32,
        to_host: BUF_SIZE as u32,
    };

    /// The same size both ways.
    pub fn both(size: u32) -> Self {
        BufSizes {
            to_remote: size,
            to_host: size,
        }
    }

    /// Checks both sizes a peer offered: non-zero, room for a header and a
    /// byte, a multiple of 4 (every buffer's header stays aligned), at most
    /// [`MAX_BUF_SIZE`].
    ///
    /// # Errors
    /// [`BufSizeError::Size`] naming the first bad size.
    pub fn check(&self) -> Result<(), BufSizeError> {
        for (dir, size) in [(Dir::ToRemote, self.to_remote), (Dir::ToHost, self.to_host)] {
            let why = if size == 0 {
                "zero"
            } else if (size as usize) <= HDR_LEN {
                "no larger than the 16-byte header"
            } else if size % 4 != 0 {
                "not a multiple of 4"
            } else if size > MAX_BUF_SIZE {
                "larger than 65536 (a header's len is 16 bits)"
            } else {
                continue;
            };
            return Err(BufSizeError::Size { dir, size, why });
        }
        Ok(())
    }

    /// Checks sizes this side is asked to offer: as [`BufSizes::check`],
    /// and at least [`MIN_OFFER`].
    ///
    /// # Errors
    /// [`BufSizeError::Size`].
    pub fn check_offer(&self) -> Result<(), BufSizeError> {
        self.check()?;
        for (dir, size) in [(Dir::ToRemote, self.to_remote), (Dir::ToHost, self.to_host)] {
            if size < MIN_OFFER {
                return Err(BufSizeError::Size {
                    dir,
                    size,
                    why: "smaller than 512",
                });
            }
        }
        Ok(())
    }

    /// Bytes one message this role sends may take (header included).
    pub fn tx(&self, role: Role) -> usize {
        match role {
            Role::Host => self.to_remote as usize,
            Role::Remote => self.to_host as usize,
        }
    }

    /// Bytes one message this role receives may take (header included).
    pub fn rx(&self, role: Role) -> usize {
        match role {
            Role::Host => self.to_host as usize,
            Role::Remote => self.to_remote as usize,
        }
    }
}

/// How buffer sizes are negotiated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Convention {
    /// Linux's: bit 1, the 13-byte versioned config.
    #[default]
    Linux,
    /// NuttX's OpenAMP: bit 2, sizes first in the config.
    Nuttx,
    /// Upstream OpenAMP: nothing negotiated; each side uses its own
    /// settings, which must agree.
    Fixed,
}

impl fmt::Display for Convention {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Convention::Linux => "linux",
            Convention::Nuttx => "nuttx",
            Convention::Fixed => "fixed",
        })
    }
}

impl FromStr for Convention {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "linux" => Ok(Convention::Linux),
            "nuttx" => Ok(Convention::Nuttx),
            "fixed" => Ok(Convention::Fixed),
            _ => Err(format!("unknown convention {s:?} (linux, nuttx or fixed)")),
        }
    }
}

impl Convention {
    /// The feature bit that says the config holds the sizes (none under
    /// [`Convention::Fixed`]).
    pub fn bit(self) -> Option<u32> {
        match self {
            Convention::Linux => Some(VIRTIO_RPMSG_F_BUFSZ),
            Convention::Nuttx => Some(NUTTX_RPMSG_F_BUFSZ),
            Convention::Fixed => None,
        }
    }

    /// The config space a remote offering `sizes` writes (empty under
    /// [`Convention::Fixed`]).
    pub fn config(self, sizes: BufSizes) -> Vec<u8> {
        match self {
            Convention::Linux => LinuxConfig::new(sizes).as_slice().to_vec(),
            Convention::Nuttx => NuttxConfig {
                h2r_buf_size: sizes.to_remote.to_le(),
                r2h_buf_size: sizes.to_host.to_le(),
                reserved: [0; 14],
            }
            .as_slice()
            .to_vec(),
            Convention::Fixed => Vec::new(),
        }
    }

    /// Reads and checks the sizes in `config` (the vdev's config space).
    /// [`Convention::Fixed`] has none: 512 bytes, as without negotiation.
    ///
    /// # Errors
    /// [`BufSizeError::ConfigShort`]; under Linux's convention what
    /// [`LinuxConfig::sizes`] refuses; under NuttX's
    /// [`BufSizeError::Size`].
    pub fn parse(self, config: &[u8]) -> Result<BufSizes, BufSizeError> {
        match self {
            Convention::Linux => LinuxConfig::from_bytes(config)?.sizes(),
            Convention::Nuttx => {
                if config.len() < NUTTX_NEED {
                    return Err(BufSizeError::ConfigShort {
                        len: config.len(),
                        need: NUTTX_NEED,
                        convention: self,
                    });
                }
                let mut c = NuttxConfig::default();
                let n = config.len().min(std::mem::size_of::<NuttxConfig>());
                c.as_mut_slice()[..n].copy_from_slice(&config[..n]);
                let sizes = BufSizes {
                    to_remote: u32::from_le(c.h2r_buf_size),
                    to_host: u32::from_le(c.r2h_buf_size),
                };
                sizes.check()?;
                Ok(sizes)
            }
            Convention::Fixed => Ok(BufSizes::DEFAULT),
        }
    }

    /// The convention a device's offered features say it speaks, if any:
    /// bit 2 is NuttX's (with or without its ACK at bit 1), bit 1 alone
    /// Linux's.
    pub fn offered(dfeatures: u32) -> Option<Convention> {
        if dfeatures & (1 << NUTTX_RPMSG_F_BUFSZ) != 0 {
            Some(Convention::Nuttx)
        } else if dfeatures & (1 << VIRTIO_RPMSG_F_BUFSZ) != 0 {
            Some(Convention::Linux)
        } else {
            None
        }
    }
}

/// Both buffer-size bits.
pub const BUFSZ_BITS: u32 = (1 << VIRTIO_RPMSG_F_BUFSZ) | (1 << NUTTX_RPMSG_F_BUFSZ);

/// The host's side of the negotiation: which of `dfeatures` it takes
/// (within `accept`; the buffer-size bits only under `convention`, and
/// only when `accept` has [`VIRTIO_RPMSG_F_BUFSZ`]) and the sizes that
/// follow from the device's `config`. Under [`Convention::Fixed`] no
/// buffer-size bit is taken and the sizes are the host's own, `fixed`
/// (checked as an offer would be).
///
/// # Errors
/// [`BufSizeError`] when the device's offer is refused.
pub fn host_negotiate(
    dfeatures: u32,
    accept: u32,
    convention: Convention,
    config: &[u8],
    fixed: BufSizes,
) -> Result<(u32, BufSizes), BufSizeError> {
    let mut features = dfeatures & accept & !BUFSZ_BITS;
    let Some(bit) = convention.bit() else {
        fixed.check()?;
        return Ok((features, fixed));
    };
    if accept & (1 << VIRTIO_RPMSG_F_BUFSZ) == 0 {
        return Ok((features, BufSizes::DEFAULT));
    }
    if dfeatures & (1 << bit) == 0 {
        return Ok((features, BufSizes::DEFAULT));
    }
    if convention == Convention::Linux && dfeatures & (1 << NUTTX_RPMSG_F_BUFSZ) != 0 {
        return Err(BufSizeError::Conflict);
    }
    let sizes = convention.parse(config)?;
    features |= 1 << bit;
    Ok((features, sizes))
}

/// The remote's side: the sizes that apply once the host accepted
/// `features` of what the table offered (`dfeatures`, `config`); `fixed`
/// when the remote was given sizes under [`Convention::Fixed`] (its table
/// then offers no bit, and nothing is read from it).
///
/// # Errors
/// [`BufSizeError`] when the config (the remote's own, or one changed
/// under it) is refused.
pub fn remote_sizes(
    dfeatures: u32,
    features: u32,
    config: &[u8],
    fixed: Option<BufSizes>,
) -> Result<BufSizes, BufSizeError> {
    if let Some(s) = fixed {
        s.check()?;
        return Ok(s);
    }
    match Convention::offered(dfeatures) {
        Some(c) if c.bit().is_some_and(|b| features & (1 << b) != 0) => c.parse(config),
        _ => Ok(BufSizes::DEFAULT),
    }
}

#[cfg(test)]
mod tests;
