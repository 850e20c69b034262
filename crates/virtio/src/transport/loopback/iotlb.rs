//! The loopback's IOMMU: the IOTLB the driver's IOMMU ops fill through
//! [`Sink`], consulted by the device through [`SharedIommu`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard};

use iopath_dma::{IotlbRecord, IotlbSink};
use iopath_sys::{read_lock, write_lock};
use vm_memory::iommu::{Iommu, IotlbIterator, IovaRange};
use vm_memory::{GuestAddress, Iotlb, Permissions};

/// The loopback's IOMMU: an IOTLB filled only by the driver's records;
/// misses are refused, never resolved.
#[derive(Debug, Default)]
pub(super) struct LoopIotlb {
    tlb: RwLock<Iotlb>,
}

impl LoopIotlb {
    pub(super) fn read(&self) -> RwLockReadGuard<'_, Iotlb> {
        read_lock(&self.tlb)
    }

    pub(super) fn clear(&self) {
        write_lock(&self.tlb).invalidate_all();
    }
}

/// [`Iommu`] over a shared [`LoopIotlb`] (IommuMemory owns its IOMMU; the
/// sink must reach the same table).
#[derive(Debug, Clone)]
pub(super) struct SharedIommu(pub(super) Arc<LoopIotlb>);

impl Iommu for SharedIommu {
    type IotlbGuard<'a> = RwLockReadGuard<'a, Iotlb>;

    fn translate(
        &self,
        iova: GuestAddress,
        length: usize,
        access: Permissions,
    ) -> std::result::Result<IotlbIterator<Self::IotlbGuard<'_>>, vm_memory::iommu::Error> {
        // The device's addresses are untrusted: reject wrapping ranges before
        // the IOTLB does arithmetic on them.
        if iova.0.checked_add(length as u64).is_none() {
            return Err(vm_memory::iommu::Error::CannotResolve {
                iova_range: IovaRange { base: iova, length },
                reason: "range wraps the address space".into(),
            });
        }
        Iotlb::lookup(self.0.read(), iova, length, access).map_err(|fails| {
            vm_memory::iommu::Error::CannotResolve {
                iova_range: IovaRange { base: iova, length },
                reason: format!(
                    "{} unmapped, {} without permission",
                    fails.misses.len(),
                    fails.access_fails.len()
                ),
            }
        })
    }
}

/// The sink the driver's IOMMU ops send records to.
#[derive(Debug)]
pub(super) struct Sink {
    pub(super) iotlb: Arc<LoopIotlb>,
    pub(super) enabled: Arc<AtomicBool>,
    pub(super) records: AtomicU64,
}

impl IotlbSink for Sink {
    fn send(
        &self,
        record: IotlbRecord,
    ) -> std::result::Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let mut tlb = write_lock(&self.iotlb.tlb);
        match record {
            IotlbRecord::Update {
                iova,
                size,
                uaddr,
                perm,
            } => {
                let perm = crate::device::permissions(perm);
                let size = usize::try_from(size)?;
                if iova.checked_add(size as u64).is_none() {
                    return Err("IOTLB update wraps the address space".into());
                }
                tlb.set_mapping(GuestAddress(iova), GuestAddress(uaddr), size, perm)?;
            }
            IotlbRecord::Invalidate { iova, size } => {
                if iova.checked_add(size).is_none() {
                    return Err("IOTLB invalidate wraps the address space".into());
                }
                tlb.invalidate_mapping(GuestAddress(iova), usize::try_from(size)?);
            }
        }
        self.enabled.store(true, Ordering::Release);
        self.records.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}
