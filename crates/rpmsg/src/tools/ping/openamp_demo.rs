//! OpenAMP's `rpmsg-echo-ping` on iopath's bus: the host's side of the
//! demo, against OpenAMP's `rpmsg-echo` or any remote echoing its channel.

use std::fmt;
use std::time::{Duration, Instant};

use super::PingError;
use crate::tools::openamp::{self, SERVICE};
use crate::wire::ADDR_ANY;
use crate::{Bus, Endpoint, EndpointOptions, Stats};

/// What [`openamp_demo`] saw (as JSON, `elapsed` is `elapsed_us`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct DemoReport {
    /// Payloads sent (data sizes 1..=`payloads`).
    pub payloads: usize,
    /// Echoes that came back wrong.
    pub errors: u64,
    /// Wall time of the round trips.
    #[serde(rename = "elapsed_us", serialize_with = "micros")]
    pub elapsed: Duration,
    /// The bus's counters once the session ended.
    pub stats: Stats,
}

fn micros<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(d.as_micros() as u64)
}

/// `480 payloads (sizes 1..480) echoed, errors 0, 12.3 ms`.
impl fmt::Display for DemoReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.payloads;
        write!(
            f,
            "{n} payloads (sizes 1..{n}) echoed, errors {}, {:.1} ms",
            self.errors,
            self.elapsed.as_secs_f64() * 1e3
        )
    }
}

/// Waits up to `timeout` for the remote on `bus` to announce the channel
/// `name` of `ep`, which binds it.
///
/// # Errors
/// [`PingError::NotAnnounced`], or [`PingError::LinkDown`] before the
/// channel came.
pub fn wait_announced(
    bus: &Bus,
    ep: &Endpoint,
    name: &str,
    timeout: Duration,
) -> Result<(), PingError> {
    let start = Instant::now();
    while ep.dst() == ADDR_ANY {
        if start.elapsed() >= timeout {
            let name = name.to_owned();
            return Err(PingError::NotAnnounced { name, timeout });
        }
        if let Some(reason) = bus.down_reason() {
            return Err(PingError::LinkDown { reason });
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

/// Runs the demo on `bus` (the host's): creates an endpoint on
/// [`SERVICE`], waits up to `timeout` for the remote to announce it, sends
/// payloads with data sizes 1 to what a buffer holds (480 at 512 bytes)
/// one at a time, each echo checked, then
/// ends the session as the demo does: the endpoint is destroyed (a
/// name-service DESTROY) and the bus flushed so the remote takes it.
/// Wrong echoes are counted, not fatal; `on_wrong(num, size)` hears of each.
///
/// # Errors
/// [`PingError::NotAnnounced`], [`PingError::LinkDown`] before the
/// channel came, [`PingError::Bus`] for a failed send or a missing echo.
pub fn openamp_demo(
    bus: &Bus,
    timeout: Duration,
    mut on_wrong: impl FnMut(usize, usize),
) -> Result<DemoReport, PingError> {
    let bus_err = |what: String| move |source| PingError::Bus { what, source };
    let ep = bus
        .create(EndpointOptions::new(SERVICE))
        .map_err(bus_err("Creating the demo endpoint".into()))?;
    wait_announced(bus, &ep, SERVICE, timeout)?;
    let mut errors = 0u64;
    let t0 = Instant::now();
    // Sizes 1 up to what one buffer holds, as OpenAMP's ping counts them
    // from its tx buffer size: 480 with 512-byte buffers.
    let max_data = bus.max_payload().saturating_sub(openamp::HEADER_LEN);
    let mut p = vec![0u8; openamp::HEADER_LEN + max_data];
    for (num, size) in (1..=max_data).enumerate() {
        let len = openamp::write_payload(&mut p, num as u64, size);
        ep.send(&p[..len])
            .map_err(bus_err(format!("Sending payload {num}")))?;
        let m = ep
            .recv(Some(timeout))
            .map_err(bus_err(format!("Waiting for echo {num}")))?;
        if !openamp::is_payload(&m.data, num as u64, size) {
            errors += 1;
            on_wrong(num, size);
        }
    }
    let elapsed = t0.elapsed();
    drop(ep);
    bus.flush(Duration::from_secs(2));
    Ok(DemoReport {
        payloads: max_data,
        errors,
        elapsed,
        stats: bus.stats(),
    })
}
