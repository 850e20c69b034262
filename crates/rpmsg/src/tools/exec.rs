//! Running an unmodified program on the endpoint service: the preload
//! library (`libiopath_rpmsg_preload.so`, crate `iopath-rpmsg-preload`)
//! gives it Linux's `/dev/rpmsg_ctrlN` and `/dev/rpmsgN`, configured by the
//! environment variables named here.
//!
//! ```text
//!   check_ctrl ── the endpoint service's socket is there
//!   find_preload ── --preload | $IOPATH_RPMSG_PRELOAD | beside the binary
//!   PreloadExec::new(ctrl, cmd) ── program found on $PATH, ELF checked
//!        .command() ── LD_PRELOAD, IOPATH_RPMSG_CTRL[, IOPATH_RPMSG_RUNDIR]
//! ```

use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use thiserror::Error;

use super::elf::{self, ElfError, Linkage};

/// The preload library's file name.
pub const PRELOAD_SO: &str = "libiopath_rpmsg_preload.so";

/// The variable naming the preload library (else it is looked for beside
/// the running binary).
pub const ENV_PRELOAD: &str = "IOPATH_RPMSG_PRELOAD";

/// The variable the preload library reads for the endpoint service's
/// control socket.
pub const ENV_CTRL: &str = "IOPATH_RPMSG_CTRL";

/// The variable the preload library reads for the service's node
/// directory, when it is not the default
/// ([`crate::ctrl::default_run_dir`]).
pub const ENV_RUNDIR: &str = "IOPATH_RPMSG_RUNDIR";

/// How much of a program is read to check its ELF header.
const HEAD_LEN: u64 = 64 * 1024;

/// Why a program cannot be run with the preload library.
#[derive(Debug, Error)]
pub enum ExecError {
    /// A named file does not exist.
    #[error("{}: no such file", path.display())]
    NoSuchFile {
        /// The path.
        path: PathBuf,
    },
    /// `$IOPATH_RPMSG_PRELOAD` names no file.
    #[error("{ENV_PRELOAD}={}: no such file", path.display())]
    EnvNoSuchFile {
        /// The variable's value.
        path: PathBuf,
    },
    /// The library is not beside the running binary.
    #[error(
        "{PRELOAD_SO} not found next to {} (build it with `cargo build -p iopath-rpmsg-preload`)",
        exe.display()
    )]
    NotFound {
        /// The running binary.
        exe: PathBuf,
    },
    /// The program is not on `$PATH`.
    #[error("{}: command not found", prog.display())]
    CommandNotFound {
        /// The program as given.
        prog: PathBuf,
    },
    /// The program is statically linked: `LD_PRELOAD` cannot reach it.
    #[error(
        "{} is statically linked: LD_PRELOAD cannot reach it, so it cannot use the \
         endpoint service as /dev/rpmsg*; link it dynamically",
        path.display()
    )]
    Static {
        /// The program's file.
        path: PathBuf,
    },
    /// The control socket given is some other file.
    #[error("{}: not a socket", path.display())]
    CtrlNotSocket {
        /// The path given.
        path: PathBuf,
    },
    /// Nothing at the control socket's path.
    #[error("{}: no endpoint service there", path.display())]
    NoService {
        /// The path given.
        path: PathBuf,
        /// What `stat(2)` said.
        #[source]
        source: std::io::Error,
    },
    /// A file could not be read or resolved.
    #[error("{}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ExecError + '_ {
    move |source| ExecError::Io {
        path: path.to_owned(),
        source,
    }
}

/// The preload library to use: `explicit` if given, else
/// `$IOPATH_RPMSG_PRELOAD`, else [`PRELOAD_SO`] next to the running binary.
///
/// # Errors
/// [`ExecError::NoSuchFile`], [`ExecError::EnvNoSuchFile`] or
/// [`ExecError::NotFound`].
pub fn find_preload(explicit: Option<&Path>) -> Result<PathBuf, ExecError> {
    if let Some(p) = explicit {
        if !p.is_file() {
            return Err(ExecError::NoSuchFile { path: p.to_owned() });
        }
        return Ok(p.to_owned());
    }
    if let Some(p) = std::env::var_os(ENV_PRELOAD).filter(|v| !v.is_empty()) {
        let p = PathBuf::from(p);
        if !p.is_file() {
            return Err(ExecError::EnvNoSuchFile { path: p });
        }
        return Ok(p);
    }
    let exe = std::env::current_exe().map_err(io(Path::new("the running binary")))?;
    let beside = exe.with_file_name(PRELOAD_SO);
    if beside.is_file() {
        return Ok(beside);
    }
    Err(ExecError::NotFound { exe })
}

