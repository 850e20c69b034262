//! `iopath rpmsg remote`: the virtio device side, serving one host after
//! another on the same shared memory.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, ensure, Context, Result};
use iopath_rpmsg::rsc_table::ShmLayout;
use iopath_rpmsg::session::{
    serve_hosts, AcceptError, RemoteEvent, ServeHosts, ServeHostsError, Skipped,
};
use iopath_rpmsg::vring::VIRTIO_RING_F_EVENT_IDX;
use iopath_rpmsg::{shm_path, NotifySpec, RemoteServices, SharedMem, ShmOptions};

use iopath_rpmsg::openamp;

use super::common::{stats_json, stats_line};
use iopath_rpmsg::session::Cleanup;

use super::stop;

/// Options of `iopath rpmsg remote`.
#[derive(Debug, clap::Args)]
pub struct RemoteArgs {
    /// Shared-memory file (a bare name means /dev/shm/NAME).
    #[arg(long)]
    shm: PathBuf,
    /// Create the file with SIZE bytes (e.g. 0x80000, 512K, 2M) and write a
    /// fresh resource table: OpenAMP demo layout (table at 0, vrings at
    /// 0x4000 and 0x8000 aligned 0x1000, buffers from 0x10000).
    #[arg(long, value_parser = super::common::parse_size)]
    create: Option<u64>,
    /// Entries per vring (with --create).
    #[arg(long, default_value_t = 256)]
    ring: u32,
    /// Offer VIRTIO_RING_F_EVENT_IDX (with --create).
    #[arg(long)]
    event_idx: bool,
    /// How to notify: eventfd:SOCK (eventfd pair passed over SOCK), unix:SOCK
    /// (one byte per kick, OpenAMP demo), or poll. The remote listens.
    #[arg(long, default_value = openamp::NOTIFY)]
    notify: NotifySpec,
    /// Echo service to announce (repeatable).
    #[arg(long, default_value = openamp::SERVICE, value_parser = super::common::parse_name)]
    echo: Vec<String>,
    /// Sink service to announce (repeatable): messages are counted and
    /// dropped, except the 4 bytes "SYNC", answered with the count so far
    /// (u64, little-endian; the SYNC included), so a sender can tell when
    /// a stream has arrived.
    #[arg(long, value_parser = super::common::parse_name)]
    sink: Vec<String>,
    /// Behave like OpenAMP's rpmsg-echo demo: exit once the host destroys
    /// the channel (or sends the shutdown word 0xEF56A55A).
    #[arg(long)]
    openamp: bool,
    /// Exit once the host destroys the channel.
    #[arg(long)]
    exit_on_unbind: bool,
    /// After echoing N messages, destroy the echo services (name-service
    /// DESTROY) and exit.
    #[arg(long)]
    echo_limit: Option<u64>,
    /// Give up if the host has not set DRIVER_OK within SECS.
    #[arg(long)]
    ready_timeout: Option<u64>,
    /// Serve one host only: exit when it goes (status 1 if it went without
    /// a clean stop). By default the remote waits for the next host, as
    /// firmware outlives the driver.
    #[arg(long)]
    once: bool,
    /// Mode of the shared-memory file made by --create, octal. Whoever can
    /// read it reads every message on the bus; whoever can write it can
    /// forge any.
    #[arg(long, default_value = "600", value_parser = super::common::parse_mode)]
    shm_mode: u32,
    /// Attach to a shared-memory file that users other than its owner can
    /// write (refused by default).
    #[arg(long)]
    allow_writable_shm: bool,
    /// Print the final counters as JSON.
    #[arg(long)]
    json: bool,
}

/// Runs `iopath rpmsg remote` until a session ends it or a signal stops it.
pub fn run(a: RemoteArgs) -> Result<()> {
    let stop = stop::install("remote")?;
    let r = serve(&a, &stop);
    stop.run();
    r
}

