//! The echo latency's limit: a child process kicked through an eventfd
//! pair kicks back, nothing else between the two.

use std::path::Path;
use std::time::{Duration, Instant};

use iopath_rpmsg::notify::Wake;
use iopath_rpmsg::{Notifier, NotifySpec};

use crate::child::Server;
use crate::place::Spawned;
use crate::{Error, Result};

/// The raw ping-pong: a child process (the bench server `Echo`) that
/// answers every kick with one.
#[derive(Debug)]
pub struct RawPingPong {
    _child: Spawned,
    n: Box<dyn Notifier>,
    _dir: tempfile::TempDir,
}

impl RawPingPong {
    /// A partner (a child of the executable `iopath`, on `cpu`) that
    /// echoes `kicks` kicks.
    ///
    /// # Errors
    /// When the child cannot be started or does not connect.
    pub fn start(iopath: &Path, kicks: u64, cpu: Option<usize>) -> Result<RawPingPong> {
        let dir = crate::cleanup::temp_dir("iopath-bench-rawpp-", &std::env::temp_dir())?;
        let spec = NotifySpec::Eventfd(dir.path().join("ev"));
        let listener = spec
            .bind()
            .map_err(Error::layer("binding the raw ping-pong's socket"))?;
        let server = Server::Echo {
            notify: spec.to_string(),
            count: kicks,
        };
        let child = Spawned::new("the raw echo", cpu, &mut server.command(iopath))?;
        let n = listener
            .accept()
            .map_err(Error::layer("waiting for the raw echo child"))?;
        Ok(RawPingPong {
            _child: child,
            n,
            _dir: dir,
        })
    }

    /// `count` round trips, latencies appended to `lat`; the time taken.
    ///
    /// # Errors
    /// When a kick fails or the partner is gone.
    pub fn round_trips(&self, count: u64, lat: &mut Vec<f64>) -> Result<Duration> {
        let t0 = Instant::now();
        for _ in 0..count {
            let t = Instant::now();
            self.n
                .kick()
                .map_err(Error::layer("kicking the raw echo child"))?;
            while self
                .n
                .wait(Duration::from_secs(5))
                .map_err(Error::layer("waiting for the raw echo child"))?
                != Wake::Kicked
            {}
            lat.push(t.elapsed().as_secs_f64() * 1e6);
        }
        Ok(t0.elapsed())
    }
}

/// The far end (child [`Server::Echo`]): connects to `spec` and answers
/// `count` kicks, each with a kick.
pub(crate) fn serve(spec: &str, count: u64) -> Result<()> {
    let spec: NotifySpec = spec.parse().map_err(|e| crate::Error::Invalid {
        option: crate::child::ENV,
        reason: format!("{spec:?}: {e}"),
    })?;
    let n = spec
        .connect(Duration::from_secs(10))
        .map_err(Error::layer(format!("connecting to {spec}")))?;
    for _ in 0..count {
        while n
            .wait(Duration::from_secs(5))
            .map_err(Error::layer("waiting for a kick"))?
            != Wake::Kicked
        {}
        n.kick().map_err(Error::layer("kicking back"))?;
    }
    Ok(())
}
