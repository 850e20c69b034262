//! One owner per role on a shared-memory file, with real processes: a
//! second remote (with `--create` or not) or a second host is refused
//! whatever companion socket it names, `--create` never truncates a file a
//! live session has mapped, each refusal names the holder's pid, and the
//! pair already running keeps its data flowing.

#[allow(dead_code)]
mod common;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{echo_ept, round_trip, s, spawn_host, wait_path, Proc, BIN};

fn iopath(args: &[&str]) -> (Output, Duration) {
    let start = Instant::now();
    let o = Command::new(BIN).args(args).output().unwrap();
    (o, start.elapsed())
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn second_remote_or_host_is_refused_naming_the_holder() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let shm = d.join("shm");
    // A file made once, then served by a remote that opens it (no
    // --create) and a host.
    let ev = format!("unix:{}", s(&d.join("ev")));
    let made = iopath(&[
        "rpmsg",
        "remote",
        "--shm",
        s(&shm),
        "--create",
        "0x80000",
        "--notify",
        "poll",
        "--ready-timeout",
        "1",
    ]);
    assert!(!made.0.status.success());
    assert_eq!(std::fs::metadata(&shm).unwrap().len(), 0x80000);
    let remote = Proc::spawn(
        d,
        "remote",
        &[
            "rpmsg",
            "remote",
            "--shm",
            s(&shm),
            "--notify",
            &ev,
            "--echo",
            "echo",
        ],
    );
    wait_path(&d.join("ev"));
    let ctrl = d.join("ctrl");
    let host = spawn_host(d, s(&shm), &ev, &["--ctrl", s(&ctrl)]);
    wait_path(&ctrl);
    let ep = echo_ept(&ctrl);
    round_trip(&ep, 1);
    let before = std::fs::read(&shm).unwrap();

    // --create on another notify socket: refused before the file is
    // touched, naming the remote that holds it.
    let other = format!("unix:{}", s(&d.join("other")));
    let (o, took) = iopath(&[
        "rpmsg",
        "remote",
        "--shm",
        s(&shm),
        "--create",
        "0x100000",
        "--notify",
        &other,
    ]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("in use by another remote (pid {})", remote.pid())),
        "{err}"
    );
    assert!(took < Duration::from_secs(1), "{took:?}");
    assert_eq!(std::fs::metadata(&shm).unwrap().len(), 0x80000);
    assert!(!d.join("other").exists());
    // Without --create too.
    let (o, _) = iopath(&["rpmsg", "remote", "--shm", s(&shm), "--notify", &other]);
    assert!(
        stderr(&o).contains("in use by another remote"),
        "{}",
        stderr(&o)
    );
    round_trip(&ep, 2);

    // A second host, on another notify socket or on the busy remote's
    // own: refused within a second, naming the first host.
    for notify in [other.as_str(), ev.as_str()] {
        let (o, took) = iopath(&[
            "rpmsg",
            "host",
            "--shm",
            s(&shm),
            "--notify",
            notify,
            "--ctrl",
            s(&d.join("ctrl2")),
            "--timeout",
            "3",
        ]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(
            err.contains(&format!("in use by another host (pid {})", host.pid())),
            "{notify}: {err}"
        );
        assert!(took < Duration::from_secs(1), "{notify}: {took:?}");
        round_trip(&ep, 3);
    }
    // The rings were never reset under the pair: the table is as it was.
    let after = std::fs::read(&shm).unwrap();
    assert_eq!(before[..0x400], after[..0x400]);
    round_trip(&ep, 4);
}

#[test]
fn create_refused_for_a_bad_notify_removes_the_file_it_made() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let shm = d.join("shm");
    // A notify socket whose directory does not exist.
    let bad = format!("unix:{}", s(&d.join("missing/ev")));
    // The same remote, refused for the same bad --notify, twice.
    let create = || {
        iopath(&[
            "rpmsg",
            "remote",
            "--shm",
            s(&shm),
            "--create",
            "0x80000",
            "--notify",
            &bad,
        ])
    };
    let (o, _) = create();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("notify socket"), "{}", stderr(&o));
    assert!(!shm.exists(), "the file --create made was left behind");
    // A file that was there before is the user's: kept.
    std::fs::write(&shm, b"mine").unwrap();
    let (o, _) = create();
    assert_eq!(o.status.code(), Some(1));
    assert!(shm.exists());
}
