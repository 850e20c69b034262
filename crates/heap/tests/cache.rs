//! The cache-aware `auto`: cold, warm and half-warm files load byte for
//! byte, the load says how much came from the page cache, and cold ranges
//! stay out of it.

mod common;

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use iopath_heap::{
    cache_runs, load, new_engine, CacheLookup, CacheRun, EngineOptions, Heap, HugePages, IoFile,
    LoadOptions, MemfdHeap, Method, Pull, ReadReq, CACHE_GRAIN,
};
use iopath_testkit::Feature;

/// Chunks of the half-warm file: every other one cached.
const CHUNK: usize = 2 << 20;
/// 11 chunks and an odd tail (neither a page nor a block multiple), which
/// is in a cold chunk.
const SIZE: usize = 11 * CHUNK + 4321;

/// A scratch file of `SIZE` pattern bytes on a disk file system, written
/// back so that `POSIX_FADV_DONTNEED` can drop it. `None` (skipped) where
/// there is no disk directory or no direct I/O.
fn scratch(seed: u64) -> Option<(tempfile::TempDir, std::path::PathBuf, Vec<u8>)> {
    let dir = common::disk_dir()?;
    let data = common::pattern(SIZE, seed);
    let path = dir.path().join("model.bin");
    std::fs::write(&path, &data).unwrap();
    File::open(&path).unwrap().sync_all().unwrap();
    if IoFile::open(&path).unwrap().dio_align().is_none() {
        iopath_testkit::skip(
            Feature::DirectIo,
            "no direct I/O on the scratch file system",
        );
        return None;
    }
    Some((dir, path, data))
}

/// Drops the file from the page cache and checks that it is gone.
fn make_cold(path: &Path) {
    let f = IoFile::open(path).unwrap();
    f.drop_cache().unwrap();
    assert_eq!(f.cached_bytes().unwrap(), 0, "cache not dropped");
}

/// Reads `off..off + len` through a descriptor that does no readahead, so
/// exactly those pages enter the page cache.
fn warm(path: &Path, off: usize, len: usize) {
    let f = File::open(path).unwrap();
    rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::Random).unwrap();
    let mut buf = vec![0u8; len];
    f.read_exact_at(&mut buf, off as u64).unwrap();
}

/// Every other chunk cached, starting with the first; returns the bytes
/// cached.
fn make_half_warm(path: &Path) -> u64 {
    make_cold(path);
    let mut cached = 0;
    for c in (0..SIZE.div_ceil(CHUNK)).step_by(2) {
        let off = c * CHUNK;
        let len = CHUNK.min(SIZE - off);
        warm(path, off, len);
        cached += len as u64;
    }
    cached
}

/// Asserts that the page cache holds no more of `file` than the `before`
/// bytes measured ahead of the reads: a read that pollutes adds pages,
/// while the memory pressure of tests running beside may only take some
/// away (a CI run lost 2 pages of 3,072 between the two counts).
#[track_caller]
fn assert_not_polluted(file: &IoFile, before: u64, what: &str) {
    let now = file.cached_bytes().unwrap();
    assert!(
        now <= before,
        "{what} polluted the page cache: {now} bytes cached, {before} before"
    );
}

/// Loads the file with `auto` into small buffers, compares every byte and
/// returns what the load says came from the cache.
fn load_and_compare(path: &Path, data: &[u8]) -> iopath_heap::LoadStats {
    // Buffers straddle the chunks.
    load_and_compare_in(path, data, 3 << 20)
}

/// [`load_and_compare`] with buffers of `buffer_size` bytes.
fn load_and_compare_in(path: &Path, data: &[u8], buffer_size: usize) -> iopath_heap::LoadStats {
    let opts = LoadOptions {
        buffer_size,
        method: Method::Auto,
        ..LoadOptions::default()
    };
    let loaded = load(path, &MemfdHeap::new(HugePages::None), &opts, &mut |_| {}).unwrap();
    assert_eq!(loaded.stats.bytes, SIZE as u64);
    let mut off = 0;
    for (b, &len) in loaded.buffers.iter().zip(&loaded.lens) {
        let mut got = vec![0u8; len];
        b.read_at(0, &mut got).unwrap();
        assert!(
            got == data[off..off + len],
            "bytes differ in [{off}, +{len})"
        );
        off += len;
    }
    assert_eq!(off, SIZE);
    loaded.stats
}

#[test]
fn cold_load_reads_direct_and_leaves_the_cache_empty() {
    let Some((_dir, path, data)) = scratch(21) else {
        return;
    };
    make_cold(&path);
    let s = load_and_compare(&path, &data);
    assert_eq!(s.from_cache, 0, "{s:?}");
    assert!(matches!(s.method, Method::Uring | Method::Direct), "{s:?}");
    let f = IoFile::open(&path).unwrap();
    assert_eq!(
        f.cached_bytes().unwrap(),
        0,
        "a cold load filled the page cache"
    );
    // cachestat says the same, where the kernel has it.
    match cache_runs(&f, 0, SIZE as u64, CacheLookup::Cachestat) {
        Ok(runs) => assert_eq!(
            runs,
            [CacheRun {
                off: 0,
                len: SIZE as u64,
                cached: false
            }]
        ),
        Err(e) => iopath_testkit::skip(Feature::Cachestat, e),
    }
}

