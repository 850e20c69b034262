//! `map`: tensors the page cache holds whole become views of their file
//! (the file mapped private), the rest are read; bytes equal the file's,
//! the stats say what was mapped and what read, a write to the view never
//! reaches the file, and a file truncated during or after the load fails
//! the load naming the shard, or reads as zeros, never kills the process.

mod common;

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use iopath_heap::{
    dtype_align, load_checkpoint, Error, HeapKind, HugePages, IoFile, LoadOptions, MemfdHeap,
    Tensors, TOUCH_READ,
};
use iopath_testkit::Feature;

const MIB: usize = 1 << 20;

/// A 3-shard checkpoint in `dir`: per shard two 1 MiB F32 tensors, then a
/// 3-byte U8 one (which leaves the next F32 tensor misaligned in the file,
/// so it is read even when cached), then another 1 MiB F32 one. Returns
/// the shard paths and every tensor's bytes by name.
fn checkpoint(dir: &Path) -> (Vec<PathBuf>, Vec<(String, Vec<u8>)>) {
    let mut want = Vec::new();
    let mut paths = Vec::new();
    for s in 0..3u64 {
        let path = dir.join(format!("model-{:05}-of-00003.safetensors", s + 1));
        let t: Vec<(String, &str, Vec<usize>, Vec<u8>)> = vec![
            (
                format!("s{s}.a"),
                "F32",
                vec![MIB / 4],
                common::pattern(MIB, s * 4),
            ),
            (
                format!("s{s}.b"),
                "F32",
                vec![MIB / 4],
                common::pattern(MIB, s * 4 + 1),
            ),
            (
                format!("s{s}.odd"),
                "U8",
                vec![3],
                common::pattern(3, s * 4 + 2),
            ),
            (
                format!("s{s}.c"),
                "F32",
                vec![MIB / 4],
                common::pattern(MIB, s * 4 + 3),
            ),
        ];
        common::write_safetensors(&path, &t);
        want.extend(t.into_iter().map(|(n, _, _, d)| (n, d)));
        paths.push(path);
    }
    (paths, want)
}

fn map_opts() -> LoadOptions {
    let mut o = LoadOptions {
        buffer_size: 2 << 20,
        ..LoadOptions::default()
    };
    o.set_method("map").unwrap();
    o
}

/// Every tensor byte-equal with the file; returns the names of those that
/// are views of their file.
fn check(t: &Tensors, want: &[(String, Vec<u8>)]) -> Vec<String> {
    assert_eq!(t.tensors.len(), want.len());
    let mut mapped = Vec::new();
    for (name, data) in want {
        let x = &t.tensors[name];
        let mut got = vec![0u8; x.len];
        x.buffer.read_at(x.offset, &mut got).unwrap();
        assert!(got == *data, "{name}: bytes differ");
        assert!(x.buffer.same_as(&t.buffers[x.buffer_index]), "{name}");
        assert_eq!((x.buffer.addr() + x.offset) % dtype_align(x.dtype), 0);
        if x.buffer.kind() == HeapKind::File {
            assert_eq!(
                x.offset as u64, x.file_offset,
                "{name}: a view at its file offset"
            );
            mapped.push(name.clone());
        }
    }
    let total: u64 = want.iter().map(|(_, d)| d.len() as u64).sum();
    assert_eq!(t.stats.bytes + t.stats.mapped, total);
    t.verify().unwrap();
    mapped
}

