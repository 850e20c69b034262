//! Per-request cost through the split queue and the loopback device, with
//! the DMA ops behind static dispatch (`SplitQueue<Direct>`, the "direct
//! path") and dynamic dispatch (`SplitQueue<dyn DmaOps>`, "the DMA API"),
//! next to the limit measured in the same run: an eventfd ping-pong between
//! two threads (one kick and one interrupt, which every batch pays).
//! `request_inline` runs the device side in the same thread, so the CPU cost
//! of the driver (and its DMA ops) is not hidden behind wake-ups.
//!
//! `cargo bench -p iopath-virtio --bench queue -- --warm-up-time 1 --measurement-time 3`

// criterion's macros generate undocumented items.
#![allow(missing_docs)]

use std::hint::black_box;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use iopath_dma::{Bounce, Direct, DmaOps, Iommu};
use iopath_heap::{Buffer, Heap, HugePages, MemfdHeap};
use iopath_virtio::driver;
use iopath_virtio::features::{self, VIRTIO_F_EVENT_IDX, VIRTIO_F_INDIRECT_DESC};
use iopath_virtio::transport::loopback::{Echo, Loopback};
use iopath_virtio::{share_memory, QueueFeatures, Seg, SplitQueue, Transport};
use rustix::event::{eventfd, poll, EventfdFlags, PollFd, PollFlags};
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, FileOffset, GuestAddress, GuestMemoryMmap};

/// Requests per kick.
const BATCH: usize = 32;
/// Bytes each way per request.
const REQ: usize = 4096;

struct Rig<O: DmaOps + ?Sized> {
    dev: Loopback,
    q: SplitQueue<O>,
    bufs: Vec<(Buffer, Buffer)>,
}

fn rig<O: DmaOps + ?Sized>(ops: Arc<O>) -> Rig<O> {
    let dev = Loopback::new(Echo::default()).unwrap();
    let negotiated = driver::negotiate(
        &dev,
        VIRTIO_F_EVENT_IDX | VIRTIO_F_INDIRECT_DESC | features::VIRTIO_F_ACCESS_PLATFORM,
        0,
    )
    .unwrap();
    let q = SplitQueue::new(ops.clone(), 0, 128, QueueFeatures::from_bits(negotiated)).unwrap();
    dev.setup_queue(0, &q.config()).unwrap();
    let heap = MemfdHeap::new(HugePages::None);
    let bufs: Vec<_> = (0..BATCH)
        .map(|_| {
            let (a, b) = (heap.alloc(REQ).unwrap(), heap.alloc(REQ).unwrap());
            a.fill(0, REQ, 0x11).unwrap();
            ops.register(&a).unwrap();
            ops.register(&b).unwrap();
            (a, b)
        })
        .collect();
    share_memory(&dev, &*ops).unwrap();
    driver::driver_ok(&dev).unwrap();
    Rig { dev, q, bufs }
}

fn batch<O: DmaOps + ?Sized>(r: &mut Rig<O>) {
    for (i, (a, b)) in r.bufs.iter().enumerate() {
        r.q.add(&[Seg::buf(a, 0, REQ)], &[Seg::buf(b, 0, REQ)], i as u64)
            .unwrap();
    }
    if r.q.should_notify() {
        r.dev.notify(0).unwrap();
    }
    let mut got = 0;
    while got < BATCH {
        match r.q.pop_used().unwrap() {
            Some(c) => {
                assert_eq!(c.len as usize, REQ);
                got += 1;
            }
            None => {
                if r.q.enable_interrupts() {
                    r.dev
                        .wait_interrupt(0, Some(Duration::from_secs(10)))
                        .unwrap();
                }
            }
        }
    }
}

/// Driver queue and a device queue (rust-vmm `virtio-queue` over the
/// device's own mappings of the regions) in one thread: the CPU cost of a
/// request on both sides, with no thread wake-ups to hide it.
struct Inline<O: DmaOps + ?Sized> {
    q: SplitQueue<O>,
    dq: Queue,
    mem: GuestMemoryMmap,
    bufs: Vec<(Buffer, Buffer)>,
    tmp: Vec<u8>,
}

fn inline<O: DmaOps + ?Sized>(ops: Arc<O>) -> Inline<O> {
    let q = SplitQueue::new(
        ops.clone(),
        0,
        128,
        QueueFeatures {
            event_idx: true,
            indirect: true,
        },
    )
    .unwrap();
    let heap = MemfdHeap::new(HugePages::None);
    let bufs: Vec<_> = (0..BATCH)
        .map(|_| {
            let (a, b) = (heap.alloc(REQ).unwrap(), heap.alloc(REQ).unwrap());
            a.fill(0, REQ, 0x22).unwrap();
            ops.register(&a).unwrap();
            ops.register(&b).unwrap();
            (a, b)
        })
        .collect();
    let mut regions = ops.regions();
    regions.sort_by_key(|r| r.gpa);
    let mem = GuestMemoryMmap::from_ranges_with_files(regions.iter().map(|r| {
        let fd = r.buffer.fd().try_clone_to_owned().unwrap();
        (
            GuestAddress(r.gpa),
            r.len(),
            Some(FileOffset::new(std::fs::File::from(fd), 0)),
        )
    }))
    .unwrap();
    let cfg = q.config();
    let mut dq = Queue::new(128).unwrap();
    dq.try_set_size(cfg.size).unwrap();
    dq.try_set_desc_table_address(GuestAddress(cfg.desc))
        .unwrap();
    dq.try_set_avail_ring_address(GuestAddress(cfg.avail))
        .unwrap();
    dq.try_set_used_ring_address(GuestAddress(cfg.used))
        .unwrap();
    dq.set_event_idx(true);
    dq.set_ready(true);
    Inline {
        q,
        dq,
        mem,
        bufs,
        tmp: vec![0; REQ],
    }
}

