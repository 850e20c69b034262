//! The bulk rows' report: a table, a chart panel of MB/s by message size,
//! the figures as JSON; they join the rpmsg report
//! ([`crate::rpmsg::RpmsgReport::add_bulk`]).

use serde_json::json;

use super::BulkRow;
use crate::report::plot::{Bar, Panel, LIMIT, OTHER, PRIMARY, SECONDARY};
use crate::report::{Cell, Column, Table, Unit};
use crate::Summary;

/// The memcpy limit's bars, grey beside the raw socket's red.
const MEMCPY: crate::report::plot::RGBColor = OTHER;

/// What the bulk rows measured.
#[derive(Debug)]
pub struct BulkReport {
    pub(super) runs: usize,
    pub(super) bytes: u64,
    pub(super) wheres: String,
    pub(super) rows: Vec<BulkRow>,
}

fn median(v: &[f64]) -> f64 {
    Summary::of(v).median
}

impl BulkReport {
    /// The table: MB/s of each way per message size, and the two ratios
    /// to their limits.
    pub(crate) fn table(&self) -> Table {
        let range = |v: &[f64]| Cell::runs(v, Unit::Grouped, 0);
        let mut t = Table::new(
            format!(
                "bulk, {}: one-way streams of {} MiB per row over 64 KiB buffers, MB/s, medians (min-max) over {} runs",
                self.wheres,
                self.bytes >> 20,
                self.runs
            ),
            vec![
                Column::left("message"),
                Column::right("endpoint fd"),
                Column::right("raw SOCK_SEQPACKET (limit)"),
                Column::right("fd / raw"),
                Column::right("Bus API, zero-copy receive"),
                Column::right("memcpy, one thread (limit)"),
                Column::right("Bus / memcpy"),
            ],
        );
        for r in &self.rows {
            t.row(vec![
                Cell::text(format!("{} B", r.size)),
                range(&r.fd),
                range(&r.raw),
                Cell::times(median(&r.fd) / median(&r.raw)),
                range(&r.bus),
                range(&r.memcpy),
                Cell::times(median(&r.bus) / median(&r.memcpy)),
            ]);
        }
        t
    }

    /// MB/s by message size: each way beside its limit.
    pub(crate) fn panel(&self) -> Panel {
        let bar = Bar::runs;
        Panel {
            title: format!(
                "bulk one-way streams, {}: MB/s by message size",
                self.wheres
            ),
            y_desc: "MB/s (log)".into(),
            log: true,
            bars: self
                .rows
                .iter()
                .flat_map(|r| {
                    [
                        bar(format!("{} fd", r.size), &r.fd, PRIMARY),
                        bar(format!("{} raw", r.size), &r.raw, LIMIT),
                        bar(format!("{} Bus", r.size), &r.bus, SECONDARY),
                        bar(format!("{} memcpy", r.size), &r.memcpy, MEMCPY),
                    ]
                })
                .collect(),
            lines: Vec::new(),
            legend: vec![
                ("endpoint fd".into(), PRIMARY),
                ("limit: raw SOCK_SEQPACKET".into(), LIMIT),
                ("Bus API (zero-copy receive)".into(), SECONDARY),
                ("limit: memcpy, one thread".into(), MEMCPY),
            ],
        }
    }

    /// Every figure as JSON.
    pub(crate) fn json(&self) -> serde_json::Value {
        json!({
            "where": self.wheres,
            "runs": self.runs,
            "bytes_per_row": self.bytes,
            "buffer_size": super::BUF,
            "rows": self.rows.iter().map(|r| json!({
                "size": r.size,
                "messages": r.msgs,
                "endpoint_fd_mb_s": r.fd,
                "raw_seqpacket_mb_s": r.raw,
                "bus_api_mb_s": r.bus,
                "memcpy_mb_s": r.memcpy,
                "fd_vs_raw": median(&r.fd) / median(&r.raw),
                "bus_vs_memcpy": median(&r.bus) / median(&r.memcpy),
            })).collect::<Vec<_>>(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_make_the_table_panel_and_figures() {
        let r = BulkReport {
            runs: 3,
            bytes: 32 << 20,
            wheres: "split".into(),
            rows: vec![BulkRow {
                size: 4096,
                msgs: 8192,
                fd: vec![700.0, 800.0, 900.0],
                raw: vec![1000.0, 1000.0, 1100.0],
                bus: vec![2000.0, 2500.0, 2600.0],
                memcpy: vec![5000.0, 5000.0, 5000.0],
            }],
        };
        let p = r.panel();
        let medians: Vec<f64> = p.bars.iter().map(|b| b.segments[0].1).collect();
        assert_eq!(medians, [800.0, 1000.0, 2500.0, 5000.0]);
        assert_eq!(p.bars[0].whisker, Some((700.0, 900.0)));
        assert_eq!(r.table().rows.len(), 1);
        assert_eq!(r.json()["rows"][0]["fd_vs_raw"], 0.8);
    }
}
