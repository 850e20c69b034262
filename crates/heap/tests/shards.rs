//! Sharded checkpoints: a directory or its index loaded into one map,
//! every tensor byte-identical with its shard; a missing shard, a tensor
//! in two shards, a truncated, hostile or changed shard fail the whole
//! load, naming the shard.

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use iopath_heap::{
    dtype_align, load_checkpoint, load_safetensors, Error, HugePages, LoadOptions, MemfdHeap,
    Progress, Tensors,
};

type Spec = (String, &'static str, Vec<usize>, Vec<u8>);

/// A 3-shard checkpoint in `dir` with its index; returns every tensor's
/// bytes by name.
fn checkpoint(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut want = BTreeMap::new();
    let mut map = serde_json::Map::new();
    for s in 0..3u64 {
        let file = format!("model-{:05}-of-00003.safetensors", s + 1);
        let tensors: Vec<Spec> = (0..5u64)
            .map(|t| {
                let seed = s * 10 + t;
                let (dtype, n, size) =
                    [("BF16", 700, 2), ("F32", 300, 4), ("U8", 33, 1)][(seed % 3) as usize];
                let n = n * (1 + t as usize);
                let name = format!("layers.{s}.w{t}");
                (name, dtype, vec![n], common::pattern(n * size, seed))
            })
            .chain(std::iter::once((
                format!("layers.{s}.big"),
                "F32",
                vec![100_000],
                common::pattern(400_000, 100 + s),
            )))
            .collect();
        for (name, _, _, data) in &tensors {
            want.insert(name.clone(), data.clone());
            map.insert(name.clone(), file.clone().into());
        }
        common::write_safetensors(&dir.join(&file), &tensors);
    }
    let index = serde_json::json!({"metadata": {"total_size": 1}, "weight_map": map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    want
}

fn opts() -> LoadOptions {
    LoadOptions {
        buffer_size: 128 << 10,
        ..LoadOptions::default()
    }
}

fn check(t: &Tensors, want: &BTreeMap<String, Vec<u8>>) {
    assert_eq!(
        t.tensors.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>()
    );
    for (name, x) in &t.tensors {
        let mut got = vec![0u8; x.len];
        x.buffer.read_at(x.offset, &mut got).unwrap();
        assert!(got == want[name], "{name}: bytes differ");
        assert!(x.buffer.same_as(&t.buffers[x.buffer_index]), "{name}");
        assert_eq!((x.buffer.addr() + x.offset) % dtype_align(x.dtype), 0);
        let shard = t.shards[x.shard]
            .path
            .file_name()
            .unwrap()
            .to_str()
            .unwrap();
        let n: usize = name.split('.').nth(1).unwrap().parse().unwrap();
        assert_eq!(shard, format!("model-{:05}-of-00003.safetensors", n + 1));
    }
    assert_eq!(
        t.stats.bytes,
        want.values().map(|v| v.len() as u64).sum::<u64>()
    );
    assert_eq!(t.stats.buffers, t.buffers.len());
    assert_eq!(
        t.shards.iter().map(|s| s.tensors).sum::<usize>(),
        want.len()
    );
    assert_eq!(t.metadata["total_size"], "1");
    assert_eq!(t.metadata["format"], "pt");
    t.verify().unwrap();
}

#[test]
fn a_directory_and_its_index_load_into_one_map() {
    let Some(dir) = common::disk_dir() else {
        return;
    };
    let want = checkpoint(dir.path());
    let heap = MemfdHeap::new(HugePages::None);
    for at_once in [1, 2, 3, 8] {
        for path in [
            dir.path().to_path_buf(),
            dir.path().join("model.safetensors.index.json"),
        ] {
            let mut seen: Vec<Progress> = Vec::new();
            let t = load_checkpoint(&path, &heap, &opts(), at_once, &mut |p| seen.push(*p))
                .unwrap_or_else(|e| panic!("{at_once} at once, {path:?}: {e}"));
            check(&t, &want);
            // Progress: the whole load's bytes grow to the total, each
            // shard's to its own.
            let last = seen.last().unwrap();
            assert_eq!((last.bytes, last.total), (t.stats.bytes, t.stats.bytes));
            assert_eq!(last.buffers, last.buffers_total);
            assert!(seen.windows(2).all(|w| w[0].bytes < w[1].bytes));
            for (i, s) in t.shards.iter().enumerate() {
                let ends = seen.iter().rfind(|p| p.shard == i).unwrap();
                assert_eq!(
                    (ends.shard_bytes, ends.shard_total),
                    (s.stats.bytes, s.stats.bytes)
                );
                assert_eq!(ends.shards, 3);
            }
        }
    }
    // Without the index, the directory's shard files.
    std::fs::remove_file(dir.path().join("model.safetensors.index.json")).unwrap();
    let t = load_safetensors(dir.path(), &heap, &opts(), &mut |_| {}).unwrap();
    assert_eq!(t.tensors.len(), want.len());
    t.verify().unwrap();
}

fn shard_error(path: &Path) -> (usize, PathBuf, Error) {
    let heap = MemfdHeap::new(HugePages::None);
    match load_checkpoint(path, &heap, &opts(), 2, &mut |_| {}) {
        Err(Error::Shard {
            index,
            count: 3,
            path,
            source,
        }) => (index, path, *source),
        other => panic!("{other:?}"),
    }
}

fn checkpoint_reason(path: &Path) -> String {
    let heap = MemfdHeap::new(HugePages::None);
    match load_safetensors(path, &heap, &opts(), &mut |_| {}) {
        Err(Error::Checkpoint { reason, .. }) => reason,
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_truncated_or_hostile_shard_fails_the_load_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    checkpoint(dir.path());
    let second = dir.path().join("model-00002-of-00003.safetensors");
    let whole = std::fs::read(&second).unwrap();
    std::fs::write(&second, &whole[..whole.len() - 100]).unwrap();
    let (index, path, e) = shard_error(dir.path());
    assert_eq!((index, &path), (2, &second));
    assert!(
        matches!(&e, Error::Safetensors { reason, .. } if reason.contains("the tensors' data ends at byte")),
        "{e}"
    );
    let mut hostile = (1u64 << 40).to_le_bytes().to_vec();
    hostile.extend_from_slice(b"{}");
    std::fs::write(&second, hostile).unwrap();
    let (index, _, e) = shard_error(dir.path());
    assert_eq!(index, 2);
    let msg = iopath_sys::error_chain(&Error::Shard {
        index,
        count: 3,
        path: second.clone(),
        source: Box::new(e),
    });
    assert!(
        msg.starts_with(&format!("shard 2 of 3 ({}): ", second.display()))
            && msg.contains("header length 1099511627776 is over the limit"),
        "{msg}"
    );
}

#[test]
fn a_missing_shard_or_a_tensor_in_two_shards_is_named() {
    let dir = tempfile::tempdir().unwrap();
    checkpoint(dir.path());
    let third = dir.path().join("model-00003-of-00003.safetensors");
    let kept = std::fs::read(&third).unwrap();
    std::fs::remove_file(&third).unwrap();
    assert_eq!(
        checkpoint_reason(dir.path()),
        "the index names shard model-00003-of-00003.safetensors (6 tensors), which does not exist"
    );
    std::fs::write(&third, &kept).unwrap();
    // A fourth file holding a tensor of the first, and no index.
    let a = dir.path().join("model-00001-of-00003.safetensors");
    std::fs::copy(&a, dir.path().join("copy.safetensors")).unwrap();
    std::fs::remove_file(dir.path().join("model.safetensors.index.json")).unwrap();
    assert_eq!(
        checkpoint_reason(dir.path()),
        "tensor \"layers.0.w0\" is in two shards: copy.safetensors and model-00001-of-00003.safetensors"
    );
    std::fs::remove_file(dir.path().join("copy.safetensors")).unwrap();
    // An index that puts a tensor in the wrong shard.
    let want = checkpoint(dir.path());
    let index = dir.path().join("model.safetensors.index.json");
    let text = std::fs::read_to_string(&index).unwrap().replace(
        "\"layers.1.w0\":\"model-00002-of-00003.safetensors\"",
        "\"layers.1.w0\":\"model-00003-of-00003.safetensors\"",
    );
    std::fs::write(&index, text).unwrap();
    assert_eq!(
        checkpoint_reason(&index),
        "tensor \"layers.1.w0\" is in shard model-00002-of-00003.safetensors but the index names \
         shard model-00003-of-00003.safetensors"
    );
    assert!(want.contains_key("layers.1.w0"));
}

#[test]
fn a_shard_changed_during_the_load_fails_it() {
    let dir = tempfile::tempdir().unwrap();
    checkpoint(dir.path());
    let first = dir.path().join("model-00001-of-00003.safetensors");
    // Past the timestamp granularity of the file system's clock.
    std::thread::sleep(std::time::Duration::from_millis(50));
    let heap = MemfdHeap::new(HugePages::None);
    let mut written = false;
    let r = load_checkpoint(dir.path(), &heap, &opts(), 1, &mut |_| {
        if !written {
            // Same size, one byte rewritten in place.
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(&first)
                .unwrap();
            f.write_all_at(b"\x5a", 4096).unwrap();
            written = true;
        }
    });
    match r {
        Err(Error::Shard {
            index: 1, source, ..
        }) => assert!(
            matches!(&*source, Error::Changed { path } if *path == first),
            "{source}"
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn one_file_keeps_its_own_errors() {
    let dir = tempfile::tempdir().unwrap();
    checkpoint(dir.path());
    let one = dir.path().join("model-00002-of-00003.safetensors");
    let heap = MemfdHeap::new(HugePages::None);
    let t = load_safetensors(&one, &heap, &opts(), &mut |_| {}).unwrap();
    assert_eq!(t.shards.len(), 1);
    assert_eq!(t.tensors.len(), 6);
    t.verify().unwrap();
    std::fs::write(&one, b"short").unwrap();
    let r = load_safetensors(&one, &heap, &opts(), &mut |_| {});
    assert!(matches!(r, Err(Error::Safetensors { .. })), "{r:?}");
}

/// A cold checkpoint of `shards` shards of 12 F32 tensors of 3 MiB each
/// (36 MiB a shard: more than one probe slice, so `auto` measures both
/// engines on a shard), written back and dropped from the page cache.
/// `None` (skipped) without a disk directory or direct I/O.
fn cold_checkpoint(shards: u64) -> Option<(tempfile::TempDir, BTreeMap<String, Vec<u8>>)> {
    let dir = common::disk_dir()?;
    let mut want = BTreeMap::new();
    for s in 0..shards {
        let path = dir
            .path()
            .join(format!("model-{:05}-of-{shards:05}.safetensors", s + 1));
        let tensors: Vec<Spec> = (0..12u64)
            .map(|t| {
                let data = common::pattern(3 << 20, s * 100 + t);
                (format!("layers.{s}.w{t}"), "F32", vec![(3 << 20) / 4], data)
            })
            .collect();
        for (name, _, _, data) in &tensors {
            want.insert(name.clone(), data.clone());
        }
        common::write_safetensors(&path, &tensors);
        std::fs::File::open(&path).unwrap().sync_all().unwrap();
        let f = iopath_heap::IoFile::open(&path).unwrap();
        if f.dio_align().is_none() {
            iopath_testkit::skip(
                iopath_testkit::Feature::DirectIo,
                "no direct I/O on the scratch file system",
            );
            return None;
        }
        f.drop_cache().unwrap();
        assert_eq!(f.cached_bytes().unwrap(), 0, "cache not dropped");
    }
    Some((dir, want))
}

#[test]
fn the_shards_of_a_cold_checkpoint_share_one_probe() {
    let heap = MemfdHeap::new(HugePages::None);
    let opts = LoadOptions {
        buffer_size: 4 << 20,
        ..LoadOptions::default()
    };
    for at_once in [1, 3] {
        let Some((dir, want)) = cold_checkpoint(3) else {
            return;
        };
        let t = load_checkpoint(dir.path(), &heap, &opts, at_once, &mut |_| {})
            .unwrap_or_else(|e| panic!("{at_once} at once: {e}"));
        for (name, x) in &t.tensors {
            let mut got = vec![0u8; x.len];
            x.buffer.read_at(x.offset, &mut got).unwrap();
            assert!(got == want[name], "{at_once} at once, {name}: bytes differ");
        }
        // Cold but for the header's page or so that the header read cached.
        assert!(t.stats.from_cache < 1 << 20, "{at_once} at once: not cold");
        let probes: Vec<_> = t.shards.iter().map(|s| s.stats.probe).collect();
        let Some(Some(p)) = probes.iter().find(|p| p.is_some_and(|p| p.uring.0 > 0)) else {
            // No probe at all: io_uring is not available here, and `auto`
            // read direct.
            iopath_testkit::skip(iopath_testkit::Feature::IoUring, "auto did not probe");
            return;
        };
        // One shard measured both engines; every shard that reports a
        // measurement reports that one (one probe per shard would time
        // each shard's slices apart).
        assert!(p.direct.0 > 0, "{at_once} at once: {p:?}");
        for (i, q) in probes.iter().enumerate() {
            let q = q.unwrap();
            if q.uring.0 > 0 || q.direct.0 > 0 {
                assert_eq!(q, *p, "{at_once} at once, shard {i}");
            }
        }
        if at_once == 1 {
            // One after the other: the first measures, the others take its
            // choice.
            for (i, s) in t.shards.iter().enumerate() {
                assert_eq!(s.stats.probe, Some(*p), "shard {i}");
                assert_eq!(Some(s.stats.method), p.chosen, "shard {i}");
            }
        }
    }
}

/// A memfd heap whose allocations take 10 ms each: slower than the reads,
/// so shards wait for their buffers.
#[derive(Debug)]
struct SlowHeap(MemfdHeap);

impl iopath_heap::Heap for SlowHeap {
    fn name(&self) -> String {
        "slow memfd".into()
    }

    fn alloc(&self, len: usize) -> iopath_heap::Result<iopath_heap::Buffer> {
        std::thread::sleep(std::time::Duration::from_millis(10));
        self.0.alloc(len)
    }
}

#[test]
fn a_shard_truncated_during_the_load_is_the_one_named() {
    // With slow allocation the first shard is still waiting for buffers
    // when the second fails and the allocator stops: its own error then
    // (no buffer came) is an echo, and the load names the second.
    let heap = SlowHeap(MemfdHeap::new(HugePages::None));
    for alloc_threads in [1, 2] {
        let Some((dir, _)) = cold_checkpoint(3) else {
            return;
        };
        let second = dir.path().join("model-00002-of-00003.safetensors");
        let opts = LoadOptions {
            buffer_size: 4 << 20,
            alloc_threads,
            ..LoadOptions::default()
        };
        let mut cut = false;
        let r = load_checkpoint(dir.path(), &heap, &opts, 2, &mut |p| {
            if !cut && p.shard == 1 {
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(&second)
                    .unwrap()
                    .set_len(1 << 20)
                    .unwrap();
                cut = true;
            }
        });
        match r {
            Err(Error::Shard { index: 2, path, .. }) => assert_eq!(path, second),
            other => panic!("{alloc_threads} allocator thread(s): {other:?}"),
        }
    }
}
