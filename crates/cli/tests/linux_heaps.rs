//! The heaps on a kernel that has them: User-Mode Linux 6.12
//! (`scripts/linux-lab`) with `/dev/udmabuf` and `/dev/dma_heap/system`,
//! and the file to load on ext4 on a UML block device (`/dev/ubda`), so
//! `O_DIRECT` is real (tmpfs and hostfs would turn it into a copy).
//!
//! In the guest: `iopath heaps` lists both heaps as available; every
//! method loads the file into udmabuf and into dma-heap:system byte for
//! byte (`--verify`); udmabuf takes direct I/O without a fallback, the
//! dma-heap falls back per request and counts it, and `auto` says what it
//! measured; `--heap auto` takes udmabuf and says why; a udmabuf over
//! `size_limit_mb` and an unknown dma-heap are refused with clear errors.
//! This test binary then runs again inside the guest
//! (`guest_busy_rule_and_export`): a buffer mapped for a device refuses a
//! load by every method (memfd and udmabuf), and a udmabuf exported to a
//! second process there is imported and checked.

#[allow(dead_code)]
mod lab;

use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use iopath_heap::{new_engine, open_heap, EngineOptions, Error, HeapKind, IoFile, Method};
use iopath_testkit::have_peer;
use lab::Lab;

const BIN: &str = env!("CARGO_BIN_EXE_iopath");
/// Neither a page nor a block multiple; three and a bit 8 MiB buffers.
const FILE_SIZE: usize = 24 * (1 << 20) + 777;
const METHODS: [&str; 6] = ["auto", "buffered", "direct", "sendfile", "uring", "bounce"];
/// The socket fd a child of the guest test imports from.
const CHILD_FD_ENV: &str = "IOPATH_HEAPS_CHILD_FD";
/// The file the guest test loads.
const FILE_ENV: &str = "IOPATH_HEAPS_FILE";

/// What runs in the guest, as `sh SCRIPT IOPATH TEST_EXE OUT MNT`. The
/// guest's root is the host's tree (hostfs), so the disk is mounted on
/// MNT, an empty directory of this test's own: a fixed path such as
/// `/tmp/m` could hide the checkout (and OUT) from the guest.
const GUEST: &str = r#"
iopath=$1 exe=$2 out=$3 mnt=$4
mount -t ext4 /dev/ubda "$mnt" || { echo "linux-heaps: mount failed"; exit 3; }
f=$mnt/f.bin
"$iopath" heaps >"$out/heaps.txt" 2>&1
for h in udmabuf dma-heap:system; do
    for m in auto buffered direct sendfile uring bounce; do
        # Cold each time: auto copies what the page cache holds instead of
        # measuring its engines.
        echo 1 >/proc/sys/vm/drop_caches
        "$iopath" load "$f" --heap "$h" --method "$m" --buffer-size 8M --verify --json \
            >>"$out/loads.jsonl" 2>>"$out/loads.err" || echo "{\"failed\": \"$h $m\"}" >>"$out/loads.jsonl"
    done
done
echo 1 >/proc/sys/vm/drop_caches
"$iopath" load "$f" --buffer-size 8M --verify --json >"$out/auto.json" 2>&1
truncate -s 80M "$mnt/big.bin"
"$iopath" load "$mnt/big.bin" --heap udmabuf --buffer-size 80M >"$out/limit.txt" 2>&1
"$iopath" load "$f" --heap dma-heap:nope >"$out/noheap.txt" 2>&1
IOPATH_HEAPS_FILE=$f "$exe" --ignored --exact guest_busy_rule_and_export --nocapture \
    --test-threads 1 >"$out/guest.txt" 2>&1
echo "linux-heaps: done"
"#;

fn pattern(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// An ext4 image holding `f.bin` (made on the host with e2fsprogs).
fn ext4_image(dir: &Path, data: &[u8]) -> PathBuf {
    let src = dir.join("f.bin");
    std::fs::write(&src, data).unwrap();
    let img = dir.join("disk.img");
    let f = std::fs::File::create(&img).unwrap();
    f.set_len(160 << 20).unwrap();
    let ok = Command::new("mkfs.ext4")
        .args(["-q", "-F"])
        .arg(&img)
        .status()
        .unwrap()
        .success();
    assert!(ok, "mkfs.ext4 failed");
    let out = Command::new("debugfs")
        .arg("-w")
        .arg("-R")
        .arg(format!("write {} f.bin", src.display()))
        .arg(&img)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "debugfs: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    img
}

fn read(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name)).unwrap_or_default()
}

