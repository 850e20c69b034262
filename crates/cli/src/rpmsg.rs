//! `iopath rpmsg remote|host|ping|ept|exec`: rpmsg over virtio rings in
//! shared memory.

use anyhow::Result;

pub(crate) mod common;
mod ept;
mod exec;
mod host;
mod ping;
mod remote;

/// The `iopath rpmsg` subcommands (their help is in `main.rs`).
#[derive(Debug, clap::Subcommand)]
pub enum RpmsgCmd {
    /// Be the remote (virtio device): wait for the host, announce echo
    /// services, echo every message back; then wait for the next host
    /// (--once: exit, status 1 if the host died). SIGINT/SIGTERM: clean
    /// stop, status 0.
    Remote(remote::RemoteArgs),
    /// Be the host (virtio driver): own the buffers and the bus, serve local
    /// clients on a control socket; if the remote dies, hang its clients up
    /// and serve again once a remote is back (--once: exit, status 1).
    /// SIGINT/SIGTERM: clean stop, status 0.
    Host(host::HostArgs),
    /// Echo round trips through an endpoint fd from the host's endpoint
    /// service (or an inherited one): every byte checked; p50/p99/max
    /// latency and messages per second.
    Ping(ping::PingArgs),
    /// Endpoints from the host's endpoint service: create one as an fd (and
    /// hand it to a command) or the legacy way (a node to open).
    #[command(subcommand)]
    Ept(ept::EptCmd),
    /// Run an unmodified program written for Linux's /dev/rpmsg_ctrlN and
    /// /dev/rpmsgN on the host's endpoint service (LD_PRELOAD of
    /// libiopath_rpmsg_preload.so).
    Exec(exec::ExecArgs),
}

/// Runs one `rpmsg` subcommand.
pub fn run(cmd: RpmsgCmd) -> Result<()> {
    match cmd {
        RpmsgCmd::Remote(a) => remote::run(a),
        RpmsgCmd::Host(a) => host::run(a),
        RpmsgCmd::Ping(a) => ping::run(a),
        RpmsgCmd::Ept(c) => ept::run(c),
        RpmsgCmd::Exec(a) => exec::exec(a),
    }
}
