//! The guest harness of `guest_dd.rs`: back ends (`iopath blk serve`,
//! `qemu-storage-daemon`) killed on drop, the image the guest writes and
//! its byte-for-byte check, and one guest run through `scripts/guest-dd`.

pub mod rand;
pub mod restart;

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use iopath_sys::process::Supervised;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// dd block size the script uses (`--bs 8M`).
pub const BS: u64 = 8 << 20;
/// dd count: 64 MiB written and read per run keeps the test quick under TCG.
pub const COUNT: u64 = 8;
/// Pattern range: inside the zeroed range, not aligned to dd's 8 MiB.
pub const PAT_OFF: u64 = (24 << 20) + (12 << 10);
pub const PAT_SIZE: u64 = (3 << 20) + (8 << 10);
/// What the image holds before the guest runs.
pub const FILL: u8 = 0xa5;

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub const QEMU: (&str, &str) = ("qemu-system-x86_64", "qemu-system-x86");
pub const QSD: (&str, &str) = ("qemu-storage-daemon", "qemu-utils");

/// One guest at a time: TCG guests are CPU-bound and the machine is small.
pub fn guest_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    iopath_sys::lock(&LOCK)
}

/// Builds the guest once per test binary (`scripts/guest-dd --prepare`).
pub fn prepare() {
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
/// its log, which failure messages quote ([`log_tail`]).
pub type Backend = Supervised;

/// Starts the back end `cmd`, its output into `log`.
pub fn spawn(name: &str, mut cmd: Command, log: PathBuf) -> Backend {
    Supervised::logged(name, log, &mut cmd).unwrap()
}

/// The last lines `backend` printed.
fn log_tail(backend: &Backend) -> String {
    let text = backend.output();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

pub fn start_qsd(image: &Path, sock: &Path, queues: u32, log: PathBuf) -> Backend {
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
    spawn("qemu-storage-daemon", cmd, log)
}

pub fn start_iopath(image: &Path, sock: &Path, queues: u32, log: PathBuf) -> Backend {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_iopath"));
    cmd.args(["blk", "serve", "--image"])
        .arg(image)
        .arg("--socket")
        .arg(sock)
        .args(["--queues", &queues.to_string()]);
    spawn("iopath blk serve", cmd, log)
}

pub fn wait_for_socket(backend: &mut Backend, sock: &Path) {
    let limit = Duration::from_secs(20);
    if let Err(e) = backend.wait_for("its socket", limit, || sock.exists()) {
        panic!("{e}\n{}", log_tail(backend));
    }
}

/// The little-endian u64 at device offset `o` holds `o ^ seed`.
pub fn pattern_word(o: u64, seed: u64) -> [u8; 8] {
    (o ^ seed).to_le_bytes()
}

/// What one guest run writes: dd's `count` blocks of zeros from offset 0,
/// then the pattern over `[pat_off, pat_off + pat_size)`.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    count: u64,
    pat_off: u64,
    pat_size: u64,
}

/// The layout of the ordinary runs.
pub const RUN: Layout = Layout {
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

pub fn make_image(path: &Path, layout: &Layout) {
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
pub fn check_image(path: &Path, layout: &Layout, seed: u64) -> Result<(), String> {
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

/// How the guest's virtio-blk maps its buffers (`scripts/guest-dd` flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dma {
    /// Guest-physical addresses, no DMA API.
    Direct,
    /// Behind the vIOMMU (`--iommu`): IOVAs the back end translates.
    Iommu,
    /// Behind the vIOMMU with `swiotlb=force` (`--iommu --swiotlb`).
    IommuSwiotlb,
}

impl Dma {
    fn args(self) -> &'static [&'static str] {
        match self {
            Dma::Direct => &[],
            Dma::Iommu => &["--iommu"],
            Dma::IommuSwiotlb => &["--iommu", "--swiotlb"],
        }
    }
}

/// Boots the guest against `backend` and checks the JSON it prints.
pub fn run_guest(
    backend: &mut Backend,
    sock: &Path,
    dir: &Path,
    queues: u32,
    seed: u64,
    dma: Dma,
) -> serde_json::Value {
    let mut args: Vec<String> = vec!["--socket".into(), sock.display().to_string()];
    for a in [
        "--count",
        &COUNT.to_string(),
        "--bs",
        "8M",
        "--queues",
        &queues.to_string(),
        "--timeout",
        "240",
        "--json",
        "--pattern-offset",
        &PAT_OFF.to_string(),
        "--pattern-size",
        &PAT_SIZE.to_string(),
        "--pattern-seed",
        &format!("{seed:#x}"),
    ] {
        args.push(a.to_string());
    }
    args.extend(dma.args().iter().map(|a| a.to_string()));
    let json = run_guest_dd(backend, dir, &args, &format!("{queues} queue(s)"));
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
    assert_interrupts(&json, queues);
    assert_eq!(json["pattern"]["seed"], format!("{seed:#018x}"));
    json
}

/// Runs `scripts/guest-dd` with `args` (which include `--json`) against
/// `backend` and returns the JSON of a passing run. If the back end dies
/// while the guest still runs, the guest is stopped at once and the
/// failure quotes the back end's exit status and log; `what` names the
/// run in failures.
pub fn run_guest_dd(
    backend: &mut Backend,
    dir: &Path,
    args: &[String],
    what: &str,
) -> serde_json::Value {
    let out_path = dir.join("guest-dd.out");
    let err_path = dir.join("guest-dd.err");
    let mut guest = Command::new(repo().join("scripts/guest-dd"))
        .args(args)
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
            if let Some(st) = backend.exited() {
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
            Some((st, _)) => format!("{} exited during the run: {st}", backend.name()),
            None => format!("{} still running", backend.name()),
        };
        panic!(
            "guest-dd failed ({status}), {what}; {died}\n--- guest-dd:\n{stderr}\n--- {} log:\n{}",
            backend.name(),
            log_tail(backend)
        );
    }
    let stdout = std::fs::read(&out_path).expect("read guest-dd.out");
    let json: serde_json::Value =
        serde_json::from_slice(&stdout).expect("guest-dd --json prints one JSON object");
    assert_eq!(json["result"], "pass");
    json
}

/// One interrupt vector per queue, and every queue completed requests.
pub fn assert_interrupts(json: &serde_json::Value, queues: u32) {
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
}

/// The guest (one at a time) and a scratch directory, or `None` (and a
/// "skipped" line) without QEMU.
pub fn guest_ready() -> Option<(std::sync::MutexGuard<'static, ()>, tempfile::TempDir)> {
    if !iopath_testkit::have_peers(&[QEMU]) {
        return None;
    }
    let guard = guest_lock();
    prepare();
    Some((guard, tempfile::tempdir().expect("tempdir")))
}

pub fn guest_dd_against(start: fn(&Path, &Path, u32, PathBuf) -> Backend) {
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
        let json = run_guest(&mut backend, &sock, dir.path(), queues, seed, Dma::Direct);
        let name = backend.name().to_string();
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
