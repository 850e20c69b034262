//! `iopath rpmsg exec`: run an unmodified program with the preload library
//! (`libiopath_rpmsg_preload.so`) giving it `/dev/rpmsg_ctrl0` and
//! `/dev/rpmsgN` on the host's endpoint service.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;

use anyhow::{Context, Result};
use iopath_rpmsg::tools::exec::{check_ctrl, find_preload, ExecError, PreloadExec, ENV_PRELOAD};

/// Options of `iopath rpmsg exec`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
The program sees Linux's rpmsg_ctrl / rpmsg_char uAPI: open(\"/dev/rpmsg_ctrl0\"),
RPMSG_CREATE_EPT_IOCTL then open(\"/dev/rpmsgN\"), RPMSG_CREATE_EPT_FD_IOCTL,
read/write/poll with rpmsg_char's errnos. Every other path and fd goes to libc.
A statically linked program cannot be preloaded: it is refused.

Examples:
  iopath rpmsg exec --ctrl /tmp/rp.ctrl -- ./rpmsg_test_tool --dev /dev/rpmsg_ctrl0
  IOPATH_RPMSG_PRELOAD=/opt/lib/libiopath_rpmsg_preload.so iopath rpmsg exec --ctrl /tmp/rp.ctrl -- prog")]
pub struct ExecArgs {
    /// The host's control socket (`iopath rpmsg host --ctrl`).
    #[arg(long)]
    ctrl: PathBuf,
    /// The preload library; default: $IOPATH_RPMSG_PRELOAD, else
    /// libiopath_rpmsg_preload.so next to the iopath binary.
    #[arg(long)]
    preload: Option<PathBuf>,
    /// Where the service puts its nodes, if not beside the socket (its
    /// --rundir).
    #[arg(long)]
    rundir: Option<PathBuf>,
    /// The program and its arguments.
    #[arg(last = true, required = true)]
    cmd: Vec<OsString>,
}

/// Runs the program (replacing this process) with the preload set up.
pub fn exec(a: ExecArgs) -> Result<()> {
    let c = a.ctrl.display();
    check_ctrl(&a.ctrl).map_err(|e| match e {
        ExecError::NoService { source, .. } => anyhow::Error::new(source).context(format!(
            "--ctrl {c}: no endpoint service there (start `iopath rpmsg host --ctrl {c}` first); \
             the program was not run"
        )),
        e => anyhow::anyhow!("--ctrl {e}"),
    })?;
    let so = find_preload(a.preload.as_deref()).map_err(|e| match e {
        ExecError::NoSuchFile { .. } => anyhow::Error::new(e).context("--preload"),
        ExecError::NotFound { .. } => {
            anyhow::anyhow!("{e}; give its path with --preload or {ENV_PRELOAD}")
        }
        e => e.into(),
    })?;
    let run = PreloadExec::new(&so, &a.ctrl, a.rundir.as_deref(), &a.cmd)?;
    if let Some(why) = &run.unreadable_elf {
        // Not for us to refuse: the loader will say what it thinks.
        eprintln!(
            "iopath: warning: {}: {why}; cannot tell whether it is dynamically linked",
            run.file.display()
        );
    }
    let err = run.command().exec();
    Err(err).with_context(|| format!("running {}", run.file.display()))
}
