//! Who holds a shared-memory file: one remote and one host at a time, and
//! a remote's `--create` only while no session has the file mapped.
//!
//! The rule lives in byte-range locks on the shared file itself, so no
//! choice of companion path (notify or control socket) gets around it:
//!
//! ```text
//!  byte 0   remote   OFD write lock, for the remote's life
//!  byte 1   host     OFD write lock, for the host's life (across remotes)
//!  byte 2   session  OFD read lock while a session has the file mapped;
//!                    --create holds it as a write lock while it truncates
//!  byte 8+n          classic (per-process) read lock mirroring byte n
//! ```
//!
//! Open file description locks (`F_OFD_SETLK`, [fcntl(2)]) enforce the
//! rule: two holders conflict even inside one process, and closing some
//! other fd of the file does not drop them. But `F_OFD_GETLK` reports
//! `l_pid = -1`, so each is mirrored by a classic `F_SETLK` read lock,
//! whose `F_GETLK` names the holder's pid. Classic locks go whenever the
//! process closes any fd of the file, so the mirror is refreshed after each
//! (re)open and a refusal names a pid only where the kernel still tells it.
//!
//! None of them is `flock(2)`: OpenAMP's libmetal takes a blocking
//! `flock(LOCK_EX)` on the file whenever it maps it, and on Linux `flock`
//! and `fcntl` locks do not see each other, so its demo never waits on us.
//!
//! [fcntl(2)]: https://man7.org/linux/man-pages/man2/fcntl.2.html

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::{ShmError, ShmHolder};

/// The role a process plays on a shared-memory file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShmRole {
    /// The device side (`iopath rpmsg remote`).
    Remote,
    /// The driver side (`iopath rpmsg host`).
    Host,
}

const REMOTE: i64 = 0;
const HOST: i64 = 1;
const SESSION: i64 = 2;
/// Offset of the classic mirror of each byte.
const MIRROR: i64 = 8;
/// How long `--create` waits for a session to let go: a host sees its
/// remote die within that and detaches, so a remote restarted at once is
/// not refused.
const CREATE_WAIT: Duration = Duration::from_secs(1);

impl ShmRole {
    fn byte(self) -> i64 {
        match self {
            ShmRole::Remote => REMOTE,
            ShmRole::Host => HOST,
        }
    }

    fn holder(self) -> ShmHolder {
        match self {
            ShmRole::Remote => ShmHolder::Remote,
            ShmRole::Host => ShmHolder::Host,
        }
    }
}

/// A role held on a shared-memory file, for as long as this lives.
#[derive(Debug)]
pub struct ShmOwner {
    file: File,
    path: PathBuf,
    role: ShmRole,
    attached: AtomicBool,
}

