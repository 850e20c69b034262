//! `iopath rpmsg ept create`: an endpoint from the host's endpoint service,
//! as an fd handed to a command, or the legacy way (a node to open).

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use anyhow::{ensure, Context, Result};
use iopath_rpmsg::ctrl::{hand_to_command, proto, CtrlClient, EptFd, EptInfo};

/// Endpoint requests to the host's endpoint service.
#[derive(Debug, clap::Subcommand)]
pub enum EptCmd {
    /// Create an endpoint. The fd way (default) hands the endpoint to a
    /// command as an inherited fd (its number in IOPATH_RPMSG_FD); it is
    /// destroyed when the last copy closes. --legacy makes a node under
    /// the service's runtime directory instead and prints its path (then
    /// waits: the endpoint lives until destroyed through the node or until
    /// this process ends); with a command, it opens the node and hands that.
    Create(CreateArgs),
    /// The endpoint service's counters: endpoints held (fd and legacy),
    /// open nodes, control connections, created/destroyed totals, bad
    /// clients, dropped and oversize messages.
    Stats {
        /// The host's control socket.
        #[arg(long)]
        ctrl: PathBuf,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
}

/// Options of `iopath rpmsg ept create`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  iopath rpmsg ept create --ctrl /tmp/rp.ctrl --name echo -- \\
      sh -c 'iopath rpmsg ping --fd $IOPATH_RPMSG_FD --count 100'
  iopath rpmsg ept create --ctrl /tmp/rp.ctrl --name echo --legacy &
      (prints e.g. /tmp/rp.ctrl.d/rpmsg0)")]
pub struct CreateArgs {
    /// The host's control socket.
    #[arg(long)]
    ctrl: PathBuf,
    /// Endpoint name (at most 31 bytes); with --dst any, the endpoint binds
    /// to the remote's channel of that name.
    #[arg(long, value_parser = super::common::parse_name)]
    name: String,
    /// Local address, or "any" for the next free one from 1024.
    #[arg(long, default_value = "any", value_parser = parse_addr)]
    src: u32,
    /// Remote address, or "any".
    #[arg(long, default_value = "any", value_parser = parse_addr)]
    dst: u32,
    /// The legacy way: a node to find and open (once).
    #[arg(long)]
    legacy: bool,
    /// Hand the fd over with O_NONBLOCK.
    #[arg(long)]
    nonblock: bool,
    /// Print what was created as one JSON object.
    #[arg(long)]
    json: bool,
    /// Command to run with the endpoint fd inherited.
    #[arg(last = true)]
    cmd: Vec<String>,
}

/// Parses an rpmsg address: "any", 1024, 0x400.
fn parse_addr(s: &str) -> Result<u32, String> {
    proto::parse_addr(s).ok_or_else(|| format!("not an address: {s:?} (a number, or any)"))
}

/// Runs one `ept` subcommand.
pub fn run(cmd: EptCmd) -> Result<()> {
    match cmd {
        EptCmd::Create(a) => create(a),
        EptCmd::Stats { ctrl, json } => stats(&ctrl, json),
    }
}

fn stats(ctrl: &Path, json: bool) -> Result<()> {
    let c = CtrlClient::connect(ctrl)
        .with_context(|| format!("endpoint service {}", ctrl.display()))?;
    let s = c.stats().context("STATS")?;
    if json {
        println!("{}", serde_json::to_value(s)?);
    } else {
        println!("{s}");
    }
    Ok(())
}

/// What was created, as one JSON object.
fn show(info: &EptInfo, path: Option<&str>) -> Result<()> {
    let mut v = serde_json::to_value(info)?;
    v["path"] = path.into();
    println!("{v}");
    Ok(())
}

fn create(a: CreateArgs) -> Result<()> {
    let c = CtrlClient::connect(&a.ctrl)
        .with_context(|| format!("endpoint service {}", a.ctrl.display()))?;
    let info = EptInfo {
        name: a.name.clone(),
        src: a.src,
        dst: a.dst,
    };
    let nonblock = if a.nonblock { proto::O_NONBLOCK } else { 0 };
    let (fd, got, node) = if a.legacy {
        let (got, path) = c
            .create_ept(&info)
            .with_context(|| format!("creating endpoint {:?} (legacy)", a.name))?;
        let shown = path.display().to_string();
        if a.json {
            show(&got, Some(&shown))?;
        }
        if a.cmd.is_empty() {
            if !a.json {
                println!("{shown}");
            }
            // The endpoint belongs to this connection: stay until it is
            // destroyed through the node or the service goes.
            ensure!(
                c.hold_until_gone(&path),
                "the endpoint service closed the connection"
            );
            return Ok(());
        }
        let ep = EptFd::open_node(&path, nonblock)
            .with_context(|| format!("opening {}", path.display()))?;
        (ep.into_fd(), got, Some(path))
    } else {
        ensure!(
            !a.cmd.is_empty(),
            "the fd way needs a command to hand the endpoint to (iopath rpmsg ept create ... -- CMD ARGS); or use --legacy"
        );
        let ep = c
            .create_ept_fd(&info, proto::O_RDWR | nonblock)
            .with_context(|| format!("creating endpoint {:?}", a.name))?;
        let got = ep.info().clone();
        if a.json {
            show(&got, None)?;
        }
        (ep.into_fd(), got, None)
    };
    let code = run_with(&a.cmd, fd, &got, node.as_deref())?;
    drop(c);
    std::process::exit(code);
}

/// Runs `cmd` with `fd` inherited, then closes our copy so the child holds
/// the last one; returns the child's exit code.
fn run_with(cmd: &[String], fd: OwnedFd, info: &EptInfo, node: Option<&Path>) -> Result<i32> {
    let mut c = std::process::Command::new(&cmd[0]);
    hand_to_command(c.args(&cmd[1..]), fd.as_fd(), info, node);
    let mut child = c.spawn().with_context(|| format!("running {:?}", cmd[0]))?;
    drop(fd);
    Ok(child.wait()?.code().unwrap_or(128 + 9))
}
