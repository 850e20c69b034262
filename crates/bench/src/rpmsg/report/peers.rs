//! The peer rows of `iopath bench rpmsg` (OpenAMP's driver and iopath's
//! endpoint fd and Bus API against OpenAMP's echo and iopath's remote):
//! their tables, figures and chart panels.

use super::super::peers::{
    Driver, PeerPlacement, PeerRow, Remote, OPENAMP_EVENT, OPENAMP_SHM, PEER_WARM, SIZE,
};
use super::super::RpmsgReport;
use crate::report::plot::{Bar, Panel, PEER, PRIMARY, SECONDARY};
use crate::report::{Cell, Column, Table};
use crate::{Latency, Summary};

impl RpmsgReport {
    /// The table of one peer placement: round trips/s per pair, p50, p99,
    /// and each pair over OpenAMP's own (by round trips/s and by p50).
    pub(super) fn peer_table(&self, m: &PeerPlacement, place: &str) -> Table {
        let mut t = Table::new(
            self.peers_heading(m, place),
            vec![
                Column::left("driver side"),
                Column::left("remote"),
                Column::right("round trips/s, median (min-max)"),
                Column::right("p50 us"),
                Column::right("p99 us"),
                Column::right("/ OpenAMP pair"),
                Column::right("by p50"),
            ],
        );
        let pair = m.row(Driver::OpenAmp, Remote::OpenAmp);
        for r in &m.rows {
            let mut cells = vec![Cell::text(r.driver.name()), Cell::text(r.remote.name())];
            if r.runs.is_empty() {
                cells.extend([
                    Cell::text("failed"),
                    Cell::Empty,
                    Cell::Empty,
                    Cell::NotAvailable,
                    Cell::NotAvailable,
                ]);
            } else {
                let s = rate(r);
                cells.extend([
                    Cell::grouped(s.median, 0).with_range(s.min, s.max),
                    Cell::num(median_of(r, |l| l.p50_us), 1),
                    Cell::num(median_of(r, |l| l.p99_us), 1),
                    Cell::or_na(rate_ratio(r, pair).map(|(v, _)| Cell::times(v))),
                    Cell::or_na(p50_ratio(r, pair).map(Cell::times)),
                ]);
            }
            t.row(cells);
        }
        for r in &m.rows {
            for f in &r.failures {
                t.note(format!(
                    "note: a run of {} <-> {} failed: {f}",
                    r.driver.name(),
                    r.remote.name()
                ));
            }
        }
        t
    }

    fn peers_heading(&self, m: &PeerPlacement, place: &str) -> String {
        format!(
            "rpmsg peers, placement {} ({place}): {} runs, up to {} strict {}-byte round trips per row \
             (at most {} s) after {} unmeasured, the pairs taking turns; OpenAMP's demo platform \
             ({}, a byte per kick on unix:{}); OpenAMP from {}",
            m.placement.name(),
            self.runs,
            self.count,
            SIZE,
            self.peer_budget.as_secs(),
            PEER_WARM,
            OPENAMP_SHM,
            OPENAMP_EVENT,
            self.openamp
                .as_deref()
                .map_or_else(|| "-".into(), |d| d.display().to_string())
        )
    }

    /// `peers` for the JSON report: every peer placement's rows, or
    /// `missing`.
    pub(super) fn peers_json(&self) -> serde_json::Value {
        match &self.peers {
            None => serde_json::json!({ "missing": MISSING }),
            Some(all) => {
                let placements: Vec<serde_json::Value> = all
                    .iter()
                    .zip(&self.peer_wheres)
                    .map(|(m, place)| {
                        let pair = m.row(Driver::OpenAmp, Remote::OpenAmp);
                        let rows: Vec<serde_json::Value> = m
                            .rows
                            .iter()
                            .map(|r| {
                                serde_json::json!({
                                    "driver": r.driver.key(),
                                    "remote": r.remote.key(),
                                    "driver_name": r.driver.name(),
                                    "remote_name": r.remote.name(),
                                    "runs": r.runs,
                                    "round_trips_per_s": rate(r).json(),
                                    "p50_us": median_of(r, |l| l.p50_us),
                                    "p99_us": median_of(r, |l| l.p99_us),
                                    "over_openamp_pair": rate_ratio(r, pair).map(|(v, _)| v),
                                    "over_openamp_pair_by_p50": p50_ratio(r, pair),
                                    "failures": r.failures,
                                })
                            })
                            .collect();
                        serde_json::json!({
                            "placement": m.placement.name(),
                            "where": place,
                            "rows": rows,
                        })
                    })
                    .collect();
                serde_json::json!({
                    "openamp": self.openamp,
                    "size": SIZE,
                    "warm": PEER_WARM,
                    "count": self.count,
                    "budget_s": self.peer_budget.as_secs(),
                    "notify": format!("unix:{}", OPENAMP_EVENT),
                    "shm": OPENAMP_SHM,
                    "placements": placements,
                })
            }
        }
    }