/// Checks that `ctrl` is a socket before a program is run on it: without
/// the endpoint service every rpmsg call of the program would fail, far
/// from the cause.
///
/// # Errors
/// [`ExecError::NoService`] when nothing is there,
/// [`ExecError::CtrlNotSocket`] for another kind of file.
pub fn check_ctrl(ctrl: &Path) -> Result<(), ExecError> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::metadata(ctrl) {
        Ok(m) if m.file_type().is_socket() => Ok(()),
        Ok(_) => Err(ExecError::CtrlNotSocket {
            path: ctrl.to_owned(),
        }),
        Err(source) => Err(ExecError::NoService {
            path: ctrl.to_owned(),
            source,
        }),
    }
}

/// `prog` as `execvp(3)` would find it.
fn resolve(prog: &Path) -> Option<PathBuf> {
    if prog.as_os_str().as_encoded_bytes().contains(&b'/') {
        return Some(prog.to_owned());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(prog))
        .find(|p| p.is_file())
}

/// A program checked and ready to run with the preload library.
#[derive(Debug)]
pub struct PreloadExec {
    /// The program's file, as found on `$PATH`.
    pub file: PathBuf,
    /// Set when the program's ELF header could not be read: the loader
    /// decides then (it may well run it).
    pub unreadable_elf: Option<ElfError>,
    so: PathBuf,
    ctrl: PathBuf,
    rundir: Option<PathBuf>,
    cmd: Vec<OsString>,
}

impl PreloadExec {
    /// Finds `cmd[0]` and checks that the loader will preload `so` into it;
    /// `ctrl` is the endpoint service's control socket, `rundir` its node
    /// directory if not the default.
    ///
    /// # Errors
    /// [`ExecError::CommandNotFound`], [`ExecError::Static`] for a
    /// statically linked program, [`ExecError::Io`] if a file cannot be
    /// read or a path made absolute.
    ///
    /// # Panics
    /// If `cmd` is empty.
    pub fn new(
        so: &Path,
        ctrl: &Path,
        rundir: Option<&Path>,
        cmd: &[OsString],
    ) -> Result<Self, ExecError> {
        let so = std::fs::canonicalize(so).map_err(io(so))?;
        let prog = PathBuf::from(&cmd[0]);
        let file = resolve(&prog).ok_or(ExecError::CommandNotFound { prog })?;
        let mut head = Vec::with_capacity(HEAD_LEN as usize);
        std::fs::File::open(&file)
            .and_then(|f| f.take(HEAD_LEN).read_to_end(&mut head))
            .map_err(io(&file))?;
        let unreadable_elf = match elf::linkage(&head) {
            Ok(Linkage::Static) => return Err(ExecError::Static { path: file }),
            Ok(Linkage::Dynamic | Linkage::NotElf) => None,
            Err(e) => Some(e),
        };
        // Absolute, so that a program that changes directory still finds them.
        let ctrl = std::path::absolute(ctrl).map_err(io(ctrl))?;
        let rundir = match rundir {
            Some(d) => Some(std::path::absolute(d).map_err(io(d))?),
            None => None,
        };
        Ok(PreloadExec {
            file,
            unreadable_elf,
            so,
            ctrl,
            rundir,
            cmd: cmd.to_vec(),
        })
    }

    /// The command: the program with the preload library put first in
    /// `LD_PRELOAD` (before any the caller's environment has) and the
    /// service's paths in the environment.
    pub fn command(&self) -> Command {
        let mut preload = self.so.clone().into_os_string();
        if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
            preload.push(":");
            preload.push(old);
        }
        let mut cmd = Command::new(&self.cmd[0]);
        cmd.args(&self.cmd[1..])
            .env("LD_PRELOAD", preload)
            .env(ENV_CTRL, &self.ctrl);
        if let Some(d) = &self.rundir {
            cmd.env(ENV_RUNDIR, d);
        }
        cmd
    }
}