#[test]
fn cached_tensors_are_views_of_the_file_and_the_rest_is_read() {
    // tmpfs: every page is in the page cache, always.
    let Some(dir) = common::shm_dir() else {
        return;
    };
    let (paths, want) = checkpoint(dir.path());
    let heap = MemfdHeap::new(HugePages::None);
    let t = load_checkpoint(dir.path(), &heap, &map_opts(), 2, &mut |_| {}).unwrap();
    let mapped = check(&t, &want);
    // Every aligned tensor mapped; the misaligned one and the 3 bytes read.
    let expect: Vec<String> = (0..3)
        .flat_map(|s| [format!("s{s}.a"), format!("s{s}.b"), format!("s{s}.odd")])
        .collect();
    let mut mapped_sorted = mapped.clone();
    mapped_sorted.sort();
    assert_eq!(mapped_sorted, expect);
    assert_eq!(t.stats.mapped, 3 * (2 * MIB as u64 + 3));
    assert_eq!(t.stats.bytes, 3 * MIB as u64);
    assert_eq!(t.stats.populate, Some(TOUCH_READ));
    assert_eq!(t.stats.populate, Some("read faults"));
    // A write through a view is private (copy-on-write)...
    let a = &t.tensors["s0.a"];
    a.buffer.write_at(a.offset, b"mine").unwrap();
    let mut head = [0u8; 4];
    File::open(&paths[0])
        .unwrap()
        .read_exact_at(&mut head, a.file_offset)
        .unwrap();
    assert_eq!(head[..], want[0].1[..4], "a view's write reached the file");
    // ...while a write to the file shows through a page not copied yet
    // (the documented cost of a view of the page cache).
    let b = &t.tensors["s0.b"];
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&paths[0])
        .unwrap();
    f.write_all_at(b"file", b.file_offset).unwrap();
    b.buffer.read_at(b.offset, &mut head).unwrap();
    assert_eq!(&head, b"file");
    // Without `map`, nothing is a view.
    let mut plain = map_opts();
    plain.set_method("auto").unwrap();
    assert!(!plain.map_cached);
    let t = load_checkpoint(dir.path(), &heap, &plain, 2, &mut |_| {}).unwrap();
    assert!(t.buffers.iter().all(|b| b.kind() == HeapKind::Memfd));
    assert_eq!(t.stats.mapped, 0);
}

#[test]
fn only_the_cached_part_of_a_half_warm_file_is_mapped() {
    let Some(dir) = common::disk_dir() else {
        return;
    };
    let (paths, want) = checkpoint(dir.path());
    for p in &paths {
        File::open(p).unwrap().sync_all().unwrap();
        let f = IoFile::open(p).unwrap();
        f.drop_cache().unwrap();
        if f.cached_bytes().unwrap() != 0 {
            iopath_testkit::skip(
                Feature::DiskDir,
                format!("the page cache of {p:?} cannot be dropped here"),
            );
            return;
        }
    }
    // Shard 2's tensor `a` cached, with a grain's margin either side (its
    // neighbours are only partly cached, so they are read).
    let header = {
        let f = File::open(&paths[1]).unwrap();
        rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::Random).unwrap();
        let mut n = [0u8; 8];
        f.read_exact_at(&mut n, 0).unwrap();
        u64::from_le_bytes(n)
    };
    // `s1.a` is the first tensor: at 8 + the header's length.
    let a_off = 8 + header;
    let start = a_off - (64 << 10).min(a_off);
    let end = a_off + MIB as u64 + (64 << 10);
    let f = File::open(&paths[1]).unwrap();
    rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::Random).unwrap();
    let mut buf = vec![0u8; (end - start) as usize];
    f.read_exact_at(&mut buf, start).unwrap();
    let heap = MemfdHeap::new(HugePages::None);
    let t = load_checkpoint(dir.path(), &heap, &map_opts(), 2, &mut |_| {}).unwrap();
    let mapped = check(&t, &want);
    assert_eq!(mapped, vec!["s1.a".to_string()]);
    assert_eq!(t.stats.mapped, MIB as u64);
    assert_eq!(
        t.buffers
            .iter()
            .filter(|b| b.kind() == HeapKind::File)
            .count(),
        1
    );
}

