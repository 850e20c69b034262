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

use rustix::thread::CpuSet;

use crate::error::{check, check_failed};
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
        match s {
            "one" => Ok(Placement::One),
            "split" => Ok(Placement::Split),
            "free" => Ok(Placement::Free),
            _ => Err(format!("{s:?} is none of one, split, free")),
        }
    }
}

/// The CPUs this process may run on.
#[derive(Debug, Clone)]
pub(crate) struct Cpus {
    allowed: CpuSet,
    ids: Vec<usize>,
}

thread_local! {
    /// What "not pinned" means for a child spawned from a pinned thread.
    static ALL_CPUS: std::cell::Cell<Option<CpuSet>> = const { std::cell::Cell::new(None) };
}

impl Cpus {
    /// Reads this thread's affinity (call before pinning anything).
    pub(crate) fn get() -> Result<Cpus> {
        let allowed = rustix::thread::sched_getaffinity(None)
            .map_err(Error::sys("reading the CPU affinity"))?;
        let ids: Vec<usize> = (0..CpuSet::MAX_CPU)
            .filter(|&i| allowed.is_set(i))
            .collect();
        check!(!ids.is_empty(), "no CPU in this process's affinity mask");
        ALL_CPUS.with(|c| c.set(Some(allowed)));
        Ok(Cpus { allowed, ids })
    }

    /// Two distinct CPUs if there are two (else the one twice).
    pub(crate) fn pair(&self) -> (usize, usize) {
        (self.ids[0], *self.ids.get(1).unwrap_or(&self.ids[0]))
    }
}

/// Pins the calling thread to `cpu`, or to all of `all` with `None`.
fn pin(cpu: Option<usize>, all: &CpuSet) -> Result<()> {
    let mut set = *all;
    if let Some(c) = cpu {
        set = CpuSet::new();
        set.set(c);
    }
    rustix::thread::sched_setaffinity(None, &set).map_err(Error::sys("setting the CPU affinity"))
}

/// Spawns `cmd` pinned to `cpu` (`None`: on every CPU this process may
/// use), recorded for [`crate::cleanup`]. A child inherits the affinity of
/// the thread that forks it, so the calling thread is pinned around the
/// spawn and restored after.
pub(crate) fn spawn_on(cpu: Option<usize>, cmd: &mut Command) -> Result<Child> {
    let mine =
        rustix::thread::sched_getaffinity(None).map_err(Error::sys("reading the CPU affinity"))?;
    pin(cpu, &ALL_CPUS.with(std::cell::Cell::get).unwrap_or(mine))?;
    let child = crate::cleanup::spawn(cmd, false);
    rustix::thread::sched_setaffinity(None, &mine)
        .map_err(Error::sys("restoring the CPU affinity"))?;
    child.map_err(Error::spawn(cmd.get_program().to_string_lossy()))
}

/// Runs `f` with the calling thread (and the threads it starts) pinned to
/// `cpu`, then unpins it.
pub(crate) fn on_cpu<T>(
    cpu: Option<usize>,
    cpus: &Cpus,
    f: impl FnOnce() -> Result<T>,
) -> Result<T> {
    pin(cpu, &cpus.allowed)?;
    let r = f();
    pin(None, &cpus.allowed)?;
    r
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
            let pid = rustix::process::Pid::from_child(&self.child);
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
            let deadline = Instant::now() + Duration::from_secs(3);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
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
        let child = spawn_on(cpu, cmd.stdin(Stdio::null()))?;
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

    /// Its exit status, if it has exited.
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
