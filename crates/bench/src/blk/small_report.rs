//! The small-block table's part of the `iopath bench blk` report: its
//! table, the ratios the experiment is about, and a chart of IOPS by
//! queue depth.

use super::small::{SmallReport, SmallRow, ADAPTIVE, BUSY, FIO, QSD, SLEEP, TWO_QUEUES};
use crate::report::plot::{Bar, Line, Panel, PEER as PEER_COLOR, PRIMARY, SECONDARY};
use crate::report::{Cell, Column, Table};

impl SmallReport {
    fn find(&self, name: &str, op: &str, qd: usize) -> Option<&SmallRow> {
        self.rows
            .iter()
            .find(|r| r.name == name && r.op == op && r.queue_depth == qd && r.skipped.is_none())
    }

    fn depths(&self) -> Vec<usize> {
        let mut d: Vec<usize> = self.rows.iter().map(|r| r.queue_depth).collect();
        d.sort_unstable();
        d.dedup();
        d
    }

    /// The table: IOPS (min-max), p50, p99, CPU per request, share of
    /// fio's IOPS at the same direction and depth.
    pub(super) fn table(&self, placement: &str) -> Table {
        let mut t = Table::new(
            format!(
                "4 KiB random I/O, {} requests per run, {} runs per row, median; {placement}",
                self.count, self.runs
            ),
            vec![
                Column::left("row"),
                Column::left("op"),
                Column::right("QD"),
                Column::right("IOPS, median (min-max)"),
                Column::right("p50"),
                Column::right("p99"),
                Column::right("CPU per request"),
                Column::right("of fio"),
            ],
        );
        for r in &self.rows {
            let head = vec![
                r.name.clone().into(),
                r.op.into(),
                Cell::num(r.queue_depth as f64, 0),
            ];
            if let Some(why) = &r.skipped {
                t.not_run(
                    format!("{} {} qd {}", r.name, r.op, r.queue_depth),
                    why.as_str(),
                );
                continue;
            }
            let lim = self.find(FIO, r.op, r.queue_depth).map(|f| f.iops.median);
            let rest = vec![
                Cell::grouped(r.iops.median, 0).with_range(r.iops.min, r.iops.max),
                Cell::micros(r.p50_us, 1),
                Cell::micros(r.p99_us, 1),
                Cell::micros(r.cpu_us, 1),
                Cell::or_na(
                    lim.filter(|l| *l > 0.0)
                        .map(|l| Cell::percent(r.iops.median / l * 100.0, 1)),
                ),
            ];
            t.row([head, rest].concat());
        }
        let mut notes: Vec<String> = self
            .ratios()
            .into_iter()
            .map(|(what, v)| match v {
                Some(v) => format!("{what}: {v:.2}x"),
                None => format!("{what}: n/a"),
            })
            .collect();
        notes.append(&mut t.notes);
        t.notes = notes;
        t
    }

    /// The ratios the table is about, from the medians.
    pub(super) fn ratios(&self) -> Vec<(String, Option<f64>)> {
        let iops = |n: &str, op: &str, qd| self.find(n, op, qd).map(|r| r.iops.median);
        let p50 = |n: &str, op: &str, qd| self.find(n, op, qd).map(|r| r.p50_us);
        let div = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) if b > 0.0 => Some(a / b),
            _ => None,
        };
        let deep = self.depths().into_iter().max().unwrap_or(1);
        let mut v = Vec::new();
        for op in ["read", "write"] {
            v.push((
                format!("{op} qd 1: --poll / qemu-storage-daemon, IOPS"),
                div(iops(BUSY, op, 1), iops(QSD, op, 1)),
            ));
            v.push((
                format!("{op} qd 1: --poll / fio, p50 latency"),
                div(p50(BUSY, op, 1), p50(FIO, op, 1)),
            ));
            v.push((
                format!("{op} qd 1: adaptive / qemu-storage-daemon, IOPS"),
                div(iops(ADAPTIVE, op, 1), iops(QSD, op, 1)),
            ));
            v.push((
                format!("{op} qd 1: adaptive / sleeping, IOPS"),
                div(iops(ADAPTIVE, op, 1), iops(SLEEP, op, 1)),
            ));
            v.push((
                format!("{op} qd {deep}: adaptive / qemu-storage-daemon, IOPS"),
                div(iops(ADAPTIVE, op, deep), iops(QSD, op, deep)),
            ));
            v.push((
                format!("{op} qd {deep}: adaptive / fio, IOPS"),
                div(iops(ADAPTIVE, op, deep), iops(FIO, op, deep)),
            ));
            v.push((
                format!("{op} qd {deep}: 2 queues / 1 queue (adaptive), IOPS"),
                div(iops(TWO_QUEUES, op, deep), iops(ADAPTIVE, op, deep)),
            ));
        }
        v
    }

    /// One panel per direction: IOPS by queue depth, a bar per row and
    /// depth, fio's IOPS at each depth as a line.
    pub(super) fn panels(&self) -> Vec<Panel> {
        let short = |n: &str| {
            match n {
                SLEEP => "sleep",
                ADAPTIVE => "adaptive",
                BUSY => "--poll",
                QSD => "qsd",
                TWO_QUEUES => "adaptive 2q",
                other => other,
            }
            .to_string()
        };
        let depths = self.depths();
        ["read", "write"]
            .into_iter()
            .map(|op| {
                let mut bars = Vec::new();
                let mut lines = Vec::new();
                for &qd in &depths {
                    let start = bars.len();
                    for r in self
                        .rows
                        .iter()
                        .filter(|r| r.op == op && r.queue_depth == qd && r.name != FIO)
                    {
                        let color = match r.name.as_str() {
                            QSD => PEER_COLOR,
                            SLEEP => SECONDARY,
                            _ => PRIMARY,
                        };
                        bars.push(Bar {
                            label: format!("{} qd{qd}", short(&r.name)),
                            segments: if r.skipped.is_none() {
                                vec![(0.0, r.iops.median, color)]
                            } else {
                                Vec::new()
                            },
                            whisker: r.skipped.is_none().then_some((r.iops.min, r.iops.max)),
                        });
                    }
                    if let Some(f) = self.find(FIO, op, qd) {
                        lines.push(Line::span(
                            format!("fio qd{qd} ({:.0} IOPS)", f.iops.median),
                            start,
                            bars.len(),
                            f.iops.median,
                        ));
                    }
                }
                Panel {
                    title: format!("4 KiB random {op}: IOPS by queue depth"),
                    y_desc: "IOPS, median (min-max)".into(),
                    log: true,
                    bars,
                    lines,
                    legend: vec![
                        ("iopath blk serve, sleeping".into(), SECONDARY),
                        ("iopath blk serve, adaptive / --poll".into(), PRIMARY),
                        ("qemu-storage-daemon".into(), PEER_COLOR),
                    ],
                }
            })
            .collect()
    }
}
