//! rpmsg with real processes: `iopath rpmsg remote` and `iopath rpmsg host`
//! as two processes over a shared-memory file, `iopath rpmsg ping` as a
//! third; OpenAMP demo mode; malformed input from a peer.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_iopath");

struct Proc {
    name: String,
    child: Child,
    err: PathBuf,
}

impl Proc {
    fn spawn(dir: &Path, name: &str, args: &[&str]) -> Proc {
        let err = dir.join(format!("{name}.err"));
        let out = dir.join(format!("{name}.out"));
        let child = Command::new(BIN)
            .args(args)
            .env("IOPATH_LOG", "info")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&err).unwrap())
            .spawn()
            .unwrap();
        Proc {
            name: name.to_owned(),
            child,
            err,
        }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.err).unwrap_or_default()
    }

    fn stdout(&self) -> String {
        std::fs::read_to_string(self.err.with_extension("out")).unwrap_or_default()
    }

    /// Waits for the process to exit on its own.
    fn wait(&mut self, timeout: Duration) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st;
            }
            assert!(
                start.elapsed() < timeout,
                "{} did not exit within {timeout:?}; stderr:\n{}",
                self.name,
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_path(p: &Path) {
    let start = Instant::now();
    while !p.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{} never appeared",
            p.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn ping(ctrl: &Path, extra: &[&str]) -> Output {
    Command::new(BIN)
        .args(["rpmsg", "ping", "--ctrl", ctrl.to_str().unwrap()])
        .args(extra)
        .output()
        .unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

struct Pair {
    dir: tempfile::TempDir,
    remote: Proc,
    host: Proc,
    ctrl: PathBuf,
}

/// A remote (echo service "echo") and a host with a control socket.
fn pair(notify: &str, remote_extra: &[&str], host_extra: &[&str]) -> Pair {
    let dir = tempfile::tempdir().unwrap();
    let shm = dir.path().join("shm");
    let notify = notify.replace("DIR", s(dir.path()));
    let mut ra = vec![
        "rpmsg",
        "remote",
        "--shm",
        s(&shm),
        "--create",
        "0x80000",
        "--notify",
        &notify,
        "--echo",
        "echo",
    ];
    ra.extend_from_slice(remote_extra);
    let remote = Proc::spawn(dir.path(), "remote", &ra);
    let ctrl = dir.path().join("ctrl");
    let mut ha = vec![
        "rpmsg",
        "host",
        "--shm",
        s(&shm),
        "--notify",
        &notify,
        "--ctrl",
        s(&ctrl),
    ];
    ha.extend_from_slice(host_extra);
    let host = Proc::spawn(dir.path(), "host", &ha);
    wait_path(&ctrl);
    Pair {
        dir,
        remote,
        host,
        ctrl,
    }
}

fn json(o: &Output) -> serde_json::Value {
    assert!(
        o.status.success(),
        "ping failed: {}\n{}",
        String::from_utf8_lossy(&o.stderr),
        String::from_utf8_lossy(&o.stdout)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

fn echo_every_size(notify: &str, remote_extra: &[&str]) {
    let p = pair(notify, remote_extra, &[]);
    // 992 round trips: every size 1..=496 twice, every byte compared by ping.
    let v = json(&ping(
        &p.ctrl,
        &["--name", "echo", "--count", "992", "--json"],
    ));
    assert_eq!(v["count"], 992);
    assert_eq!(v["sizes"], serde_json::json!([1, 496]));
    assert_eq!(v["bytes"], 2 * (496 * 497 / 2));
    assert_eq!(v["checked"], true);
    // A second client on the same bus.
    let v = json(&ping(
        &p.ctrl,
        &[
            "--name", "echo", "--count", "100", "--size", "496", "--json",
        ],
    ));
    assert_eq!(v["bytes"], 100 * 496);
    let stderr = p.remote.stderr();
    assert!(stderr.contains("host ready"), "{stderr}");
    assert!(
        !stderr.contains("malformed") && !stderr.contains("refused"),
        "{stderr}"
    );
}

#[test]
fn every_size_eventfd() {
    echo_every_size("eventfd:DIR/ev", &[]);
}

#[test]
fn every_size_unix_byte_event_idx() {
    echo_every_size("unix:DIR/ev", &["--event-idx"]);
}

#[test]
fn every_size_poll() {
    echo_every_size("poll", &[]);
}

#[test]
fn remote_destroy_tears_down_host_channel() {
    let mut p = pair("eventfd:DIR/ev", &["--echo-limit", "10"], &[]);
    let o = ping(
        &p.ctrl,
        &["--name", "echo", "--count", "50", "--timeout", "5"],
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("closed after 10 round trips"), "{err}");
    assert!(p.remote.wait(Duration::from_secs(10)).success());
    let host_err = p.host.stderr();
    assert!(host_err.contains("peer destroyed \"echo\""), "{host_err}");
    // The channel is gone on the host: nobody can attach to it any more.
    let o = ping(
        &p.ctrl,
        &["--name", "echo", "--count", "1", "--timeout", "1"],
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("refused") || err.contains("connect"), "{err}");
    // And the host ends once the remote has gone.
    assert!(p.host.wait(Duration::from_secs(10)).success());
}

#[test]
fn host_destroy_tears_down_remote_channel() {
    let mut p = pair("unix:DIR/ev", &["--exit-on-unbind"], &[]);
    let v = json(&ping(
        &p.ctrl,
        &["--name", "echo", "--count", "10", "--json"],
    ));
    assert_eq!(v["count"], 10);
    // Closing the ping's endpoint sends a name-service DESTROY; the remote
    // sees its channel torn down and exits.
    assert!(p.remote.wait(Duration::from_secs(10)).success());
    let err = p.remote.stderr();
    assert!(err.contains("host destroyed its endpoint"), "{err}");
    assert!(err.contains("channel closed"), "{err}");
    drop(p.dir);
}

/// OpenAMP demo mode both ways: iopath plays rpmsg-echo (remote) and
/// rpmsg-echo-ping (host), layout 0x80000 with the unix-socket byte.
#[test]
fn openamp_demo_ping_against_demo_echo() {
    let dir = tempfile::tempdir().unwrap();
    let shm = dir.path().join("openamp.shm");
    let ev = format!("unix:{}/openamp.event.0", s(dir.path()));
    let mut remote = Proc::spawn(
        dir.path(),
        "remote",
        &[
            "rpmsg",
            "remote",
            "--shm",
            s(&shm),
            "--create",
            "0x80000",
            "--notify",
            &ev,
            "--openamp",
        ],
    );
    let mut host = Proc::spawn(
        dir.path(),
        "host",
        &[
            "rpmsg",
            "host",
            "--shm",
            s(&shm),
            "--notify",
            &ev,
            "--openamp-ping",
        ],
    );
    assert!(
        host.wait(Duration::from_secs(60)).success(),
        "{}",
        host.stderr()
    );
    assert!(
        host.stdout()
            .contains("480 payloads (sizes 1..480) echoed, errors 0"),
        "{}",
        host.stdout()
    );
    // The session ends with a name-service DESTROY: the demo echo exits.
    assert!(
        remote.wait(Duration::from_secs(10)).success(),
        "{}",
        remote.stderr()
    );
    assert!(
        remote.stderr().contains("host destroyed its endpoint"),
        "{}",
        remote.stderr()
    );
}

#[test]
fn openamp_demo_ping_against_plain_remote() {
    let dir = tempfile::tempdir().unwrap();
    let shm = dir.path().join("openamp.shm");
    let ev = format!("unix:{}/openamp.event.0", s(dir.path()));
    let _remote = Proc::spawn(
        dir.path(),
        "remote",
        &[
            "rpmsg",
            "remote",
            "--shm",
            s(&shm),
            "--create",
            "0x80000",
            "--notify",
            &ev,
            "--event-idx",
        ],
    );
    let mut host = Proc::spawn(
        dir.path(),
        "host",
        &[
            "rpmsg",
            "host",
            "--shm",
            s(&shm),
            "--notify",
            &ev,
            "--openamp-ping",
            "--json",
        ],
    );
    assert!(
        host.wait(Duration::from_secs(60)).success(),
        "{}",
        host.stderr()
    );
    let v: serde_json::Value = serde_json::from_str(&host.stdout()).unwrap();
    assert_eq!(v["payloads"], 480);
    assert_eq!(v["errors"], 0);
}

#[test]
fn demo_echo_against_host_and_ping_client() {
    let dir = tempfile::tempdir().unwrap();
    let shm = dir.path().join("openamp.shm");
    let ev = format!("unix:{}/openamp.event.0", s(dir.path()));
    let ctrl = dir.path().join("ctrl");
    let mut remote = Proc::spawn(
        dir.path(),
        "remote",
        &[
            "rpmsg",
            "remote",
            "--shm",
            s(&shm),
            "--create",
            "0x80000",
            "--notify",
            &ev,
            "--openamp",
        ],
    );
    let _host = Proc::spawn(
        dir.path(),
        "host",
        &[
            "rpmsg",
            "host",
            "--shm",
            s(&shm),
            "--notify",
            &ev,
            "--ctrl",
            s(&ctrl),
        ],
    );
    wait_path(&ctrl);
    let v = json(&ping(&ctrl, &["--openamp", "--json"]));
    assert_eq!(v["count"], 480);
    assert_eq!(v["sizes"], serde_json::json!([17, 496]));
    assert!(
        remote.wait(Duration::from_secs(10)).success(),
        "{}",
        remote.stderr()
    );
}
