//! Writing a resource table: where a new shared memory's table, vrings and
//! buffers go. Each layout is checked by parsing the table it writes.

use super::{
    ResourceTable, RscError, RSC_VDEV, TABLE_HDR_LEN, VDEV_LEN, VIRTIO_ID_RPMSG, VRING_LEN,
};
use crate::bufsz::{BufSizeError, BufSizes, Convention};
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
    /// Buffer sizes offered, and the convention that says so (its feature
    /// bit and config space); `None`: no offer, 512 bytes both ways, the
    /// table as before sizes could be negotiated.
    pub buf_sizes: Option<(Convention, BufSizes)>,
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
            buf_sizes: None,
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
            buf_sizes: None,
        };
        // Validate by building and parsing, so one set of rules applies.
        let t = ResourceTable::parse(&l.table(), 0, shm_size)?;
        t.buffer_pool(shm_size)?;
        Ok(l)
    }

    /// This layout offering `sizes` under `convention` (under
    /// [`Convention::Fixed`] the table is as without an offer; only the
    /// pool is checked to hold the buffers).
    ///
    /// # Errors
    /// [`BufSizeError`] if a size cannot be offered or the buffers do not
    /// fit the shared memory.
    pub fn with_buf_sizes(
        self,
        convention: Convention,
        sizes: BufSizes,
    ) -> Result<Self, BufSizeError> {
        sizes.check_offer()?;
        let l = ShmLayout {
            buf_sizes: Some((convention, sizes)),
            ..self
        };
        let t = ResourceTable::parse(&l.table(), 0, l.shm_size)
            .expect("a layout that parsed still parses with a config space");
        t.buffer_pool_for(l.shm_size, sizes)?;
        Ok(l)
    }

    /// The smallest shared memory (a multiple of 64 KiB) that holds rings
    /// of `num` entries and their buffers of `sizes`, as
    /// [`ShmLayout::for_size`] places them.
    pub fn size_for(num: u32, sizes: BufSizes) -> Option<u64> {
        let ring = VringPlacement::ring_size(num, 0x1000)?;
        let stride = ring.div_ceil(0x4000) * 0x4000;
        let rings_end = 0x4000 + 2 * stride;
        let pool = rings_end.div_ceil(super::POOL_ALIGN) * super::POOL_ALIGN + super::BUF_OFFSET;
        let bufs = u64::from(num) * (u64::from(sizes.to_remote) + u64::from(sizes.to_host));
        Some((pool + bufs).div_ceil(super::POOL_ALIGN) * super::POOL_ALIGN)
    }

    /// The resource table bytes for this layout (one rpmsg vdev, two vrings
    /// with notify ids 1 and 2, status 0, and the buffer-size config space
    /// when sizes are offered; none otherwise).
    pub fn table(&self) -> Vec<u8> {
        let config = match self.buf_sizes {
            Some((c, sizes)) => c.config(sizes),
            None => Vec::new(),
        };
        let dfeatures = match self.buf_sizes {
            Some((c, _)) => self.dfeatures | c.bit().map_or(0, |b| 1 << b),
            None => self.dfeatures,
        };
        let mut b = Vec::with_capacity(TABLE_HDR_LEN + 4 + VDEV_LEN + 2 * VRING_LEN + config.len());
        let mut put = |v: u32| b.extend_from_slice(&v.to_le_bytes());
        put(1); // ver
        put(1); // num
        put(0);
        put(0); // reserved
        put((TABLE_HDR_LEN + 4) as u32); // offset[0]
        put(RSC_VDEV);
        put(VIRTIO_ID_RPMSG);
        put(0); // notifyid
        put(dfeatures);
        put(0); // gfeatures
        put(config.len() as u32); // config_len
        put(2u32 << 8); // status 0, num_of_vrings 2, reserved 0 0
        for (i, da) in [self.vring0, self.vring1].into_iter().enumerate() {
            put(da);
            put(self.align);
            put(self.num);
            put(i as u32 + 1);
            put(0);
        }
        b.extend_from_slice(&config);
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

    #[test]
    fn offered_sizes_are_in_the_table_and_the_pool() {
        let s = BufSizes {
            to_remote: 4096,
            to_host: 65536,
        };
        let size = ShmLayout::size_for(256, s).unwrap();
        let l = ShmLayout::for_size(size, 256)
            .unwrap()
            .with_buf_sizes(Convention::Linux, s)
            .unwrap();
        let b = l.table();
        assert_eq!(b.len(), 88 + 13);
        let t = ResourceTable::parse(&b, 0, size).unwrap();
        assert_eq!(t.vdev.dfeatures, 0b11);
        assert_eq!(t.vdev.config_len, 13);
        assert_eq!(Convention::Linux.parse(&t.vdev.config), Ok(s));
        let (start, need) = t.buffer_pool_for(size, s).unwrap();
        assert_eq!(need, 256 * (4096 + 65536));
        assert!(start + need <= size);
        // One buffer short of room: refused, naming the sizes.
        let e = ShmLayout::for_size(size - 0x10000, 256)
            .unwrap()
            .with_buf_sizes(Convention::Linux, s)
            .unwrap_err();
        assert!(e.to_string().contains("65536"), "{e}");
        // Without an offer the table is the one of before, byte for byte.
        assert_eq!(ShmLayout::openamp_demo().table().len(), 88);
    }
}
