//! Every transfer engine, through one helper taking `&dyn Engine`, on a disk
//! file system (ext4 here) and on tmpfs, compared byte for byte.

mod common;

use std::path::Path;

use iopath_heap::{
    new_engine, Buffer, DioAlign, Engine, EngineOptions, Error, Heap, HugePages, IoFile, MemfdHeap,
    Method, Pull, ReadReq,
};
use iopath_testkit::Feature;

/// File size that is neither a page nor a 512-byte block multiple.
const SIZE: usize = 3 * (1 << 20) + 777;
const BUF: usize = 4 << 20;

fn engines() -> Vec<Box<dyn Engine>> {
    let small = EngineOptions {
        queue_depth: 4,
        chunk: 64 << 10,
    };
    let mut v = Vec::new();
    for m in Method::ALL {
        v.push(new_engine(m, EngineOptions::default()).unwrap());
        if m == Method::Uring {
            // Many small requests in flight, too.
            v.push(new_engine(m, small).unwrap());
        }
    }
    v
}

/// Reads, writes, short files and busy buffers through one engine.
fn exercise(engine: &dyn Engine, dir: &Path, disk: bool) {
    let what = format!("{:?} in {}", engine, dir.display());
    let data = common::pattern(SIZE, 7);
    let path = dir.join("src.bin");
    std::fs::write(&path, &data).unwrap();
    let file = IoFile::open(&path).unwrap();
    let buf = MemfdHeap::new(HugePages::None).alloc(BUF).unwrap();

    let cases: &[(u64, usize, usize)] = &[
        (0, 0, SIZE),                 // whole file, unaligned tail at EOF
        (4096, 8192, 1 << 20),        // all aligned
        (100, 100, (1 << 20) + 3),    // congruent, unaligned head and tail
        (100, 0, 70_000),             // offsets disagree: all staged
        ((SIZE - 5) as u64, 7, 5),    // the last bytes
        (1, 4095, 1),                 // one byte
        (SIZE as u64, 0, 0),          // nothing, at EOF
        (512 * 3, 512, 512 * 5 + 10), // block-aligned (not page-aligned) start
    ];
    for &(file_off, buf_off, len) in cases {
        buf.fill(0, BUF, common::POISON).unwrap();
        let t = engine
            .read(&file, file_off, &buf, buf_off, len)
            .unwrap_or_else(|e| panic!("{what}: read {file_off}/{buf_off}/{len}: {e}"));
        assert_eq!(t.bytes, len as u64, "{what}");
        let direct = matches!(
            engine.method(),
            Method::Direct | Method::Uring | Method::Bounce
        );
        if direct && file.dio_align().is_some() {
            assert_eq!(t.fallbacks, 0, "{what}: unexpected fallback");
        }
        let mut got = vec![0u8; BUF];
        buf.read_at(0, &mut got).unwrap();
        common::assert_placed(&what, &got, &data, file_off, buf_off, len);
    }

    // Direct engines leave the page cache alone.
    if disk
        && matches!(
            engine.method(),
            Method::Direct | Method::Uring | Method::Bounce
        )
    {
        file.drop_cache().unwrap();
        assert_eq!(file.cached_bytes().unwrap(), 0, "{what}: cache not dropped");
        engine.read(&file, 0, &buf, 0, SIZE).unwrap();
        assert_eq!(
            file.cached_bytes().unwrap(),
            0,
            "{what}: direct read filled the page cache"
        );
    }

    // A batch of reads, some unaligned, one empty, in several buffers.
    let heap = MemfdHeap::new(HugePages::None);
    let batch: Vec<(u64, usize, usize)> = vec![
        (0, 0, 1 << 20),
        (1 << 20, 0, 1 << 20),
        (100, 100, 500_000),
        (7, 0, 0),
        ((2 << 20) + 4096, 4096, SIZE - (2 << 20) - 4096), // to EOF
        (33, 1, 4000),
    ];
    let bufs: Vec<Buffer> = batch.iter().map(|_| heap.alloc(2 << 20).unwrap()).collect();
    let mut reqs = batch
        .iter()
        .zip(&bufs)
        .map(|(&(file_off, buf_off, len), b)| {
            Ok(ReadReq {
                buf: b.clone(),
                buf_off,
                file_off,
                len,
            })
        });
    let mut seen = Vec::new();
    let t = engine
        .read_batch(
            &file,
            &mut |_| reqs.next().map_or(Ok(Pull::End), |r| r.map(Pull::Req)),
            &mut |i, t| seen.push((i, t.bytes)),
        )
        .unwrap_or_else(|e| panic!("{what}: batch: {e}"));
    let want: u64 = batch.iter().map(|b| b.2 as u64).sum();
    assert_eq!(t.bytes, want, "{what}");
    seen.sort();
    let expect: Vec<(usize, u64)> = batch
        .iter()
        .enumerate()
        .map(|(i, b)| (i, b.2 as u64))
        .collect();
    assert_eq!(seen, expect, "{what}: done callbacks");
    for (&(file_off, buf_off, len), b) in batch.iter().zip(&bufs) {
        let mut got = vec![0u8; len];
        b.read_at(buf_off, &mut got).unwrap();
        let fo = file_off as usize;
        assert!(
            got == data[fo..fo + len],
            "{what}: batch bytes differ at {file_off}"
        );
    }
    // A batch that runs past EOF fails with ShortFile, after the rest.
    let mut reqs = [(0u64, 1usize << 20), ((SIZE - 100) as u64, 200)]
        .into_iter()
        .zip(&bufs)
        .map(|((file_off, len), b)| {
            Ok(ReadReq {
                buf: b.clone(),
                buf_off: 0,
                file_off,
                len,
            })
        });
    let err = engine
        .read_batch(
            &file,
            &mut |_| reqs.next().map_or(Ok(Pull::End), |r| r.map(Pull::Req)),
            &mut |_, _| {},
        )
        .unwrap_err();
    assert!(
        matches!(err, Error::ShortFile { missing: 100, .. }),
        "{what}: {err}"
    );

    // A read past the end says how short the file is.
    let err = engine
        .read(&file, (SIZE - 10) as u64, &buf, 0, 100)
        .unwrap_err();
    match err {
        Error::ShortFile {
            size,
            missing,
            offset,
            len,
            ..
        } => {
            assert_eq!((size, missing, len), (SIZE as u64, 90, 100), "{what}");
            assert_eq!(offset, (SIZE - 10) as u64);
        }
        e => panic!("{what}: expected ShortFile, got {e}"),
    }
    // Outside the buffer.
    assert!(matches!(
        engine.read(&file, 0, &buf, BUF - 10, 11),
        Err(Error::OutOfRange { .. })
    ));
    // Busy while a device holds it; nothing is written.
    buf.fill(0, BUF, 0x55).unwrap();
    let pin = buf.pin_for_device();
    assert!(matches!(
        engine.read(&file, 0, &buf, 0, 4096),
        Err(Error::Busy { maps: 1 })
    ));
    drop(pin);
    let mut first = [0u8; 16];
    buf.read_at(0, &mut first).unwrap();
    assert_eq!(first, [0x55; 16], "{what}: busy read wrote");

    // Writes: build the expected file in memory alongside.
    let src = common::pattern(BUF, 99);
    buf.write_at(0, &src).unwrap();
    let out_path = dir.join("dst.bin");
    let _ = std::fs::remove_file(&out_path);
    let out = IoFile::open_rw(&out_path).unwrap();
    let mut model: Vec<u8> = Vec::new();
    let writes: &[(usize, usize, u64)] = &[
        (0, 1 << 20, 0),                 // aligned, grows the file
        (100, 5000, 100),                // congruent, inside
        (3, 70_000, 1_000_001),          // disagreeing offsets, grows, odd end
        (4096, (1 << 20) + 17, 2 << 20), // aligned start, odd end, grows
        (0, 10, ((2 << 20) + 5) as u64), // tiny, inside
        (BUF - 1, 1, 3 << 20),           // one byte far out: a hole
    ];
    for &(buf_off, len, file_off) in writes {
        let t = engine
            .write(&buf, buf_off, len, &out, file_off)
            .unwrap_or_else(|e| panic!("{what}: write {buf_off}/{len}/{file_off}: {e}"));
        assert_eq!(t.bytes, len as u64);
        let end = file_off as usize + len;
        if model.len() < end {
            model.resize(end, 0);
        }
        model[file_off as usize..end].copy_from_slice(&src[buf_off..buf_off + len]);
        assert_eq!(
            out.size().unwrap(),
            model.len() as u64,
            "{what}: size after write {buf_off}/{len}/{file_off}"
        );
    }
    drop(out);
    let written = std::fs::read(&out_path).unwrap();
    assert!(written == model, "{what}: written file differs");
}