#[test]
fn heaps_load_verify_and_share_in_uml() {
    if !have_peer("mkfs.ext4", "e2fsprogs") || !have_peer("debugfs", "e2fsprogs") {
        return;
    }
    let Some(kernel) = Lab::get().map(Lab::kernel) else {
        return;
    };
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let dir = tmp.path();
    let data = pattern(FILE_SIZE);
    let img = ext4_image(dir, &data);
    let script = dir.join("guest.sh");
    std::fs::write(&script, GUEST).unwrap();
    let mnt = dir.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let out = Command::new(lab::repo_root().join("scripts/linux-lab"))
        .arg("run")
        .arg("--ubd")
        .arg(&img)
        .args(["--mem", "512M", "--timeout", "400", "--kernel"])
        .arg(&kernel)
        .arg("--")
        .arg(&script)
        .arg(BIN)
        .arg(std::env::current_exe().unwrap())
        .arg(dir)
        .arg(&mnt)
        .stdin(Stdio::null())
        .output()
        .expect("run scripts/linux-lab run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("linux-heaps: done"),
        "the guest failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );

    let heaps = read(dir, "heaps.txt");
    for h in ["udmabuf", "dma-heap:system"] {
        assert!(
            heaps
                .lines()
                .any(|l| l.starts_with(&format!("{h} ")) && l.contains(" available")),
            "{h} not available:\n{heaps}"
        );
    }

    let loads: Vec<serde_json::Value> = read(dir, "loads.jsonl")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        loads.len(),
        2 * METHODS.len(),
        "{loads:?}\n{}",
        read(dir, "loads.err")
    );
    for v in &loads {
        assert!(v["failed"].is_null(), "{v}\n{}", read(dir, "loads.err"));
        let (heap, asked) = (
            v["heap"].as_str().unwrap(),
            v["requested_method"].as_str().unwrap(),
        );
        assert_eq!(v["verified"], true, "{v}");
        assert_eq!(v["bytes"], FILE_SIZE as u64, "{v}");
        let buffers = v["buffers"].as_u64().unwrap();
        let fallbacks = v["fallbacks"].as_u64().unwrap();
        match (heap, asked) {
            // Direct I/O fills the memfd under each udmabuf: no fallback.
            ("udmabuf", "direct" | "uring" | "bounce" | "auto") => {
                assert_eq!(fallbacks, 0, "{v}")
            }
            // The dma-heap's mapping refuses direct I/O: counted fallbacks.
            ("dma-heap:system", "direct" | "uring") => {
                assert_eq!(fallbacks, buffers, "{v}")
            }
            ("dma-heap:system", "auto") => {
                assert_eq!(v["auto_probe"]["mapping_refuses_direct_io"], true, "{v}");
                let m = v["method"].as_str().unwrap();
                assert!(m == "bounce" || m == "buffered", "{v}");
            }
            _ => {}
        }
        if heap == "udmabuf" && asked == "auto" {
            let m = v["method"].as_str().unwrap();
            assert!(m == "uring" || m == "direct", "{v}");
        }
    }

    let auto: serde_json::Value = serde_json::from_str(read(dir, "auto.json").trim())
        .unwrap_or_else(|e| panic!("{e}: {}", read(dir, "auto.json")));
    assert_eq!(auto["heap"], "udmabuf", "{auto}");
    assert_eq!(auto["verified"], true, "{auto}");
    let why = auto["heap_why"].as_str().unwrap();
    assert!(
        why.contains("dma-heap:system refuses direct I/O into its mapping")
            && why.contains("Bad address"),
        "{why}"
    );

    let limit = read(dir, "limit.txt");
    assert!(
        limit.starts_with("iopath: error: --buffer-size 83886080: udmabuf refuses a buffer of 83886080 bytes: the kernel's limit is 64 MiB")
            && limit.contains("size_limit_mb"),
        "{limit}"
    );
    let noheap = read(dir, "noheap.txt");
    assert!(
        noheap.contains("this kernel has no dma-heap `nope` (it has: system)"),
        "{noheap}"
    );

    let guest = read(dir, "guest.txt");
    assert!(
        guest.contains("test result: ok. 1 passed")
            && guest.contains("memfd busy rule ok")
            && guest.contains("udmabuf busy rule ok")
            && guest.contains("udmabuf import ok"),
        "{guest}"
    );
}

