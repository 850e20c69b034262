//! Where a benchmark's processes run, and the child processes it starts.
//!
//! On a small VM a wake-up that crosses to an idle vCPU costs tens of
//! microseconds, one on the same CPU a few; unpinned, two rows of a table
//! compare placements, not code. A [`Placement`] pins every process of a
//! measurement, the limit's included, the same way: the client (the bench
//! itself, the driver) on one CPU, the servers on the same or another one.

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};

pub(crate) use iopath_sys::cpus::Cpus;

use crate::{Error, Result};

/// Where the processes of one measurement run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Every process on one CPU: no wake-up crosses CPUs.
    One,
    /// The client on one CPU, the servers (and the limit's) on another.
    Split,
    /// No pinning: where the scheduler puts them.
    Free,
}

impl Placement {
    /// The names on the command line.
    pub const NAMES: [&'static str; 3] = ["one", "split", "free"];

    /// The name on the command line.
    pub fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }

    /// In words, with the client and the servers named.
    pub(crate) fn describe(self, cpus: &Cpus, client: &str, servers: &str) -> String {
        let (a, b) = cpus.pair();
        match self {
            Placement::Free => "no pinning (the scheduler's choice)".into(),
            Placement::One => format!("every process on CPU {a}"),
            Placement::Split => format!("{client} on CPU {a}, {servers} on CPU {b}"),
        }
    }

    /// CPUs of (client, servers); `None`: not pinned.
    pub(crate) fn cpus(self, cpus: &Cpus) -> (Option<usize>, Option<usize>) {
        let (a, b) = cpus.pair();
        match self {
            Placement::Free => (None, None),
            Placement::One => (Some(a), Some(a)),
            Placement::Split => (Some(a), Some(b)),
        }
    }
}

impl std::str::FromStr for Placement {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Placement, String> {
        let all = [Placement::One, Placement::Split, Placement::Free];
        let named = all.into_iter().find(|p| p.name() == s);
        named.ok_or_else(|| format!("{s:?} is none of one, split, free"))
    }
}

/// Spawns `cmd` on `cpu` (`None`: on every CPU this process may use),
/// recorded for [`crate::cleanup`].
pub(crate) fn spawn_on(cpu: Option<usize>, cmd: &mut Command) -> std::io::Result<Child> {
    iopath_sys::cpus::spawn_on(cpu, || crate::cleanup::spawn(cmd))?
}

/// Runs `cmd`, the peer `program` (fio, blkio-dd), on `cpu` to its end:
/// its status and output, stdout and stderr piped.
pub(crate) fn output(program: &str, cmd: &mut Command, cpu: Option<usize>) -> Result<Output> {
    cmd.stdin(Stdio::null()).stdout(Stdio::piped());
    let child = spawn_on(cpu, cmd.stderr(Stdio::piped()));
    let out = child.and_then(Child::wait_with_output);
    out.map_err(Error::spawn(program))
}

/// Runs `f` with the calling thread (and the threads it starts) pinned to
/// `cpu`, then unpins it.
pub(crate) fn on_cpu<T>(
    cpu: Option<usize>,
    cpus: &Cpus,
    f: impl FnOnce() -> Result<T>,
) -> Result<T> {
    cpus.on(cpu, f)
        .map_err(Error::sys("setting the CPU affinity"))?
}

/// A server the bench runs beside a measurement.
pub(crate) use iopath_sys::process::Supervised as Spawned;

/// Spawns `cmd` (called `name` in messages) on `cpu`, recorded for
/// [`crate::cleanup`], its output into `log` when there is one.
pub(crate) fn spawn(
    name: &str,
    log: Option<PathBuf>,
    cpu: Option<usize>,
    cmd: &mut Command,
) -> Result<Spawned> {
    Ok(Spawned::spawn_with(name, log, cmd, |c| spawn_on(cpu, c))?)
}