#[test]
fn every_engine_on_disk() {
    let Some(dir) = common::disk_dir() else {
        return;
    };
    for e in engines() {
        exercise(e.as_ref(), dir.path(), true);
    }
}

#[test]
fn every_engine_on_tmpfs() {
    let Some(dir) = common::shm_dir() else { return };
    for e in engines() {
        exercise(e.as_ref(), dir.path(), false);
    }
}

/// When the kernel refuses a direct request (EINVAL), direct engines redo it
/// buffered and count the fallback. Forcing a too-small alignment on a disk
/// file system makes the kernel refuse an unaligned O_DIRECT read for real.
#[test]
fn refused_direct_io_falls_back_per_request() {
    let Some(dir) = common::disk_dir() else {
        return;
    };
    let data = common::pattern(SIZE, 3);
    let path = dir.path().join("f.bin");
    std::fs::write(&path, &data).unwrap();
    let mut file = IoFile::open(&path).unwrap();
    let Some(real) = file.dio_align() else {
        iopath_testkit::skip(Feature::DirectIo, "no direct I/O on this file system");
        return;
    };
    if real.offset == 1 {
        iopath_testkit::skip(
            Feature::DirectIo,
            "this file system takes unaligned direct I/O",
        );
        return;
    }
    file.set_dio_align(DioAlign { mem: 1, offset: 1 }).unwrap();
    assert!(file
        .set_dio_align(DioAlign {
            mem: 3,
            offset: 512
        })
        .is_err());
    let buf = MemfdHeap::new(HugePages::None).alloc(BUF).unwrap();
    for m in [Method::Direct, Method::Uring, Method::Auto] {
        let e = new_engine(m, EngineOptions::default()).unwrap();
        buf.fill(0, BUF, 0).unwrap();
        // Cold, so that `auto` reads direct rather than copying from the
        // page cache (a fallback fills it again).
        file.drop_cache().unwrap();
        let t = e.read(&file, 101, &buf, 0, 70_001).unwrap();
        assert_eq!(t.fallbacks, 1, "{m}");
        let mut got = vec![0u8; 70_001];
        buf.read_at(0, &mut got).unwrap();
        assert!(got == data[101..101 + 70_001], "{m}: bytes differ");
        // An aligned request still goes direct.
        file.drop_cache().unwrap();
        let t = e.read(&file, 0, &buf, 0, 1 << 20).unwrap();
        assert_eq!(t.fallbacks, 0, "{m}");
        // In a batch, only the refused request falls back.
        buf.fill(0, BUF, 0).unwrap();
        file.drop_cache().unwrap();
        let mut reqs = [(0u64, 0usize, 1usize << 20), (101, 1 << 20, 70_001)]
            .into_iter()
            .map(|(file_off, buf_off, len)| {
                Ok(ReadReq {
                    buf: buf.clone(),
                    buf_off,
                    file_off,
                    len,
                })
            });
        let t = e
            .read_batch(
                &file,
                &mut |_| reqs.next().map_or(Ok(Pull::End), |r| r.map(Pull::Req)),
                &mut |_, _| {},
            )
            .unwrap();
        assert_eq!((t.bytes, t.fallbacks), ((1 << 20) + 70_001, 1), "{m}");
        let mut got = vec![0u8; (1 << 20) + 70_001];
        buf.read_at(0, &mut got).unwrap();
        assert!(got[..1 << 20] == data[..1 << 20], "{m}");
        assert!(got[1 << 20..] == data[101..101 + 70_001], "{m}");
    }
}

