//! A requested stop of `rpmsg host` or `rpmsg remote` (SIGINT, SIGTERM),
//! handled as `blk serve` does: the signals wait on a thread of their own,
//! which stops the bus (the host resets the device, so its remote knows),
//! removes the sockets and the runtime directory this process made, and
//! exits 0. Every other way out runs the same cleanup.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use iopath_rpmsg::{Bus, CtrlServer};

#[derive(Default)]
struct What {
    bus: Option<Bus>,
    files: Vec<PathBuf>,
    rundir: Option<PathBuf>,
}

/// What to undo on the way out.
#[derive(Clone)]
pub struct Stop {
    what: Arc<Mutex<What>>,
    /// A signal came: its thread cleans up and exits 0.
    requested: Arc<AtomicBool>,
}

impl Stop {
    /// Installs the SIGINT/SIGTERM handling. Call it before any thread is
    /// started, so every thread leaves the signals to the handler's.
    pub fn install(role: &'static str) -> Result<Stop> {
        let mut signals = signal_hook::iterator::Signals::new([
            signal_hook::consts::SIGINT,
            signal_hook::consts::SIGTERM,
        ])
        .context("cannot install signal handlers")?;
        let stop = Stop {
            what: Arc::new(Mutex::new(What::default())),
            requested: Arc::new(AtomicBool::new(false)),
        };
        let s2 = stop.clone();
        std::thread::Builder::new()
            .name("rpmsg-signals".into())
            .spawn(move || {
                if let Some(sig) = signals.forever().next() {
                    s2.requested.store(true, Ordering::SeqCst);
                    s2.clean();
                    eprintln!("{role}: stopped by signal {sig}");
                    std::process::exit(0);
                }
            })
            .context("cannot start the signal thread")?;
        Ok(stop)
    }

    fn what(&self) -> std::sync::MutexGuard<'_, What> {
        self.what.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The bus to stop on the way out (`None`: none any more).
    pub fn set_bus(&self, bus: Option<Bus>) {
        self.what().bus = bus;
    }

    /// A socket (or file) this process made, removed on the way out.
    pub fn add_file(&self, p: &Path) {
        self.what().files.push(p.to_owned());
    }

    /// Not ours after all (another server's socket).
    pub fn forget_file(&self, p: &Path) {
        self.what().files.retain(|f| f != p);
    }

    /// The endpoint service's runtime directory: its nodes and then the
    /// directory are removed on the way out.
    pub fn set_rundir(&self, p: Option<&Path>) {
        self.what().rundir = p.map(Path::to_owned);
    }

    /// Whether a signal's stop has begun (its thread exits the process).
    pub fn stopping(&self) -> bool {
        self.requested.load(Ordering::SeqCst)
    }

    /// Runs `make`, which starts a bus again (and what serves it, such as
    /// the control socket placed again), unless a signal's stop has begun:
    /// then it never returns, leaving the exit to that thread. It holds
    /// the lock the cleanup takes, so the two exclude each other: what
    /// `make` creates is removed by a stop that comes later, or never made.
    /// The bus is registered to be stopped on the way out.
    ///
    /// # Errors
    /// What `make` returns.
    pub fn restart<T>(&self, make: impl FnOnce() -> Result<(Bus, T)>) -> Result<(Bus, T)> {
        let mut w = self.what();
        if self.requested.load(Ordering::SeqCst) {
            drop(w);
            loop {
                std::thread::park();
            }
        }
        let (bus, t) = make()?;
        w.bus = Some(bus.clone());
        Ok((bus, t))
    }

    /// Stops the bus and removes what was made; safe to call twice. While a
    /// signal's stop is under way (the bus it stops ends the main loop too)
    /// this waits for that thread to exit the process with status 0.
    pub fn run(&self) {
        if self.requested.load(Ordering::SeqCst) {
            loop {
                std::thread::park();
            }
        }
        self.clean();
    }

    fn clean(&self) {
        let (bus, files, rundir) = {
            let mut w = self.what();
            (w.bus.take(), std::mem::take(&mut w.files), w.rundir.take())
        };
        if let Some(bus) = bus {
            bus.shutdown();
        }
        for f in files {
            let _ = std::fs::remove_file(f);
        }
        if let Some(dir) = rundir {
            CtrlServer::remove_run_dir(&dir);
        }
    }
}
