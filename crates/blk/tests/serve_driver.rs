//! iopath's virtio-blk driver against iopath's own back end, `iopath blk
//! serve` in its own process: all four DMA modes (the back end offers
//! `ACCESS_PLATFORM` and enforces the IOTLB the IOMMU ops send), both
//! patterns, several requests in flight, two queues; the image file seen
//! from the host holds exactly what was written.

mod common;
mod frontend;

use common::{write_read_verify, Mode, MODES};
use frontend::Server;

const IMAGE: u64 = 24 << 20;

fn run(mode: Mode, pattern: u8, queues: u16) {
    let q = queues.to_string();
    let srv = Server::start(IMAGE, &["--queues", &q]);
    write_read_verify(&srv.socket, &srv.image, IMAGE, mode, pattern, queues);
}

#[test]
fn every_mode_writes_and_verifies_zero_and_seq() {
    for mode in MODES {
        run(mode, 0, 1);
        run(mode, 1, 1);
    }
}

#[test]
fn every_mode_over_two_queues() {
    for mode in MODES {
        run(mode, 1, 2);
    }
}

/// The platform policy against a back end that offers `ACCESS_PLATFORM`:
/// an IOMMU platform gets IOMMU ops, a protected one bounce ops (the
/// window mapped one to one in the back end's IOTLB); both move data.
#[test]
fn the_platform_policy_against_a_device_with_access_platform() {
    use iopath_blk::{BlkDriver, DriverOptions};
    use iopath_dma::DmaOps;
    use iopath_virtio::features::VIRTIO_F_ACCESS_PLATFORM;
    use iopath_virtio::{Platform, Policy};

    let srv = Server::start(IMAGE, &[]);
    for (i, (platform, ops)) in [
        (Platform::Iommu, "iommu"),
        (Platform::Protected, "bounce"),
        (Platform::Direct, "direct"),
    ]
    .into_iter()
    .enumerate()
    {
        let (off, len) = ((i as u64 + 1) << 20, 1usize << 20);
        let buf = common::alloc(len);
        let back = common::alloc(len);
        back.fill(0, len, 0x5a).unwrap();
        let mut drv = BlkDriver::<dyn DmaOps>::new(
            common::connect(&srv.socket),
            &Policy::new(platform),
            &DriverOptions::default(),
            &[buf.clone(), back.clone()],
        )
        .unwrap();
        assert_eq!(drv.ops().name(), ops, "{platform}");
        let translated = platform != Platform::Direct;
        assert_eq!(
            drv.features() & VIRTIO_F_ACCESS_PLATFORM != 0,
            translated,
            "{platform}"
        );
        buf.write_at(0, &common::seq(off, len)).unwrap();
        drv.write(off, &buf, 0, len).unwrap();
        drv.flush().unwrap();
        drv.read(off, &back, 0, len).unwrap();
        let mut got = vec![0; len];
        back.read_at(0, &mut got).unwrap();
        assert!(got == common::seq(off, len), "{platform}: read back");
        drop(drv);
        assert!(
            srv.image_bytes(off, len) == common::seq(off, len),
            "{platform}: image"
        );
    }
}
