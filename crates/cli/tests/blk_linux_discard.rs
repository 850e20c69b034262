//! Discard, write-zeroes and read-only as Linux's own virtio-blk driver
//! uses them: User-Mode Linux (`scripts/linux-lab`) on `iopath blk serve
//! --export ...,no-access-platform`, running the host's util-linux and
//! e2fsprogs inside the guest.
//!
//! - `blkdiscard` (DISCARD), `blkdiscard -z` (WRITE_ZEROES, "do not
//!   unmap") and `fallocate -p` (WRITE_ZEROES with unmap) on three ranges
//!   of a filled image: each reads as zeros in the image file, the
//!   discarded and unmapped ones as holes where the file system punches
//!   them, and not a byte changes elsewhere.
//! - `fstrim` on a mounted ext4: the blocks of a file that was written
//!   (seen on the device before), then deleted, read as zeros and are
//!   holes, as is every other free block.
//! - a `readonly` export: the guest sees a read-only disk, its writes,
//!   discards and zero-outs fail, its reads return the image, and the
//!   image is byte-identical afterwards.

#[allow(dead_code)]
mod lab;

use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use iopath_sys::process::Supervised;
use lab::Lab;

const MIB: u64 = 1 << 20;
const IMAGE: u64 = 64 * MIB;
const FILL: u8 = 0xa5;

/// One guest at a time: the machine is small.
fn guest_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    iopath_sys::lock(&LOCK)
}

/// The host programs the guest runs, each with its Debian package; under
/// CI a missing one fails the test.
fn have_tools() -> bool {
    iopath_testkit::have_peers(&[
        ("blkdiscard", "util-linux"),
        ("fstrim", "util-linux"),
        ("fallocate", "util-linux"),
        ("mkfs.ext4", "e2fsprogs"),
        ("filefrag", "e2fsprogs"),
    ])
}

/// The lab, the guest lock and a scratch directory; `None` (the test
/// skipped, or failed under CI) without the tools or the lab.
fn lab() -> Option<(
    &'static Lab,
    std::sync::MutexGuard<'static, ()>,
    tempfile::TempDir,
)> {
    if !have_tools() {
        return None;
    }
    let lab = Lab::get()?;
    Some((lab, guest_lock(), tempfile::tempdir().unwrap()))
}

/// `iopath blk serve` with one export of `image`, killed on drop.
struct Serve {
    child: Supervised,
    socket: PathBuf,
}

impl Serve {
    fn start(dir: &Path, image: &Path, extra: &str) -> Serve {
        let socket = dir.join("vu.sock");
        let log = dir.join("serve.log");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_iopath"));
        cmd.args(["blk", "serve", "--export"])
            .arg(format!(
                "image={},socket={},no-access-platform{extra}",
                image.display(),
                socket.display()
            ))
            .env("IOPATH_LOG", "info");
        let mut child = Supervised::logged("iopath blk serve", log, &mut cmd).unwrap();
        let limit = Duration::from_secs(20);
        child
            .wait_for("its socket", limit, || socket.exists())
            .unwrap();
        Serve { child, socket }
    }

    /// Boots the lab kernel on this export and runs `script ARGS`.
    fn guest(&self, lab: &Lab, dir: &Path, script: &str, args: &[&str]) -> lab::Guest {
        let path = dir.join("guest.sh");
        std::fs::write(&path, script).unwrap();
        let g = lab.run(&[format!("{}:2", self.socket.display())], 120, &path, args);
        if g.status != Some(0) {
            let log = self.child.output();
            panic!(
                "guest script failed ({:?})\n--- output\n{}\n--- linux-lab\n{}\n--- back end\n{log}",
                g.status, g.out, g.err
            );
        }
        g
    }
}

/// A fresh image of [`IMAGE`] bytes, every one [`FILL`] (all allocated).
fn filled_image(dir: &Path) -> PathBuf {
    let p = dir.join("disk.img");
    std::fs::write(&p, vec![FILL; IMAGE as usize]).unwrap();
    p
}

/// Whether the file system of `dir` punches holes that `SEEK_DATA` sees:
/// where it does not, the tests check zeros only (and say so).
fn punches_holes(dir: &Path) -> bool {
    use rustix::fs::{fallocate, seek, FallocateFlags, SeekFrom};
    let p = dir.join("probe");
    std::fs::write(&p, vec![1u8; 64 << 10]).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    let punched = fallocate(
        f.as_fd(),
        FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE,
        0,
        32 << 10,
    )
    .is_ok()
        && matches!(seek(&f, SeekFrom::Data(0)), Ok(32768));
    let _ = std::fs::remove_file(&p);
    if !punched {
        println!(
            "{}: no holes punched on this file system; zeros checked only",
            dir.display()
        );
    }
    punched
}

