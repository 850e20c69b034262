//! The virtio-blk driver against a real peer: `qemu-storage-daemon
//! --export type=vhost-user-blk`. Every DMA mode the peer supports writes
//! and reads back both patterns with several requests in flight; the image
//! file seen from the host must then hold exactly what was written.
//!
//! qemu-storage-daemon does not offer `VIRTIO_F_ACCESS_PLATFORM` (no IOTLB
//! support in its vhost-user-blk export), so the platform policy refuses
//! IOMMU ops forced on it and a protected platform, and gives direct ops on
//! an IOMMU platform; the tests check those exact outcomes.

mod common;

use common::{alloc, connect, driver, qsd, seq, Mode};
use iopath_blk::{BlkDriver, BlkError, DriverOptions};
use iopath_dma::DmaOps;
use iopath_virtio::features::VIRTIO_F_ACCESS_PLATFORM;
use iopath_virtio::{Platform, Policy, PolicyError};

const IMAGE: u64 = 24 << 20;

fn write_read_verify(mode: Mode, pattern: u8, queues: u16) {
    let Some(peer) = qsd(IMAGE, queues) else {
        return;
    };
    common::write_read_verify(&peer.socket, &peer.image, IMAGE, mode, pattern, queues);
}

#[test]
fn direct_dyn_writes_zero_and_seq() {
    write_read_verify(Mode::Direct, 0, 1);
    write_read_verify(Mode::Direct, 1, 1);
}

#[test]
fn direct_static_writes_zero_and_seq() {
    write_read_verify(Mode::DirectStatic, 0, 1);
    write_read_verify(Mode::DirectStatic, 1, 1);
}

#[test]
fn bounce_writes_zero_and_seq() {
    write_read_verify(Mode::Bounce, 0, 1);
    write_read_verify(Mode::Bounce, 1, 1);
}

#[test]
fn two_queues_carry_requests() {
    write_read_verify(Mode::Direct, 1, 2);
}

#[test]
fn iommu_mode_is_refused_by_the_policy_before_negotiation() {
    let Some(peer) = qsd(IMAGE, 1) else { return };
    let bufs = [alloc(1 << 20)];
    let err = driver(
        Mode::Iommu,
        connect(&peer.socket),
        &bufs,
        &DriverOptions::default(),
    )
    .err()
    .expect("qemu-storage-daemon has no IOTLB");
    match err {
        BlkError::Policy(PolicyError::IommuNeedsAccessPlatform) => {}
        other => panic!("unexpected error {other:?}"),
    }
    // The offer the policy looked at lacks the bit indeed.
    let t = connect(&peer.socket);
    assert_eq!(t.device_features().unwrap() & VIRTIO_F_ACCESS_PLATFORM, 0);
}

#[test]
fn the_platform_policy_against_a_device_without_access_platform() {
    let Some(peer) = qsd(IMAGE, 1) else { return };
    let buf = alloc(1 << 20);
    let opts = DriverOptions::default();
    // An IOMMU platform: the device bypasses it, so direct ops.
    let mut drv = BlkDriver::<dyn DmaOps>::new(
        connect(&peer.socket),
        &Policy::new(Platform::Iommu),
        &opts,
        std::slice::from_ref(&buf),
    )
    .unwrap();
    assert_eq!(drv.ops().name(), "direct");
    assert_eq!(drv.features() & VIRTIO_F_ACCESS_PLATFORM, 0);
    buf.write_at(0, &seq(0, 1 << 20)).unwrap();
    drv.write(0, &buf, 0, 1 << 20).unwrap();
    drv.flush().unwrap();
    drop(drv);
    assert!(peer.image_bytes()[..1 << 20] == seq(0, 1 << 20)[..]);

    // A protected platform refuses it.
    match BlkDriver::<dyn DmaOps>::new(
        connect(&peer.socket),
        &Policy::new(Platform::Protected),
        &opts,
        &[],
    ) {
        Err(BlkError::Policy(PolicyError::ProtectedNeedsAccessPlatform)) => {}
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn flushed_writes_survive_sigkill_of_the_back_end() {
    let Some(mut peer) = qsd(IMAGE, 1) else {
        return;
    };
    let len = 4 << 20;
    let buf = alloc(len);
    buf.write_at(0, &seq(8 << 20, len)).unwrap();
    let mut drv = driver(
        Mode::Direct,
        connect(&peer.socket),
        std::slice::from_ref(&buf),
        &DriverOptions::default(),
    )
    .unwrap();
    drv.write(8 << 20, &buf, 0, len).unwrap();
    drv.flush().unwrap();
    peer.kill();
    let img = peer.image_bytes();
    assert!(img[8 << 20..(8 << 20) + len] == seq(8 << 20, len)[..]);
    // The driver notices the dead back end at once (no 30 s timeout).
    let t0 = std::time::Instant::now();
    let err = drv.write(0, &buf, 0, len).unwrap_err();
    assert!(
        matches!(err, BlkError::Virtio(iopath_virtio::Error::Closed)),
        "unexpected {err:?}"
    );
    assert!(t0.elapsed() < std::time::Duration::from_secs(5));
}

#[test]
fn a_back_end_that_stops_answering_is_a_timeout() {
    let Some(peer) = qsd(IMAGE, 1) else { return };
    let buf = alloc(1 << 20);
    let opts = DriverOptions {
        timeout: std::time::Duration::from_millis(500),
        ..DriverOptions::default()
    };
    let mut drv = driver(
        Mode::Direct,
        connect(&peer.socket),
        std::slice::from_ref(&buf),
        &opts,
    )
    .unwrap();
    drv.write(0, &buf, 0, 1 << 20).unwrap();
    peer.stop();
    let err = drv.write(0, &buf, 0, 1 << 20).unwrap_err();
    peer.signal(rustix::process::Signal::CONT);
    assert!(
        matches!(err, BlkError::Timeout { queue: 0, .. }),
        "unexpected {err:?}"
    );
}
