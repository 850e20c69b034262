//! `iopath rpmsg remote`: the virtio device side, serving one host after
//! another on the same shared memory.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use iopath_rpmsg::notify::NotifyError;
use iopath_rpmsg::rsc_table::ShmLayout;
use iopath_rpmsg::vring::VIRTIO_RING_F_EVENT_IDX;
use iopath_rpmsg::{
    shm_path, Bus, BusError, EndpointOptions, Event, LinkError, NotifySpec, SharedMem, ShmOptions,
};

use iopath_bench::rpmsg::scale::SINK_SYNC;

use super::common::{stats_json, stats_line, OPENAMP_SHUTDOWN};
use super::stop::Stop;

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
    #[arg(long, default_value = "unix:/tmp/openamp.event.0")]
    notify: NotifySpec,
    /// Echo service to announce (repeatable).
    #[arg(long, default_value = super::common::OPENAMP_SERVICE, value_parser = super::common::parse_name)]
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

/// Why a session with a host ended.
enum Exit {
    /// The host destroyed a channel (with --exit-on-unbind / --openamp).
    Unbound(String),
    /// The echo limit was reached.
    Limit,
    /// The OpenAMP shutdown word came.
    Shutdown,
    /// The link went down: the host went away, reset the device, or broke
    /// the rings.
    LinkDown(String),
}

/// Runs `iopath rpmsg remote` until a session ends it or a signal stops it.
pub fn run(a: RemoteArgs) -> Result<()> {
    let stop = Stop::install("remote")?;
    let r = serve_hosts(&a, &stop);
    stop.run();
    r
}