impl ShmOwner {
    /// Takes `role` on the file at `path` (which must exist).
    ///
    /// # Errors
    /// [`ShmError::InUse`] naming the holder (and its pid where the kernel
    /// tells it), [`ShmError::File`] if the file cannot be opened.
    pub fn claim(path: &Path, role: ShmRole) -> Result<Self, ShmError> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(file_err(path, "open"))?;
        Self::claim_file(f, path, role)
    }

    /// As [`ShmOwner::claim`], on an open file (read and write).
    pub(crate) fn claim_file(file: File, path: &Path, role: ShmRole) -> Result<Self, ShmError> {
        match ofd(&file, libc::F_WRLCK, role.byte()) {
            Ok(()) => {}
            Err(e) if busy(&e) => return Err(in_use(&file, path, role.holder(), role.byte())),
            Err(e) => return Err(file_err(path, "fcntl(F_OFD_SETLK)")(e)),
        }
        let owner = ShmOwner {
            file,
            path: path.to_owned(),
            role,
            attached: AtomicBool::new(false),
        };
        owner.refresh();
        Ok(owner)
    }

    /// Refuses at once, without taking anything, when another process
    /// holds `role` on `path`: lets a host say so before it touches the
    /// remote's notify socket. A missing file is no refusal.
    ///
    /// # Errors
    /// [`ShmError::InUse`].
    pub fn check(path: &Path, role: ShmRole) -> Result<(), ShmError> {
        let Ok(f) = File::open(path) else {
            return Ok(());
        };
        if ofd_held(&f, role.byte()) {
            return Err(in_use(&f, path, role.holder(), role.byte()));
        }
        Ok(())
    }

    /// The session starts: the file is mapped and `--create` must leave it
    /// alone until [`ShmOwner::detach`].
    ///
    /// # Errors
    /// [`ShmError::InUse`] while a remote is creating the file.
    pub fn attach(&self) -> Result<(), ShmError> {
        match ofd(&self.file, libc::F_RDLCK, SESSION) {
            Ok(()) => {}
            Err(e) if busy(&e) => {
                return Err(in_use(&self.file, &self.path, ShmHolder::Remote, REMOTE))
            }
            Err(e) => return Err(file_err(&self.path, "fcntl(F_OFD_SETLK)")(e)),
        }
        self.attached.store(true, Ordering::SeqCst);
        self.refresh();
        Ok(())
    }

    /// The session ended (the link went down): a remote may create the
    /// file afresh. The role is kept.
    pub fn detach(&self) {
        self.attached.store(false, Ordering::SeqCst);
        let _ = ofd(&self.file, libc::F_UNLCK, SESSION);
        let _ = classic(&self.file, libc::F_UNLCK, MIRROR + SESSION);
    }

    /// Takes the mirrors that name this process to whoever is refused
    /// again: the kernel dropped them if the process closed any fd of the
    /// file since (e.g. an old mapping's).
    pub fn refresh(&self) {
        let _ = classic(&self.file, libc::F_RDLCK, MIRROR + self.role.byte());
        if self.attached.load(Ordering::SeqCst) {
            let _ = classic(&self.file, libc::F_RDLCK, MIRROR + SESSION);
        }
    }

    /// For `--create`: the session byte as a write lock, waiting up to
    /// [`CREATE_WAIT`] for a host that is letting go; [`ShmOwner::attach`]
    /// turns it back into a read lock once the file is made.
    pub(crate) fn hold_for_create(&self) -> Result<(), ShmError> {
        let start = Instant::now();
        loop {
            match ofd(&self.file, libc::F_WRLCK, SESSION) {
                Ok(()) => return Ok(()),
                Err(e) if busy(&e) && start.elapsed() < CREATE_WAIT => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) if busy(&e) => {
                    let holder = if ofd_held(&self.file, HOST) {
                        (ShmHolder::Host, HOST)
                    } else {
                        (ShmHolder::Session, SESSION)
                    };
                    return Err(in_use(&self.file, &self.path, holder.0, holder.1));
                }
                Err(e) => return Err(file_err(&self.path, "fcntl(F_OFD_SETLK)")(e)),
            }
        }
    }
}

fn file_err<'a>(path: &'a Path, op: &'static str) -> impl FnOnce(std::io::Error) -> ShmError + 'a {
    move |source| ShmError::File {
        path: path.to_owned(),
        op,
        source,
    }
}

fn busy(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EACCES))
}

fn in_use(f: &File, path: &Path, holder: ShmHolder, byte: i64) -> ShmError {
    ShmError::InUse {
        path: path.to_owned(),
        holder,
        pid: classic_holder(f, MIRROR + byte),
    }
}

fn one_byte(ty: libc::c_int, start: i64) -> libc::flock {
    libc::flock {
        l_type: ty as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: start,
        l_len: 1,
        l_pid: 0, // required by the OFD commands
    }
}

/// `F_OFD_SETLK` of type `ty` on byte `start`, not waiting.
fn ofd(f: &File, ty: libc::c_int, start: i64) -> std::io::Result<()> {
    let lock = one_byte(ty, start);
    // SAFETY: `f` is open for the duration of the call; F_OFD_SETLK reads
    // one `struct flock` through the pointer, which points at `lock`.
    let r = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_OFD_SETLK, &lock) };
    if r == -1 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Whether an open file description other than `f`'s holds byte `start`.