#[test]
fn methods_parse_and_bad_paths() {
    for m in Method::ALL {
        assert_eq!(m.name().parse::<Method>().unwrap(), m);
    }
    assert!(matches!("fast".parse::<Method>(), Err(Error::UnknownMethod(s)) if s == "fast"));
    assert!(matches!(
        IoFile::open("/nonexistent/x"),
        Err(Error::Open { .. })
    ));
    assert!(matches!(
        IoFile::open("/"),
        Err(Error::NotAFile {
            what: "a directory",
            ..
        })
    ));
}

/// dma-bufs cannot be `sendfile` targets, so the sendfile engine splices
/// through a pipe for them. Exercised here with a memfd labelled as a
/// udmabuf (this machine has no /dev/udmabuf).
#[test]
fn sendfile_splices_for_non_memfd_buffers() {
    let Some(dir) = common::disk_dir() else {
        return;
    };
    let data = common::pattern(SIZE, 5);
    let path = dir.path().join("f.bin");
    std::fs::write(&path, &data).unwrap();
    let file = IoFile::open(&path).unwrap();
    let memfd = MemfdHeap::new(HugePages::None).alloc(BUF).unwrap();
    let fd = memfd.fd().try_clone_to_owned().unwrap();
    let buf = Buffer::from_fd(fd, BUF, iopath_heap::HeapKind::Udmabuf).unwrap();
    let e = new_engine(Method::Sendfile, EngineOptions::default()).unwrap();
    let t = e.read(&file, 3, &buf, 5, SIZE - 3).unwrap();
    assert_eq!(t.bytes, (SIZE - 3) as u64);
    let mut got = vec![0u8; SIZE - 3];
    buf.read_at(5, &mut got).unwrap();
    assert!(got == data[3..], "spliced bytes differ");
    let out = IoFile::open_rw(dir.path().join("out.bin")).unwrap();
    e.write(&buf, 5, SIZE - 3, &out, 11).unwrap();
    let written = std::fs::read(dir.path().join("out.bin")).unwrap();
    assert_eq!(written.len(), SIZE - 3 + 11);
    assert!(written[..11].iter().all(|&b| b == 0));
    assert!(written[11..] == data[3..], "written bytes differ");
}

