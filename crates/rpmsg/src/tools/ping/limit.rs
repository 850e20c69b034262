//! The echo's limit, and the figures both are read as: a partner process
//! kicked through an eventfd pair kicks back, nothing else between the
//! two ([`RawPingPong`]); a series of round trips as percentiles
//! ([`Latency`]).

use std::path::Path;
use std::process::{Child, Command};

use iopath_sys::process::Supervised;
use std::time::{Duration, Instant};

use super::PingError;
use crate::notify::{NotifyError, Wake};
use crate::{Notifier, NotifySpec};

/// The variable that makes a process the raw ping-pong's partner: `COUNT
/// SPEC`, the kicks to answer and where to connect.
const PARTNER: &str = "IOPATH_RAW_PINGPONG";

/// The sample at fraction `p` (0..=1) of `sorted` (nearest rank; 0 when
/// empty).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Latency of a series of round trips, microseconds.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Latency {
    /// Round trips.
    pub count: u64,
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// Slowest.
    pub max_us: f64,
    /// Round trips per second over the whole series.
    pub msgs_per_s: f64,
}

impl Latency {
    /// From per-round-trip microseconds and the series' wall time.
    pub fn from(mut us: Vec<f64>, elapsed: Duration) -> Self {
        us.sort_by(f64::total_cmp);
        Latency {
            count: us.len() as u64,
            p50_us: percentile(&us, 0.5),
            p99_us: percentile(&us, 0.99),
            max_us: us.last().copied().unwrap_or(0.0),
            msgs_per_s: us.len() as f64 / elapsed.as_secs_f64().max(1e-9),
        }
    }

    /// One line: p50, p99, max, msgs/s.
    pub fn line(&self) -> String {
        format!(
            "p50 {:.1} us, p99 {:.1} us, max {:.1} us, {:.0} msgs/s",
            self.p50_us, self.p99_us, self.max_us, self.msgs_per_s
        )
    }
}

fn notify(what: &'static str) -> impl FnOnce(NotifyError) -> PingError {
    move |source| PingError::Notify { what, source }
}

/// The raw ping-pong: a partner process that answers every kick with one;
/// killed when dropped.
#[derive(Debug)]
pub struct RawPingPong {
    n: Box<dyn Notifier>,
    _partner: Supervised,
}

impl RawPingPong {
    /// Starts a partner that answers `kicks` kicks: the program `exe`,
    /// whose `main` calls [`serve_partner_if_asked`] first, spawned by
    /// `spawn` (which may place or record it), its socket in `dir` until
    /// it has connected.
    ///
    /// # Errors
    /// [`PingError::Partner`] when it cannot be started,
    /// [`PingError::Notify`] when it does not connect within 10 s.
    pub fn start(
        exe: &Path,
        dir: &Path,
        kicks: u64,
        spawn: impl FnOnce(&mut Command) -> std::io::Result<Child>,
    ) -> Result<RawPingPong, PingError> {
        let sock = dir.join(format!("raw-pingpong-{}.sock", std::process::id()));
        let spec = NotifySpec::Eventfd(sock.clone());
        let listener = spec.bind().map_err(notify("binding its socket"))?;
        let mut cmd = Command::new(exe);
        cmd.env(PARTNER, format!("{kicks} {spec}"));
        let name = "the raw ping-pong's partner";
        let partner = Supervised::spawn_with(name, None, &mut cmd, spawn);
        let partner = partner.map_err(PingError::Partner)?;
        let given = Duration::from_secs(10);
        let n = listener.accept_until(Instant::now() + given, given);
        let _ = std::fs::remove_file(&sock);
        let n = n.map_err(notify("waiting for the partner"));
        // Kills the partner when it did not connect.
        let raw = |n| RawPingPong {
            n,
            _partner: partner,
        };
        n.map(raw)
    }

    /// `count` round trips, latencies appended to `lat`; the time taken.
    ///
    /// # Errors
    /// [`PingError::Notify`] when a kick fails or the partner is gone.
    pub fn round_trips(&self, count: u64, lat: &mut Vec<f64>) -> Result<Duration, PingError> {
        let t0 = Instant::now();
        for _ in 0..count {
            let t = Instant::now();
            self.n.kick().map_err(notify("kicking the partner"))?;
            let wait = || self.n.wait(Duration::from_secs(5));
            while wait().map_err(notify("waiting for the partner"))? != Wake::Kicked {}
            lat.push(t.elapsed().as_secs_f64() * 1e6);
        }
        Ok(t0.elapsed())
    }
}

/// Serves as the raw ping-pong's partner when this process was started as
/// one ([`RawPingPong::start`]): connects and answers each kick with one,
/// as many as asked. `None` when it was not started as one.
pub fn serve_partner_if_asked() -> Option<Result<(), PingError>> {
    let value = std::env::var(PARTNER).ok()?;
    let serve = || {
        let what = "reading IOPATH_RAW_PINGPONG";
        let bad = || notify(what)(NotifyError::Spec(value.clone()));
        let (count, spec) = value.split_once(' ').ok_or_else(bad)?;
        let count: u64 = count.parse().map_err(|_| bad())?;
        let spec: NotifySpec = spec.parse().map_err(notify(what))?;
        let n = spec
            .connect(Duration::from_secs(10))
            .map_err(notify("connecting to the ping-pong"))?;
        for _ in 0..count {
            let wait = || n.wait(Duration::from_secs(5));
            while wait().map_err(notify("waiting for a kick"))? != Wake::Kicked {}
            n.kick().map_err(notify("kicking back"))?;
        }
        Ok(())
    };
    Some(serve())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_a_series() {
        let l = Latency::from(
            (1..=100).rev().map(f64::from).collect(),
            Duration::from_secs(1),
        );
        assert_eq!(l.count, 100);
        assert_eq!(l.p50_us, 51.0);
        assert_eq!(l.p99_us, 99.0);
        assert_eq!(l.max_us, 100.0);
        assert_eq!(l.msgs_per_s, 100.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }

    /// The partner's side, run by the test below as a child of this test
    /// binary.
    #[test]
    #[ignore]
    fn raw_pingpong_partner() {
        serve_partner_if_asked()
            .expect("IOPATH_RAW_PINGPONG set")
            .unwrap();
    }

    #[test]
    fn raw_pingpong_round_trips_with_a_partner_process() {
        let exe = std::env::current_exe().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let partner = "tools::ping::limit::tests::raw_pingpong_partner";
        let raw = RawPingPong::start(&exe, dir.path(), 50, |c| {
            c.args(["--exact", partner, "--ignored"])
                .stdout(std::process::Stdio::null())
                .spawn()
        })
        .unwrap();
        // Its socket went once the partner connected.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        let mut lat = Vec::new();
        raw.round_trips(50, &mut lat).unwrap();
        assert_eq!(lat.len(), 50);
        assert!(lat.iter().all(|&us| us > 0.0), "{lat:?}");
    }
}