/// Whether `[start, end)` of `image` holds no data (`SEEK_DATA` from
/// `start` lands at or past `end`).
fn is_hole(image: &Path, start: u64, end: u64) -> bool {
    let f = std::fs::File::open(image).unwrap();
    match rustix::fs::seek(&f, rustix::fs::SeekFrom::Data(start)) {
        Ok(at) => at >= end,
        Err(e) => e == rustix::io::Errno::NXIO,
    }
}

/// Bytes of `image` that the file system has allocated.
fn allocated(image: &Path) -> u64 {
    std::fs::metadata(image).unwrap().blocks() * 512
}

/// The first offset in `range` of `data` that is not `want`.
fn first_not(data: &[u8], range: std::ops::Range<u64>, want: u8) -> Option<u64> {
    let start = range.start;
    data[range.start as usize..range.end as usize]
        .iter()
        .position(|&b| b != want)
        .map(|i| start + i as u64)
}

/// What runs in the guest for the ranges test (`sh SCRIPT`): one range
/// discarded, one zeroed without unmap, one zeroed with unmap.
const RANGES: &str = r#"set -e
echo "discard_max_bytes $(cat /sys/block/vda/queue/discard_max_bytes)"
echo "write_zeroes_max_bytes $(cat /sys/block/vda/queue/write_zeroes_max_bytes)"
blkdiscard --offset 4MiB --length 4MiB /dev/vda
blkdiscard --zeroout --offset 12MiB --length 4MiB /dev/vda
fallocate --punch-hole --offset 20MiB --length 4MiB /dev/vda
echo ranges-done
"#;

#[test]
fn blkdiscard_and_zeroout_from_linux_leave_zeros_and_holes() {
    let Some((lab, _g, dir)) = lab() else {
        return;
    };
    let d = dir.path();
    let image = filled_image(d);
    let holes = punches_holes(d);
    let before = allocated(&image);
    let serve = Serve::start(d, &image, "");
    let g = serve.guest(lab, d, RANGES, &[]);
    assert!(g.has_line("ranges-done"), "{}", g.out);
    // The guest's block layer saw both operations offered.
    assert!(!g.has_line("discard_max_bytes 0"), "{}", g.out);
    assert!(!g.has_line("write_zeroes_max_bytes 0"), "{}", g.out);
    drop(serve);

    let data = std::fs::read(&image).unwrap();
    assert_eq!(data.len() as u64, IMAGE);
    let ranges = [
        ("blkdiscard", 4 * MIB..8 * MIB, true),
        ("blkdiscard -z", 12 * MIB..16 * MIB, false),
        ("fallocate -p", 20 * MIB..24 * MIB, true),
    ];
    for (what, r, hole) in &ranges {
        if let Some(at) = first_not(&data, r.clone(), 0) {
            panic!("{what}: byte {at} of the image is not zero");
        }
        if holes && *hole {
            assert!(is_hole(&image, r.start, r.end), "{what}: no hole at {r:?}");
        }
    }
    // Not a byte changed around them.
    for r in [
        0..4 * MIB,
        8 * MIB..12 * MIB,
        16 * MIB..20 * MIB,
        24 * MIB..IMAGE,
    ] {
        if let Some(at) = first_not(&data, r, FILL) {
            panic!("byte {at} outside the ranges changed");
        }
    }
    if holes {
        // Less a block or so the host file system may take for the extents
        // of a file now in pieces.
        let freed = before.saturating_sub(allocated(&image));
        assert!(
            freed + 64 * 1024 >= 8 * MIB,
            "only {freed} bytes deallocated"
        );
        println!("blkdiscard and fallocate -p deallocated {freed} bytes of the image");
    }
}

/// What runs in the guest for the fstrim test (`sh SCRIPT DIR`): ext4
/// without discards of its own, a file written and synced, the device
/// copied out (so the host sees the file on it), the file deleted, fstrim.
const FSTRIM: &str = r#"set -e
dir=$1
mkfs.ext4 -q -F -E nodiscard -b 4096 /dev/vda
mkdir -p "$dir/mnt"
mount -t ext4 /dev/vda "$dir/mnt"
cp "$dir/file.bin" "$dir/mnt/f"
sync
filefrag -v "$dir/mnt/f"
dd if=/dev/vda of="$dir/before.img" bs=1M iflag=direct status=none
rm "$dir/mnt/f"
sync
fstrim -v "$dir/mnt"
umount "$dir/mnt"
echo fstrim-done
"#;

/// The extents (first 4 KiB block, blocks) in `filefrag -v` output.
fn extents(filefrag: &str) -> Vec<(u64, u64)> {
    filefrag
        .lines()
        .filter_map(|l| {
            // "   0:        0..    2047:       2065..      4112:   2048: ..."
            let f: Vec<&str> = l.split(':').map(str::trim).collect();
            if f.len() < 4 || f[0].parse::<u64>().is_err() {
                return None;
            }
            let start = f[2].split("..").next()?.trim().parse().ok()?;
            Some((start, f[3].parse().ok()?))
        })
        .collect()
}

