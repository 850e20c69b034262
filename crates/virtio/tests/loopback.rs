//! A loopback device in a second thread (rust-vmm `virtio-queue` over its
//! own mappings of the shared fds) echoes requests through a split queue,
//! for every DMA ops implementation, with dynamic and static dispatch; the
//! bytes must match.

use std::sync::Arc;
use std::time::Duration;

use iopath_dma::testing::AlwaysBounce;
use iopath_dma::{Bounce, Direct, DmaOps, Iommu};
use iopath_heap::{Buffer, Heap, HugePages, MemfdHeap};
use iopath_virtio::driver;
use iopath_virtio::features::{self, VIRTIO_F_EVENT_IDX, VIRTIO_F_INDIRECT_DESC};
use iopath_virtio::transport::loopback::{Echo, Loopback};
use iopath_virtio::{share_memory, Completion, Policy, QueueFeatures, Seg, SplitQueue, Transport};

const QSIZE: u16 = 64;

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

struct Req {
    outs: Vec<Buffer>,
    ins: Vec<Buffer>,
    data: Vec<u8>,
}

/// Echoes `n` requests of varied shapes, up to 8 in flight, and checks every
/// byte. Returns the loopback for the caller's checks.
fn echo<O: DmaOps + ?Sized>(ops: Arc<O>, driver_features: u64, n: usize) -> Loopback {
    let dev = Loopback::new(Echo::default()).unwrap();
    let negotiated = driver::negotiate(&dev, driver_features, 0).unwrap();
    assert_eq!(
        negotiated & !features::VIRTIO_F_VERSION_1,
        driver_features & Echo::default().features
    );
    let mut q =
        SplitQueue::new(ops.clone(), 0, QSIZE, QueueFeatures::from_bits(negotiated)).unwrap();
    dev.setup_queue(0, &q.config()).unwrap();

    let heap = MemfdHeap::new(HugePages::None);
    // Buffers registered up front (Direct and Iommu share them as regions).
    let reqs: Vec<Req> = (0..n)
        .map(|i| {
            let nout = 1 + i % 3;
            let nin = 1 + (i / 3) % 3;
            let total = 1 + (i * 7919) % 20_000;
            let data = pattern(total, i as u64);
            let outs: Vec<Buffer> = (0..nout).map(|_| heap.alloc(20 << 10).unwrap()).collect();
            let ins: Vec<Buffer> = (0..nin).map(|_| heap.alloc(20 << 10).unwrap()).collect();
            for b in outs.iter().chain(&ins) {
                ops.register(b).unwrap();
            }
            Req { outs, ins, data }
        })
        .collect();
    share_memory(&dev, &*ops).unwrap();
    driver::driver_ok(&dev).unwrap();

    let mut next = 0;
    let mut done = 0;
    let mut in_flight = 0;
    while done < n {
        while next < n && in_flight < 8 {
            let r = &reqs[next];
            // Split the request's bytes over its out buffers, and its
            // response space over its in buffers (same total).
            let len = r.data.len();
            let chunk = len.div_ceil(r.outs.len());
            let mut outs = Vec::new();
            for (k, b) in r.outs.iter().enumerate() {
                let start = (k * chunk).min(len);
                let end = ((k + 1) * chunk).min(len);
                if end > start {
                    b.write_at(0, &r.data[start..end]).unwrap();
                    outs.push(Seg::buf(b, 0, end - start));
                }
            }
            let ichunk = len.div_ceil(r.ins.len());
            let mut ins = Vec::new();
            for (k, b) in r.ins.iter().enumerate() {
                let start = (k * ichunk).min(len);
                let end = ((k + 1) * ichunk).min(len);
                if end > start {
                    b.fill(0, end - start, 0).unwrap();
                    ins.push(Seg::buf(b, 0, end - start));
                }
            }
            q.add(&outs, &ins, next as u64).unwrap();
            // While in flight the buffers are the device's.
            assert!(r.ins[0].write_at(0, b"x").is_err());
            next += 1;
            in_flight += 1;
        }
        if q.should_notify() {
            dev.notify(0).unwrap();
        }
        loop {
            match q.pop_used().unwrap() {
                Some(Completion { token, len }) => {
                    let r = &reqs[token as usize];
                    assert_eq!(len as usize, r.data.len(), "request {token}");
                    let mut got = Vec::new();
                    let ichunk = r.data.len().div_ceil(r.ins.len());
                    for (k, b) in r.ins.iter().enumerate() {
                        let start = (k * ichunk).min(r.data.len());
                        let end = ((k + 1) * ichunk).min(r.data.len());
                        let mut part = vec![0u8; end - start];
                        b.read_at(0, &mut part).unwrap();
                        got.extend(part);
                    }
                    assert!(got == r.data, "request {token}: echoed bytes differ");
                    done += 1;
                    in_flight -= 1;
                }
                None => {
                    if in_flight == 0 || next < n && in_flight < 8 {
                        break;
                    }
                    if q.enable_interrupts() {
                        assert!(
                            dev.wait_interrupt(0, Some(Duration::from_secs(10)))
                                .unwrap(),
                            "no interrupt within 10 s ({} requests served)",
                            dev.requests()
                        );
                    }
                }
            }
        }
    }
    assert_eq!(dev.device_errors(), 0);
    assert_eq!(q.in_flight(), 0);
    assert_eq!(q.num_free(), QSIZE);
    assert_eq!(ops.live_mappings(), 0, "mappings leaked");
    dev
}

