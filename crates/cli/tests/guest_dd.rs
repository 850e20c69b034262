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

/// What one guest run writes: dd's `count` blocks of zeros from offset 0,
/// then the pattern over `[pat_off, pat_off + pat_size)`.
#[derive(Clone, Copy, Debug)]
struct Layout {
    count: u64,
    pat_off: u64,
    pat_size: u64,
}

/// The layout of the ordinary runs.
const RUN: Layout = Layout {
    count: COUNT,
    pat_off: PAT_OFF,
    pat_size: PAT_SIZE,
};

impl Layout {
    /// Bytes dd writes.
    fn dd_bytes(&self) -> u64 {
        self.count * BS
    }

    /// Image size: 64 MiB past what dd touches, so the tail shows dd
    /// stopped.
    fn image_size(&self) -> u64 {
        self.dd_bytes() + (64 << 20)
    }

    /// What the image must hold at device offset `o` after a passing run.
    fn expected_byte(&self, o: u64, seed: u64) -> (u8, &'static str) {
        if (self.pat_off..self.pat_off + self.pat_size).contains(&o) {
            (pattern_word(o & !7, seed)[(o & 7) as usize], "the pattern")
        } else if o < self.dd_bytes() {
            (0, "dd's zeros")
        } else {
            (FILL, "the untouched fill")
        }
    }
}

fn make_image(path: &Path, layout: &Layout) {
    let mut f = File::create(path).expect("create image");
    f.set_len(layout.image_size()).expect("size image");
    // Fill what dd will overwrite and a little beyond, so that zeros prove
    // the guest's write landed and the fill past it proves where it stopped.
    let chunk = vec![FILL; 1 << 20];
    for _ in 0..(layout.dd_bytes() + (4 << 20)) / chunk.len() as u64 {
        f.write_all(&chunk).expect("fill image");
    }
    f.sync_all().expect("sync image");
}

