//! Helpers shared by the rpmsg process tests (`rpmsg*.rs`):
//! child processes killed on drop, a remote/host pair on a temporary
//! shared-memory file, waiting for a socket to appear.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

use iopath_rpmsg::ctrl::proto::{O_CLOEXEC, O_RDWR};
use iopath_rpmsg::ctrl::{CtrlClient, EptFd, EptInfo};
use iopath_rpmsg::wire::ADDR_ANY;
use iopath_sys::process::Supervised;

pub const BIN: &str = env!("CARGO_BIN_EXE_iopath");

/// A child process (stdout and stderr in `DIR/NAME.out`, `DIR/NAME.err`),
/// killed on drop.
pub struct Proc {
    pub name: String,
    child: Supervised,
    err: PathBuf,
}

impl Proc {
    pub fn spawn(dir: &Path, name: &str, args: &[&str]) -> Proc {
        Self::spawn_program(dir, name, Path::new(BIN), args)
    }

    pub fn spawn_program(dir: &Path, name: &str, program: &Path, args: &[&str]) -> Proc {
        let err = dir.join(format!("{name}.err"));
        let out = dir.join(format!("{name}.out"));
        let mut cmd = Command::new(program);
        cmd.args(args)
            .current_dir(dir)
            .env("IOPATH_LOG", "info")
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&err).unwrap());
        let child = Supervised::spawn(name, &mut cmd).unwrap();
        Proc {
            name: name.to_owned(),
            child,
            err,
        }
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.err).unwrap_or_default()
    }

    /// Waits (at most 10 s) for its stderr to hold `line`; returns it all.
    pub fn wait_for_line(&self, line: &str) -> String {
        iopath_testkit::wait_for_line(&self.name, || self.stderr(), line, Duration::from_secs(10))
    }

    pub fn stdout(&self) -> String {
        std::fs::read_to_string(self.err.with_extension("out")).unwrap_or_default()
    }

    /// Waits for the process to exit on its own.
    pub fn wait(&mut self, timeout: Duration) -> ExitStatus {
        match self.child.wait_until(Instant::now() + timeout) {
            Ok(st) => st,
            Err(e) => panic!("{e}; stderr:\n{}", self.stderr()),
        }
    }

    /// Sends `sig` to the process (e.g. SIGSTOP / SIGCONT to freeze it).
    #[allow(dead_code)] // not every test binary freezes a process
    pub fn signal(&self, sig: rustix::process::Signal) {
        self.child.signal(sig).unwrap();
    }

    /// The process id.
    #[allow(dead_code)] // not every test binary looks into /proc
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills the process and reaps it.
    pub fn kill(&mut self) {
        self.child.kill();
    }
}

pub fn wait_path(p: &Path) {
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

pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `iopath rpmsg remote --shm SHM --create 0x80000 --notify NOTIFY EXTRA..`
/// as process "remote" in `dir`.
pub fn spawn_remote(dir: &Path, shm: &str, notify: &str, extra: &[&str]) -> Proc {
    let mut args = vec![
        "rpmsg", "remote", "--shm", shm, "--create", "0x80000", "--notify", notify,
    ];
    args.extend_from_slice(extra);
    Proc::spawn(dir, "remote", &args)
}

/// `iopath rpmsg host --shm SHM --notify NOTIFY EXTRA..` as process "host"
/// in `dir`.
pub fn spawn_host(dir: &Path, shm: &str, notify: &str, extra: &[&str]) -> Proc {
    let mut args = vec!["rpmsg", "host", "--shm", shm, "--notify", notify];
    args.extend_from_slice(extra);
    Proc::spawn(dir, "host", &args)
}

pub struct Pair {
    pub dir: tempfile::TempDir,
    pub remote: Proc,
    pub host: Proc,
    pub ctrl: PathBuf,
}

impl Pair {
    /// The host's directory of endpoint sockets.
    pub fn rundir(&self) -> PathBuf {
        self.dir.path().join("ctrl.d")
    }
}

/// A remote (echo service "echo") and a host with a control socket, on a
/// fresh temporary directory; "DIR" in `notify` stands for that directory.
pub fn pair(notify: &str, remote_extra: &[&str], host_extra: &[&str]) -> Pair {
    let dir = tempfile::tempdir().unwrap();
    let shm = dir.path().join("shm");
    let notify = notify.replace("DIR", s(dir.path()));
    let mut ra = vec!["--echo", "echo"];
    ra.extend_from_slice(remote_extra);
    let remote = spawn_remote(dir.path(), s(&shm), &notify, &ra);
    let ctrl = dir.path().join("ctrl");
    let mut ha = vec!["--ctrl", s(&ctrl)];
    ha.extend_from_slice(host_extra);
    let host = spawn_host(dir.path(), s(&shm), &notify, &ha);
    wait_path(&ctrl);
    Pair {
        dir,
        remote,
        host,
        ctrl,
    }
}

/// An endpoint bound to the remote's "echo" (retrying until announced).
pub fn echo_ept(ctrl: &Path) -> EptFd {
    let start = Instant::now();
    loop {
        if let Ok(c) = CtrlClient::connect(ctrl) {
            if let Ok(ep) = c.create_ept_fd(&EptInfo::new("echo"), O_RDWR | O_CLOEXEC) {
                if ep.info().dst != ADDR_ANY {
                    return ep;
                }
            }
        }
        if start.elapsed() > Duration::from_secs(20) {
            // The processes' logs sit beside the control socket.
            let dir = ctrl.parent().unwrap();
            let log = |n: &str| std::fs::read_to_string(dir.join(n)).unwrap_or_default();
            panic!(
                "echo never announced through {}\nhost:\n{}\nremote:\n{}",
                ctrl.display(),
                log("host.err"),
                log("remote.err")
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends a pattern through `ep`; the echo must come back byte for byte.
pub fn round_trip(ep: &EptFd, seed: u8) {
    let msg: Vec<u8> = (0..300u32)
        .map(|i| (i as u8).wrapping_mul(13) ^ seed)
        .collect();
    ep.send(&msg).unwrap();
    let mut back = [0u8; 600];
    let n = ep.recv_timeout(&mut back, Duration::from_secs(10)).unwrap();
    assert_eq!(n, Some(msg.len()));
    assert_eq!(&back[..msg.len()], &msg[..]);
}
