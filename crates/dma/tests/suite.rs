//! One test suite, run against every DMA ops implementation and the fake
//! that always bounces. The device side is `DeviceView`: its own mappings of
//! the shared fds, translating through the IOTLB records for `Iommu`.

use std::sync::Arc;
use std::time::Duration;

use iopath_dma::testing::{AlwaysBounce, DeviceView, Fault};
use iopath_dma::{Bounce, Direct, Direction, DmaOps, Error, Iommu, MapWait, Mapping};
use iopath_heap::{Buffer, Heap, HugePages, MemfdHeap};

fn alloc(len: usize) -> Buffer {
    MemfdHeap::new(HugePages::None).alloc(len).unwrap()
}

/// Whether this process's thread `name` sleeps in a futex wait (a condition
/// variable or a mutex): its state in `/proc/self/task/<tid>/stat` is `S`
/// and its `wchan` a futex function (or `0` where the kernel hides it). See
/// proc_pid_stat(5) and proc_pid_wchan(5).
fn waits_on_futex(name: &str) -> bool {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return false;
    };
    tasks.flatten().any(|t| {
        let read = |f: &str| std::fs::read_to_string(t.path().join(f)).unwrap_or_default();
        let asleep = |stat: String| {
            stat.rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('S'))
        };
        let wchan = read("wchan");
        read("comm").trim_end() == name
            && asleep(read("stat"))
            && (wchan.contains("futex") || wchan == "0")
    })
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

/// A buffer filled with a pattern, registered with `ops`.
fn prepared(ops: &dyn DmaOps, view: &DeviceView, len: usize, seed: u8) -> (Buffer, Vec<u8>) {
    let buf = alloc(len);
    let data = pattern(len, seed);
    buf.write_at(0, &data).unwrap();
    ops.register(&buf).unwrap();
    view.refresh(ops).unwrap();
    (buf, data)
}

fn to_device_arrives(ops: &dyn DmaOps) {
    let view = DeviceView::connect(ops).unwrap();
    let (buf, data) = prepared(ops, &view, 64 << 10, 1);
    let m = ops
        .map(&buf, 100, 5000, Direction::ToDevice, MapWait::Fail)
        .unwrap();
    assert_eq!(m.len(), 5000);
    let mut seen = vec![0u8; 5000];
    view.read(m.addr(), &mut seen).unwrap();
    assert_eq!(
        seen,
        &data[100..5100],
        "{}: device saw other bytes",
        ops.name()
    );

    // Mapped = busy: CPU writes through the accessors are refused.
    let err = buf.write_at(0, b"x").unwrap_err();
    assert!(matches!(err, iopath_heap::Error::Busy { maps: 1 }), "{err}");
    assert!(buf.fill(0, 1, 0).is_err());
    ops.unmap(&m).unwrap();
    buf.write_at(0, b"x").unwrap();
    assert_eq!(ops.live_mappings(), 0);
}

fn from_device_arrives_after_unmap(ops: &dyn DmaOps) {
    let view = DeviceView::connect(ops).unwrap();
    let (buf, data) = prepared(ops, &view, 64 << 10, 2);
    let m = ops
        .map(&buf, 4096, 10_000, Direction::FromDevice, MapWait::Fail)
        .unwrap();
    let written = pattern(10_000, 99);
    view.write(m.addr(), &written).unwrap();
    ops.unmap(&m).unwrap();
    let mut got = vec![0u8; 64 << 10];
    buf.read_at(0, &mut got).unwrap();
    assert_eq!(&got[4096..14096], &written[..], "{}", ops.name());
    assert_eq!(
        &got[..4096],
        &data[..4096],
        "{}: bytes before the mapping changed",
        ops.name()
    );
    assert_eq!(
        &got[14096..],
        &data[14096..],
        "{}: bytes after the mapping changed",
        ops.name()
    );
}

fn sync_round_trip(ops: &dyn DmaOps) {
    let view = DeviceView::connect(ops).unwrap();
    let (buf, _) = prepared(ops, &view, 8192, 3);
    let m = ops
        .map(&buf, 0, 8192, Direction::Bidirectional, MapWait::Fail)
        .unwrap();
    view.write(m.addr() + 10, b"from device").unwrap();
    ops.sync_for_cpu(&m, 0, 8192).unwrap();
    let mut got = [0u8; 11];
    buf.read_at(10, &mut got).unwrap();
    assert_eq!(&got, b"from device", "{}", ops.name());
    // The CPU owns it now: writes are allowed.
    buf.write_at(100, b"from cpu").unwrap();
    ops.sync_for_device(&m, 0, 8192).unwrap();
    assert!(
        buf.write_at(0, b"x").is_err(),
        "busy again after sync_for_device"
    );
    let mut seen = [0u8; 8];
    view.read(m.addr() + 100, &mut seen).unwrap();
    assert_eq!(&seen, b"from cpu", "{}", ops.name());
    ops.unmap(&m).unwrap();
}

