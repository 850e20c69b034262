//! What an interrupted bench leaves behind, and removing it.
//!
//! Scratch files and child processes are removed and stopped by their
//! owners on drop, but a signal ends the process without unwinding. So
//! each is also recorded here, and [`on_signals`] starts a thread that, on
//! SIGINT or SIGTERM, stops the children, removes the paths and exits with
//! 128 + the signal's number. Children are held as pidfds, so one that
//! was reaped (its pid free for reuse) is never signalled by mistake.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rustix::process::{pidfd_open, pidfd_send_signal, Pid, PidfdFlags, Signal};

#[derive(Default)]
struct Tracked {
    /// Pidfds of children.
    children: Vec<OwnedFd>,
    paths: Vec<PathBuf>,
    /// The signal thread cleaned up: the process is about to exit, so
    /// nothing new may start and a new path goes at once.
    cleaned: bool,
}

static TRACKED: Mutex<Tracked> = Mutex::new(Tracked {
    children: Vec::new(),
    paths: Vec::new(),
    cleaned: false,
});

fn tracked() -> std::sync::MutexGuard<'static, Tracked> {
    iopath_sys::lock(&TRACKED)
}

/// Whether the process behind `pidfd` has exited (its pidfd is readable).
fn exited(pidfd: &OwnedFd) -> bool {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let mut fds = [PollFd::new(pidfd, PollFlags::IN)];
    matches!(poll(&mut fds, Some(&Timespec::default())), Ok(n) if n > 0)
}

impl Tracked {
    fn spawn(&mut self, cmd: &mut Command) -> std::io::Result<Child> {
        if self.cleaned {
            return Err(std::io::Error::new(
                std::io::ErrorKind::Interrupted,
                "interrupted: the bench is stopping",
            ));
        }
        let child = cmd.spawn()?;
        self.child(child.id());
        Ok(child)
    }

    fn path(&mut self, p: &Path) {
        self.paths.push(p.to_path_buf());
        if self.cleaned {
            self.clean_up(Duration::ZERO);
        }
    }

    fn child(&mut self, pid: u32) {
        let pidfd = Pid::from_raw(pid as i32).and_then(|p| pidfd_open(p, PidfdFlags::empty()).ok());
        // Forget the children that are gone, so a long bench holds few fds.
        self.children.retain(|fd| !exited(fd));
        self.children.extend(pidfd);
    }

    /// Stops the children (SIGTERM, then SIGKILL after `grace`) and
    /// removes the paths. Returns (children stopped, paths removed).
    fn clean_up(&mut self, grace: Duration) -> (usize, usize) {
        let live: Vec<_> = self.children.drain(..).filter(|fd| !exited(fd)).collect();
        let signal = |s: Signal| {
            for fd in &live {
                let _ = pidfd_send_signal(fd, s);
            }
        };
        signal(Signal::TERM);
        let deadline = Instant::now() + grace;
        while live.iter().any(|fd| !exited(fd)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if live.iter().any(|fd| !exited(fd)) {
            signal(Signal::KILL);
        }
        let mut removed = 0;
        for p in self.paths.drain(..) {
            let gone = if p.is_dir() {
                std::fs::remove_dir_all(&p)
            } else {
                std::fs::remove_file(&p)
            };
            removed += usize::from(gone.is_ok());
        }
        (live.len(), removed)
    }
}

/// Spawns `cmd` and records the child to stop on a signal. The record is
/// held across the spawn, so a signal's cleanup sees the child or runs
/// before it: once cleaned up, nothing more starts (the spawn fails with
/// [`std::io::ErrorKind::Interrupted`]).
pub(crate) fn spawn(cmd: &mut Command) -> std::io::Result<Child> {
    tracked().spawn(cmd)
}

/// Records a scratch file or directory (a unique temporary name) to remove
/// on a signal; once a signal's cleanup ran, `p` goes at once.
pub(crate) fn path(p: &Path) {
    tracked().path(p);
}

/// A scratch directory `prefix…` in `parent`, removed when dropped and,
/// recorded here, by a signal's cleanup.
pub(crate) fn temp_dir(prefix: &str, parent: &Path) -> crate::Result<tempfile::TempDir> {
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(parent)
        .map_err(crate::Error::io(parent))?;
    path(dir.path());
    Ok(dir)
}

/// Set by the signal thread before it stops anything.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Call before failing: when a signal arrived, the error is likely the
/// cleanup's doing and the signal thread is about to exit with 128 + the
/// signal; so wait for it (at most 30 s) rather than exit 1 first.
pub(crate) fn wait_if_interrupted() {
    let start = Instant::now();
    while INTERRUPTED.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Starts the thread that cleans up and exits on SIGINT or SIGTERM
/// (status 130 or 143, as a shell reports a process the signal ended).
pub(crate) fn on_signals() -> crate::Result<()> {
    iopath_sys::signals::on_stop("bench-signals", |sig| {
        INTERRUPTED.store(true, Ordering::SeqCst);
        let (children, paths) = {
            let mut t = tracked();
            t.cleaned = true;
            t.clean_up(Duration::from_secs(3))
        };
        eprintln!(
            "\ninterrupted by {}: stopped {children} child process{}, \
             removed {paths} scratch path{}",
            iopath_sys::signals::signal_name(sig),
            if children == 1 { "" } else { "es" },
            if paths == 1 { "" } else { "s" }
        );
        128 + sig
    })
    .map_err(crate::Error::sys(
        "installing the SIGINT and SIGTERM handlers",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn clean_up_stops_children_and_removes_paths() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("scratch");
        std::fs::write(&file, b"x").unwrap();
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        std::fs::write(sub.join("f"), b"y").unwrap();
        let mut t = Tracked::default();
        t.paths.push(file.clone());
        t.paths.push(sub.clone());
        // One child ends on SIGTERM; one ignores it and needs SIGKILL;
        // one has exited and been reaped already, and is left alone.
        let mut polite = Command::new("sleep").arg("60").spawn().unwrap();
        let mut stubborn = Command::new("sh")
            .args(["-c", "trap '' TERM; while :; do sleep 1; done"])
            .spawn()
            .unwrap();
        let mut done = Command::new("true").spawn().unwrap();
        t.child(polite.id());
        t.child(stubborn.id());
        t.child(done.id());
        assert!(done.wait().unwrap().success());
        // Let the shell install its trap before it is signalled.
        std::thread::sleep(Duration::from_millis(200));
        let start = Instant::now();
        let (children, paths) = t.clean_up(Duration::from_millis(300));
        assert_eq!((children, paths), (2, 2));
        assert!(start.elapsed() < Duration::from_secs(3));
        assert!(!file.exists() && !sub.exists());
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(polite.wait().unwrap().signal(), Some(15));
        assert_eq!(stubborn.wait().unwrap().signal(), Some(9));
        assert!(t.children.is_empty() && t.paths.is_empty());
    }

    #[test]
    fn after_the_cleanup_nothing_starts_and_a_new_path_goes_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = Tracked::default();
        let mut before = t.spawn(Command::new("sleep").arg("60")).unwrap();
        t.cleaned = true;
        assert_eq!(t.clean_up(Duration::from_millis(300)), (1, 0));
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(before.wait().unwrap().signal(), Some(15));
        // A spawn that lost the race to the signal does not happen.
        let e = t.spawn(Command::new("sleep").arg("60")).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::Interrupted);
        assert!(t.children.is_empty());
        // A path recorded after the cleanup is removed as it is recorded.
        let late = dir.path().join("late");
        std::fs::write(&late, b"x").unwrap();
        t.path(&late);
        assert!(!late.exists() && t.paths.is_empty());
    }
}