/// Binds, opens the shared memory and serves one host after another.
fn serve(a: &RemoteArgs, stop: &Cleanup) -> Result<()> {
    let path = shm_path(&a.shm);
    let opts = ShmOptions {
        mode: a.shm_mode,
        allow_others_write: a.allow_writable_shm,
    };
    let shm = match a.create {
        Some(size) => {
            // 0x80000 with rings of 256 is OpenAMP's demo layout.
            let mut layout = ShmLayout::for_size(size, a.ring).with_context(|| {
                format!("--create {size:#x} with --ring {}: no layout fits", a.ring)
            })?;
            if a.event_idx {
                layout.dfeatures |= 1 << VIRTIO_RING_F_EVENT_IDX;
            }
            SharedMem::create_with(&path, &layout, &opts)
                .with_context(|| format!("creating {}", path.display()))?
        }
        None => {
            ensure!(
                !a.event_idx,
                "--event-idx needs --create (the table is written then)"
            );
            let shm = SharedMem::open_with(&path, &opts).with_context(|| {
                format!(
                    "opening {} (--allow-writable-shm attaches to a file others can write)",
                    path.display()
                )
            })?;
            shm.table(0)
                .with_context(|| format!("resource table in {}", path.display()))?;
            shm
        }
    };
    // Bound once the table is written: a host that connects finds it (a
    // second remote on the same file was refused by its lock above).
    let listener = a
        .notify
        .bind()
        .with_context(|| format!("notify socket {}", a.notify))?;
    if let Some(p) = listener.path() {
        stop.add_file(p);
    }
    eprintln!(
        "remote: {} ({} bytes), waiting for the host on {}",
        path.display(),
        shm.len(),
        a.notify
    );
    let services = RemoteServices {
        echo: a.echo.clone(),
        sink: a.sink.clone(),
        openamp: a.openamp,
        exit_on_unbind: a.exit_on_unbind,
        echo_limit: a.echo_limit,
    };
    let cfg = ServeHosts {
        listener: &listener,
        shm: &shm,
        ready_timeout: a.ready_timeout.map(Duration::from_secs),
        services: &services,
        once: a.once,
    };
    let (echo, json, notify) = (a.echo.clone(), a.json, a.notify.to_string());
    serve_hosts(&cfg, stop, move |ev| match ev {
        RemoteEvent::Skipped(Skipped::NotAHost(e)) => {
            eprintln!("remote: a connection that is no host ({e}); waiting again")
        }
        RemoteEvent::Skipped(Skipped::ClosedBeforeReady(e)) => {
            eprintln!("remote: the connection closed before DRIVER_OK ({e}); waiting again")
        }
        RemoteEvent::HostReady { features } => {
            let names: Vec<&str> = [(0, "NS"), (VIRTIO_RING_F_EVENT_IDX, "EVENT_IDX")]
                .into_iter()
                .filter(|(bit, _)| features & (1 << bit) != 0)
                .map(|(_, n)| n)
                .collect();
            eprintln!(
                "remote: host ready (features {}), announcing {:?}",
                if names.is_empty() {
                    "none".into()
                } else {
                    names.join(", ")
                },
                echo
            );
        }
        RemoteEvent::EndpointDestroyed { name, addr } => {
            eprintln!("remote: host destroyed its endpoint {addr} on {name:?}");
        }
        RemoteEvent::SessionEnded(end) => eprintln!("remote: {end}"),
        RemoteEvent::Stats { echoed, stats } => {
            if json {
                println!(
                    "{}",
                    serde_json::json!({ "role": "remote", "echoed": echoed, "stats": stats_json(stats) })
                );
            } else {
                eprintln!("remote: {}", stats_line(stats));
            }
        }
        RemoteEvent::HostGone { reason } => {
            eprintln!("remote: host gone ({reason}); waiting for the next host on {notify}")
        }
    })
    .map_err(|e| match e {
        ServeHostsError::Accept(AcceptError::Accept(e)) => {
            anyhow::Error::new(e).context("waiting for the host")
        }
        ServeHostsError::Accept(AcceptError::Ready(e)) => {
            anyhow::Error::new(e).context("waiting for DRIVER_OK")
        }
        ServeHostsError::Announce(e) => anyhow::Error::new(e),
        ServeHostsError::HostGone { reason } => anyhow!("the host went away: {reason}"),
        ServeHostsError::Reset(e) => anyhow::Error::new(e).context("resetting the device"),
    })
}