    /// A chart panel per peer placement: round trips/s per pair.
    pub(super) fn peers_panels(&self) -> Vec<Panel> {
        let Some(all) = &self.peers else {
            return Vec::new();
        };
        all.iter()
            .map(|m| Panel {
                title: format!("peers, placement {}: round trips/s", m.placement.name()),
                y_desc: "round trips/s".into(),
                log: false,
                bars: m
                    .rows
                    .iter()
                    .map(|r| {
                        let s = rate(r);
                        let color = match r.driver {
                            Driver::OpenAmp => PEER,
                            Driver::EptFd => PRIMARY,
                            Driver::Bus => SECONDARY,
                        };
                        Bar {
                            label: format!("{}/{}", r.driver.key(), r.remote.key()),
                            segments: vec![(
                                0.0,
                                if s.median.is_nan() { 0.0 } else { s.median },
                                color,
                            )],
                            whisker: (!s.median.is_nan()).then_some((s.min, s.max)),
                        }
                    })
                    .collect(),
                lines: Vec::new(),
                legend: vec![
                    ("OpenAMP driver".into(), PEER),
                    ("endpoint fd".into(), PRIMARY),
                    ("Bus API".into(), SECONDARY),
                ],
            })
            .collect()
    }
}

/// How much faster `a` is than `b` by the median round trip: `b`'s p50
/// over `a`'s (medians over runs). Unlike round trips/s, it does not
/// count the rare long stall a spinning peer takes when it loses its CPU.
pub(super) fn p50_ratio(a: &PeerRow, b: &PeerRow) -> Option<f64> {
    if a.runs.is_empty() || b.runs.is_empty() {
        return None;
    }
    Some(median_of(b, |l| l.p50_us) / median_of(a, |l| l.p50_us))
}

/// A peer row's round trips/s over its runs.
fn rate(r: &PeerRow) -> Summary {
    let v: Vec<f64> = r.runs.iter().map(|l| l.msgs_per_s).collect();
    Summary::of(&v)
}

/// Median over runs of one latency figure.
fn median_of(r: &PeerRow, f: impl Fn(&Latency) -> f64) -> f64 {
    let v: Vec<f64> = r.runs.iter().map(f).collect();
    Summary::of(&v).median
}

/// `a`'s round trips/s over `b`'s: the ratio of the medians, and the
/// spread of the per-run ratios (run i of one against run i of the other:
/// they ran side by side).
pub(super) fn rate_ratio(a: &PeerRow, b: &PeerRow) -> Option<(f64, Option<(f64, f64)>)> {
    let (ra, rb) = (rate(a), rate(b));
    if a.runs.is_empty() || b.runs.is_empty() || rb.median <= 0.0 {
        return None;
    }
    let per: Vec<f64> = a
        .runs
        .iter()
        .zip(&b.runs)
        .map(|(x, y)| x.msgs_per_s / y.msgs_per_s)
        .collect();
    let s = Summary::of(&per);
    Some((ra.median / rb.median, Some((s.min, s.max))))
}

/// The note in place of the peer rows without `--openamp`.
pub(super) const MISSING: &str =
    "the OpenAMP peer rows (OpenAMP's driver and iopath's endpoint fd and Bus \
API, each against OpenAMP's rpmsg-echo and iopath's remote) are missing: no --openamp DIR \
(build DIR with `scripts/openamp-demo build SRC DIR`)";
