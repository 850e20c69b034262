//! A real Linux guest drives a vhost-user-blk back end: `scripts/guest-dd`
//! boots Debian's kernel under QEMU (TCG) on the back end's socket and runs
//! `dd if=/dev/zero of=/dev/vda bs=8M count=N oflag=direct`, a direct read of
//! the same range, then writes a pattern and reads it back. The host then
//! checks the image byte for byte: zeros where dd wrote zeros, the pattern
//! where the guest wrote it, and the untouched fill everywhere else.
//!
//! Back ends: iopath's own (`iopath blk serve`) and, as a second peer,
//! `qemu-storage-daemon`. Each runs with 1 and with 2 queues (the guest then
//! has 2 CPUs and writes one pattern slice from each, so both virtqueues
//! carry requests).

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// dd block size the script uses (`--bs 8M`).
const BS: u64 = 8 << 20;
/// dd count: 64 MiB written and read per run keeps the test quick under TCG.
const COUNT: u64 = 8;
/// Image size: larger than what dd touches, so the tail shows dd stopped.
const IMAGE: u64 = 192 << 20;
/// Pattern range: inside the zeroed range, not aligned to dd's 8 MiB.
const PAT_OFF: u64 = (24 << 20) + (12 << 10);
const PAT_SIZE: u64 = (3 << 20) + (8 << 10);
/// What the image holds before the guest runs.
const FILL: u8 = 0xa5;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

const QEMU: (&str, &str) = ("qemu-system-x86_64", "qemu-system-x86");
const QSD: (&str, &str) = ("qemu-storage-daemon", "qemu-utils");
const FIO: (&str, &str) = ("fio", "fio");

/// One guest at a time: TCG guests are CPU-bound and the machine is small.
fn guest_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Builds the guest once per test binary (`scripts/guest-dd --prepare`).
fn prepare() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        let out = Command::new(repo().join("scripts/guest-dd"))
            .arg("--prepare")
            .output()
            .expect("run scripts/guest-dd --prepare");
        assert!(
            out.status.success(),
            "guest-dd --prepare failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    });
}

/// A back end process, killed when dropped; its stdout and stderr go to
/// `log`, which failure messages quote.
struct Backend {
    child: Child,
    name: &'static str,
    log: PathBuf,
}

impl Backend {
    fn spawn(name: &'static str, mut cmd: Command, log: PathBuf) -> Backend {
        let out = File::create(&log).expect("create back-end log");
        let err = out.try_clone().expect("dup back-end log");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {name}: {e}"));
        Backend { child, name, log }
    }

    /// The last lines the back end printed.
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
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
    Backend::spawn("qemu-storage-daemon", cmd, log)
}

fn start_iopath(image: &Path, sock: &Path, queues: u32, log: PathBuf) -> Backend {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_iopath"));
    cmd.args(["blk", "serve", "--image"])
        .arg(image)
        .arg("--socket")
        .arg(sock)
        .args(["--queues", &queues.to_string()]);
    Backend::spawn("iopath blk serve", cmd, log)
}

