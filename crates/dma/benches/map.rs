//! Cost of one map + unmap per DMA ops type and buffer size, next to a
//! plain memcpy of the same size (the floor for a bounce) measured in the
//! same run.
//!
//! `cargo bench -p iopath-dma --bench map -- --warm-up-time 1 --measurement-time 3`

// criterion's macros generate undocumented items.
#![allow(missing_docs)]

use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::{Arc, Mutex};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use iopath_dma::{Bounce, Direct, Direction, DmaOps, Iommu, IotlbRecord, IotlbSink, MapWait};
use iopath_heap::{Heap, HugePages, MemfdHeap};

/// An enforcer's table: what a back end does with each record.
#[derive(Debug, Default)]
struct Enforcer(Mutex<BTreeMap<u64, (u64, u64)>>);

impl IotlbSink for Enforcer {
    fn send(&self, r: IotlbRecord) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let mut t = self.0.lock().unwrap();
        match r {
            IotlbRecord::Update {
                iova, size, uaddr, ..
            } => {
                t.insert(iova, (size, uaddr));
            }
            IotlbRecord::Invalidate { iova, .. } => {
                t.remove(&iova);
            }
        }
        Ok(())
    }
}

/// One map + unmap of `size` bytes, generic so `&Direct` is static dispatch
/// and `&dyn DmaOps` dynamic.
fn one<O: DmaOps + ?Sized>(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    o: &O,
    buf: &iopath_heap::Buffer,
    size: usize,
    dir: Direction,
) {
    g.bench_with_input(BenchmarkId::new(name, size), &size, |b, &size| {
        b.iter(|| {
            let m = o.map(buf, 0, size, dir, MapWait::Fail).unwrap();
            o.unmap(black_box(&m)).unwrap();
        })
    });
}

fn map_unmap(c: &mut Criterion) {
    let heap = MemfdHeap::new(HugePages::None);
    let sizes = [4usize << 10, 64 << 10, 8 << 20];
    let buf = heap.alloc(8 << 20).unwrap();
    buf.fill(0, 8 << 20, 0x5a).unwrap();
    let dst = heap.alloc(8 << 20).unwrap();

    let iommu = Iommu::new();
    iommu.set_iotlb_sink(Arc::new(Enforcer::default())).unwrap();
    let direct = Direct::new();
    let bounce = Bounce::new(16 << 20, 2048).unwrap();
    direct.register(&buf).unwrap();
    iommu.register(&buf).unwrap();

    let mut g = c.benchmark_group("map_unmap");
    for &size in &sizes {
        g.throughput(Throughput::Bytes(size as u64));
        // Floor: copying the bytes once into shared memory (what a bounce
        // map costs at least, per direction).
        g.bench_with_input(BenchmarkId::new("memcpy", size), &size, |b, &size| {
            let tmp = vec![0x5au8; size];
            b.iter(|| dst.write_at(0, black_box(&tmp)).unwrap())
        });
        one(
            &mut g,
            "direct/static/to",
            &direct,
            &buf,
            size,
            Direction::ToDevice,
        );
        one(
            &mut g,
            "direct/dyn/to",
            &direct as &dyn DmaOps,
            &buf,
            size,
            Direction::ToDevice,
        );
        one(
            &mut g,
            "direct/dyn/from",
            &direct as &dyn DmaOps,
            &buf,
            size,
            Direction::FromDevice,
        );
        one(
            &mut g,
            "iommu/static/to",
            &iommu,
            &buf,
            size,
            Direction::ToDevice,
        );
        one(
            &mut g,
            "iommu/dyn/to",
            &iommu as &dyn DmaOps,
            &buf,
            size,
            Direction::ToDevice,
        );
        one(
            &mut g,
            "iommu/dyn/from",
            &iommu as &dyn DmaOps,
            &buf,
            size,
            Direction::FromDevice,
        );
        one(
            &mut g,
            "bounce/static/to",
            &bounce,
            &buf,
            size,
            Direction::ToDevice,
        );
        one(
            &mut g,
            "bounce/dyn/to",
            &bounce as &dyn DmaOps,
            &buf,
            size,
            Direction::ToDevice,
        );
        one(
            &mut g,
            "bounce/dyn/from",
            &bounce as &dyn DmaOps,
            &buf,
            size,
            Direction::FromDevice,
        );
    }
    g.finish();
}

criterion_group!(benches, map_unmap);
criterion_main!(benches);
