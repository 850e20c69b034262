//! iopath-dma: the DMA API for iopath devices.
//!
//! Every buffer a driver gives a device goes through a `DmaOps`
//! implementation, modelled on the kernel's per-device map ops: direct,
//! IOMMU-translated (IOTLB records to the enforcer) or bounced through a small
//! shared window.
