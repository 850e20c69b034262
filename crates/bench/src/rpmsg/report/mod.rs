//! The report of `iopath bench rpmsg`, from the measured rows in the
//! parent module: per placement the create+destroy table and the echo
//! table, the polling echo, the scale tables, the peer tables and the
//! targets ([`crate::report::Report`]); the chart; every figure as JSON.

mod chart;
mod json;
mod peers;
mod tables;
mod targets;

use super::*;
use crate::report::Report;

pub(super) use json::placement_json;

impl RpmsgReport {
    /// Adds the scale experiments' tables (before the peer rows and the
    /// targets), their figures (JSON `scale`), their chart panels and their
    /// targets (256 endpoints against one, no endpoint starved).
    pub fn add_scale(&mut self, sc: &super::scale::ScaleReport) {
        self.scale = Some((sc.tables(), sc.json()));
        self.scale_panels = sc.panels();
    }

    /// Adds the bulk rows: their table (after the scale tables), their
    /// figures (JSON `bulk`), their chart panel and their targets.
    pub fn add_bulk(&mut self, b: super::bulk::BulkReport) {
        self.bulk = Some(b);
    }

    /// The report: per placement the create+destroy and echo tables, the
    /// polling echo (with `poll`), the scale tables (when added), the peer
    /// tables (or a note that they are missing) and the targets.
    pub fn report(&self) -> Report {
        let mut r = Report::new(
            "rpmsg",
            format!(
                "rpmsg endpoints, {} runs, {} echo round trips per row; {}",
                self.runs,
                self.count,
                self.load_text()
            ),
        );
        for (m, place) in self.measured.iter().zip(&self.wheres) {
            r.table(tables::create_destroy(m, place, self.runs));
            r.table(tables::echo(m, self.count));
        }
        if let Some(pm) = &self.poll {
            r.table(tables::poll(pm, self.count));
        }
        if let Some((tables, _)) = &self.scale {
            for t in tables {
                r.table(t.clone());
            }
        }
        if let Some(b) = &self.bulk {
            r.table(b.table());
        }
        match &self.peers {
            None => r.note(format!("note: {}", peers::MISSING)),
            Some(all) => {
                for (m, place) in all.iter().zip(&self.peer_wheres) {
                    r.table(self.peer_table(m, place));
                }
            }
        }
        r.table(targets::table(&self.targets(), &self.load_text()));
        r.set_chart(self.chart());
        r.set_figures(self.json());
        r
    }

    /// The load average in words (other work moves every figure, the
    /// spinning OpenAMP pair's most).
    fn load_text(&self) -> String {
        let f = |v: Option<f64>| v.map_or_else(|| "?".into(), |v| format!("{v:.2}"));
        format!(
            "1-minute load average {} before, {} after",
            f(self.loadavg.0),
            f(self.loadavg.1)
        )
    }
}

/// Each way's per-cycle microseconds over every chunk of every row.
fn per_cycle(rows: &[Row]) -> [Summary; WAYS] {
    std::array::from_fn(|w| {
        let v: Vec<f64> = rows
            .iter()
            .flat_map(|r| r.chunks[w].iter().copied())
            .collect();
        Summary::of(&v)
    })
}

/// 1k, 10k, 100k, 1500.
fn short_count(n: u64) -> String {
    if n >= 1000 && n % 1000 == 0 {
        format!("{}k", n / 1000)
    } else {
        n.to_string()
    }
}
