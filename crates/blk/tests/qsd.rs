//! The virtio-blk driver against a real peer: `qemu-storage-daemon
//! --export type=vhost-user-blk`. Every DMA mode the peer supports writes
//! and reads back both patterns with several requests in flight; the image
//! file seen from the host must then hold exactly what was written.
//!
//! qemu-storage-daemon does not offer `VIRTIO_F_ACCESS_PLATFORM` (no IOTLB
//! support in its vhost-user-blk export), so the IOMMU mode is refused at
//! feature negotiation; the test checks that exact refusal.

mod common;

use common::{alloc, connect, driver, qsd, seq, Mode};
use iopath_blk::{BlkError, DriverOptions, Request};
use iopath_virtio::features::VIRTIO_F_ACCESS_PLATFORM;

const IMAGE: u64 = 24 << 20;

/// Writes `total` bytes from `dev_off` in `bs` blocks with `depth` in flight
/// over every queue, `pattern` 0 = zeros (after an 0xa5 fill), 1 = seq.
fn write_read_verify(mode: Mode, pattern: u8, queues: u16) {
    let Some(peer) = qsd(IMAGE, queues) else {
        return;
    };
    let (bs, depth, dev_off, total) = (1usize << 20, 4usize, 1u64 << 20, 12usize << 20);
    let bufs: Vec<_> = (0..depth).map(|_| alloc(bs)).collect();
    let opts = DriverOptions {
        queues,
        ..DriverOptions::default()
    };
    // Pre-fill the range with 0xa5 so a zero pattern that never arrives
    // shows; read back into a buffer that starts dirty.
    let fill = alloc(total);
    fill.fill(0, total, 0xa5).unwrap();
    let back = alloc(total);
    back.fill(0, total, 0x5a).unwrap();
    let all = [bufs.clone(), vec![fill.clone(), back.clone()]].concat();
    let mut drv = driver(mode, connect(&peer.socket), &all, &opts).unwrap();
    assert_eq!(drv.num_queues(), usize::from(queues));
    drv.write(dev_off, &fill, 0, total).unwrap();

    let expect = |i: usize| -> Vec<u8> {
        if pattern == 1 {
            seq(dev_off + (i * bs) as u64, bs)
        } else {
            vec![0u8; bs]
        }
    };
    // Submit every block, keeping `depth` in flight, spread over the queues.
    let blocks = total / bs;
    let mut next = 0;
    let mut in_flight = vec![None::<usize>; depth];
    let mut done = 0;
    while done < blocks {
        for (slot, busy) in in_flight.iter_mut().enumerate() {
            if busy.is_none() && next < blocks {
                bufs[slot].write_at(0, &expect(next)).unwrap();
                let q = next % drv.num_queues();
                drv.submit(
                    q,
                    Request::Write {
                        offset: dev_off + (next * bs) as u64,
                        buf: &bufs[slot],
                        buf_offset: 0,
                        len: bs,
                    },
                    slot as u64,
                )
                .unwrap();
                *busy = Some(q);
                next += 1;
            }
        }
        // Complete one request on the queue of the oldest busy slot.
        let q = in_flight.iter().flatten().next().copied().unwrap();
        let d = drv.complete(q).unwrap();
        d.result.unwrap();
        in_flight[d.tag as usize] = None;
        done += 1;
    }
    drv.flush().unwrap();
    assert_eq!(drv.live_mappings(), 0, "every mapping is gone");

    // Read back through the driver.
    drv.read(dev_off, &back, 0, total).unwrap();
    let mut got = vec![0u8; total];
    back.read_at(0, &mut got).unwrap();
    for i in 0..blocks {
        assert!(
            got[i * bs..(i + 1) * bs] == expect(i)[..],
            "{mode:?}: block {i} read back wrong"
        );
    }
    drop(drv);

    // The host's view of the image: untouched before, the data, untouched after.
    let img = peer.image_bytes();
    assert_eq!(img.len() as u64, IMAGE);
    assert!(
        img[..dev_off as usize].iter().all(|&b| b == 0),
        "{mode:?}: bytes before the range changed"
    );
    for i in 0..blocks {
        let at = dev_off as usize + i * bs;
        assert!(
            img[at..at + bs] == expect(i)[..],
            "{mode:?}: block {i} wrong in the image file"
        );
    }
    assert!(
        img[dev_off as usize + total..].iter().all(|&b| b == 0),
        "{mode:?}: bytes after the range changed"
    );
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
fn iommu_mode_is_refused_by_qemu_storage_daemon_at_negotiation() {
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
        BlkError::Virtio(iopath_virtio::Error::FeaturesRejected { missing, .. }) => {
            assert_eq!(missing, VIRTIO_F_ACCESS_PLATFORM)
        }
        other => panic!("unexpected error {other:?}"),
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
