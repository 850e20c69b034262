//! `iopath rpmsg exec`: run an unmodified program with the preload library
//! (`libiopath_rpmsg_preload.so`) giving it `/dev/rpmsg_ctrl0` and
//! `/dev/rpmsgN` on the host's endpoint service.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// The preload library's file name.
pub const PRELOAD_SO: &str = "libiopath_rpmsg_preload.so";

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

/// The preload library to use.
fn find_preload(opt: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = opt {
        if !p.is_file() {
            bail!("--preload {}: no such file", p.display());
        }
        return Ok(p.to_owned());
    }
    if let Some(p) = std::env::var_os("IOPATH_RPMSG_PRELOAD").filter(|v| !v.is_empty()) {
        let p = PathBuf::from(p);
        if !p.is_file() {
            bail!("IOPATH_RPMSG_PRELOAD={}: no such file", p.display());
        }
        return Ok(p);
    }
    let exe = std::env::current_exe().context("finding the iopath binary")?;
    let beside = exe.with_file_name(PRELOAD_SO);
    if beside.is_file() {
        return Ok(beside);
    }
    bail!(
        "{PRELOAD_SO} not found next to {} (build it with `cargo build -p iopath-rpmsg-preload`); \
         give its path with --preload or IOPATH_RPMSG_PRELOAD",
        exe.display()
    )
}

/// `prog` as `execvp` would find it.
fn resolve(prog: &Path) -> Option<PathBuf> {
    if prog.as_os_str().as_encoded_bytes().contains(&b'/') {
        return Some(prog.to_owned());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(prog))
        .find(|p| p.is_file())
}

/// What an executable is, as far as preloading goes.
#[derive(Debug, PartialEq, Eq)]
pub enum Linkage {
    /// An ELF file with an interpreter (`PT_INTERP`): the dynamic loader
    /// runs it and honours `LD_PRELOAD`.
    Dynamic,
    /// An ELF file without one: statically linked, nothing is preloaded.
    Static,
    /// Not ELF (a script: its interpreter is what gets preloaded).
    NotElf,
}

/// Reads `bytes` (the start of an executable) as ELF and says whether it
/// names an interpreter; malformed headers are errors, never panics.
pub fn linkage(bytes: &[u8]) -> Result<Linkage, &'static str> {
    if bytes.len() < 4 || bytes[..4] != *b"\x7fELF" {
        return Ok(Linkage::NotElf);
    }
    let get = |at: usize, n: usize| -> Result<u64, &'static str> {
        let end = at.checked_add(n).ok_or("bad ELF offset")?;
        let b = bytes.get(at..end).ok_or("truncated ELF header")?;
        let mut v = [0u8; 8];
        match bytes.get(5) {
            Some(1) => v[..n].copy_from_slice(b),
            Some(2) => {
                for (i, x) in b.iter().rev().enumerate() {
                    v[i] = *x;
                }
            }
            _ => return Err("bad ELF data encoding"),
        }
        Ok(u64::from_le_bytes(v))
    };
    // (e_phoff, e_phentsize, e_phnum, p_type size) for ELF32 and ELF64.
    let (phoff, phentsize, phnum) = match bytes.get(4) {
        Some(1) => (get(28, 4)?, get(42, 2)?, get(44, 2)?),
        Some(2) => (get(32, 8)?, get(54, 2)?, get(56, 2)?),
        _ => return Err("bad ELF class"),
    };
    for i in 0..phnum {
        let at = phoff
            .checked_add(i.checked_mul(phentsize).ok_or("bad program headers")?)
            .ok_or("bad program headers")?;
        let at = usize::try_from(at).map_err(|_| "bad program headers")?;
        const PT_INTERP: u64 = 3;
        if get(at, 4)? == PT_INTERP {
            return Ok(Linkage::Dynamic);
        }
    }
    Ok(Linkage::Static)
}

/// Runs the program (replacing this process) with the preload set up.
pub fn exec(a: ExecArgs) -> Result<()> {
    let so = find_preload(a.preload.as_deref())?;
    let so = std::fs::canonicalize(&so).with_context(|| format!("{}", so.display()))?;
    let prog = PathBuf::from(&a.cmd[0]);
    let Some(file) = resolve(&prog) else {
        bail!("{}: command not found", prog.display());
    };
    let mut head = Vec::with_capacity(64 * 1024);
    use std::io::Read;
    std::fs::File::open(&file)
        .with_context(|| format!("{}", file.display()))?
        .take(64 * 1024)
        .read_to_end(&mut head)
        .with_context(|| format!("reading {}", file.display()))?;
    match linkage(&head) {
        Ok(Linkage::Static) => bail!(
            "{} is statically linked: LD_PRELOAD cannot reach it, so it cannot use the \
             endpoint service as /dev/rpmsg*; link it dynamically",
            file.display()
        ),
        Ok(Linkage::Dynamic | Linkage::NotElf) => {}
        // Not for us to refuse: the loader will say what it thinks.
        Err(why) => eprintln!(
            "iopath: warning: {}: {why}; cannot tell whether it is dynamically linked",
            file.display()
        ),
    }
    // Absolute, so that a program that changes directory still finds them.
    let ctrl =
        std::path::absolute(&a.ctrl).with_context(|| format!("--ctrl {}", a.ctrl.display()))?;
    let mut preload = so.into_os_string();
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        preload.push(":");
        preload.push(old);
    }
    let mut cmd = std::process::Command::new(&a.cmd[0]);
    cmd.args(&a.cmd[1..])
        .env("LD_PRELOAD", preload)
        .env("IOPATH_RPMSG_CTRL", ctrl);
    if let Some(d) = &a.rundir {
        cmd.env("IOPATH_RPMSG_RUNDIR", std::path::absolute(d)?);
    }
    let err = cmd.exec();
    Err(err).with_context(|| format!("running {}", file.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linkage_of_real_and_broken_files() {
        // This test binary is dynamically linked (it has an interpreter).
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        assert_eq!(linkage(&me), Ok(Linkage::Dynamic));
        assert_eq!(linkage(b"#!/bin/sh\n"), Ok(Linkage::NotElf));
        assert!(linkage(b"\x7fELF").is_err());
        assert!(linkage(&me[..40]).is_err());
        // No program headers at all: nothing names an interpreter.
        let mut none = me[..64].to_vec();
        none[56] = 0;
        none[57] = 0;
        assert_eq!(linkage(&none), Ok(Linkage::Static));
        // Any prefix of a real file, and garbage after the magic: an
        // answer or an error, never a panic.
        for n in (0..me.len().min(4096)).step_by(7) {
            let _ = linkage(&me[..n]);
        }
        let mut junk = me[..64].to_vec();
        junk[32..40].fill(0xff);
        assert!(linkage(&junk).is_err());
    }
}
