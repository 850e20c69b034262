//! A child process this process owns: its output in a log, waited for
//! with a deadline while it lives, stopped and reaped when dropped.
//!
//! The bench's servers, the peers the tests start (`iopath blk serve`,
//! qemu-storage-daemon) and the raw ping-pong's partner are all one
//! [`Supervised`]: a child that outlives its owner, or that the owner
//! waits for after it died, is the bug this type exists to prevent.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{kill_process, Pid, Signal};

/// Why a [`Supervised`] child could not start or did not do what its
/// owner waited for. The messages of what it did not do end with its
/// last words.
#[derive(Debug, thiserror::Error)]
pub enum ChildError {
    /// The program could not be started (or its log not created).
    #[error("Cannot start {program}")]
    Spawn {
        /// The program.
        program: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Its log file could not be created.
    #[error("Cannot create the log {}", path.display())]
    Log {
        /// The log file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// It exited before what its owner waited for.
    #[error("{name} exited ({status}) before {what} ({words})")]
    Exited {
        /// The child's name.
        name: String,
        /// How it ended.
        status: ExitStatus,
        /// What the owner waited for.
        what: String,
        /// Its last words ([`Supervised::last_words`]).
        words: String,
    },
    /// What its owner waited for did not come in time.
    #[error("no {what} in {secs} s ({words})")]
    NotReady {
        /// What the owner waited for.
        what: String,
        /// How long it waited.
        secs: u64,
        /// Its last words.
        words: String,
    },
    /// It did not exit by the deadline.
    #[error("{name} did not finish in time ({words})")]
    Unfinished {
        /// The child's name.
        name: String,
        /// Its last words.
        words: String,
    },
    /// Its status could not be read.
    #[error("waiting for a child failed")]
    Wait(#[source] io::Error),
}

/// A child process, its standard input closed and, if it has one, its
/// output in a log file; when dropped, killed (or with
/// [`Supervised::term_first`] sent SIGTERM and given 3 s to exit) and
/// reaped. Declare it before any scratch directory it uses, so that it
/// is gone first.
#[derive(Debug)]
pub struct Supervised {
    child: Child,
    name: String,
    log: Option<PathBuf>,
    term: bool,
}

impl Drop for Supervised {
    fn drop(&mut self) {
        if self.term {
            let _ = self.signal(Signal::TERM);
            let deadline = Instant::now() + Duration::from_secs(3);
            if self.wait_until(deadline).is_ok() {
                return;
            }
        }
        self.kill();
    }
}

impl Supervised {
    /// Spawns `cmd`, called `name` in messages, with `spawn` (which may
    /// place or record it; [`Command::spawn`] otherwise), its output into
    /// `log` when there is one.
    ///
    /// # Errors
    /// [`ChildError::Log`] when the log cannot be created,
    /// [`ChildError::Spawn`] when the program cannot be started.
    pub fn spawn_with(
        name: impl Into<String>,
        log: Option<PathBuf>,
        cmd: &mut Command,
        spawn: impl FnOnce(&mut Command) -> io::Result<Child>,
    ) -> Result<Supervised, ChildError> {
        if let Some(log) = &log {
            let f = File::create(log).and_then(|f| Ok((f.try_clone()?, f)));
            let (out, err) = f.map_err(|source| ChildError::Log {
                path: log.clone(),
                source,
            })?;
            cmd.stdout(out).stderr(err);
        }
        let program = cmd.get_program().to_string_lossy().into_owned();
        let failed = |source| ChildError::Spawn { program, source };
        let child = spawn(cmd.stdin(Stdio::null())).map_err(failed)?;
        Ok(Supervised {
            child,
            name: name.into(),
            log,
            term: false,
        })
    }

    /// [`Supervised::spawn_with`] with [`Command::spawn`], its output where
    /// `cmd` sends it.
    ///
    /// # Errors
    /// As [`Supervised::spawn_with`].
    pub fn spawn(name: impl Into<String>, cmd: &mut Command) -> Result<Supervised, ChildError> {
        Supervised::spawn_with(name, None, cmd, Command::spawn)
    }

    /// [`Supervised::spawn_with`] with [`Command::spawn`], its output into
    /// `log`.
    ///
    /// # Errors
    /// As [`Supervised::spawn_with`].
    pub fn logged(
        name: impl Into<String>,
        log: impl Into<PathBuf>,
        cmd: &mut Command,
    ) -> Result<Supervised, ChildError> {
        Supervised::spawn_with(name, Some(log.into()), cmd, Command::spawn)
    }

    /// Stops it with SIGTERM first when dropped.
    pub fn term_first(mut self) -> Supervised {
        self.term = true;
        self
    }

    /// Its name in messages.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Sends it `sig`.
    ///
    /// # Errors
    /// When the signal cannot be sent.
    pub fn signal(&self, sig: Signal) -> io::Result<()> {
        Ok(kill_process(Pid::from_child(&self.child), sig)?)
    }

    /// Kills it and reaps it (nothing when it is gone already).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Its log file, if it has one.
    pub fn log(&self) -> Option<&Path> {
        self.log.as_deref()
    }

    /// What it wrote to its log so far (nothing without a log).
    pub fn output(&self) -> String {
        let read = |log| std::fs::read_to_string(log).ok();
        self.log().and_then(read).unwrap_or_default()
    }

    /// How it ended, if it has.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Its name and last lines of output, for an error message.
    pub fn last_words(&self) -> String {
        let s = self.output();
        let lines: Vec<&str> = s.lines().collect();
        let tail = lines[lines.len().saturating_sub(4)..].join(" | ");
        format!("{}: {}", self.name, tail.trim())
    }

    /// Waits for it to exit, at most until `deadline`.
    ///
    /// # Errors
    /// [`ChildError::Unfinished`] past the deadline, [`ChildError::Wait`]
    /// when its status cannot be read.
    pub fn wait_until(&mut self, deadline: Instant) -> Result<ExitStatus, ChildError> {
        loop {
            if let Some(st) = self.child.try_wait().map_err(ChildError::Wait)? {
                return Ok(st);
            }
            if Instant::now() > deadline {
                let (name, words) = (self.name.clone(), self.last_words());
                return Err(ChildError::Unfinished { name, words });
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits until `ready` says yes while it lives, at most `limit`; `what`
    /// names what it waits for.
    ///
    /// # Errors
    /// [`ChildError::Exited`] when it exits first, [`ChildError::NotReady`]
    /// after `limit`.
    pub fn wait_for(
        &mut self,
        what: &str,
        limit: Duration,
        mut ready: impl FnMut() -> bool,
    ) -> Result<(), ChildError> {
        let start = Instant::now();
        while !ready() {
            // Its last words are read once it has exited: they then hold
            // what it said on its way out.
            if let Some(status) = self.exited() {
                return Err(ChildError::Exited {
                    name: self.name.clone(),
                    status,
                    what: what.into(),
                    words: self.last_words(),
                });
            }
            if start.elapsed() >= limit {
                return Err(ChildError::NotReady {
                    what: what.into(),
                    secs: limit.as_secs(),
                    words: self.last_words(),
                });
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(())
    }
}

/// CPU time (user and system) of process `pid` so far, its threads that
/// have exited included: `/proc/PID/stat`'s utime and stime (per-thread
/// counters would miss the threads that ended). `None` when it cannot be
/// read.
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // utime and stime: the 12th and 13th fields after the command (which
    // may hold spaces) and its `)`.
    let after = stat.rsplit_once(')')?.1;
    let mut fields = after.split_whitespace().skip(11);
    let mut next = || fields.next()?.parse::<u64>().ok();
    let ticks = next()? + next()?;
    let hz = rustix::param::clock_ticks_per_second().max(1);
    Some(Duration::from_nanos(ticks * 1_000_000_000 / hz))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Command {
        let mut c = Command::new("sh");
        c.args(["-c", script]);
        c
    }

    #[test]
    fn waits_for_readiness_and_says_why_it_did_not_come() {
        let dir = tempfile::tempdir().unwrap();
        let flag = dir.path().join("flag");
        let script = format!("echo starting; touch {}; sleep 60", flag.display());
        let mut up = Supervised::logged("up", dir.path().join("up.log"), &mut sh(&script)).unwrap();
        up.wait_for("its flag", Duration::from_secs(10), || flag.exists())
            .unwrap();
        assert_eq!(up.output(), "starting\n");
        assert_eq!(up.exited(), None);

        let log = dir.path().join("gone.log");
        let mut gone =
            Supervised::logged("gone", log, &mut sh("echo bad disk >&2; exit 3")).unwrap();
        let e = gone.wait_for("its socket", Duration::from_secs(10), || false);
        let e = e.unwrap_err().to_string();
        assert_eq!(
            e,
            "gone exited (exit status: 3) before its socket (gone: bad disk)"
        );

        let mut slow = Supervised::spawn("slow", &mut sh("sleep 60")).unwrap();
        let e = slow
            .wait_for("a socket", Duration::ZERO, || false)
            .unwrap_err();
        assert_eq!(e.to_string(), "no a socket in 0 s (slow: )");
        let e = slow.wait_until(Instant::now()).unwrap_err();
        assert!(matches!(e, ChildError::Unfinished { .. }), "{e:?}");

        let e = Supervised::logged(
            "x",
            dir.path().join("x.log"),
            &mut Command::new("/nonexistent"),
        );
        assert!(
            matches!(e, Err(ChildError::Spawn { ref program, .. }) if program == "/nonexistent")
        );
        let nowhere = dir.path().join("no-such-dir/x.log");
        let e = Supervised::logged("x", &nowhere, &mut sh("true")).unwrap_err();
        let want = format!("Cannot create the log {}", nowhere.display());
        assert_eq!(e.to_string(), want);
    }

    #[test]
    fn cpu_time_counts_a_spinning_child() {
        let mut spin = Supervised::spawn("spin", &mut sh("while :; do :; done")).unwrap();
        let start = Instant::now();
        let busy = || cpu_time(spin.id()).unwrap() >= Duration::from_millis(100);
        while !busy() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "no CPU time counted"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        spin.kill();
        assert_eq!(cpu_time(u32::MAX), None);
    }

    #[test]
    fn dropping_stops_and_reaps_it() {
        // Killed at once, or asked first and given time to exit.
        let killed = Supervised::spawn("k", &mut sh("sleep 60")).unwrap();
        let asked = Supervised::spawn("t", &mut sh("sleep 60")).unwrap();
        let asked = asked.term_first();
        let pids = [killed.id(), asked.id()];
        drop((killed, asked));
        for pid in pids {
            // Reaped: no such process (not even a zombie) any more.
            let pid = Pid::from_raw(pid as i32).unwrap();
            assert_eq!(
                rustix::process::test_kill_process(pid),
                Err(rustix::io::Errno::SRCH)
            );
        }
        // One that ignores SIGTERM is killed after its 3 s of grace.
        let dir = tempfile::tempdir().unwrap();
        let flag = dir.path().join("trapped");
        let script = format!(
            "trap '' TERM; touch {}; while :; do sleep 1; done",
            flag.display()
        );
        let mut s = Supervised::spawn("s", &mut sh(&script)).unwrap();
        s.wait_for("its trap", Duration::from_secs(10), || flag.exists())
            .unwrap();
        let (pid, start) = (s.id(), Instant::now());
        drop(s.term_first());
        assert!(start.elapsed() >= Duration::from_secs(3));
        let pid = Pid::from_raw(pid as i32).unwrap();
        assert_eq!(
            rustix::process::test_kill_process(pid),
            Err(rustix::io::Errno::SRCH)
        );
    }
}