#[test]
fn a_shard_truncated_during_a_map_load_fails_it() {
    let Some(dir) = common::shm_dir() else {
        return;
    };
    // Shard 1 has a tensor that is read (misaligned), so progress comes;
    // shard 2's are all aligned, all mapped.
    let f32s = |n: usize, seed: u64| ("F32", vec![n / 4], common::pattern(n, seed));
    let one = dir.path().join("model-00001-of-00002.safetensors");
    let two = dir.path().join("model-00002-of-00002.safetensors");
    let (d, s, b) = f32s(MIB, 1);
    common::write_safetensors(
        &one,
        &[("odd", "U8", vec![3], vec![1, 2, 3]), ("x", d, s, b)],
    );
    let (d, s, b) = f32s(MIB, 2);
    let (d2, s2, b2) = f32s(MIB, 3);
    common::write_safetensors(&two, &[("y", d, s, b), ("z", d2, s2, b2)]);
    // Past the timestamp granularity of the file system's clock.
    std::thread::sleep(std::time::Duration::from_millis(50));
    let heap = MemfdHeap::new(HugePages::None);
    for cut_to in [MIB as u64, 0] {
        let mut cut = false;
        // One shard at a time: the first read of shard 1 cuts shard 2,
        // whose header was checked and whose tensors were chosen to map.
        let r = load_checkpoint(dir.path(), &heap, &map_opts(), 1, &mut |_| {
            if !cut {
                let f = std::fs::OpenOptions::new().write(true).open(&two).unwrap();
                f.set_len(cut_to).unwrap();
                cut = true;
            }
        });
        assert!(cut);
        match r {
            Err(Error::Shard { index: 2, path, .. }) => assert_eq!(path, two),
            other => panic!("cut to {cut_to}: {other:?}"),
        }
        let (d, s, b) = f32s(MIB, 2);
        let (d2, s2, b2) = f32s(MIB, 3);
        common::write_safetensors(&two, &[("y", d, s, b), ("z", d2, s2, b2)]);
    }
}

#[test]
fn a_file_truncated_under_its_views_reads_as_zeros() {
    let Some(dir) = common::shm_dir() else {
        return;
    };
    let (paths, want) = checkpoint(dir.path());
    let heap = MemfdHeap::new(HugePages::None);
    let t = load_checkpoint(&paths[0], &heap, &map_opts(), 1, &mut |_| {}).unwrap();
    let c = &t.tensors["s0.a"];
    assert_eq!(c.buffer.kind(), HeapKind::File);
    assert!(c.buffer.is_guarded());
    // A view of the page cache: a truncation takes its pages (a mapping of
    // any loader's would raise SIGBUS on the next access).
    std::fs::OpenOptions::new()
        .write(true)
        .open(&paths[0])
        .unwrap()
        .set_len(0)
        .unwrap();
    let mut got = vec![1u8; c.len];
    c.buffer.read_at(c.offset, &mut got).unwrap();
    assert!(got.iter().all(|&b| b == 0));
    assert!(c.buffer.peer_truncated());
    assert_ne!(want[0].1, got);
}

