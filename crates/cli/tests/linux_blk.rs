//! Linux's own vhost-user front end and virtio-blk driver against a
//! vhost-user-blk back end: User-Mode Linux (`scripts/linux-lab`) boots
//! with `virtio_uml.device=SOCK:2`, so `/dev/vda` is `virtio_blk` on
//! `virtio_uml` on the back end's socket. In the guest, a 16 MiB pattern
//! (host file, through hostfs) is written to `/dev/vda` with `O_DIRECT`
//! and `fsync`, read back with `O_DIRECT` and compared; the host then
//! compares what the guest read and the image file itself, byte for byte:
//! the pattern where the guest wrote it, the fill everywhere else.
//!
//! Back ends: `iopath blk serve --no-access-platform` (`virtio_uml`
//! accepts `VIRTIO_F_ACCESS_PLATFORM` without running an IOMMU) and
//! `qemu-storage-daemon`, each with 1 and 2 queues; iopath's serves two
//! guests in turn (the first powers off under it without a reset). UML runs one CPU and
//! `virtio_blk` uses at most one queue per CPU, so with 2 offered the
//! guest must use exactly `min(2, CPUs)`: `/sys/block/vda/mq` is checked
//! against that. Debian's prebuilt `linux.uml` (6.1, `virtio_blk` a
//! module) runs the same on iopath; offered `VIRTIO_F_ACCESS_PLATFORM`, it
//! fails its probe, and the back end says why and names the flag.

#[allow(dead_code)]
mod lab;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use iopath_sys::process::Supervised;
use iopath_testkit::have_peer;
use lab::Lab;

const MIB: u64 = 1 << 20;
const IMAGE_SIZE: u64 = 64 * MIB;
/// Where the guest writes the pattern, and how much (MiB).
const SEEK_MIB: u64 = 5;
const COUNT_MIB: u64 = 16;
const FILL: u8 = 0xa5;
const QSD: (&str, &str) = ("qemu-storage-daemon", "qemu-utils");
const DEBIAN_UML: (&str, &str) = ("linux.uml", "user-mode-linux");

/// What runs in the guest (as `sh SCRIPT PATTERN OUT SEEK COUNT`, chrooted
/// into the host's /): loads `virtio_blk` if the kernel has it as a
/// module, then dd's the pattern out and back and compares.
const GUEST: &str = r#"set -e
pat=$1 out=$2 seek=$3 count=$4
if [ ! -b /dev/vda ] && [ -n "$VIRTIO_BLK_KO" ]; then insmod "$VIRTIO_BLK_KO"; fi
for i in 1 2 3 4 5 6 7 8 9 10; do [ -b /dev/vda ] && break; sleep 0.2; done
if [ ! -b /dev/vda ]; then
    echo "linux-blk: no /dev/vda"; ls /sys/block; dmesg | tail -n 20; exit 3
fi
echo "linux-blk: queues $(ls /sys/block/vda/mq | wc -l) cpus $(nproc)"
t0=$(date +%s.%N)
dd if="$pat" of=/dev/vda bs=1M seek="$seek" count="$count" oflag=direct conv=fsync status=none
t1=$(date +%s.%N)
dd if=/dev/vda of="$out" bs=1M skip="$seek" count="$count" iflag=direct status=none
t2=$(date +%s.%N)
cmp "$pat" "$out"
echo "linux-blk: write $(awk "BEGIN{print $t1 - $t0}") s read $(awk "BEGIN{print $t2 - $t1}") s"
"#;

/// One guest at a time: the machine is small.
fn guest_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    iopath_sys::lock(&LOCK)
}

/// A back end process, killed on drop.
type Backend = Supervised;

/// Starts the back end `cmd`, its output into `log`, and waits for it to
/// listen on `sock`.
fn listening(name: &str, mut cmd: Command, log: PathBuf, sock: &Path) -> Backend {
    let mut b = Supervised::logged(name, log, &mut cmd).unwrap();
    let limit = Duration::from_secs(20);
    b.wait_for("its socket", limit, || sock.exists()).unwrap();
    b
}

fn start_iopath(image: &Path, sock: &Path, queues: u32, log: PathBuf) -> Backend {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_iopath"));
    cmd.args(["blk", "serve", "--no-access-platform", "--image"])
        .arg(image)
        .arg("--socket")
        .arg(sock)
        .args(["--queues", &queues.to_string()]);
    listening("iopath blk serve", cmd, log, sock)
}

fn start_qsd(image: &Path, sock: &Path, queues: u32, log: PathBuf) -> Backend {
    let mut cmd = Command::new("qemu-storage-daemon");
    cmd.arg("--blockdev")
        .arg(format!(
            "driver=file,node-name=disk,filename={},cache.direct=on",
            image.display()
        ))
        .arg("--export")
        .arg(format!(
            "type=vhost-user-blk,id=exp,node-name=disk,addr.type=unix,addr.path={},\
             writable=on,num-queues={queues}",
            sock.display()
        ));
    listening("qemu-storage-daemon", cmd, log, sock)
}