fn wait_for_socket(backend: &mut Backend, sock: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !sock.exists() {
        if let Some(status) = backend.child.try_wait().expect("poll back end") {
            panic!(
                "{} exited before listening: {status}\n{}",
                backend.name,
                backend.log_tail()
            );
        }
        assert!(
            Instant::now() < deadline,
            "{} never created {sock:?}",
            backend.name
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The little-endian u64 at device offset `o` holds `o ^ seed`.
fn pattern_word(o: u64, seed: u64) -> [u8; 8] {
    (o ^ seed).to_le_bytes()
}

fn make_image(path: &Path) {
    let mut f = File::create(path).expect("create image");
    f.set_len(IMAGE).expect("size image");
    // Fill what dd will overwrite and a little beyond, so that zeros prove
    // the guest's write landed and the fill past it proves where it stopped.
    let chunk = vec![FILL; 1 << 20];
    for _ in 0..(COUNT * BS + (4 << 20)) / chunk.len() as u64 {
        f.write_all(&chunk).expect("fill image");
    }
    f.sync_all().expect("sync image");
}

/// What the image must hold at device offset `o` after a passing run.
fn expected_byte(o: u64, seed: u64) -> (u8, &'static str) {
    if (PAT_OFF..PAT_OFF + PAT_SIZE).contains(&o) {
        (pattern_word(o & !7, seed)[(o & 7) as usize], "the pattern")
    } else if o < COUNT * BS {
        (0, "dd's zeros")
    } else {
        (FILL, "the untouched fill")
    }
}

/// Checks the image byte for byte over everything the guest may have
/// touched and 4 MiB beyond; returns the first difference.
fn check_image(path: &Path, seed: u64) -> Result<(), String> {
    let mut f = File::open(path).map_err(|e| e.to_string())?;
    let end = COUNT * BS + (4 << 20);
    let mut got = vec![0u8; 1 << 20];
    let mut want = vec![0u8; 1 << 20];
    let mut pos = 0u64;
    f.seek(SeekFrom::Start(0)).map_err(|e| e.to_string())?;
    while pos < end {
        let len = got.len().min((end - pos) as usize);
        f.read_exact(&mut got[..len]).map_err(|e| e.to_string())?;
        for (i, w) in want[..len].iter_mut().enumerate() {
            *w = expected_byte(pos + i as u64, seed).0;
        }
        if got[..len] != want[..len] {
            let i = (0..len).find(|&i| got[i] != want[i]).unwrap_or(0);
            let o = pos + i as u64;
            let (w, what) = expected_byte(o, seed);
            return Err(format!(
                "byte {o} is {:#04x}, want {w:#04x} ({what})",
                got[i]
            ));
        }
        pos += len as u64;
    }
    Ok(())
}

/// Boots the guest against `backend` and checks the JSON it prints. If the
/// back end dies while the guest still runs, the guest is stopped at once
/// and the failure quotes the back end's exit status and log.
fn run_guest(
    backend: &mut Backend,
    sock: &Path,
    dir: &Path,
    queues: u32,
    seed: u64,
    iommu: bool,
) -> serde_json::Value {
    let out_path = dir.join("guest-dd.out");
    let err_path = dir.join("guest-dd.err");
    let mut guest = Command::new(repo().join("scripts/guest-dd"))
        .arg("--socket")
        .arg(sock)
        .args(["--count", &COUNT.to_string(), "--bs", "8M"])
        .args([
            "--queues",
            &queues.to_string(),
            "--timeout",
            "240",
            "--json",
        ])
        .args(["--pattern-offset", &PAT_OFF.to_string()])
        .args(["--pattern-size", &PAT_SIZE.to_string()])
        .args(["--pattern-seed", &format!("{seed:#x}")])
        .args(if iommu { &["--iommu"][..] } else { &[] })
        .stdin(Stdio::null())
        .stdout(File::create(&out_path).expect("create guest-dd.out"))
        .stderr(File::create(&err_path).expect("create guest-dd.err"))
        .spawn()
        .expect("run scripts/guest-dd");
    let mut backend_exit: Option<(std::process::ExitStatus, Instant)> = None;
    let status = loop {
        if let Some(status) = guest.try_wait().expect("poll guest-dd") {
            break status;
        }
        if backend_exit.is_none() {
            if let Some(st) = backend.child.try_wait().expect("poll back end") {
                backend_exit = Some((st, Instant::now()));
            }
        }
        // A back end may exit when the guest disconnects at its end; give
        // guest-dd a moment to finish before calling it a crash.
        if let Some((_, when)) = backend_exit {
            if when.elapsed() > Duration::from_secs(10) {
                // SIGTERM, so that guest-dd's trap stops QEMU.
                let _ = Command::new("kill")
                    .args(["-TERM", &guest.id().to_string()])
                    .status();
                break guest.wait().expect("wait guest-dd");
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    eprintln!("{stderr}");
    if !status.success() {
        let died = match backend_exit {
            Some((st, _)) => format!("{} exited during the run: {st}", backend.name),
            None => format!("{} still running", backend.name),
        };
        panic!(
            "guest-dd failed ({status}), {queues} queue(s); {died}\n--- guest-dd:\n{stderr}\n--- {} log:\n{}",
            backend.name,
            backend.log_tail()
        );
    }
    let stdout = std::fs::read(&out_path).expect("read guest-dd.out");
    let json: serde_json::Value =
        serde_json::from_slice(&stdout).expect("guest-dd --json prints one JSON object");
    assert_eq!(json["result"], "pass");
    assert_eq!(
        json["guest_queues"], queues,
        "the guest's virtio-blk queue count"
    );
    for dir in ["write", "read"] {
        assert_eq!(
            json[dir]["bytes"],
            COUNT * BS,
            "{dir} bytes in dd's summary"
        );
        let secs = json[dir]["seconds"].as_f64().expect("seconds");
        assert!(secs > 0.0, "{dir} seconds {secs}");
    }
    let irqs = json["interrupts_per_queue"].as_array().expect("interrupts");
    assert_eq!(
        irqs.len(),
        queues as usize,
        "one interrupt vector per queue"
    );
    for (q, n) in irqs.iter().enumerate() {
        assert!(
            n.as_u64().unwrap_or(0) > 0,
            "queue {q} completed no request"
        );
    }
    assert_eq!(json["pattern"]["seed"], format!("{seed:#018x}"));
    json
}

/// The guest (one at a time) and a scratch directory, or `None` (and a
/// "skipped" line) without QEMU.
fn guest_ready() -> Option<(std::sync::MutexGuard<'static, ()>, tempfile::TempDir)> {
    if !iopath_testkit::have_peers(&[QEMU]) {
        return None;
    }
    let guard = guest_lock();
    prepare();
    Some((guard, tempfile::tempdir().expect("tempdir")))
}

fn guest_dd_against(start: fn(&Path, &Path, u32, PathBuf) -> Backend) {
    let Some((_guard, dir)) = guest_ready() else {
        return;
    };
    for (queues, seed) in [(1u32, 0x0123_4567_89ab_cdefu64), (2, 0xfeed_face_0bad_f00d)] {
        let image = dir.path().join(format!("disk-q{queues}.img"));
        let sock = dir.path().join(format!("vu-q{queues}.sock"));
        make_image(&image);
        let log = dir.path().join(format!("backend-q{queues}.log"));
        let mut backend = start(&image, &sock, queues, log);
        wait_for_socket(&mut backend, &sock);
        let json = run_guest(&mut backend, &sock, dir.path(), queues, seed, false);
        let name = backend.name;
        drop(backend);
        if let Err(e) = check_image(&image, seed) {
            panic!("{name}, {queues} queue(s): the image disagrees with the guest: {e}");
        }
        // The check itself must be able to fail: another seed is another pattern.
        assert!(
            check_image(&image, seed ^ 8).is_err(),
            "the image check accepts any seed"
        );
        println!(
            "{name}, {queues} queue(s): write {} MB/s, read {} MB/s, image checked byte for byte",
            json["write"]["mb_per_s"], json["read"]["mb_per_s"]
        );
        std::fs::remove_file(&image).expect("remove image");
    }
}

#[test]
fn guest_dd_qemu_storage_daemon() {
    if !iopath_testkit::have_peers(&[QSD]) {
        return;
    }
    guest_dd_against(start_qsd);
}

#[test]
fn guest_dd_iopath_blk_serve() {
    guest_dd_against(start_iopath);
}

/// The device behind the guest's intel-iommu: `ACCESS_PLATFORM`, every
/// address an IOVA the back end resolves through IOTLB misses answered by
/// QEMU, while the guest's lazy IOTLB flushes invalidate ranges with I/O in
/// flight (which once deadlocked the miss, the invalidation's
/// acknowledgement and the I/O until the miss timed out).
#[test]
fn guest_dd_iommu_iopath_blk_serve() {
    let Some((_guard, dir)) = guest_ready() else {
        return;
    };
    let seed = 0x10_4d4d_55ee_d001u64;
    let image = dir.path().join("disk-iommu.img");
    let sock = dir.path().join("vu-iommu.sock");
    make_image(&image);
    let mut backend = start_iopath(&image, &sock, 1, dir.path().join("backend-iommu.log"));
    wait_for_socket(&mut backend, &sock);
    run_guest(&mut backend, &sock, dir.path(), 1, seed, true);
    drop(backend);
    if let Err(e) = check_image(&image, seed) {
        panic!("behind the vIOMMU: the image disagrees with the guest: {e}");
    }
    println!("behind intel-iommu: guest dd and pattern passed, image checked byte for byte");
}

#[test]
fn pattern_word_is_offset_xor_seed_little_endian() {
    assert_eq!(pattern_word(8, 0), [8, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(pattern_word(0x1000, 0xff), [0xff, 0x10, 0, 0, 0, 0, 0, 0]);
}

/// `iopath bench blk --guest` adds the guest's dd rows, both back ends with
/// figures, and their ratio.
#[test]
fn bench_blk_guest_rows() {
    if !iopath_testkit::have_peers(&[QEMU, QSD, FIO]) {
        return;
    }
    let _guard = guest_lock();
    prepare();
    let dir = tempfile::tempdir_in("/var/tmp").expect("tempdir");
    let out = Command::new(env!("CARGO_BIN_EXE_iopath"))
        .args(["bench", "blk", "--guest", "--size", "32M", "--runs", "1"])
        .args(["--modes", "direct", "--json", "--dir"])
        .arg(dir.path())
        .output()
        .expect("run iopath bench blk --guest");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench blk --guest failed: {stderr}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("bench JSON");
    let rows = v["rows"].as_array().expect("rows");
    for name in [
        "guest dd (Linux, TCG) on iopath blk serve",
        "guest dd (Linux, TCG) on qemu-storage-daemon",
    ] {
        let row = rows
            .iter()
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("no row {name:?} in {v}"));
        assert!(
            row["skipped"].is_null(),
            "{name} skipped: {}",
            row["skipped"]
        );
        let runs = row["runs_gib_per_s"].as_array().expect("runs");
        assert_eq!(runs.len(), 1, "{name}: one run");
        assert!(runs[0].as_f64().unwrap_or(0.0) > 0.0, "{name}: {runs:?}");
    }
    let ratio = v["ratios"]["guest dd: iopath blk serve / qemu-storage-daemon"]
        .as_f64()
        .expect("guest ratio");
    assert!(ratio > 0.0, "guest ratio {ratio}");
}

/// The guest's own check can fail: against a back end that drops writes
/// and reads zeros (qemu-storage-daemon's null-co driver), guest-dd exits 1
/// with the pattern mismatch as its reason.
#[test]
fn guest_dd_fails_when_the_back_end_loses_writes() {
    if !iopath_testkit::have_peers(&[QEMU, QSD]) {
        return;
    }
    let _guard = guest_lock();
    prepare();
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("null.sock");
    let mut cmd = Command::new("qemu-storage-daemon");
    cmd.arg("--blockdev")
        .arg(format!(
            "driver=null-co,node-name=disk,size={},read-zeroes=on",
            64u64 << 20
        ))
        .arg("--export")
        .arg(format!(
            "type=vhost-user-blk,id=exp,node-name=disk,addr.type=unix,addr.path={},writable=on",
            sock.display()
        ));
    let mut backend = Backend::spawn(
        "qemu-storage-daemon (null-co)",
        cmd,
        dir.path().join("b.log"),
    );
    wait_for_socket(&mut backend, &sock);
    let out = Command::new(repo().join("scripts/guest-dd"))
        .arg("--socket")
        .arg(&sock)
        .args(["--count", "1", "--timeout", "240", "--json"])
        .output()
        .expect("run scripts/guest-dd");
    drop(backend);
    assert_eq!(out.status.code(), Some(1), "guest-dd must fail: {out:?}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("failure JSON");
    assert_eq!(json["result"], "fail");
    assert_eq!(json["reason"], "pattern read-back differs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("first mismatch at device offset 65536"),
        "the guest names the first bad word: {stderr}"
    );
}
