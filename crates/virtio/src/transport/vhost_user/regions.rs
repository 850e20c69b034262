//! The memory table the front end shares: the `SET_MEM_TABLE` entry of a
//! region, the check that regions do not overlap, and the translation of a
//! device address to the front end's user address (for `SET_VRING_ADDR`).

use std::os::fd::AsRawFd;

use iopath_dma::SharedRegion;
use vhost::VhostUserMemoryRegionInfo;

use super::{Result, VhostUserError};

/// The `SET_MEM_TABLE` / `ADD_MEM_REG` entry of a region.
pub(super) fn region_info(r: &SharedRegion) -> VhostUserMemoryRegionInfo {
    VhostUserMemoryRegionInfo {
        guest_phys_addr: r.gpa,
        memory_size: r.len() as u64,
        userspace_addr: r.uaddr(),
        mmap_offset: 0,
        mmap_handle: r.buffer.fd().as_raw_fd(),
    }
}

/// Whether `addr..addr + len` lies inside the region's device addresses.
fn region_contains(r: &SharedRegion, addr: u64, len: u64) -> bool {
    addr >= r.gpa
        && addr
            .checked_add(len)
            .is_some_and(|end| end <= r.gpa.saturating_add(r.len() as u64))
}

/// The front end's user address of device addresses `device_addr..+len`.
pub(super) fn user_addr(regions: &[SharedRegion], device_addr: u64, len: u64) -> Result<u64> {
    regions
        .iter()
        .find(|r| region_contains(r, device_addr, len))
        .map(|r| r.uaddr() + (device_addr - r.gpa))
        .ok_or(VhostUserError::NotShared {
            addr: device_addr,
            len,
        })
}

/// Refuses empty, wrapping or overlapping regions.
pub(super) fn check_disjoint(regions: &[SharedRegion]) -> Result<()> {
    let mut sorted: Vec<_> = regions.iter().collect();
    sorted.sort_by_key(|r| r.gpa);
    let mut end = 0u64;
    for (i, r) in sorted.iter().enumerate() {
        let len = r.len() as u64;
        match r.gpa.checked_add(len) {
            Some(r_end) if len != 0 && (i == 0 || r.gpa >= end) => end = r_end,
            _ => return Err(VhostUserError::BadRegion { addr: r.gpa, len }),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use iopath_heap::{Heap, HugePages, MemfdHeap};

    fn region(len: usize, gpa: u64) -> SharedRegion {
        SharedRegion {
            buffer: MemfdHeap::new(HugePages::None).alloc(len).unwrap(),
            gpa,
        }
    }

    #[test]
    fn overlapping_regions_are_refused() {
        let a = region(4096, 0x1000);
        let b = region(8192, 0x1800);
        assert!(matches!(
            check_disjoint(&[a.clone(), b]),
            Err(VhostUserError::BadRegion { addr: 0x1800, .. })
        ));
        let c = region(4096, 0x2000);
        check_disjoint(&[c, a]).unwrap();
    }

    #[test]
    fn wrapping_region_is_refused() {
        let a = region(8192, u64::MAX - 4095);
        assert!(matches!(
            check_disjoint(&[a]),
            Err(VhostUserError::BadRegion { .. })
        ));
    }

    #[test]
    fn device_addresses_translate_to_user_addresses_inside_regions_only() {
        let a = region(8192, 0x10000);
        let ua = a.uaddr();
        let regions = [a];
        assert_eq!(user_addr(&regions, 0x10010, 16).unwrap(), ua + 0x10);
        assert_eq!(user_addr(&regions, 0x11000, 4096).unwrap(), ua + 0x1000);
        assert!(matches!(
            user_addr(&regions, 0x11001, 4096),
            Err(VhostUserError::NotShared { addr: 0x11001, .. })
        ));
        assert!(user_addr(&regions, u64::MAX - 1, 16).is_err());
    }
}