fn fnv1a(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// In the guest: the busy rule for memfd and udmabuf by every method, and
/// a udmabuf exported to a second process.
#[test]
#[ignore = "runs inside the UML guest of heaps_load_verify_and_share_in_uml"]
fn guest_busy_rule_and_export() {
    let path = PathBuf::from(std::env::var_os(FILE_ENV).expect("run by the guest script"));
    let data = std::fs::read(&path).unwrap();
    let file = IoFile::open(&path).unwrap();
    assert!(
        file.dio_align().is_some(),
        "no O_DIRECT on the guest's ext4"
    );
    let len = data.len().div_ceil(4096) * 4096;
    for heap in ["memfd", "udmabuf"] {
        let buf = open_heap(heap).unwrap().alloc(len).unwrap();
        buf.fill(0, len, 0x5a).unwrap();
        // Mapped for a device (what a DMA mapping holds): every load refuses.
        let pin = buf.pin_for_device();
        for m in Method::ALL {
            let e = new_engine(m, EngineOptions::default()).unwrap();
            match e.read(&file, 0, &buf, 0, data.len()) {
                Err(Error::Busy { maps: 1 }) => {}
                other => panic!("{heap} {m}: expected Busy, got {other:?}"),
            }
        }
        let mut head = [0u8; 64];
        buf.read_at(0, &mut head).unwrap();
        assert_eq!(head, [0x5a; 64], "{heap}: a refused load wrote");
        drop(pin);
        let e = new_engine(Method::Direct, EngineOptions::default()).unwrap();
        let t = e.read(&file, 0, &buf, 0, data.len()).unwrap();
        assert_eq!(t.fallbacks, 0, "{heap}");
        let mut got = vec![0u8; data.len()];
        buf.read_at(0, &mut got).unwrap();
        assert!(got == data, "{heap}: bytes differ after the pin dropped");
        println!("{heap} busy rule ok");

        if heap == "udmabuf" {
            let (mine, theirs) = UnixStream::pair().unwrap();
            // The child inherits its end: clear close-on-exec on it.
            rustix::io::fcntl_setfd(&theirs, rustix::io::FdFlags::empty()).unwrap();
            let child = Command::new(std::env::current_exe().unwrap())
                .args(["--ignored", "--exact", "guest_import_child", "--nocapture"])
                .env(CHILD_FD_ENV, theirs.as_raw_fd().to_string())
                .env(FILE_ENV, &path)
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            drop(theirs);
            buf.export(&mine).unwrap();
            let out = child.wait_with_output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "child: {text}");
            let want = format!("udmabuf import ok {:016x}", fnv1a(&data));
            assert!(text.contains(&want), "child said: {text}; want {want}");
            println!("{want}");
        }
    }
    std::io::stdout().flush().unwrap();
}

/// The second process: imports the udmabuf and checksums what it holds.
#[test]
#[ignore = "run by guest_busy_rule_and_export in a child process"]
fn guest_import_child() {
    let fd: i32 = std::env::var(CHILD_FD_ENV).unwrap().parse().unwrap();
    // SAFETY: the parent passed this fd, open and ours alone, by number.
    let sock = UnixStream::from(unsafe { OwnedFd::from_raw_fd(fd) });
    let buf = iopath_heap::Buffer::import(&sock).unwrap();
    assert_eq!(buf.kind(), HeapKind::Udmabuf);
    // The memfd came along: this process can fill the buffer directly too.
    assert!(buf.takes_direct_io() && buf.memfd().is_some());
    let len = std::fs::metadata(std::env::var_os(FILE_ENV).unwrap())
        .unwrap()
        .len() as usize;
    let mut got = vec![0u8; len];
    buf.read_at(0, &mut got).unwrap();
    println!("udmabuf import ok {:016x}", fnv1a(&got));
}
