//! An interrupted `iopath bench` (SIGTERM from a supervisor, SIGINT from a
//! terminal) leaves no scratch file and no child process behind, and
//! exits 128 + the signal's number.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_iopath");

/// The files under `prefix` that process `pid` holds open or mapped.
fn open_files(pid: u32, prefix: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .collect();
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    out.extend(
        maps.lines()
            .filter_map(|l| l.find('/').map(|i| PathBuf::from(&l[i..]))),
    );
    out.retain(|p| p.to_string_lossy().starts_with(prefix));
    out
}

/// The direct children of `pid`.
fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for t in tasks.flatten() {
        let s = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
        out.extend(s.split_whitespace().filter_map(|p| p.parse::<u32>().ok()));
    }
    out
}

/// Whether `pid` still runs (a zombie nobody reaped counts as gone).
fn running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !matches!(
            s.rsplit(") ").next().and_then(|r| r.chars().next()),
            Some('Z')
        ),
        Err(_) => false,
    }
}

fn wait_until<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn bench(args: &[&str]) -> Child {
    Command::new(BIN)
        .arg("bench")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn signal(child: &Child, sig: i32) {
    let pid = rustix::process::Pid::from_child(child);
    let sig = if sig == 15 {
        rustix::process::Signal::TERM
    } else {
        rustix::process::Signal::INT
    };
    rustix::process::kill_process(pid, sig).unwrap();
}

/// Waits for the bench to exit and returns its status code and stderr.
fn finish(child: Child) -> (Option<i32>, String) {
    let start = Instant::now();
    let out = child.wait_with_output().unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "exit took {:?}",
        start.elapsed()
    );
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn sigterm_mid_heap_bench_removes_the_scratch_file() {
    // A scratch file big enough that the bench is still writing or reading
    // it when the signal comes.
    let child = bench(&[
        "heap",
        "--size",
        "256M",
        "--runs",
        "5",
        "--methods",
        "buffered",
    ]);
    let pid = child.id();
    let scratch = wait_until("the scratch file", Duration::from_secs(60), || {
        open_files(pid, "/var/tmp/iopath-bench-").pop()
    });
    assert!(scratch.exists());
    signal(&child, 15);
    let (code, stderr) = finish(child);
    assert_eq!(code, Some(143), "{stderr}");
    assert!(stderr.contains("interrupted by SIGTERM"), "{stderr}");
    assert!(!scratch.exists(), "{} left behind", scratch.display());
}

/// The bench's scratch directories present in the temporary directory.
fn temp_scratch() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(std::env::temp_dir())
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("iopath-bench-"))
        })
        .collect();
    v.sort();
    v
}

#[test]
fn sigint_mid_rpmsg_bench_stops_host_and_remote_and_removes_shm() {
    let before = temp_scratch();
    let child = bench(&[
        "rpmsg",
        "--loops",
        "100000",
        "--runs",
        "3",
        "--placement",
        "free",
    ]);
    let pid = child.id();
    // The host, the remote and the raw limit's server, and the shared
    // memory the bench made.
    let kids = wait_until(
        "the host, the remote and the raw server",
        Duration::from_secs(60),
        || {
            let k = children(pid);
            (k.len() >= 3).then_some(k)
        },
    );
    let shm_dir = wait_until("the shared memory", Duration::from_secs(30), || {
        kids.iter()
            .flat_map(|&k| open_files(k, "/dev/shm/iopath-bench-rpmsg-"))
            .next()
            .and_then(|p| p.parent().map(PathBuf::from))
    });
    signal(&child, 2);
    let (code, stderr) = finish(child);
    assert_eq!(code, Some(130), "{stderr}");
    assert!(stderr.contains("interrupted by SIGINT"), "{stderr}");
    wait_until("the children to end", Duration::from_secs(5), || {
        (!kids.iter().any(|&k| running(k))).then_some(())
    });
    assert!(!shm_dir.exists(), "{} left behind", shm_dir.display());
    // Nor a scratch directory in the temporary directory (the raw server's
    // socket lives in one).
    let left: Vec<_> = temp_scratch()
        .into_iter()
        .filter(|p| !before.contains(p))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}