/// Checks the image byte for byte over everything the guest may have
/// touched and 4 MiB beyond; returns the first difference.
fn check_image(path: &Path, layout: &Layout, seed: u64) -> Result<(), String> {
    let mut f = File::open(path).map_err(|e| e.to_string())?;
    let end = layout.dd_bytes() + (4 << 20);
    let mut got = vec![0u8; 1 << 20];
    let mut want = vec![0u8; 1 << 20];
    let mut pos = 0u64;
    f.seek(SeekFrom::Start(0)).map_err(|e| e.to_string())?;
    while pos < end {
        let len = got.len().min((end - pos) as usize);
        f.read_exact(&mut got[..len]).map_err(|e| e.to_string())?;
        for (i, w) in want[..len].iter_mut().enumerate() {
            *w = layout.expected_byte(pos + i as u64, seed).0;
        }
        if got[..len] != want[..len] {
            let i = (0..len).find(|&i| got[i] != want[i]).unwrap_or(0);
            let o = pos + i as u64;
            let (w, what) = layout.expected_byte(o, seed);
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
        make_image(&image, &RUN);
        let log = dir.path().join(format!("backend-q{queues}.log"));
        let mut backend = start(&image, &sock, queues, log);
        wait_for_socket(&mut backend, &sock);
        let json = run_guest(&mut backend, &sock, dir.path(), queues, seed, false);
        let name = backend.name;
        drop(backend);
        if let Err(e) = check_image(&image, &RUN, seed) {
            panic!("{name}, {queues} queue(s): the image disagrees with the guest: {e}");
        }
        // The check itself must be able to fail: another seed is another pattern.
        assert!(
            check_image(&image, &RUN, seed ^ 8).is_err(),
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
    make_image(&image, &RUN);
    let mut backend = start_iopath(&image, &sock, 1, dir.path().join("backend-iommu.log"));
    wait_for_socket(&mut backend, &sock);
    run_guest(&mut backend, &sock, dir.path(), 1, seed, true);
    drop(backend);
    if let Err(e) = check_image(&image, &RUN, seed) {
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

/// The restart runs: a dd of 256 MiB and a 64 MiB pattern, long enough
/// under TCG (about half a second each) for a kill to land inside them.
const RESTART: Layout = Layout {
    count: 32,
    pat_off: (16 << 20) + (12 << 10),
    pat_size: 64 << 20,
};
/// How often QEMU tries to reconnect once the back end is gone.
const RECONNECT_MS: u64 = 100;

/// The inflight record (`VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD`) of a
/// stopped back end, read from the memfd it holds: per queue, how many
/// descriptor heads are marked in flight. `None` when the back end holds
/// no inflight memfd.
fn inflight_heads(pid: u32) -> Option<Vec<usize>> {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
    for fd in fds.flatten() {
        let target = std::fs::read_link(fd.path()).unwrap_or_default();
        if !target.to_string_lossy().contains("memfd:iopath-inflight") {
            continue;
        }
        let bytes = std::fs::read(fd.path()).ok()?;
        // Per queue, the spec's split-ring region: a 16-byte header (its
        // desc_num, a u16, at byte 10), then 16 bytes per descriptor whose
        // first byte is 1 while the head is in flight; regions follow each
        // other at 64-byte alignment.
        let desc_num = usize::from(u16::from_le_bytes(bytes.get(10..12)?.try_into().ok()?));
        let region = (16 + 16 * desc_num).next_multiple_of(64);
        return Some(
            bytes
                .chunks_exact(region)
                .map(|q| {
                    q[16..16 + 16 * desc_num]
                        .chunks_exact(16)
                        .filter(|d| d[0] == 1)
                        .count()
                })
                .collect(),
        );
    }
    None
}

/// One kill of the back end under the running guest.
#[derive(Debug)]
struct Kill {
    /// What the guest was doing.
    during: &'static str,
    /// Heads the inflight record held at the kill, per queue (`None`: no
    /// record).
    inflight: Option<Vec<usize>>,
    /// From the kill until the new back end had the guest's memory mapped
    /// again (QEMU reconnected and restarted the device).
    reconnect: Duration,
    /// The new back end's log.
    log: PathBuf,
}

/// Whether the image holds `want` at `offset` (read past the page cache's
/// view of an O_DIRECT writer: pread sees what was written).
fn image_holds(image: &File, offset: u64, want: &[u8]) -> bool {
    use std::os::unix::fs::FileExt;
    let mut got = vec![0u8; want.len()];
    image.read_exact_at(&mut got, offset).is_ok() && got == want
}

/// Whether process `pid` maps the guest's memory (QEMU's memfd).
fn maps_guest_memory(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .is_ok_and(|m| m.contains("memory-backend-memfd"))
}

fn signal(pid: u32, sig: rustix::process::Signal) {
    let pid = rustix::process::Pid::from_raw(pid as i32).expect("a child's pid");
    let _ = rustix::process::kill_process(pid, sig);
}

/// Waits (at most `limit`) until `ready` holds, polling every 2 ms; false
/// when the guest ended first or time ran out.
fn wait_until(guest: &mut Child, limit: Duration, mut ready: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if ready() {
            return true;
        }
        if guest.try_wait().expect("poll guest-dd").is_some() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    false
}

/// Kills `backend` with SIGKILL, preferably while requests are in flight:
/// it is stopped (SIGSTOP) and its inflight record read until the record
/// shows some (at most 300 tries, or as soon as there is no record), then
/// killed; a new back end is started on the same image and socket and the
/// time until QEMU has restarted the device on it measured.
fn kill_and_restart(
    backend: &mut Backend,
    guest: &mut Child,
    during: &'static str,
    restart: &dyn Fn(u32) -> Backend,
    generation: u32,
) -> Kill {
    use rustix::process::Signal;
    let pid = backend.child.id();
    let mut inflight = None;
    for _ in 0..300 {
        signal(pid, Signal::STOP);
        // The stop is asynchronous: wait until the process is stopped, so
        // the record cannot change under the read.
        let stat = format!("/proc/{pid}/stat");
        for _ in 0..1000 {
            let s = std::fs::read_to_string(&stat).unwrap_or_default();
            if s.rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('T'))
            {
                break;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        inflight = inflight_heads(pid);
        if inflight
            .as_ref()
            .is_none_or(|q| q.iter().sum::<usize>() > 0)
        {
            break;
        }
        signal(pid, Signal::CONT);
        std::thread::sleep(Duration::from_millis(1));
    }
    signal(pid, Signal::KILL);
    let killed = Instant::now();
    // Reaped before the restart: a dying listener still accepts, and the
    // new back end would find the socket "in use".
    let _ = backend.child.wait();
    *backend = restart(generation);
    let new = backend.child.id();
    let back = wait_until(guest, Duration::from_secs(30), || maps_guest_memory(new));
    assert!(
        back,
        "{during}: QEMU did not reconnect to the restarted {} within 30 s\n{}",
        backend.name,
        backend.log_tail()
    );
    Kill {
        during,
        inflight,
        reconnect: killed.elapsed(),
        log: backend.log.clone(),
    }
}

/// How a guest run through two back-end restarts ended.
#[derive(Debug)]
struct RestartRun {
    kills: Vec<Kill>,
    /// guest-dd's verdict: `Ok(json)` or `Err(reason)`.
    guest: Result<serde_json::Value, String>,
    /// The host's byte-for-byte check of the image.
    image: Result<(), String>,
    /// Name of the back end.
    name: &'static str,
}

/// Runs the guest's dd and pattern against back ends made by `start`
/// (generation 0, 1, 2 on the same image and socket) with `queues`
/// virtqueues (and as many guest CPUs, the pattern written from each),
/// killing the back end once during dd's write and once during the
/// pattern's write.
fn guest_through_restarts(
    dir: &Path,
    seed: u64,
    queues: u32,
    start: &dyn Fn(&Path, &Path, u32, PathBuf) -> Backend,
) -> RestartRun {
    let image = dir.join("disk-restart.img");
    let sock = dir.join("vu-restart.sock");
    make_image(&image, &RESTART);
    let restart = |generation: u32| {
        let log = dir.join(format!("backend-restart-{generation}.log"));
        let mut b = start(&image, &sock, queues, log);
        if generation == 0 {
            wait_for_socket(&mut b, &sock);
        }
        b
    };
    let mut backend = restart(0);
    let out_path = dir.join("guest-restart.out");
    let err_path = dir.join("guest-restart.err");
    let mut guest = Command::new(repo().join("scripts/guest-dd"))
        .arg("--socket")
        .arg(&sock)
        .args(["--count", &RESTART.count.to_string(), "--bs", "8M"])
        .args(["--reconnect-ms", &RECONNECT_MS.to_string()])
        .args(["--queues", &queues.to_string()])
        .args(["--timeout", "100", "--json"])
        .args(["--pattern-offset", &RESTART.pat_off.to_string()])
        .args(["--pattern-size", &RESTART.pat_size.to_string()])
        .args(["--pattern-seed", &format!("{seed:#x}")])
        .stdin(Stdio::null())
        .stdout(File::create(&out_path).expect("create guest-restart.out"))
        .stderr(File::create(&err_path).expect("create guest-restart.err"))
        .spawn()
        .expect("run scripts/guest-dd");
    let img = File::open(&image).expect("open image");
    let mut kills = Vec::new();
    // During dd's write: once 96 MiB of the 256 are zeros.
    let zeros = [0u8; 512];
    if wait_until(&mut guest, Duration::from_secs(80), || {
        image_holds(&img, 96 << 20, &zeros)
    }) {
        kills.push(kill_and_restart(
            &mut backend,
            &mut guest,
            "dd write",
            &restart,
            1,
        ));
    }
    // During the pattern's write: once its word 32 MiB in is there.
    let at = RESTART.pat_off + (32 << 20);
    if wait_until(&mut guest, Duration::from_secs(30), || {
        image_holds(&img, at, &pattern_word(at, seed))
    }) {
        kills.push(kill_and_restart(
            &mut backend,
            &mut guest,
            "pattern write",
            &restart,
            2,
        ));
    }
    // A back end that lost requests leaves the guest waiting on them for
    // ever: 30 s after the last restart (what is left of a run then takes
    // a few seconds) it is stopped (SIGTERM, so that guest-dd's trap stops
    // QEMU).
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(st) = guest.try_wait().expect("poll guest-dd") {
            break Some(st);
        }
        if Instant::now() > deadline {
            signal(guest.id(), rustix::process::Signal::TERM);
            let _ = guest.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    eprintln!("{stderr}");
    let stdout = std::fs::read(&out_path).unwrap_or_default();
    let json: Option<serde_json::Value> = serde_json::from_slice(&stdout).ok();
    let guest_result = match (status, json) {
        (None, _) => Err("the guest's I/O hung (stopped 30 s after the last restart)".into()),
        (Some(st), Some(j)) if st.success() && j["result"] == "pass" => Ok(j),
        (Some(st), j) => Err(format!(
            "guest-dd exited {st}: {}",
            j.map_or_else(|| "no JSON".into(), |j| j["reason"].to_string())
        )),
    };
    let name = backend.name;
    drop(backend);
    let image_check = check_image(&image, &RESTART, seed);
    std::fs::remove_file(&image).expect("remove image");
    RestartRun {
        kills,
        guest: guest_result,
        image: image_check,
        name,
    }
}

fn describe(run: &RestartRun) -> String {
    let kills: Vec<String> = run
        .kills
        .iter()
        .map(|k| {
            format!(
                "killed during {}: {}, reconnected in {} ms",
                k.during,
                k.inflight.as_ref().map_or_else(
                    || "no inflight record".into(),
                    |q| format!("{q:?} request(s) in flight per queue")
                ),
                k.reconnect.as_millis()
            )
        })
        .collect();
    format!(
        "{}: {}; guest: {}; image: {}",
        run.name,
        kills.join("; "),
        match &run.guest {
            Ok(j) => format!(
                "dd and pattern passed (write {} MB/s)",
                j["write"]["mb_per_s"]
            ),
            Err(e) => format!("FAILED ({e})"),
        },
        match &run.image {
            Ok(()) => "checked byte for byte".to_string(),
            Err(e) => format!("differs ({e})"),
        }
    )
}

/// Back-end restart under a running guest: `iopath blk serve` is killed
/// with SIGKILL while requests are in flight, once during the guest's dd
/// and once during its pattern write, and started again on the same image
/// and socket; QEMU reconnects (`reconnect-ms`), hands the new back end
/// the inflight record (`SET_INFLIGHT_FD`), and the back end resubmits the
/// heads it holds. Two virtqueues (the guest has two CPUs and writes half
/// the pattern from each), so each queue's region of the record must be
/// kept and replayed apart. The guest's dd and pattern check must pass
/// without an I/O error and the image must hold exactly what the guest
/// wrote.
#[test]
fn guest_dd_survives_iopath_blk_serve_restarts() {
    let Some((_guard, dir)) = guest_ready() else {
        return;
    };
    let seed = 0x7e57_a27e_d0d0_cafeu64;
    let run = guest_through_restarts(dir.path(), seed, 2, &start_iopath);
    println!("restart: {}", describe(&run));
    assert_eq!(run.kills.len(), 2, "both kills landed: {}", describe(&run));
    if let Err(e) = &run.guest {
        panic!(
            "the guest failed through the restarts: {e}\n{}",
            describe(&run)
        );
    }
    if let Err(e) = &run.image {
        panic!(
            "the image disagrees with the guest: {e}\n{}",
            describe(&run)
        );
    }
    // The record was there at every kill, and at least once held requests
    // (the stop is retried until it does); each restarted back end
    // resubmitted what the record held at its predecessor's kill (one
    // fewer when the kill fell between a used-ring update and the record's:
    // that head was complete and is not run again).
    assert!(
        run.kills.iter().all(|k| k.inflight.is_some()),
        "no inflight record: {}",
        describe(&run)
    );
    let mut total = 0;
    for k in &run.kills {
        let log = std::fs::read_to_string(&k.log).unwrap_or_default();
        for (q, &held) in k.inflight.iter().flatten().enumerate() {
            let resubmitted = log
                .lines()
                .find_map(|l| {
                    let (_, rest) = l.split_once(&format!("queue {q}: "))?;
                    let (n, _) = rest.split_once(" request(s) were in flight")?;
                    n.parse::<usize>().ok()
                })
                .unwrap_or(0);
            assert!(
                resubmitted == held || resubmitted + 1 == held,
                "killed during {}: queue {q}'s record held {held} heads, the new back end \
                 resubmitted {resubmitted}\n{log}",
                k.during
            );
            total += resubmitted;
        }
    }
    assert!(
        total > 0,
        "no restart resubmitted a request: {}",
        describe(&run)
    );
}

/// The same restarts with `qemu-storage-daemon` as the back end: a peer's
/// result, recorded (BENCHMARKS.md), not required; the test fails only if
/// the run itself could not be made.
#[test]
fn guest_dd_restart_qemu_storage_daemon_recorded() {
    if !iopath_testkit::have_peers(&[QSD]) {
        return;
    }
    let Some((_guard, dir)) = guest_ready() else {
        return;
    };
    let seed = 0x0a5d_0a5d_0a5d_0a5du64;
    let run = guest_through_restarts(dir.path(), seed, 2, &start_qsd);
    println!("restart: {}", describe(&run));
    // The second kill waits for the pattern, which a guest stuck after the
    // first never writes: only the first must have landed.
    assert!(!run.kills.is_empty(), "no kill landed: {}", describe(&run));
}