/// Binds, opens the shared memory and serves one host after another.
fn serve_hosts(a: &RemoteArgs, stop: &Stop) -> Result<()> {
    let path = shm_path(&a.shm);
    let opts = ShmOptions {
        mode: a.shm_mode,
        allow_others_write: a.allow_writable_shm,
    };
    let shm = match a.create {
        Some(size) => {
            let mut layout = if size == 0x80000 && a.ring == 256 {
                ShmLayout::openamp_demo()
            } else {
                ShmLayout::for_size(size, a.ring).with_context(|| {
                    format!("--create {size:#x} with --ring {}: no layout fits", a.ring)
                })?
            };
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
    loop {
        let notifier = match listener.accept() {
            Ok(n) => n,
            Err(e @ NotifyError::Io { op: "accept", .. }) => {
                return Err(e).context("waiting for the host");
            }
            Err(e) => {
                eprintln!("remote: a connection that is no host ({e}); waiting again");
                continue;
            }
        };
        let bus = match Bus::remote(
            shm.clone(),
            notifier,
            a.ready_timeout.map(Duration::from_secs),
        ) {
            Ok(b) => b,
            Err(BusError::Link(LinkError::Notify(e))) => {
                eprintln!("remote: the connection closed before DRIVER_OK ({e}); waiting again");
                continue;
            }
            Err(e) => return Err(e).context("waiting for DRIVER_OK"),
        };
        stop.set_bus(Some(bus.clone()));
        let (why, echoed) = serve(a, &bus)?;
        stop.set_bus(None);
        let s = bus.stats();
        bus.shutdown();
        if a.json {
            println!(
                "{}",
                serde_json::json!({ "role": "remote", "echoed": echoed, "stats": stats_json(&s) })
            );
        } else {
            eprintln!("remote: {}", stats_line(&s));
        }
        let Exit::LinkDown(reason) = why else {
            return Ok(());
        };
        if a.once {
            bail!("the host went away: {reason}");
        }
        // The next host must find the device reset, not the status the
        // last one left (DRIVER_OK if it was killed).
        let st = shm.table(0).context("resource table")?.vdev.status_offset() as u64;
        shm.store_u8(st, 0).context("resetting the device status")?;
        eprintln!(
            "remote: host gone ({reason}); waiting for the next host on {}",
            a.notify
        );
    }
}

/// Serves one host: announces the echo services and echoes until the
/// session ends. Returns why, and how many messages were echoed.
fn serve(a: &RemoteArgs, bus: &Bus) -> Result<(Exit, u64)> {
    let f = bus.features();
    let names: Vec<&str> = [(0, "NS"), (VIRTIO_RING_F_EVENT_IDX, "EVENT_IDX")]
        .into_iter()
        .filter(|(bit, _)| f & (1 << bit) != 0)
        .map(|(_, n)| n)
        .collect();
    eprintln!(
        "remote: host ready (features {}), announcing {:?}",
        if names.is_empty() {
            "none".into()
        } else {
            names.join(", ")
        },
        a.echo
    );
    let (exit_tx, exit_rx) = mpsc::channel::<Exit>();
    let exit_on_unbind = a.exit_on_unbind || a.openamp;
    let echoed = Arc::new(AtomicU64::new(0));
    let mut eps = Vec::new();
    for name in &a.echo {
        let tx = exit_tx.clone();
        let name2 = name.clone();
        let echoed = Arc::clone(&echoed);
        let limit = a.echo_limit;
        let openamp = a.openamp;
        let ep = bus
            .create_with_callback(EndpointOptions::new(name), move |ep, ev| match ev {
                Event::Message(m) => {
                    if openamp && m.data.len() == 4 && m.data[..4] == OPENAMP_SHUTDOWN.to_le_bytes()
                    {
                        let _ = tx.send(Exit::Shutdown);
                        return;
                    }
                    let n = echoed.fetch_add(1, Ordering::Relaxed) + 1;
                    if limit.is_some_and(|l| n > l) {
                        return; // past the limit: about to destroy the service
                    }
                    if let Err(e) = ep.send_to(m.src, &m.data, Some(Duration::from_secs(5))) {
                        tracing::warn!("echo to {} failed: {e}", m.src);
                    }
                    if limit == Some(n) {
                        let _ = tx.send(Exit::Limit);
                    }
                }
                Event::Unbound { addr } => {
                    eprintln!("remote: host destroyed its endpoint {addr} on {name2:?}");
                    if exit_on_unbind {
                        let _ = tx.send(Exit::Unbound(name2.clone()));
                    }
                }
                Event::LinkDown(_) => {}
            })
            .with_context(|| format!("announcing {name:?}"))?;
        eps.push(ep);
    }
    for name in &a.sink {
        let mut count = 0u64;
        let ep = bus
            .create_with_callback(EndpointOptions::new(name), move |ep, ev| {
                if let Event::Message(m) = ev {
                    count += 1;
                    let n = count;
                    if m.data == SINK_SYNC {
                        if let Err(e) =
                            ep.send_to(m.src, &n.to_le_bytes(), Some(Duration::from_secs(5)))
                        {
                            tracing::warn!("sink answer to {} failed: {e}", m.src);
                        }
                    }
                }
            })
            .with_context(|| format!("announcing {name:?}"))?;
        eps.push(ep);
    }
    let b2 = bus.clone();
    let down_tx = exit_tx.clone();
    std::thread::spawn(move || {
        let r = b2.wait_down(None).unwrap_or_default();
        let _ = down_tx.send(Exit::LinkDown(r));
    });
    drop(exit_tx);
    let why = exit_rx.recv().unwrap_or(Exit::Shutdown);
    let msg = match &why {
        Exit::Unbound(r) => format!("channel closed ({r})"),
        Exit::Limit => "echo limit reached, destroying the services".into(),
        Exit::Shutdown => "shutdown word received".into(),
        Exit::LinkDown(r) => format!("link down ({r})"),
    };
    eprintln!("remote: {msg}");
    // Dropping the endpoints sends the name-service DESTROY records.
    drop(eps);
    if matches!(why, Exit::Limit) {
        // Give the host a moment to take the DESTROY before we go.
        let _ = bus.wait_down(Some(Duration::from_millis(500)));
    }
    Ok((why, echoed.load(Ordering::Relaxed)))
}