type Start = fn(&Path, &Path, u32, PathBuf) -> Backend;

/// The 16 MiB pattern: each little-endian u64 is its offset xor `seed`.
fn pattern(seed: u64) -> Vec<u8> {
    (0..COUNT_MIB * MIB / 8)
        .flat_map(|i| ((i * 8) ^ seed).to_le_bytes())
        .collect()
}

/// The first offset where `got` and `want` differ, for messages.
fn first_diff(got: &[u8], want: &[u8]) -> Option<usize> {
    got.iter()
        .zip(want)
        .position(|(a, b)| a != b)
        .or((got.len() != want.len()).then(|| got.len().min(want.len())))
}

/// Boots the UML `kernel` `boots` times, one after the other, on one
/// back end from `start` with `queues` queues; each guest writes a pattern
/// of its own and checks it. Then the image is checked on the host.
fn run(start: Start, kernel: &Path, virtio_blk_ko: Option<&Path>, queues: u32, boots: u32) {
    let _guard = guest_lock();
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("disk.img");
    std::fs::write(&image, vec![FILL; IMAGE_SIZE as usize]).unwrap();
    let sock = dir.path().join("vu.sock");
    let backend = start(&image, &sock, queues, dir.path().join("backend.log"));
    let script = dir.path().join("guest.sh");
    std::fs::write(&script, GUEST).unwrap();
    let what = format!(
        "{} with {queues} queue(s), UML {}",
        backend.name(),
        kernel.display()
    );
    let mut pat = Vec::new();
    for boot in 0..boots {
        let seed = 0x6c69_6e75_7800 + u64::from(queues) * 16 + u64::from(boot);
        pat = pattern(seed);
        boot_once(
            &backend,
            &what,
            dir.path(),
            &script,
            kernel,
            virtio_blk_ko,
            &pat,
            queues,
        );
    }
    drop(backend);
    let img = std::fs::read(&image).unwrap();
    let (start_b, end_b) = (
        (SEEK_MIB * MIB) as usize,
        ((SEEK_MIB + COUNT_MIB) * MIB) as usize,
    );
    assert_eq!(img.len(), IMAGE_SIZE as usize, "{what}: image size changed");
    if let Some(at) = first_diff(&img[start_b..end_b], &pat) {
        panic!(
            "{what}: the image differs from the last pattern at byte {}",
            start_b + at
        );
    }
    if let Some(at) = img[..start_b]
        .iter()
        .chain(&img[end_b..])
        .position(|&b| b != FILL)
    {
        panic!("{what}: the image changed outside the pattern (byte {at} of the rest)");
    }
    println!("{what}: the image holds the last guest's pattern and the fill elsewhere");
}

/// One guest: writes `pat`, reads it back, and powers off.
#[allow(clippy::too_many_arguments)]
fn boot_once(
    backend: &Backend,
    what: &str,
    dir: &Path,
    script: &Path,
    kernel: &Path,
    virtio_blk_ko: Option<&Path>,
    pat: &[u8],
    queues: u32,
) {
    let pat_file = dir.join("pattern.bin");
    std::fs::write(&pat_file, pat).unwrap();
    let out_file = dir.join("read-back.bin");
    let _ = std::fs::remove_file(&out_file);
    let mut lab = Command::new(lab::repo_root().join("scripts/linux-lab"));
    lab.arg("run")
        .arg("--device")
        .arg(format!("{}:2", dir.join("vu.sock").display()))
        .args(["--timeout", "240", "--kernel"])
        .arg(kernel);
    if let Some(ko) = virtio_blk_ko {
        lab.arg("--env")
            .arg(format!("VIRTIO_BLK_KO={}", ko.display()));
    }
    lab.arg("--")
        .arg(script)
        .arg(&pat_file)
        .arg(&out_file)
        .arg(SEEK_MIB.to_string())
        .arg(COUNT_MIB.to_string())
        .current_dir(dir)
        .stdin(Stdio::null());
    let t = Instant::now();
    let out = lab.output().expect("run scripts/linux-lab run");
    let took = t.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{what}: the guest failed ({}):\n{stdout}\n{}\nback end:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        backend.output()
    );
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("linux-blk: queues "))
        .unwrap_or_else(|| panic!("{what}: no queue count in:\n{stdout}"));
    let nums: Vec<u32> = line
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    let [used, cpus] = nums[..] else {
        panic!("{what}: bad queue line {line:?}");
    };
    assert_eq!(
        used,
        queues.min(cpus),
        "{what}: /sys/block/vda/mq has {used} queues with {cpus} CPU(s)"
    );
    let read_back = std::fs::read(&out_file).unwrap();
    if let Some(at) = first_diff(&read_back, pat) {
        panic!("{what}: what the guest read differs from the pattern at byte {at}");
    }
    let times = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("linux-blk: "))
        .find(|l| l.starts_with("write"))
        .unwrap_or("");
    println!(
        "{what}: boot + 16 MiB dd out and back + poweroff in {:.1} s ({times}); \
         {used} queue(s) used with {cpus} CPU(s); read-back checked byte for byte",
        took.as_secs_f64()
    );
}