#[test]
fn warm_load_copies_everything_from_the_cache() {
    let Some((_dir, path, data)) = scratch(22) else {
        return;
    };
    make_cold(&path);
    warm(&path, 0, SIZE);
    let s = load_and_compare(&path, &data);
    assert_eq!(s.from_cache, SIZE as u64, "{s:?}");
    assert_eq!(s.method, Method::Buffered, "all copied: {s:?}");
    assert_eq!(s.fallbacks, 0);
    // One buffer, one request: copied in pieces by both copiers.
    let s = load_and_compare_in(&path, &data, 24 << 20);
    assert_eq!((s.buffers, s.from_cache), (1, SIZE as u64), "{s:?}");
}

#[test]
fn half_warm_load_copies_the_cached_half_and_adds_nothing_to_the_cache() {
    let Some((_dir, path, data)) = scratch(23) else {
        return;
    };
    let cached = make_half_warm(&path);
    let f = IoFile::open(&path).unwrap();
    assert_eq!(
        f.cached_bytes().unwrap(),
        cached,
        "set-up: warmed more than asked"
    );
    let s = load_and_compare(&path, &data);
    assert_eq!(s.from_cache, cached, "{s:?}");
    assert!(matches!(s.method, Method::Uring | Method::Direct), "{s:?}");
    assert_eq!(
        f.cached_bytes().unwrap(),
        cached,
        "the cold chunks entered the page cache"
    );
    // A second load finds the same state.
    let s = load_and_compare(&path, &data);
    assert_eq!(s.from_cache, cached, "{s:?}");

    // Warmed by plain sequential reads of the first half of each even
    // chunk this time: readahead caches a little more than was read and
    // marks a page of it to read further ahead when touched. The copies
    // touch it and must not read ahead into the cold rest.
    make_cold(&path);
    let plain = File::open(&path).unwrap();
    let mut half = vec![0u8; CHUNK / 2];
    for c in (0..SIZE / CHUNK).step_by(2) {
        plain.read_exact_at(&mut half, (c * CHUNK) as u64).unwrap();
    }
    for c in (1..SIZE.div_ceil(CHUNK)).step_by(2) {
        let off = (c * CHUNK) as u64;
        let len = std::num::NonZeroU64::new(CHUNK.min(SIZE - c * CHUNK) as u64);
        rustix::fs::fadvise(&plain, off, len, rustix::fs::Advice::DontNeed).unwrap();
    }
    let before = f.cached_bytes().unwrap();
    let s = load_and_compare(&path, &data);
    assert!(s.from_cache > 0 && s.from_cache <= before, "{s:?}");
    assert_not_polluted(&f, before, "readahead of a copy");
}

#[test]
fn cachestat_and_mincore_agree_on_the_runs() {
    let Some((_dir, path, _data)) = scratch(24) else {
        return;
    };
    make_half_warm(&path);
    let f = IoFile::open(&path).unwrap();
    let want: Vec<CacheRun> = (0..SIZE.div_ceil(CHUNK))
        .map(|c| CacheRun {
            off: (c * CHUNK) as u64,
            len: CHUNK.min(SIZE - c * CHUNK) as u64,
            cached: c % 2 == 0,
        })
        .collect();
    let by_mincore = cache_runs(&f, 0, SIZE as u64, CacheLookup::Mincore).unwrap();
    assert_eq!(by_mincore, want);
    assert_eq!(
        cache_runs(&f, 0, SIZE as u64, CacheLookup::Auto).unwrap(),
        want
    );
    match cache_runs(&f, 0, SIZE as u64, CacheLookup::Cachestat) {
        Ok(runs) => assert_eq!(runs, want),
        Err(e) => iopath_testkit::skip(Feature::Cachestat, e),
    }
    // Unaligned sub-ranges: cut at the range, merged, past EOF cut off.
    let off = CHUNK as u64 - 100;
    for how in [CacheLookup::Mincore, CacheLookup::Auto] {
        let runs = cache_runs(&f, off, (CHUNK + 200) as u64, how).unwrap();
        assert_eq!(
            runs,
            [
                CacheRun {
                    off,
                    len: 100,
                    cached: true
                },
                CacheRun {
                    off: CHUNK as u64,
                    len: CHUNK as u64,
                    cached: false
                },
                CacheRun {
                    off: 2 * CHUNK as u64,
                    len: 100,
                    cached: true
                },
            ],
            "{how:?}"
        );
        let tail = cache_runs(&f, SIZE as u64 - 10, 1 << 20, how).unwrap();
        assert_eq!(tail.iter().map(|r| r.len).sum::<u64>(), 10, "{how:?}");
        assert!(cache_runs(&f, SIZE as u64, 10, how).unwrap().is_empty());
    }
    // One cold page in a cached grain makes the grain cold.
    make_cold(&path);
    warm(&path, 0, 4096);
    warm(&path, 8192, CHUNK - 8192);
    for how in [CacheLookup::Mincore, CacheLookup::Auto] {
        let runs = cache_runs(&f, 0, CHUNK as u64, how).unwrap();
        assert_eq!(
            runs[0],
            CacheRun {
                off: 0,
                len: CACHE_GRAIN,
                cached: false
            },
            "{how:?}"
        );
        assert_eq!(runs.len(), 2, "{how:?}: {runs:?}");
    }
}