/// Many map/unmap cycles, then the largest mapping `full` must still fit
/// without waiting: no slot or IOVA leaked.
fn no_leaks(ops: &dyn DmaOps, full: usize) {
    let view = DeviceView::connect(ops).unwrap();
    let (buf, _) = prepared(ops, &view, full.max(256 << 10), 4);
    let sizes = [1usize, 100, 2048, 2049, 4096, 70_000, 256 << 10];
    for i in 0..600 {
        let len = sizes[i % sizes.len()];
        let off = (i * 13) % 512;
        let dir = [
            Direction::ToDevice,
            Direction::FromDevice,
            Direction::Bidirectional,
        ][i % 3];
        let m = ops.map(&buf, off, len, dir, MapWait::Fail).unwrap();
        if i % 2 == 0 {
            ops.unmap(&m).unwrap();
        } else {
            let m2 = ops.map(&buf, 0, 512, dir, MapWait::Fail).unwrap();
            ops.unmap(&m).unwrap();
            ops.unmap(&m2).unwrap();
        }
    }
    assert_eq!(ops.live_mappings(), 0);
    assert_eq!(buf.device_maps(), 0, "pins leaked");
    let m = ops
        .map(&buf, 0, full, Direction::ToDevice, MapWait::Fail)
        .unwrap_or_else(|e| panic!("{}: space leaked: {e}", ops.name()));
    ops.unmap(&m).unwrap();
    if let Some(t) = view.iotlb() {
        assert!(t.is_empty(), "IOTLB entries left: {}", t.len());
    }
}

