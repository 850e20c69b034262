//! What a host or remote process undoes on the way out, shared between its
//! main loop and the thread that handles a stop request (a signal): the bus
//! to stop (the host resets the device, so its remote knows), the sockets
//! it made, and the endpoint service's runtime directory.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::{Bus, CtrlServer};

#[derive(Default)]
struct What {
    bus: Option<Bus>,
    files: Vec<PathBuf>,
    rundir: Option<PathBuf>,
}

/// What to undo on the way out; clones share it.
#[derive(Clone, Default)]
pub struct Cleanup {
    what: Arc<Mutex<What>>,
    /// A stop was requested: its thread cleans up and ends the process.
    requested: Arc<AtomicBool>,
}

impl fmt::Debug for Cleanup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cleanup")
            .field("requested", &self.stopping())
            .finish_non_exhaustive()
    }
}

impl Cleanup {
    /// Nothing to undo yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Nothing to undo yet, and a stop on SIGINT/SIGTERM: a thread of its
    /// own waits for them, tells `on_signal` which came, undoes what is
    /// registered by then and ends the process with status 0. Call it
    /// before any other thread starts, so every thread leaves the signals
    /// to that one.
    ///
    /// # Errors
    /// The signal handling cannot be installed.
    pub fn on_stop_signals(on_signal: impl FnOnce(i32) + Send + 'static) -> std::io::Result<Self> {
        let stop = Self::new();
        let s2 = stop.clone();
        iopath_sys::signals::on_stop("rpmsg-signals", move |sig| {
            s2.stop_requested();
            on_signal(sig);
            0
        })?;
        Ok(stop)
    }

    fn what(&self) -> MutexGuard<'_, What> {
        iopath_sys::lock(&self.what)
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

    /// Called by the thread that handles a stop request, which then ends
    /// the process: marks the stop as begun and undoes everything.
    pub fn stop_requested(&self) {
        self.requested.store(true, Ordering::SeqCst);
        self.clean();
    }

    /// Whether a requested stop has begun (its thread ends the process).
    pub fn stopping(&self) -> bool {
        self.requested.load(Ordering::SeqCst)
    }

    /// Runs `make`, which starts a bus again (and what serves it, such as
    /// the control socket placed again), unless a requested stop has begun:
    /// then it never returns, leaving the exit to that thread. It holds
    /// the lock the cleanup takes, so the two exclude each other: what
    /// `make` creates is removed by a stop that comes later, or never made.
    /// The bus is registered to be stopped on the way out.
    ///
    /// # Errors
    /// What `make` returns.
    pub fn restart<T, E>(&self, make: impl FnOnce() -> Result<(Bus, T), E>) -> Result<(Bus, T), E> {
        let mut w = self.what();
        if self.stopping() {
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
    /// requested stop is under way (the bus it stops ends the main loop
    /// too) this waits for that thread to end the process.
    pub fn run(&self) {
        if self.stopping() {
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