fn ofd_held(f: &File, start: i64) -> bool {
    let mut lock = one_byte(libc::F_WRLCK, start);
    // SAFETY: `f` is open for the duration of the call; F_OFD_GETLK reads
    // and writes one `struct flock` through the pointer, which points at
    // `lock`, a live and initialised one.
    let r = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_OFD_GETLK, &mut lock) };
    r == 0 && lock.l_type != libc::F_UNLCK as libc::c_short
}

/// Classic `F_SETLK` of type `ty` on byte `start`, not waiting.
fn classic(f: &File, ty: libc::c_int, start: i64) -> std::io::Result<()> {
    let lock = one_byte(ty, start);
    // SAFETY: `f` is open for the duration of the call; F_SETLK reads one
    // `struct flock` through the pointer, which points at `lock`.
    let r = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETLK, &lock) };
    if r == -1 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The pid of another process holding a classic lock on byte `start`.
fn classic_holder(f: &File, start: i64) -> Option<u32> {
    let mut lock = one_byte(libc::F_WRLCK, start);
    // SAFETY: `f` is open for the duration of the call; F_GETLK reads and
    // writes one `struct flock` through the pointer, which points at
    // `lock`, a live and initialised one.
    let r = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETLK, &mut lock) };
    if r != 0 || lock.l_type == libc::F_UNLCK as libc::c_short {
        return None;
    }
    u32::try_from(lock.l_pid).ok().filter(|&p| p > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(dir: &Path) -> PathBuf {
        let p = dir.join("shm");
        std::fs::write(&p, vec![0u8; 4096]).unwrap();
        p
    }

    #[test]
    fn one_holder_per_role_and_create_waits_for_sessions() {
        let dir = tempfile::tempdir().unwrap();
        let p = file(dir.path());
        let host = ShmOwner::claim(&p, ShmRole::Host).unwrap();
        // Same process, other description: still refused (OFD locks).
        let e = ShmOwner::claim(&p, ShmRole::Host).unwrap_err();
        assert!(
            matches!(
                e,
                ShmError::InUse {
                    holder: ShmHolder::Host,
                    ..
                }
            ),
            "{e}"
        );
        assert!(ShmOwner::check(&p, ShmRole::Host).is_err());
        assert!(ShmOwner::check(&p, ShmRole::Remote).is_ok());
        let remote = ShmOwner::claim(&p, ShmRole::Remote).unwrap();
        host.attach().unwrap();
        // A creator (a second remote's role is free once the first goes).
        drop(remote);
        let creator = ShmOwner::claim(&p, ShmRole::Remote).unwrap();
        let start = Instant::now();
        let e = creator.hold_for_create().unwrap_err();
        assert!(start.elapsed() >= CREATE_WAIT);
        assert!(
            matches!(
                e,
                ShmError::InUse {
                    holder: ShmHolder::Host,
                    ..
                }
            ),
            "{e}"
        );
        // The host lets go of the session, keeping its role.
        host.detach();
        creator.hold_for_create().unwrap();
        // While the file is being made, a host cannot attach.
        assert!(host.attach().is_err());
        creator.attach().unwrap();
        host.attach().unwrap();
        assert!(ShmOwner::claim(&p, ShmRole::Host).is_err());
        drop(host);
        assert!(ShmOwner::claim(&p, ShmRole::Host).is_ok());
    }

    #[test]
    fn libmetal_flock_is_not_blocked() {
        let dir = tempfile::tempdir().unwrap();
        let p = file(dir.path());
        let remote = ShmOwner::claim(&p, ShmRole::Remote).unwrap();
        remote.attach().unwrap();
        let other = File::open(&p).unwrap();
        rustix::fs::flock(&other, rustix::fs::FlockOperation::NonBlockingLockExclusive)
            .expect("a role lock blocks libmetal's flock");
    }
}