fn inline_batch<O: DmaOps + ?Sized>(r: &mut Inline<O>) {
    for (i, (a, b)) in r.bufs.iter().enumerate() {
        r.q.add(&[Seg::buf(a, 0, REQ)], &[Seg::buf(b, 0, REQ)], i as u64)
            .unwrap();
    }
    black_box(r.q.should_notify());
    // Device side: echo each request.
    while let Some(chain) = r.dq.pop_descriptor_chain(&r.mem) {
        let head = chain.head_index();
        let mut n = 0;
        for d in chain {
            if d.is_write_only() {
                r.mem.write_slice(&r.tmp[..n], d.addr()).unwrap();
            } else {
                n = d.len() as usize;
                r.mem.read_slice(&mut r.tmp[..n], d.addr()).unwrap();
            }
        }
        r.dq.add_used(&r.mem, head, n as u32).unwrap();
    }
    black_box(r.dq.needs_notification(&r.mem).unwrap());
    let mut got = 0;
    while let Some(c) = r.q.pop_used().unwrap() {
        assert_eq!(c.len as usize, REQ);
        got += 1;
    }
    assert_eq!(got, BATCH);
}

fn inline_requests(c: &mut Criterion) {
    let mut g = c.benchmark_group("request_inline");
    g.throughput(Throughput::Elements(BATCH as u64));
    let mut r = inline(Arc::new(Direct::new()));
    g.bench_function("direct/static", |b| b.iter(|| inline_batch(&mut r)));
    drop(r);
    let ops: Arc<dyn DmaOps> = Arc::new(Direct::new());
    let mut r = inline(ops);
    g.bench_function("direct/dyn", |b| b.iter(|| inline_batch(&mut r)));
    drop(r);
    let mut r = inline(Arc::new(Bounce::new(1 << 20, 2048).unwrap()));
    g.bench_function("bounce/static", |b| b.iter(|| inline_batch(&mut r)));
    drop(r);
    let ops: Arc<dyn DmaOps> = Arc::new(Bounce::new(1 << 20, 2048).unwrap());
    let mut r = inline(ops);
    g.bench_function("bounce/dyn", |b| b.iter(|| inline_batch(&mut r)));
    drop(r);
    g.finish();
}

fn wait_read(fd: &OwnedFd) {
    let mut fds = [PollFd::new(fd, PollFlags::IN)];
    poll(&mut fds, None).unwrap();
    let mut b = [0u8; 8];
    rustix::io::read(fd, &mut b).unwrap();
}

fn requests(c: &mut Criterion) {
    let mut g = c.benchmark_group("request");
    g.throughput(Throughput::Elements(BATCH as u64));

    // The limit: one kick + one interrupt between two threads.
    {
        let ping = Arc::new(eventfd(0, EventfdFlags::empty()).unwrap());
        let pong = Arc::new(eventfd(0, EventfdFlags::empty()).unwrap());
        let (p2, q2) = (ping.clone(), pong.clone());
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s2 = stop.clone();
        let peer = std::thread::spawn(move || loop {
            wait_read(&p2);
            if s2.load(std::sync::atomic::Ordering::Acquire) {
                return;
            }
            rustix::io::write(&*q2, &1u64.to_ne_bytes()).unwrap();
        });
        g.bench_function("eventfd_round_trip_per_batch", |b| {
            b.iter(|| {
                rustix::io::write(&*ping, &1u64.to_ne_bytes()).unwrap();
                wait_read(&pong);
            })
        });
        stop.store(true, std::sync::atomic::Ordering::Release);
        rustix::io::write(&*ping, &1u64.to_ne_bytes()).unwrap();
        peer.join().unwrap();
    }

    let mut r = rig(Arc::new(Direct::new()));
    g.bench_function("direct/static", |b| b.iter(|| batch(&mut r)));
    drop(r);
    let ops: Arc<dyn DmaOps> = Arc::new(Direct::new());
    let mut r = rig(ops);
    g.bench_function("direct/dyn", |b| b.iter(|| batch(&mut r)));
    drop(r);
    let mut r = rig(Arc::new(Iommu::new()));
    g.bench_function("iommu/static", |b| b.iter(|| batch(&mut r)));
    drop(r);
    let ops: Arc<dyn DmaOps> = Arc::new(Iommu::new());
    let mut r = rig(ops);
    g.bench_function("iommu/dyn", |b| b.iter(|| batch(&mut r)));
    drop(r);
    let mut r = rig(Arc::new(Bounce::new(1 << 20, 2048).unwrap()));
    g.bench_function("bounce/static", |b| b.iter(|| batch(&mut r)));
    drop(r);
    let ops: Arc<dyn DmaOps> = Arc::new(Bounce::new(1 << 20, 2048).unwrap());
    let mut r = rig(ops);
    g.bench_function("bounce/dyn", |b| b.iter(|| batch(&mut r)));
    drop(r);
    g.finish();
}

criterion_group!(benches, requests, inline_requests);
criterion_main!(benches);