#[test]
fn fstrim_on_ext4_from_linux_frees_the_deleted_blocks() {
    let Some((lab, _g, dir)) = lab() else {
        return;
    };
    let d = dir.path();
    let image = filled_image(d);
    let holes = punches_holes(d);
    // 8 MiB no block of which is zero or the fill.
    let file: Vec<u8> = (0..8 * MIB / 8)
        .flat_map(|i| (i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1 << 63).to_le_bytes())
        .collect();
    std::fs::write(d.join("file.bin"), &file).unwrap();
    let serve = Serve::start(d, &image, "");
    let g = serve.guest(lab, d, FSTRIM, &[d.to_str().unwrap()]);
    assert!(g.has_line("fstrim-done"), "{}", g.out);
    drop(serve);

    let ext = extents(&g.out);
    assert_eq!(
        ext.iter().map(|e| e.1).sum::<u64>(),
        8 * MIB / 4096,
        "filefrag:\n{}",
        g.out
    );
    let before = std::fs::read(d.join("before.img")).unwrap();
    let after = std::fs::read(&image).unwrap();
    let mut logical = 0usize;
    for &(start, len) in &ext {
        let r = (start * 4096) as usize..((start + len) * 4096) as usize;
        assert!(
            before[r.clone()] == file[logical..logical + r.len()],
            "the file was not on the device at block {start} before the trim"
        );
        logical += r.len();
        if let Some(at) = first_not(&after, r.start as u64..r.end as u64, 0) {
            panic!("byte {at} of a deleted block is not zero after fstrim");
        }
        if holes {
            assert!(
                is_hole(&image, r.start as u64, r.end as u64),
                "blocks {start}+{len} are not a hole after fstrim"
            );
        }
    }
    if holes {
        // Every free block was trimmed: what stays allocated is ext4's
        // metadata.
        let left = allocated(&image);
        assert!(
            left <= 16 * MIB,
            "{left} bytes still allocated after fstrim"
        );
        println!("after fstrim, {left} of {IMAGE} bytes of the image stay allocated");
    }
}

/// What runs in the guest for the read-only test (`sh SCRIPT DIR`): every
/// way to change the disk is tried and must fail; a read must succeed.
const READONLY: &str = r#"dir=$1
echo "ro $(cat /sys/block/vda/ro)"
try() { name=$1; shift; if "$@" 2>"$dir/err"; then echo "$name: succeeded"; else echo "$name: failed: $(tr '\n' ' ' < "$dir/err")"; fi; }
try write dd if=/dev/zero of=/dev/vda bs=4096 count=16 oflag=direct conv=fsync status=none
try buffered-write dd if=/dev/zero of=/dev/vda bs=4096 count=16 conv=fsync status=none
try discard blkdiscard --offset 0 --length 1MiB /dev/vda
try zeroout blkdiscard --zeroout --offset 0 --length 1MiB /dev/vda
try mkfs mkfs.ext4 -q -F /dev/vda
dd if=/dev/vda of="$dir/read.bin" bs=1M count=4 iflag=direct status=none && echo read-done
"#;

#[test]
fn a_readonly_export_refuses_the_guests_writes_and_keeps_the_image() {
    let Some((lab, _g, dir)) = lab() else {
        return;
    };
    let d = dir.path();
    let image = d.join("disk.img");
    let content: Vec<u8> = (0..IMAGE / 8)
        .flat_map(|i| (i ^ 0x726f_6e6c_7900).to_le_bytes())
        .collect();
    std::fs::write(&image, &content).unwrap();
    let mtime = std::fs::metadata(&image).unwrap().modified().unwrap();
    let serve = Serve::start(d, &image, ",readonly");
    let g = serve.guest(lab, d, READONLY, &[d.to_str().unwrap()]);
    drop(serve);

    assert!(
        g.has_line("ro 1"),
        "the guest's disk is not read-only:\n{}",
        g.out
    );
    for what in ["write", "buffered-write", "discard", "zeroout", "mkfs"] {
        let line = g
            .out
            .lines()
            .find(|l| l.starts_with(&format!("{what}: ")))
            .unwrap_or_else(|| panic!("no {what} line:\n{}", g.out));
        assert!(line.starts_with(&format!("{what}: failed: ")), "{line}");
        println!("{line}");
    }
    // Reads are served.
    assert!(g.has_line("read-done"), "{}", g.out);
    assert!(std::fs::read(d.join("read.bin")).unwrap() == content[..4 * MIB as usize]);
    // The image is byte-identical, and was not even written.
    assert!(
        std::fs::read(&image).unwrap() == content,
        "the image changed"
    );
    assert_eq!(
        std::fs::metadata(&image).unwrap().modified().unwrap(),
        mtime
    );
}
