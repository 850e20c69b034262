//! Where a benchmark's processes run, and the child processes it starts.
//!
//! On a small VM a wake-up that crosses to an idle vCPU costs tens of
//! microseconds, one on the same CPU a few; unpinned, two rows of a table
//! compare placements, not code. A [`Placement`] pins every process of a
//! measurement, the limit's included, the same way: the client (the bench
//! itself, the driver) on one CPU, the servers on the same or another one.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub(crate) use iopath_sys::cpus::Cpus;
use rustix::process::{kill_process, Pid, Signal};

use crate::error::check_failed;
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

/// A child process (a server the bench runs beside a measurement), its
/// output in a log file if it has one; stopped and reaped when dropped:
/// killed, or with [`Spawned::term_first`] sent SIGTERM and given 3 s to
/// exit (`iopath blk serve` then removes its socket). Declare it before
/// any scratch directory it uses, so that it is gone first.
#[derive(Debug)]
pub(crate) struct Spawned {
    child: Child,
    name: &'static str,
    log: PathBuf,
    term: bool,
}

impl Drop for Spawned {
    fn drop(&mut self) {
        if self.term {
            let _ = kill_process(Pid::from_child(&self.child), Signal::TERM);
            let deadline = Instant::now() + Duration::from_secs(3);
            if self.wait_until(deadline).is_ok() {
                return;
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Spawned {
    /// Spawns `cmd` (called `name` in messages) on `cpu`, its standard
    /// input closed.
    pub(crate) fn new(
        name: &'static str,
        cpu: Option<usize>,
        cmd: &mut Command,
    ) -> Result<Spawned> {
        let child = spawn_on(cpu, cmd.stdin(Stdio::null()));
        let child = child.map_err(Error::spawn(cmd.get_program().to_string_lossy()))?;
        let (log, term) = (PathBuf::new(), false);
        Ok(Spawned {
            child,
            name,
            log,
            term,
        })
    }

    /// The same with its output into `log`.
    pub(crate) fn logged(
        log: PathBuf,
        name: &'static str,
        cpu: Option<usize>,
        cmd: &mut Command,
    ) -> Result<Spawned> {
        let f = std::fs::File::create(&log).map_err(Error::io(&log))?;
        let f2 = f.try_clone().map_err(Error::io(&log))?;
        let mut s = Spawned::new(name, cpu, cmd.stdout(f).stderr(f2))?;
        s.log = log;
        Ok(s)
    }

    /// Stops it with SIGTERM first when dropped.
    pub(crate) fn term_first(mut self) -> Spawned {
        self.term = true;
        self
    }

    pub(crate) fn id(&self) -> u32 {
        self.child.id()
    }

    pub(crate) fn log(&self) -> &Path {
        &self.log
    }

    pub(crate) fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Its name and last lines of output, for an error message.
    pub(crate) fn last_words(&self) -> String {
        let s = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = s.lines().collect();
        let tail = lines[lines.len().saturating_sub(4)..].join(" | ");
        format!("{}: {}", self.name, tail.trim())
    }

    /// Waits for it to exit, at most until `deadline`.
    pub(crate) fn wait_until(&mut self, deadline: Instant) -> Result<ExitStatus> {
        loop {
            if let Some(st) = self
                .child
                .try_wait()
                .map_err(Error::sys("waiting for a child"))?
            {
                return Ok(st);
            }
            if Instant::now() > deadline {
                check_failed!(
                    "{} did not finish in time ({})",
                    self.name,
                    self.last_words()
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits until `ready` says yes while it lives, at most `limit`; `what`
    /// names what it waits for.
    pub(crate) fn wait_for(
        &mut self,
        what: &str,
        limit: Duration,
        mut ready: impl FnMut() -> bool,
    ) -> Result<()> {
        let start = Instant::now();
        while !ready() {
            if let Some(st) = self.exited() {
                check_failed!(
                    "{} exited ({st}) before {what} ({})",
                    self.name,
                    self.last_words()
                );
            }
            if start.elapsed() >= limit {
                check_failed!("no {what} in {} s ({})", limit.as_secs(), self.last_words());
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(())
    }
}