fn concurrent(ops: Arc<dyn DmaOps>) {
    let view = Arc::new(DeviceView::connect(&*ops).unwrap());
    let bufs: Vec<Buffer> = (0..4)
        .map(|t| prepared(&*ops, &view, 32 << 10, t as u8).0)
        .collect();
    view.refresh(&*ops).unwrap();
    let threads: Vec<_> = bufs
        .into_iter()
        .enumerate()
        .map(|(t, buf)| {
            let ops = ops.clone();
            let view = view.clone();
            std::thread::spawn(move || {
                for i in 0..150 {
                    let len = 1 + (i * 977 + t * 131) % (32 << 10);
                    let seed = (t * 50 + i) as u8;
                    let m = ops
                        .map(&buf, 0, len, Direction::FromDevice, MapWait::Block)
                        .unwrap();
                    let data = pattern(len, seed);
                    view.write(m.addr(), &data).unwrap();
                    ops.unmap(&m).unwrap();
                    let mut got = vec![0u8; len];
                    buf.read_at(0, &mut got).unwrap();
                    assert_eq!(got, data, "thread {t} iteration {i}");

                    let m = ops
                        .map(&buf, 0, len, Direction::ToDevice, MapWait::Block)
                        .unwrap();
                    let mut seen = vec![0u8; len];
                    view.read(m.addr(), &mut seen).unwrap();
                    ops.unmap(&m).unwrap();
                    assert_eq!(seen, data, "thread {t} iteration {i} (to device)");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(ops.live_mappings(), 0);
}

fn errors(ops: &dyn DmaOps) {
    let view = DeviceView::connect(ops).unwrap();
    let (buf, _) = prepared(ops, &view, 8192, 5);
    let m = ops
        .map(&buf, 0, 4096, Direction::ToDevice, MapWait::Fail)
        .unwrap();
    // Past the mapping.
    assert!(matches!(
        ops.sync_for_cpu(&m, 4000, 200),
        Err(Error::OutsideMapping {
            offset: 4000,
            len: 200,
            map_len: 4096
        })
    ));
    assert!(matches!(
        ops.sync_for_device(&m, usize::MAX, 2),
        Err(Error::OutsideMapping { .. })
    ));
    // A mapping the ops never handed out.
    let forged = Mapping::new(m.id() + 1000, m.addr(), 4096, Direction::ToDevice);
    assert!(matches!(ops.unmap(&forged), Err(Error::NotMapped { .. })));
    let moved = Mapping::new(m.id(), m.addr() + 4096, 4096, Direction::ToDevice);
    assert!(matches!(ops.unmap(&moved), Err(Error::NotMapped { .. })));
    ops.unmap(&m).unwrap();
    // Double unmap.
    assert!(matches!(ops.unmap(&m), Err(Error::NotMapped { id, .. }) if id == m.id()));
    assert!(matches!(
        ops.sync_for_cpu(&m, 0, 1),
        Err(Error::NotMapped { .. })
    ));
    // Bad map requests.
    assert!(matches!(
        ops.map(&buf, 8000, 200, Direction::ToDevice, MapWait::Fail),
        Err(Error::Heap(iopath_heap::Error::OutOfRange { .. }))
    ));
    assert!(matches!(
        ops.map(&buf, 0, 0, Direction::ToDevice, MapWait::Fail),
        Err(Error::ZeroLength)
    ));
    // The device cannot reach addresses outside the shared regions.
    let mut b = [0u8; 16];
    assert!(view.read(0, &mut b).is_err());
    assert!(view.read(u64::MAX - 4, &mut b).is_err());
    assert_eq!(ops.live_mappings(), 0);
}

fn coherent(ops: &dyn DmaOps) {
    let mem = ops.alloc_coherent(100).unwrap();
    assert_eq!(mem.len(), iopath_heap::page_size());
    let view = DeviceView::connect(ops).unwrap();
    mem.buffer().write_at(0, b"ring").unwrap();
    let mut b = [0u8; 4];
    view.read(mem.addr(), &mut b).unwrap();
    assert_eq!(&b, b"ring");
    view.write(mem.addr() + 8, b"used").unwrap();
    mem.buffer().read_at(8, &mut b).unwrap();
    assert_eq!(&b, b"used");
    let addr = mem.addr();
    ops.free_coherent(mem).unwrap();
    view.refresh(ops).unwrap();
    assert!(
        view.read(addr, &mut b).is_err(),
        "freed coherent memory still reachable"
    );
}

macro_rules! suite {
    ($modname:ident, $make:expr, $full:expr) => {
        mod $modname {
            use super::*;

            fn ops() -> Arc<dyn DmaOps> {
                Arc::new($make)
            }

            #[test]
            fn to_device() {
                to_device_arrives(&*ops());
            }
            #[test]
            fn from_device() {
                from_device_arrives_after_unmap(&*ops());
            }
            #[test]
            fn sync() {
                sync_round_trip(&*ops());
            }
            #[test]
            fn leaks() {
                no_leaks(&*ops(), $full);
            }
            #[test]
            fn threads() {
                concurrent(ops());
            }
            #[test]
            fn error_cases() {
                errors(&*ops());
            }
            #[test]
            fn coherent_memory() {
                coherent(&*ops());
            }
        }
    };
}

suite!(direct, Direct::new(), 1 << 20);
suite!(iommu, Iommu::with_space(1 << 20, 1 << 20), 1 << 20);
suite!(bounce, Bounce::new(1 << 20, 2048).unwrap(), 1 << 20);
suite!(
    always_bounce,
    AlwaysBounce::new().unwrap(),
    AlwaysBounce::WINDOW
);

#[test]
fn direct_refuses_unregistered_buffers() {
    let ops = Direct::new();
    let buf = alloc(4096);
    assert!(matches!(
        ops.map(&buf, 0, 10, Direction::ToDevice, MapWait::Fail),
        Err(Error::NotRegistered { ops: "direct", .. })
    ));
    ops.register(&buf).unwrap();
    assert!(matches!(
        ops.register(&buf),
        Err(Error::AlreadyRegistered { .. })
    ));
    let m = ops
        .map(&buf, 0, 10, Direction::ToDevice, MapWait::Fail)
        .unwrap();
    assert!(matches!(
        ops.unregister(&buf),
        Err(Error::Heap(iopath_heap::Error::Busy { .. }))
    ));
    ops.unmap(&m).unwrap();
    ops.unregister(&buf).unwrap();
    assert_eq!(buf.device_maps(), 0);
}

#[test]
fn iommu_enforcer_refuses_unmapped_and_wrong_permission() {
    let ops = Iommu::new();
    let view = DeviceView::connect(&ops).unwrap();
    let (buf, data) = prepared(&ops, &view, 16384, 6);
    let r = ops
        .map(&buf, 0, 4096, Direction::ToDevice, MapWait::Fail)
        .unwrap();
    let w = ops
        .map(&buf, 8192, 4096, Direction::FromDevice, MapWait::Fail)
        .unwrap();
    let mut b = vec![0u8; 4096];
    // Reading a to-device mapping works, writing it does not.
    view.read(r.addr(), &mut b).unwrap();
    assert_eq!(b, &data[..4096]);
    assert!(matches!(
        view.write(r.addr(), b"x"),
        Err(Fault::Permission { .. })
    ));
    // Writing a from-device mapping works, reading it does not.
    view.write(w.addr(), b"ok").unwrap();
    assert!(matches!(
        view.read(w.addr(), &mut b[..2]),
        Err(Fault::Permission { .. })
    ));
    // One byte past the mapping.
    assert!(matches!(
        view.read(r.addr(), &mut vec![0u8; 4097]),
        Err(Fault::NotMapped { .. })
    ));
    // An address never handed out.
    assert!(matches!(
        view.read(r.addr() + (1 << 30), &mut b),
        Err(Fault::NotMapped { .. })
    ));
    ops.unmap(&r).unwrap();
    assert!(matches!(
        view.read(r.addr(), &mut b),
        Err(Fault::NotMapped { .. })
    ));
    ops.unmap(&w).unwrap();
    let records = view.iotlb().unwrap().records();
    assert_eq!(records.len(), 4, "{records:?}");
}

#[test]
fn iommu_replays_live_mappings_into_a_late_sink() {
    let ops = Iommu::new();
    let buf = alloc(4096);
    buf.write_at(0, b"early").unwrap();
    ops.register(&buf).unwrap();
    let m = ops
        .map(&buf, 0, 5, Direction::ToDevice, MapWait::Fail)
        .unwrap();
    let view = DeviceView::connect(&ops).unwrap();
    let mut b = [0u8; 5];
    view.read(m.addr(), &mut b).unwrap();
    assert_eq!(&b, b"early");
    ops.unmap(&m).unwrap();
}

#[test]
fn bounce_window_limits_and_waiting() {
    let ops = Arc::new(Bounce::new(64 << 10, 2048).unwrap());
    let buf = alloc(128 << 10);
    assert!(matches!(
        ops.map(&buf, 0, (64 << 10) + 1, Direction::ToDevice, MapWait::Block),
        Err(Error::TooLarge { max, .. }) if max == 64 << 10
    ));
    let whole = ops
        .map(&buf, 0, 64 << 10, Direction::ToDevice, MapWait::Fail)
        .unwrap();
    assert_eq!(ops.free_slots(), 0);
    assert!(matches!(
        ops.map(&buf, 0, 1, Direction::ToDevice, MapWait::Fail),
        Err(Error::NoSpace {
            what: "bounce slots",
            ..
        })
    ));
    assert!(matches!(
        ops.map(
            &buf,
            0,
            1,
            Direction::ToDevice,
            MapWait::Timeout(Duration::from_millis(20))
        ),
        Err(Error::NoSpace { .. })
    ));
    // A blocked map proceeds once another thread unmaps: the waiter is
    // seen asleep in its wait for free slots before the unmap.
    let (ops2, buf2) = (ops.clone(), buf.clone());
    let waiter = std::thread::Builder::new()
        .name("map-waiter".into())
        .spawn(move || ops2.map(&buf2, 0, 4096, Direction::ToDevice, MapWait::Block))
        .unwrap();
    iopath_testkit::wait_until(
        "the blocked map waiting on a futex",
        Duration::from_secs(10),
        || waiter.is_finished() || waits_on_futex("map-waiter"),
    );
    assert!(!waiter.is_finished(), "map did not wait for free slots");
    ops.unmap(&whole).unwrap();
    let m = waiter.join().unwrap().unwrap();
    ops.unmap(&m).unwrap();
    assert_eq!(ops.free_slots(), ops.total_slots());
    // Only the window (no coherent memory yet) is shared.
    let regions = ops.regions();
    assert_eq!(regions.len(), 1);
    assert!(!regions[0].buffer.same_as(&buf));
}

#[test]
fn iommu_space_exhaustion() {
    let ops = Iommu::with_space(1 << 20, 64 << 10);
    let buf = alloc(128 << 10);
    ops.register(&buf).unwrap();
    let a = ops
        .map(&buf, 0, 64 << 10, Direction::ToDevice, MapWait::Fail)
        .unwrap();
    assert!(matches!(
        ops.map(&buf, 0, 1, Direction::ToDevice, MapWait::Fail),
        Err(Error::NoSpace {
            what: "IOVA space",
            ..
        })
    ));
    ops.unmap(&a).unwrap();
    assert_eq!(ops.free_iova_bytes(), 64 << 10);
}

#[test]
fn always_bounce_poisons_unsynced_data() {
    let ops = AlwaysBounce::new().unwrap();
    let view = DeviceView::connect(&ops).unwrap();
    let (buf, data) = prepared(&ops, &view, 4096, 7);
    let m = ops
        .map(&buf, 0, 4096, Direction::FromDevice, MapWait::Fail)
        .unwrap();
    let mut seen = vec![0u8; 4096];
    view.read(m.addr(), &mut seen).unwrap();
    assert!(seen.iter().all(|&b| b == iopath_dma::testing::POISON));
    // Before unmap the driver still has its old bytes, not the device's.
    view.write(m.addr(), b"device").unwrap();
    let mut got = [0u8; 6];
    buf.read_at(0, &mut got).unwrap();
    assert_eq!(&got, &data[..6]);
    ops.unmap(&m).unwrap();
    buf.read_at(0, &mut got).unwrap();
    assert_eq!(&got, b"device");
    assert_eq!(ops.free_bytes(), AlwaysBounce::WINDOW as u64);
}

/// A buffer mapped for a device refuses file transfers into it, with every
/// transfer engine, under every ops; after unmap the same transfer works.
#[test]
fn file_transfer_into_a_mapped_buffer_is_refused() {
    use iopath_heap::{new_engine, EngineOptions, IoFile, Method};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    let data = pattern(64 << 10, 8);
    std::fs::write(&path, &data).unwrap();
    let file = IoFile::open(&path).unwrap();
    let all: Vec<Box<dyn DmaOps>> = vec![
        Box::new(Direct::new()),
        Box::new(Iommu::new()),
        Box::new(Bounce::new(1 << 20, 2048).unwrap()),
        Box::new(AlwaysBounce::new().unwrap()),
    ];
    for ops in &all {
        for method in Method::ALL {
            let engine = match new_engine(method, EngineOptions::default()) {
                Ok(e) => e,
                // Only the io_uring engines can be unavailable.
                Err(e) => {
                    iopath_testkit::skip(
                        iopath_testkit::Feature::IoUring,
                        format_args!("engine {} unavailable: {e}", method.name()),
                    );
                    continue;
                }
            };
            let buf = alloc(64 << 10);
            ops.register(&buf).unwrap();
            let m = ops
                .map(&buf, 0, 4096, Direction::FromDevice, MapWait::Fail)
                .unwrap();
            let err = engine.read(&file, 0, &buf, 0, 64 << 10).unwrap_err();
            assert!(
                matches!(err, iopath_heap::Error::Busy { maps: 1 }),
                "{} / {}: {err}",
                ops.name(),
                method.name()
            );
            ops.unmap(&m).unwrap();
            engine.read(&file, 0, &buf, 0, 64 << 10).unwrap();
            let mut got = vec![0u8; 64 << 10];
            buf.read_at(0, &mut got).unwrap();
            assert!(got == data, "{} / {}", ops.name(), method.name());
        }
    }
}

/// Region lookup stays right across many registrations and removals.
#[test]
fn many_regions_register_and_unregister() {
    for ops in [&Direct::new() as &dyn DmaOps, &Iommu::new()] {
        let bufs: Vec<Buffer> = (0..100)
            .map(|i| {
                let b = alloc(4096);
                b.write_at(0, &[i as u8; 8]).unwrap();
                b
            })
            .collect();
        for b in &bufs {
            ops.register(b).unwrap();
        }
        for b in bufs.iter().step_by(2) {
            ops.unregister(b).unwrap();
        }
        assert_eq!(ops.regions().len(), 50);
        let view = DeviceView::connect(ops).unwrap();
        for (i, b) in bufs.iter().enumerate() {
            let r = ops.map(b, 0, 8, Direction::ToDevice, MapWait::Fail);
            if i % 2 == 0 {
                assert!(
                    matches!(r, Err(Error::NotRegistered { .. })),
                    "{}: {i}",
                    ops.name()
                );
            } else {
                let m = r.unwrap();
                let mut seen = [0u8; 8];
                view.read(m.addr(), &mut seen).unwrap();
                assert_eq!(
                    seen,
                    [i as u8; 8],
                    "{}: buffer {i} reached another region",
                    ops.name()
                );
                ops.unmap(&m).unwrap();
            }
        }
    }
}