#[test]
fn linux_virtio_blk_on_iopath_blk_serve() {
    let Some(kernel) = Lab::get().map(Lab::kernel) else {
        return;
    };
    // Two guests in turn on one back end: the first powers off under it
    // without resetting the device, and the next must be served.
    run(start_iopath, &kernel, None, 1, 2);
    run(start_iopath, &kernel, None, 2, 1);
}

#[test]
fn linux_virtio_blk_on_qemu_storage_daemon() {
    if !have_peer(QSD.0, QSD.1) {
        return;
    }
    let Some(kernel) = Lab::get().map(Lab::kernel) else {
        return;
    };
    run(start_qsd, &kernel, None, 1, 1);
    run(start_qsd, &kernel, None, 2, 1);
}

/// Debian's prebuilt UML 6.1, the kernel the failure was first seen on:
/// `virtio_blk` is a module of the same package.
#[test]
fn debian_uml_6_1_virtio_blk_on_iopath_blk_serve() {
    if !have_peer(DEBIAN_UML.0, DEBIAN_UML.1) {
        return;
    }
    let kernel = iopath_testkit::find_program(DEBIAN_UML.0).unwrap();
    let ko = std::fs::read_dir("/usr/lib/uml/modules")
        .ok()
        .and_then(|mut d| d.next())
        .and_then(|e| e.ok())
        .map(|e| e.path().join("kernel/drivers/block/virtio_blk.ko"))
        .filter(|p| p.exists());
    let Some(ko) = ko else {
        panic!(
            "{} has no virtio_blk.ko under /usr/lib/uml/modules",
            DEBIAN_UML.1
        );
    };
    run(start_iopath, &kernel, Some(&ko), 1, 1);
}

/// Debian's UML 6.1 acknowledges `VIRTIO_F_ACCESS_PLATFORM` from a back
/// end that offers it (the default) and then fails its probe (it has no
/// DMA API): the guest has no disk, and the back end, at its default log
/// level, says why and names the flag that fixes it.
#[test]
fn debian_uml_6_1_on_access_platform_is_explained_by_the_back_end() {
    if !have_peer(DEBIAN_UML.0, DEBIAN_UML.1) {
        return;
    }
    let kernel = iopath_testkit::find_program(DEBIAN_UML.0).unwrap();
    let Some(ko) = std::fs::read_dir("/usr/lib/uml/modules")
        .ok()
        .and_then(|mut d| d.next())
        .and_then(|e| e.ok())
        .map(|e| e.path().join("kernel/drivers/block/virtio_blk.ko"))
        .filter(|p| p.exists())
    else {
        panic!("{} has no virtio_blk.ko", DEBIAN_UML.1);
    };
    let _guard = guest_lock();
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("disk.img");
    std::fs::File::create(&image).unwrap().set_len(MIB).unwrap();
    let sock = dir.path().join("vu.sock");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_iopath"));
    cmd.args(["blk", "serve", "--image"])
        .arg(&image)
        .arg("--socket")
        .arg(&sock)
        .env_remove("IOPATH_LOG");
    let backend = listening(
        "iopath blk serve",
        cmd,
        dir.path().join("backend.log"),
        &sock,
    );
    let script = dir.path().join("guest.sh");
    std::fs::write(
        &script,
        "insmod \"$VIRTIO_BLK_KO\"\n\
         for i in 1 2 3 4 5; do [ -b /dev/vda ] && break; sleep 0.2; done\n\
         [ -b /dev/vda ] && echo 'vda: yes' || echo 'vda: no'\n",
    )
    .unwrap();
    let out = Command::new(lab::repo_root().join("scripts/linux-lab"))
        .arg("run")
        .arg("--device")
        .arg(format!("{}:2", sock.display()))
        .args(["--timeout", "120", "--kernel"])
        .arg(&kernel)
        .arg("--env")
        .arg(format!("VIRTIO_BLK_KO={}", ko.display()))
        .arg("--")
        .arg(&script)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.lines().any(|l| l.trim_end() == "vda: no"),
        "the guest was expected to fail its probe:\n{stdout}"
    );
    iopath_testkit::wait_until(
        "the back end explains the front end that left",
        Duration::from_secs(10),
        || backend.output().contains("--no-access-platform"),
    );
    let log = backend.output();
    assert!(
        log.contains("having acknowledged VIRTIO_F_ACCESS_PLATFORM") && log.contains("virtio_uml"),
        "{log}"
    );
}