/// Unaligned requests across cached and cold chunks, in one batch and one
/// by one, land byte for byte; only the cold parts are read from disk.
#[test]
fn unaligned_requests_across_cached_and_cold_runs() {
    let Some((_dir, path, data)) = scratch(25) else {
        return;
    };
    let cases: &[(u64, usize, usize)] = &[
        (CHUNK as u64 - 4097, 3, 8192 + 5),   // cached tail, cold head
        (100, 100, 3 * CHUNK),                // three chunks, congruent
        (7, 0, CHUNK + 1),                    // offsets disagree
        ((2 * CHUNK) as u64 + 1, 4095, 4096), // inside a cached chunk
        ((SIZE - 33) as u64, 0, 33),          // the tail
        (0, 0, 0),                            // nothing
    ];
    let heap = MemfdHeap::new(HugePages::None);
    let engine = new_engine(Method::Auto, EngineOptions::default()).unwrap();
    let file = IoFile::open(&path).unwrap();
    let bufs: Vec<_> = cases
        .iter()
        .map(|_| heap.alloc(4 * CHUNK).unwrap())
        .collect();
    let check = |what: &str| {
        for (&(file_off, buf_off, len), b) in cases.iter().zip(&bufs) {
            let mut got = vec![0u8; 4 * CHUNK];
            b.read_at(0, &mut got).unwrap();
            common::assert_placed(what, &got, &data, file_off, buf_off, len);
        }
    };
    // One by one.
    make_half_warm(&path);
    let cached = file.cached_bytes().unwrap();
    for (&(file_off, buf_off, len), b) in cases.iter().zip(&bufs) {
        b.fill(0, 4 * CHUNK, common::POISON).unwrap();
        let t = engine.read(&file, file_off, b, buf_off, len).unwrap();
        assert_eq!(t.bytes, len as u64);
        assert!(t.cached <= len as u64);
    }
    check("one by one");
    assert_not_polluted(&file, cached, "one by one");
    // One batch.
    for b in &bufs {
        b.fill(0, 4 * CHUNK, common::POISON).unwrap();
    }
    let mut reqs = cases
        .iter()
        .zip(&bufs)
        .map(|(&(file_off, buf_off, len), b)| ReadReq {
            buf: b.clone(),
            buf_off,
            file_off,
            len,
        });
    let mut seen = Vec::new();
    let t = engine
        .read_batch(
            &file,
            &mut |_| Ok(reqs.next().map_or(Pull::End, Pull::Req)),
            &mut |i, t| seen.push((i, t.bytes)),
        )
        .unwrap();
    seen.sort();
    let want: Vec<(usize, u64)> = cases
        .iter()
        .enumerate()
        .map(|(i, c)| (i, c.2 as u64))
        .collect();
    assert_eq!(seen, want, "done callbacks");
    assert_eq!(t.bytes, want.iter().map(|w| w.1).sum::<u64>());
    // The chunk-aligned request of three chunks: one cold chunk and parts of
    // two cached ones went each their way.
    assert!(t.cached > 0 && t.cached < t.bytes, "{t:?}");
    check("batch");
    assert_not_polluted(&file, cached, "the batch");
}

/// A read past the end of a half-warm file fails as every engine's does,
/// and so does one of a file that shrank after it was cached.
#[test]
fn short_files_fail_whichever_way_the_bytes_go() {
    let Some((_dir, path, _data)) = scratch(26) else {
        return;
    };
    make_half_warm(&path);
    let file = IoFile::open(&path).unwrap();
    let engine = new_engine(Method::Auto, EngineOptions::default()).unwrap();
    let buf = MemfdHeap::new(HugePages::None).alloc(12 * CHUNK).unwrap();
    let err = engine
        .read(&file, (SIZE - 10) as u64, &buf, 0, 100)
        .unwrap_err();
    assert!(
        matches!(err, iopath_heap::Error::ShortFile { missing: 90, .. }),
        "{err}"
    );
    // The whole file in one request, after the file shrank to one chunk.
    let std_file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    std_file.set_len(CHUNK as u64).unwrap();
    let err = engine.read(&file, 0, &buf, 0, SIZE).unwrap_err();
    assert!(matches!(err, iopath_heap::Error::ShortFile { .. }), "{err}");
}
