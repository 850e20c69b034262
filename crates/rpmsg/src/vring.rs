//! Where a remoteproc vring `{da, align, num}` sits in the shared memory:
//! `iopath-virtio`'s one legacy ring layout ([`RingLayout`], virtio 1.x
//! §2.7.2 "Legacy Interfaces: A Note on Virtqueue Layout") placed at the
//! table's device address. The layout's facts (what follows what, the
//! alignment of the used ring) live there; this adds only the address.

use iopath_virtio::queue::RingLayout;

/// The ring feature bits (bit numbers, as a vdev's `dfeatures` word holds
/// them), from `virtio-bindings`.
pub use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};

/// Where the three parts of a legacy vring live, as device addresses
/// (offsets into the shared memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VringPlacement {
    /// Number of entries.
    pub num: u16,
    /// Descriptor table address (the vring's `da`).
    pub desc: u64,
    /// Available ring: `flags u16, idx u16, ring[num] u16, used_event u16`.
    pub avail: u64,
    /// Used ring: `flags u16, idx u16, ring[num] {id u32, len u32}, avail_event u16`.
    pub used: u64,
    /// Total bytes from `desc` to the end of the used ring.
    pub size: u64,
    ring: RingLayout,
}

impl VringPlacement {
    /// Places a ring of `num` entries at `da` with the used ring aligned to
    /// `align`. `None` if `num` is not a power of two of at most 32768,
    /// `align` not a power of two of at least 4, `da` not a multiple of
    /// `align` (the layout aligns the used ring's offset, Linux's
    /// `vring_init()` its address: the same only then), or the ring would
    /// run past the end of the address space.
    pub fn new(da: u64, num: u32, align: u64) -> Option<Self> {
        if align == 0 || da % align != 0 {
            return None;
        }
        let ring = RingLayout::legacy(u16::try_from(num).ok()?, usize::try_from(align).ok()?)?;
        let size = ring.total() as u64;
        da.checked_add(size)?;
        Some(VringPlacement {
            num: ring.size(),
            desc: da,
            avail: da + ring.avail_offset() as u64,
            used: da + ring.used_offset() as u64,
            size,
            ring,
        })
    }

    /// Byte size of a legacy vring (the kernel's `vring_size()`).
    pub fn ring_size(num: u32, align: u64) -> Option<u64> {
        Self::new(0, num, align).map(|l| l.size)
    }

    /// The ring's layout (offsets from the descriptor table).
    pub fn ring(&self) -> RingLayout {
        self.ring
    }

    /// Address of `used_event` (after the available ring entries).
    pub fn used_event(&self) -> u64 {
        self.desc + self.ring.used_event() as u64
    }

    /// Address of `avail_event` (after the used ring entries).
    pub fn avail_event(&self) -> u64 {
        self.desc + self.ring.avail_event() as u64
    }

    /// One past the last byte.
    pub fn end(&self) -> u64 {
        self.desc + self.size
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn openamp_demo_ring() {
        // 256 entries, align 0x1000 at 0x4000: used ring at 0x6000,
        // 0x2806 bytes in all (vring_size(256, 4096) in Linux).
        let l = VringPlacement::new(0x4000, 256, 0x1000).unwrap();
        assert_eq!(l.avail, 0x5000);
        assert_eq!(l.used, 0x6000);
        assert_eq!(l.size, 0x2806);
        assert_eq!(l.used_event(), 0x5204);
        assert_eq!(l.avail_event(), 0x6804);
        assert!(VringPlacement::new(0, 3, 0x1000).is_none());
        assert!(VringPlacement::new(0, 256, 0x1001).is_none());
        assert!(VringPlacement::new(0x4010, 256, 0x1000).is_none());
        assert!(VringPlacement::new(0, 65536, 0x1000).is_none());
        assert!(VringPlacement::new(u64::MAX - 10, 256, 0x1000).is_none());
        assert_eq!(VringPlacement::new(0, 32768, 16).unwrap().num, 32768);
    }

    proptest! {
        #[test]
        fn layout_is_aligned_and_ordered(da in 0u64..1<<40, shift in 0u32..16, ashift in 2u32..16) {
            let num = 1u32 << shift;
            let align = 1u64 << ashift;
            let da = da & !(align - 1);
            let l = VringPlacement::new(da, num, align).unwrap();
            prop_assert_eq!(l.used % align, 0);
            prop_assert!(l.used >= l.used_event() + 2);
            prop_assert_eq!(l.avail, da + 16 * u64::from(num));
            prop_assert_eq!(l.end(), l.avail_event() + 2);
        }
    }
}
