//! Writing a resource table: where a new shared memory's table, vrings and
//! buffers go. Each layout is checked by parsing the table it writes.

use super::{
    ResourceTable, RscError, RSC_VDEV, TABLE_HDR_LEN, VDEV_LEN, VIRTIO_ID_RPMSG, VRING_LEN,
};
use crate::vring::VringPlacement;
use crate::wire::VIRTIO_RPMSG_F_NS;

/// A shared-memory layout to create: where the table, vrings and buffers go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShmLayout {
    /// Shared-memory size.
    pub shm_size: u64,
    /// Entries per vring.
    pub num: u32,
    /// Used-ring alignment.
    pub align: u32,
    /// vq0 address.
    pub vring0: u32,
    /// vq1 address.
    pub vring1: u32,
    /// Features offered (bit numbers as in the `dfeatures` word).
    pub dfeatures: u32,
}

impl ShmLayout {
    /// OpenAMP's Linux demo: 0x80000 bytes, table at 0, vrings of 256 at
    /// 0x4000 and 0x8000 with alignment 0x1000, buffers from 0x10000, name
    /// service offered.
    pub fn openamp_demo() -> Self {
        ShmLayout {
            shm_size: 0x80000,
            num: 256,
            align: 0x1000,
            vring0: 0x4000,
            vring1: 0x8000,
            dfeatures: 1 << VIRTIO_RPMSG_F_NS,
        }
    }

    /// The same principle for `shm_size` bytes and rings of `num` entries:
    /// table at 0, vq0 at 0x4000, vq1 at the next 0x4000 boundary after vq0,
    /// buffers from the next 0x10000 boundary.
    ///
    /// # Errors
    /// [`RscError`] if the rings or the buffers do not fit.
    pub fn for_size(shm_size: u64, num: u32) -> Result<Self, RscError> {
        let align = 0x1000u32;
        let size = VringPlacement::ring_size(num, u64::from(align))
            .ok_or(RscError::VringNum { index: 0, num })?;
        let stride = size.div_ceil(0x4000) * 0x4000;
        let vring1 = 0x4000 + stride;
        let l = ShmLayout {
            shm_size,
            num,
            align,
            vring0: 0x4000,
            vring1: u32::try_from(vring1).map_err(|_| RscError::VringOutside {
                index: 1,
                da: vring1,
                size,
                shm_len: shm_size,
            })?,
            dfeatures: 1 << VIRTIO_RPMSG_F_NS,
        };
        // Validate by building and parsing, so one set of rules applies.
        let t = ResourceTable::parse(&l.table(), 0, shm_size)?;
        t.buffer_pool(shm_size)?;
        Ok(l)
    }

    /// The resource table bytes for this layout (one rpmsg vdev, two vrings
    /// with notify ids 1 and 2, status 0, no config space).
    pub fn table(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(TABLE_HDR_LEN + 4 + VDEV_LEN + 2 * VRING_LEN);
        let mut put = |v: u32| b.extend_from_slice(&v.to_le_bytes());
        put(1); // ver
        put(1); // num
        put(0);
        put(0); // reserved
        put((TABLE_HDR_LEN + 4) as u32); // offset[0]
        put(RSC_VDEV);
        put(VIRTIO_ID_RPMSG);
        put(0); // notifyid
        put(self.dfeatures);
        put(0); // gfeatures
        put(0); // config_len
        put(2u32 << 8); // status 0, num_of_vrings 2, reserved 0 0
        for (i, da) in [self.vring0, self.vring1].into_iter().enumerate() {
            put(da);
            put(self.align);
            put(self.num);
            put(i as u32 + 1);
            put(0);
        }
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bigger_layouts() {
        let l = ShmLayout::for_size(0x200000, 1024).unwrap();
        let t = ResourceTable::parse(&l.table(), 0, l.shm_size).unwrap();
        let (start, size) = t.buffer_pool(l.shm_size).unwrap();
        assert_eq!(size, 2 * 1024 * 512);
        assert!(start >= u64::from(l.vring1));
        assert!(ShmLayout::for_size(0x80000, 1024).is_err());
    }
}
