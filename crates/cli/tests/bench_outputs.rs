//! `iopath bench` refuses an unwritable `--plot`, `--markdown` or `--json`
//! before any experiment runs: nothing is measured only to be lost.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_iopath");

/// Runs `iopath ARGS`, killing it after 20 s; (status, stdout, stderr,
/// how long it took).
fn run(args: &[&str]) -> (Option<i32>, String, String, Duration) {
    let start = Instant::now();
    let mut child = Command::new(BIN)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    while child.try_wait().unwrap().is_none() && start.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let o = child.wait_with_output().unwrap();
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
        start.elapsed(),
    )
}

#[test]
fn unwritable_outputs_are_refused_before_running() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let f = file.to_str().unwrap();
    let rpmsg = [
        "bench",
        "rpmsg",
        "--loops",
        "200",
        "--runs",
        "1",
        "--count",
        "200",
        "--placement",
        "one",
    ];
    let missing_md = format!("{d}/missing/bench.md");
    let under_file = format!("{f}/charts");
    let missing_json = format!("{d}/missing/bench.json");
    for (extra, option) in [
        (vec!["--markdown", missing_md.as_str()], "--markdown"),
        (vec!["--plot", f], "--plot"),
        (vec!["--plot", under_file.as_str()], "--plot"),
    ] {
        let mut args = rpmsg.to_vec();
        args.extend_from_slice(&extra);
        let (code, out, err, took) = run(&args);
        assert_eq!(code, Some(1), "{extra:?}: {err}");
        assert!(err.contains(option), "{extra:?}: {err}");
        assert!(out.is_empty(), "{extra:?}: an experiment ran:\n{out}");
        assert!(took < Duration::from_secs(5), "{extra:?}: {took:?}");
    }
    // Every experiment, the JSON to a file that cannot be made.
    let (code, out, err, took) = run(&["bench", "--json", &missing_json]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("--json"), "{err}");
    assert!(!out.contains("== heap"), "an experiment ran:\n{out}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    // Nothing was left behind by the checks.
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(left.len(), 1, "{left:?}");
}