#[test]
fn a_hostile_header_is_refused_before_anything_is_mapped() {
    let Some(dir) = common::shm_dir() else {
        return;
    };
    let path = dir.path().join("model.safetensors");
    // A tensor said to lie past the end of the file.
    let header = br#"{"x":{"dtype":"F32","shape":[1024],"data_offsets":[0,4096]}}    "#;
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(header);
    file.extend_from_slice(&[7u8; 64]);
    std::fs::write(&path, file).unwrap();
    let heap = MemfdHeap::new(HugePages::None);
    match load_checkpoint(&path, &heap, &map_opts(), 1, &mut |_| {}) {
        Err(Error::Safetensors { path: p, .. }) => assert_eq!(p, path),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_pool_never_keeps_a_file_buffer() {
    let Some(dir) = common::shm_dir() else {
        return;
    };
    let (_, want) = checkpoint(dir.path());
    let pool = iopath_heap::Pool::unbounded(Box::new(MemfdHeap::new(HugePages::None)));
    for _ in 0..2 {
        let t = load_checkpoint(dir.path(), &pool, &map_opts(), 2, &mut |_| {}).unwrap();
        check(&t, &want);
        // Only the read tensors' buffers are the pool's.
        let heap_bytes: u64 = t
            .buffers
            .iter()
            .filter(|b| b.kind() == HeapKind::Memfd)
            .map(|b| b.len() as u64)
            .sum();
        assert_eq!(pool.kept_bytes(), heap_bytes);
        assert!(t.buffers.iter().any(|b| b.kind() == HeapKind::File));
    }
    // The second load reused the first's buffers.
    assert!(pool.counts().0 > 0);
}

/// Runs this test binary's test `name` in a child where every private
/// read/write mapping of a file fails with `ENODEV`, as on a file system
/// without `mmap` (a seccomp filter on `mmap(2)`'s `prot` and `flags`;
/// the loader's and the libraries' mappings are other kinds). `false`
/// where the filter cannot be written (an architecture it does not know).
fn run_where_files_do_not_map(name: &str) -> bool {
    use std::os::unix::process::CommandExt;
    #[cfg(target_arch = "x86_64")]
    const ARCH: u32 = 0xc000_003e; // AUDIT_ARCH_X86_64
    #[cfg(target_arch = "aarch64")]
    const ARCH: u32 = 0xc000_00b7; // AUDIT_ARCH_AARCH64
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = name;
        return false;
    }
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    {
        let ld = |k: u32| libc::sock_filter {
            code: (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16,
            jt: 0,
            jf: 0,
            k,
        };
        let jeq = |k: u32, jt: u8, jf: u8| libc::sock_filter {
            code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
            jt,
            jf,
            k,
        };
        let ret = |k: u32| libc::sock_filter {
            code: (libc::BPF_RET | libc::BPF_K) as u16,
            jt: 0,
            jf: 0,
            k,
        };
        // struct seccomp_data: nr at 0, arch at 4, args[i] at 16 + 8 i
        // (the low half first: little-endian).
        let filter = [
            ld(4),
            jeq(ARCH, 0, 6),
            ld(0),
            jeq(libc::SYS_mmap as u32, 0, 4),
            ld(16 + 8 * 3),
            jeq(libc::MAP_PRIVATE as u32, 0, 2),
            ld(16 + 8 * 2),
            jeq((libc::PROT_READ | libc::PROT_WRITE) as u32, 1, 0),
            ret(libc::SECCOMP_RET_ALLOW),
            ret(libc::SECCOMP_RET_ERRNO | libc::ENODEV as u32),
        ];
        let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
        cmd.args(["--exact", name, "--nocapture"])
            .env("IOPATH_NO_FILE_MAPS", "1");
        // SAFETY: between fork and exec the closure makes two prctl(2)
        // calls (async-signal-safe system calls) on a filter built before
        // the fork, and allocates nothing.
        unsafe {
            cmd.pre_exec(move || {
                let prog = libc::sock_fprog {
                    len: filter.len() as u16,
                    filter: filter.as_ptr().cast_mut(),
                };
                if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                    || libc::prctl(
                        libc::PR_SET_SECCOMP,
                        libc::SECCOMP_MODE_FILTER,
                        &prog as *const libc::sock_fprog,
                    ) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{:?}: {}",
            out.status,
            String::from_utf8_lossy(&out.stdout)
        );
        true
    }
}

#[test]
fn a_file_system_that_will_not_map_files_is_read_instead() {
    let name = "a_file_system_that_will_not_map_files_is_read_instead";
    if std::env::var_os("IOPATH_NO_FILE_MAPS").is_none() {
        if !run_where_files_do_not_map(name) {
            eprintln!("skipped: no seccomp filter for this architecture");
        }
        return;
    }
    let Some(dir) = common::shm_dir() else {
        return;
    };
    let (paths, want) = checkpoint(dir.path());
    // The filter is in place: the file does not map.
    let fd = std::os::fd::OwnedFd::from(File::open(&paths[0]).unwrap());
    let refused = iopath_heap::Buffer::map_file(fd, MIB).unwrap_err();
    assert!(
        matches!(&refused, Error::Sys { op: "mmap", source } if source.raw_os_error() == Some(libc::ENODEV)),
        "{refused:?}"
    );
    // Every page cached, none mappable: every tensor read.
    let heap = MemfdHeap::new(HugePages::None);
    let t = load_checkpoint(dir.path(), &heap, &map_opts(), 2, &mut |_| {}).unwrap();
    assert!(check(&t, &want).is_empty());
    assert_eq!(t.stats.mapped, 0);
    assert_eq!(t.stats.populate, None);
}