/// `auto` measures both engines on the first requests, then runs the rest
/// through the faster; every byte lands either way.
#[test]
fn auto_measures_uring_and_direct_then_chooses() {
    let Some(dir) = common::disk_dir() else {
        return;
    };
    let size = 2 * iopath_heap::PROBE_BYTES as usize + (24 << 20) + 4095;
    let data = common::pattern(size, 11);
    let path = dir.path().join("auto.bin");
    std::fs::write(&path, &data).unwrap();
    // Cold: `auto` measures the runs it reads from the disk.
    IoFile::open(&path).unwrap().drop_cache().unwrap();
    let opts = iopath_heap::LoadOptions {
        buffer_size: 8 << 20,
        method: Method::Auto,
        ..iopath_heap::LoadOptions::default()
    };
    let heap = MemfdHeap::new(HugePages::None);
    let loaded = iopath_heap::load(&path, &heap, &opts, &mut |_| {}).unwrap();
    let p = loaded.stats.probe.expect("auto reports its probe");
    match iopath_heap::UringEngine::new(EngineOptions::default()) {
        Ok(_) => {
            assert!(p.uring.0 >= iopath_heap::PROBE_BYTES, "{p:?}");
            assert!(p.direct.0 >= iopath_heap::PROBE_BYTES, "{p:?}");
            assert_eq!(p.chosen, Some(loaded.stats.method), "{p:?}");
            assert!(matches!(
                loaded.stats.method,
                Method::Uring | Method::Direct
            ));
        }
        // Without io_uring, `auto` is direct I/O alone: only the bytes
        // below are checked.
        Err(e) => iopath_testkit::skip(
            Feature::IoUring,
            format_args!("io_uring unavailable, so auto has nothing to measure: {e}"),
        ),
    }
    assert_eq!(loaded.stats.bytes, size as u64);
    let mut off = 0;
    for (b, &len) in loaded.buffers.iter().zip(&loaded.lens) {
        let mut got = vec![0u8; len];
        b.read_at(0, &mut got).unwrap();
        assert!(got == data[off..off + len], "bytes differ at {off}");
        off += len;
    }
    assert_eq!(off, size);
}

/// A heap whose buffers are memfds labelled as dma-heap dma-bufs, so their
/// mapping is treated as one that refuses direct I/O (as the kernel's
/// `system` heap's does, with `EFAULT`).
#[derive(Debug)]
struct RefusingHeap;

impl Heap for RefusingHeap {
    fn name(&self) -> String {
        "refusing".into()
    }

    fn alloc(&self, len: usize) -> iopath_heap::Result<Buffer> {
        let b = MemfdHeap::new(HugePages::None).alloc(len)?;
        let fd = rustix::io::fcntl_dupfd_cloexec(b.fd(), 0).unwrap();
        Buffer::from_fd(fd, len, iopath_heap::HeapKind::DmaHeap)
    }
}

#[test]
fn a_mapping_that_refuses_direct_io_loads_by_every_method() {
    let Some(dir) = common::disk_dir() else {
        return;
    };
    let data = common::pattern(SIZE, 11);
    let path = dir.path().join("src.bin");
    std::fs::write(&path, &data).unwrap();
    let direct_here = IoFile::open(&path).unwrap().dio_align().is_some();
    for m in Method::ALL {
        let opts = iopath_heap::LoadOptions {
            buffer_size: 1 << 20,
            method: m,
            ..Default::default()
        };
        // Cold, for `auto` to measure.
        IoFile::open(&path).unwrap().drop_cache().unwrap();
        let loaded = iopath_heap::load(&path, &RefusingHeap, &opts, &mut |_| {})
            .unwrap_or_else(|e| panic!("{m}: {e}"));
        assert!(!loaded.buffers[0].takes_direct_io());
        loaded.verify(&path).unwrap_or_else(|e| panic!("{m}: {e}"));
        let s = loaded.stats;
        let n = loaded.buffers.len() as u64;
        match m {
            // Refused by the mapping: every request falls back, counted.
            Method::Direct | Method::Uring => assert_eq!(s.fallbacks, n, "{m}"),
            Method::Bounce if direct_here => assert_eq!(s.fallbacks, 0, "{m}"),
            Method::Auto => {
                let p = s.probe.expect("auto measures");
                assert!(p.mapping_refused_direct(), "{m}: {p:?}");
                assert!(
                    matches!(s.method, Method::Bounce | Method::Buffered),
                    "{m}: {s:?}"
                );
                assert_eq!(p.chosen, Some(s.method));
            }
            _ => {}
        }
    }
}
