//! Legacy split-ring layout (virtio 1.x spec 2.7.2 "Legacy Interfaces: A
//! Note on Virtqueue Layout"): descriptor table, then the available ring,
//! then — at the next `align` boundary — the used ring, all in one block at
//! a single device address. This is what remoteproc resource tables describe
//! with `{da, align, num}`.

/// Size of one descriptor.
pub const DESC_SIZE: u64 = 16;
/// Descriptor flag: the buffer continues in `next`.
pub const VRING_DESC_F_NEXT: u16 = 1;
/// Descriptor flag: the device writes this buffer.
pub const VRING_DESC_F_WRITE: u16 = 2;
/// Descriptor flag: the buffer is an indirect descriptor table.
pub const VRING_DESC_F_INDIRECT: u16 = 4;
/// Feature bit: `used_event`/`avail_event` notification suppression.
pub const VIRTIO_RING_F_EVENT_IDX: u32 = 29;
/// Feature bit: indirect descriptors.
pub const VIRTIO_RING_F_INDIRECT_DESC: u32 = 28;
/// Largest queue size the split ring allows.
pub const MAX_QUEUE_SIZE: u32 = 32768;

/// Where the three parts of a legacy vring live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VringLayout {
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
}

impl VringLayout {
    /// Computes the layout of a ring of `num` entries at `da` with the used
    /// ring aligned to `align` (a power of two). Returns `None` if `num` or
    /// `align` is not a power of two or the addresses overflow.
    pub fn new(da: u64, num: u32, align: u64) -> Option<Self> {
        if num == 0 || !num.is_power_of_two() || num > MAX_QUEUE_SIZE {
            return None;
        }
        if align == 0 || !align.is_power_of_two() {
            return None;
        }
        let n = u64::from(num);
        let avail = da.checked_add(n * DESC_SIZE)?;
        let avail_end = avail.checked_add(4 + 2 * n + 2)?;
        let used = avail_end.checked_add(align - 1)? & !(align - 1);
        let used_end = used.checked_add(4 + 8 * n + 2)?;
        Some(VringLayout {
            num: num as u16,
            desc: da,
            avail,
            used,
            size: used_end - da,
        })
    }

    /// Byte size of a legacy vring (the kernel's `vring_size()`).
    pub fn ring_size(num: u32, align: u64) -> Option<u64> {
        Self::new(0, num, align).map(|l| l.size)
    }

    /// Address of `used_event` (after the available ring entries).
    pub fn used_event(&self) -> u64 {
        self.avail + 4 + 2 * u64::from(self.num)
    }

    /// Address of `avail_event` (after the used ring entries).
    pub fn avail_event(&self) -> u64 {
        self.used + 4 + 8 * u64::from(self.num)
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
        let l = VringLayout::new(0x4000, 256, 0x1000).unwrap();
        assert_eq!(l.avail, 0x5000);
        assert_eq!(l.used, 0x6000);
        assert_eq!(l.size, 0x2806);
        assert_eq!(l.used_event(), 0x5204);
        assert_eq!(l.avail_event(), 0x6804);
        assert!(VringLayout::new(0, 3, 0x1000).is_none());
        assert!(VringLayout::new(0, 256, 0x1001).is_none());
        assert!(VringLayout::new(u64::MAX - 10, 256, 0x1000).is_none());
    }

    proptest! {
        #[test]
        fn layout_is_aligned_and_ordered(da in (0u64..1<<40).prop_map(|d| d & !15), shift in 0u32..16, ashift in 2u32..16) {
            let num = 1u32 << shift;
            let align = 1u64 << ashift;
            let l = VringLayout::new(da, num, align).unwrap();
            prop_assert_eq!(l.used % align, 0);
            prop_assert!(l.used >= l.used_event() + 2);
            prop_assert_eq!(l.avail, da + 16 * u64::from(num));
            prop_assert_eq!(l.end(), l.avail_event() + 2);
        }
    }
}
