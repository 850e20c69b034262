//! Buffer sizes per direction, and the two conventions that negotiate
//! them through the rpmsg vdev's feature word and config space.
//!
//! Without negotiation every buffer is [`BUF_SIZE`] (512) bytes, as Linux's
//! `virtio_rpmsg_bus` fixes them. Two conventions let the remote (the
//! device, which writes the resource table) offer other sizes:
//!
//! ```text
//!  Linux's proposal (default)         NuttX's OpenAMP
//!  feature bit 1 (VIRTIO_RPMSG_F_BUFSZ) bit 2 (bit 1 is its ACK)
//!  config, packed, 66 bytes:          config, 64 bytes:
//!   0  version u16 (= 0)               0  h2r_buf_size u32
//!   2  txbuf_size u32 (remote → host)  4  r2h_buf_size u32
//!   6  rxbuf_size u32 (host → remote)  8  reserved[14] u32
//!  10  reserved[14] u32
//! ```
//!
//! A third convention, `fixed`, negotiates nothing, as upstream OpenAMP
//! (2026.04) does: no feature bit, no config space, each side uses the
//! sizes it was given and both must be given the same.
//!
//! Linux's fields are named from the remote's view (its tx is the host's
//! rx); NuttX's name the direction. Both are little-endian here (the
//! resource table's order on the machines iopath supports).
//!
//! A bit that means one thing in one convention and another in the other
//! is never guessed at: a host reads the config only under the convention
//! it was told, and under Linux's it refuses a device that offers bit 2
//! beside bit 1 (NuttX's ACK and BUFSZ) instead of reading NuttX's sizes as
//! a version and two garbled fields. A Linux config whose version is not 0
//! (the reviewer of the proposal asked for that check), a config too short
//! for its fields, and sizes of 0, below a header, not a multiple of 4,
//! above 64 KiB or beyond the shared memory are refused with the size.

use std::fmt;
use std::str::FromStr;

use thiserror::Error;
use vm_memory::ByteValued;

use crate::role::Role;
use crate::wire::{BUF_SIZE, HDR_LEN};

/// Linux's proposal: the device takes its buffer sizes from config space.
pub const VIRTIO_RPMSG_F_BUFSZ: u32 = 1;
/// NuttX: the name-service acknowledgement (never accepted by iopath).
pub const NUTTX_RPMSG_F_ACK: u32 = 1;
/// NuttX: buffer sizes in the first 8 bytes of config space.
pub const NUTTX_RPMSG_F_BUFSZ: u32 = 2;
/// The one config version of Linux's proposal.
pub const LINUX_CONFIG_VERSION: u16 = 0;
/// Smallest buffer iopath offers (Linux's fixed size).
pub const MIN_OFFER: u32 = BUF_SIZE as u32;
/// Largest buffer: a header's `len` is a `u16`, so a larger buffer could
/// not be filled.
pub const MAX_BUF_SIZE: u32 = 64 * 1024;

/// Linux's config space (`struct virtio_rpmsg_config`, v2 of the proposal).
#[repr(C, packed)]
#[derive(Debug, Clone, Copy, Default)]
pub struct LinuxConfig {
    /// Layout version: 0.
    pub version: u16,
    /// Remote → host buffer size.
    pub txbuf_size: u32,
    /// Host → remote buffer size.
    pub rxbuf_size: u32,
    /// Reserved, written as 0.
    pub reserved: [u32; 14],
}

// SAFETY: `repr(C, packed)` of integers only (66 bytes, no padding): every
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

const _: () = assert!(std::mem::size_of::<LinuxConfig>() == 66);
const _: () = assert!(std::mem::size_of::<NuttxConfig>() == 64);

/// Bytes of a Linux config iopath reads: version and the two sizes.
const LINUX_NEED: usize = 10;
/// Bytes of a NuttX config iopath reads: the two sizes.
const NUTTX_NEED: usize = 8;

/// Why a buffer-size offer was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum BufSizeError {
    /// A Linux config version iopath does not know.
    #[error("rpmsg config version {version} is unknown (expected {LINUX_CONFIG_VERSION})")]
    Version {
        /// The version found.
        version: u16,
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
    /// Linux's proposal: bit 1, versioned config.
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
            Convention::Linux => LinuxConfig {
                version: LINUX_CONFIG_VERSION,
                txbuf_size: sizes.to_host,
                rxbuf_size: sizes.to_remote,
                reserved: [0; 14],
            }
            .as_slice()
            .to_vec(),
            Convention::Nuttx => NuttxConfig {
                h2r_buf_size: sizes.to_remote,
                r2h_buf_size: sizes.to_host,
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
    /// [`BufSizeError::ConfigShort`], [`BufSizeError::Version`],
    /// [`BufSizeError::Size`].
    pub fn parse(self, config: &[u8]) -> Result<BufSizes, BufSizeError> {
        let short = |need| BufSizeError::ConfigShort {
            len: config.len(),
            need,
            convention: self,
        };
        let sizes = match self {
            Convention::Linux => {
                if config.len() < LINUX_NEED {
                    return Err(short(LINUX_NEED));
                }
                let mut c = LinuxConfig::default();
                let n = config.len().min(std::mem::size_of::<LinuxConfig>());
                c.as_mut_slice()[..n].copy_from_slice(&config[..n]);
                let version = u16::from_le(c.version);
                if version != LINUX_CONFIG_VERSION {
                    return Err(BufSizeError::Version { version });
                }
                BufSizes {
                    to_host: u32::from_le(c.txbuf_size),
                    to_remote: u32::from_le(c.rxbuf_size),
                }
            }
            Convention::Nuttx => {
                if config.len() < NUTTX_NEED {
                    return Err(short(NUTTX_NEED));
                }
                let mut c = NuttxConfig::default();
                let n = config.len().min(std::mem::size_of::<NuttxConfig>());
                c.as_mut_slice()[..n].copy_from_slice(&config[..n]);
                BufSizes {
                    to_remote: u32::from_le(c.h2r_buf_size),
                    to_host: u32::from_le(c.r2h_buf_size),
                }
            }
            Convention::Fixed => BufSizes::DEFAULT,
        };
        sizes.check()?;
        Ok(sizes)
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
