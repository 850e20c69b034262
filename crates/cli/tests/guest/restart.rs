//! Back-end restarts under a running guest: kill the back end while
//! requests are in flight, start a new one on the same image and socket,
//! and measure until QEMU has restarted the device on it.

use super::*;

/// The restart runs: a dd of 256 MiB and a 64 MiB pattern, long enough
/// under TCG (about half a second each) for a kill to land inside them.
pub const RESTART: Layout = Layout {
    count: 32,
    pat_off: (16 << 20) + (12 << 10),
    pat_size: 64 << 20,
};
/// How often QEMU tries to reconnect once the back end is gone.
pub const RECONNECT_MS: u64 = 100;

/// The inflight record (`VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD`) of a
/// stopped back end, read from the memfd it holds: per queue, how many
/// descriptor heads are marked in flight. `None` when the back end holds
/// no inflight memfd.
pub fn inflight_heads(pid: u32) -> Option<Vec<usize>> {
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
pub struct Kill {
    /// What the guest was doing.
    pub during: &'static str,
    /// Heads the inflight record held at the kill, per queue (`None`: no
    /// record).
    pub inflight: Option<Vec<usize>>,
    /// From the kill until the new back end had the guest's memory mapped
    /// again (QEMU reconnected and restarted the device).
    pub reconnect: Duration,
    /// The new back end's log.
    pub log: PathBuf,
}

/// Whether the image holds `want` at `offset` (read past the page cache's
/// view of an O_DIRECT writer: pread sees what was written).
pub fn image_holds(image: &File, offset: u64, want: &[u8]) -> bool {
    use std::os::unix::fs::FileExt;
    let mut got = vec![0u8; want.len()];
    image.read_exact_at(&mut got, offset).is_ok() && got == want
}

/// Whether process `pid` maps the guest's memory (QEMU's memfd).
pub fn maps_guest_memory(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .is_ok_and(|m| m.contains("memory-backend-memfd"))
}

pub fn signal(pid: u32, sig: rustix::process::Signal) {
    let pid = rustix::process::Pid::from_raw(pid as i32).expect("a child's pid");
    let _ = rustix::process::kill_process(pid, sig);
}

/// Waits (at most `limit`) until `ready` holds, polling every 2 ms; false
/// when the guest ended first or time ran out.
pub fn wait_until(guest: &mut Child, limit: Duration, mut ready: impl FnMut() -> bool) -> bool {
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
pub fn kill_and_restart(
    backend: &mut Backend,
    guest: &mut Child,
    during: &'static str,
    restart: &dyn Fn(u32) -> Backend,
    generation: u32,
) -> Kill {
    use rustix::process::Signal;
    let pid = backend.id();
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
    backend.kill();
    *backend = restart(generation);
    let new = backend.id();
    let back = wait_until(guest, Duration::from_secs(30), || maps_guest_memory(new));
    assert!(
        back,
        "{during}: QEMU did not reconnect to the restarted {} within 30 s\n{}",
        backend.name(),
        super::log_tail(backend)
    );
    Kill {
        during,
        inflight,
        reconnect: killed.elapsed(),
        log: backend.log().expect("a logged back end").to_path_buf(),
    }
}

/// How a guest run through two back-end restarts ended.
#[derive(Debug)]
pub struct RestartRun {
    pub kills: Vec<Kill>,
    /// guest-dd's verdict: `Ok(json)` or `Err(reason)`.
    pub guest: Result<serde_json::Value, String>,
    /// The host's byte-for-byte check of the image.
    pub image: Result<(), String>,
    /// Name of the back end.
    pub name: String,
}

/// Runs the guest's dd and pattern against back ends made by `start`
/// (generation 0, 1, 2 on the same image and socket) with `queues`
/// virtqueues (and as many guest CPUs, the pattern written from each),
/// killing the back end once during dd's write and once during the
/// pattern's write.
pub fn guest_through_restarts(
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
    let name = backend.name().to_string();
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

pub fn describe(run: &RestartRun) -> String {
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
