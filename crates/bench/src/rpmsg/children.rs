//! The rpmsg processes the experiments start: `iopath rpmsg remote` (the
//! virtio device, echoing) and `iopath rpmsg host` (the virtio driver and
//! the endpoint service the bench is a client of).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use iopath_rpmsg::ctrl::{CtrlClient, EptFd};
use iopath_rpmsg::rsc_table::ShmLayout;
use iopath_rpmsg::tools::ping::bound_ept_fd;
use iopath_rpmsg::BufSizes;

use crate::error::{check, check_failed};
use crate::place::Spawned;
use crate::{Error, Result};

/// Size of the shared-memory file a remote creates.
pub(super) const SHM_SIZE: u64 = 0x80000;

/// `iopath rpmsg remote` of the executable `exe` creating the shared
/// memory `shm` and notifying through `notify`; the caller adds its
/// services (`--echo NAME`, `--sink NAME`) and options.
pub(super) fn remote(exe: &Path, shm: &Path, notify: &str, size: u64) -> Command {
    let mut cmd = Command::new(exe);
    cmd.args(["rpmsg", "remote", "--shm"]).arg(shm);
    cmd.args(["--create", &format!("{size:#x}"), "--notify", notify]);
    cmd
}

/// `iopath rpmsg host` of the executable `exe` on the shared memory `shm`,
/// notifying through `notify`, serving endpoints on the control socket
/// `ctrl`. The bench is the service's only client and `--scale` holds tens
/// of thousands of endpoints on one connection: the per-client and per-user
/// bounds are lifted (the service's fd reserve still holds).
pub(super) fn host(exe: &Path, shm: &Path, notify: &str, ctrl: &Path) -> Command {
    let mut cmd = Command::new(exe);
    cmd.args(["rpmsg", "host", "--shm"]).arg(shm);
    cmd.args(["--notify", notify, "--ctrl"]).arg(ctrl);
    cmd.args(["--max-endpoints-per-client", "4294967295"]);
    cmd.args(["--max-endpoints-per-uid", "4294967295"]);
    cmd
}

/// How to start a remote and a host.
#[derive(Debug, Clone)]
pub(super) struct Setup {
    /// Where the scratch directory (shared memory, control socket, logs)
    /// goes, and its name's prefix.
    pub(super) parent: PathBuf,
    pub(super) prefix: &'static str,
    /// Polling instead of an eventfd pair.
    pub(super) poll: bool,
    /// The remote's services and options after the common ones.
    pub(super) remote_args: Vec<String>,
    /// Size of the shared memory the remote creates.
    pub(super) shm_size: u64,
    /// The remote's and the host's CPUs (`None`: anywhere).
    pub(super) remote_cpu: Option<usize>,
    pub(super) host_cpu: Option<usize>,
}

impl Setup {
    /// What the create+destroy and echo rows use: a remote echoing on
    /// `echo`, on an eventfd pair, in [`super::shm_dir`].
    pub(super) fn echo(remote_cpu: Option<usize>, host_cpu: Option<usize>) -> Setup {
        Setup {
            parent: super::shm_dir(),
            prefix: "iopath-bench-rpmsg-",
            poll: false,
            remote_args: vec!["--echo".into(), "echo".into()],
            shm_size: SHM_SIZE,
            remote_cpu,
            host_cpu,
        }
    }

    /// What the bulk and scale rows use: a remote offering EVENT_IDX,
    /// rings of `ring` buffers of 64 KiB and a sink on `sink` (`more`: its
    /// other services), in the temporary directory, all on `cpu`.
    pub(super) fn sink(prefix: &'static str, ring: u32, more: &[&str], cpu: Option<usize>) -> Self {
        let args = format!("--event-idx --sink sink --buf-size 64K --ring {ring}");
        let remote_args = args.split(' ').chain(more.iter().copied());
        let shm_size = ShmLayout::size_for(ring, BufSizes::both(64 * 1024));
        Setup {
            parent: std::env::temp_dir(),
            prefix,
            remote_args: remote_args.map(String::from).collect(),
            shm_size: shm_size.expect("rings of 64 and 256 have a layout"),
            ..Setup::echo(cpu, cpu)
        }
    }
}

/// A remote and a host on a temporary shared-memory file, the host's
/// endpoint service ready; both killed when dropped, before the scratch
/// directory goes.
#[derive(Debug)]
pub(super) struct Servers {
    _remote: Spawned,
    pub(super) host: Spawned,
    ctrl: PathBuf,
    _dir: tempfile::TempDir,
}

impl Servers {
    /// Starts the remote, then the host, and waits (30 s at most) for the
    /// host's control socket.
    pub(super) fn start(exe: &Path, s: &Setup) -> Result<Servers> {
        let dir = crate::cleanup::temp_dir(s.prefix, &s.parent)?;
        let shm = dir.path().join("shm");
        let notify = if s.poll {
            "poll".to_owned()
        } else {
            format!("eventfd:{}", dir.path().join("ev").display())
        };
        let ctrl = dir.path().join("ctrl");
        let mut cmd = remote(exe, &shm, &notify, s.shm_size);
        let log = dir.path().join("remote.log");
        let mut remote =
            crate::place::spawn("remote", Some(log), s.remote_cpu, cmd.args(&s.remote_args))?;
        if s.poll {
            // With no notifier to connect through, the host must find the
            // table already written.
            remote.wait_for("shared memory", Duration::from_secs(20), || {
                std::fs::metadata(&shm).is_ok_and(|m| m.len() >= s.shm_size)
            })?;
        }
        let mut cmd = host(exe, &shm, &notify, &ctrl);
        let log = dir.path().join("host.log");
        let mut host = crate::place::spawn("host", Some(log), s.host_cpu, &mut cmd)?;
        host.wait_for("control socket", Duration::from_secs(30), || ctrl.exists())?;
        Ok(Servers {
            _remote: remote,
            host,
            ctrl,
            _dir: dir,
        })
    }

    pub(super) fn connect(&self) -> Result<CtrlClient> {
        CtrlClient::connect(&self.ctrl).map_err(Error::layer("connecting to the endpoint service"))
    }
}

/// One strict round trip through `ep`: sends `msg` (number `seq`), takes
/// its echo into `buf` (10 s at most) and checks it byte for byte; errors
/// start with `who` (`endpoint 3: `, or nothing).
pub(super) fn echo_once(ep: &EptFd, msg: &[u8], buf: &mut [u8], who: &str, seq: u64) -> Result<()> {
    ep.send(msg).map_err(Error::layer("sending an echo"))?;
    let got = ep.recv_timeout(buf, Duration::from_secs(10));
    let got = got.map_err(Error::layer("receiving an echo"))?;
    let n = got.ok_or_else(|| Error::Check(format!("{who}no echo {seq} in 10 s")))?;
    check!(
        n == msg.len() && buf[..n] == *msg,
        "{who}echo {seq} came back wrong"
    );
    Ok(())
}

/// An endpoint fd from `c` bound to the remote's `name`, once the remote
/// has announced it (30 s at most).
pub(super) fn bound(c: &CtrlClient, name: &str) -> Result<EptFd> {
    let ep = bound_ept_fd(c, name, Duration::from_secs(30));
    ep.map_err(Error::layer(format!("an endpoint fd for {name:?}")))
}