const ALL: u64 = VIRTIO_F_EVENT_IDX | VIRTIO_F_INDIRECT_DESC | features::VIRTIO_F_ACCESS_PLATFORM;

#[test]
fn direct_static() {
    echo(Arc::new(Direct::new()), ALL, 200);
}

#[test]
fn direct_dyn() {
    let ops: Arc<dyn DmaOps> = Arc::new(Direct::new());
    echo(ops, ALL, 200);
}

#[test]
fn iommu() {
    let ops: Arc<dyn DmaOps> = Arc::new(Iommu::new());
    let dev = echo(ops, ALL, 200);
    assert!(
        dev.iotlb_records() > 400,
        "{} IOTLB records",
        dev.iotlb_records()
    );
}

#[test]
fn bounce() {
    let ops: Arc<dyn DmaOps> = Arc::new(Bounce::new(1 << 20, 2048).unwrap());
    echo(ops, ALL, 200);
}

#[test]
fn always_bounce() {
    let ops: Arc<dyn DmaOps> = Arc::new(AlwaysBounce::new().unwrap());
    echo(ops, ALL, 200);
}

#[test]
fn without_event_idx_or_indirect() {
    echo(Arc::new(Direct::new()), 0, 100);
    echo(
        Arc::new(Iommu::new()),
        features::VIRTIO_F_ACCESS_PLATFORM,
        100,
    );
    echo(
        Arc::new(Bounce::new(1 << 20, 2048).unwrap()),
        VIRTIO_F_INDIRECT_DESC,
        100,
    );
}

#[test]
fn policy_picks_ops_per_platform() {
    for (platform, name) in [
        ("direct", "direct"),
        ("iommu", "iommu"),
        ("protected", "bounce"),
    ] {
        let ops = Policy::new(platform.parse().unwrap()).build(ALL).unwrap();
        assert_eq!(ops.name(), name);
        echo(ops, ALL, 30);
    }
}

/// Iommu ops without an enforcer cannot be used on a transport.
#[test]
fn iotlb_needs_an_enforcer_and_unmapped_iovas_fail_on_the_device() {
    let dev = Loopback::new(Echo::default()).unwrap();
    let negotiated = driver::negotiate(&dev, ALL, 0).unwrap();
    let ops = Arc::new(Iommu::new());
    let mut q = SplitQueue::new(ops.clone(), 0, 8, QueueFeatures::from_bits(negotiated)).unwrap();
    dev.setup_queue(0, &q.config()).unwrap();
    share_memory(&dev, &*ops).unwrap();
    driver::driver_ok(&dev).unwrap();
    // A caller-made mapping that is unmapped before the device sees it: the
    // device's IOTLB refuses it, the request completes with length 0.
    let heap = MemfdHeap::new(HugePages::None);
    let (a, b) = (heap.alloc(4096).unwrap(), heap.alloc(4096).unwrap());
    ops.register(&a).unwrap();
    ops.register(&b).unwrap();
    share_memory(&dev, &*ops).unwrap();
    let m = ops
        .map(
            &a,
            0,
            16,
            iopath_dma::Direction::ToDevice,
            iopath_dma::MapWait::Fail,
        )
        .unwrap();
    ops.unmap(&m).unwrap();
    q.add(&[Seg::Mapped(&m)], &[Seg::buf(&b, 0, 16)], 1)
        .unwrap();
    dev.notify(0).unwrap();
    let c = loop {
        if let Some(c) = q.pop_used().unwrap() {
            break c;
        }
        dev.wait_interrupt(0, Some(Duration::from_secs(10)))
            .unwrap();
    };
    assert_eq!(c, Completion { token: 1, len: 0 });
    assert_eq!(dev.device_errors(), 1);
}
