//! The report of `iopath bench blk`: its table, chart and figures, from
//! the measured rows in the parent module.

use super::*;
use crate::report::plot::{Bar, Line, Panel, OTHER, PEER as PEER_COLOR, PRIMARY};
use crate::report::{Cell, Chart, Column, Report, Table};

/// The ratio of the guest's bounced dd to its direct dd.
const SWIOTLB_RATIO: &str = "guest dd: swiotlb=force behind vIOMMU / direct (iopath blk serve)";

impl BlkReport {
    /// The report: the table of every row beside the limit, the ratios
    /// the experiment is about, the notes, the chart and every figure.
    pub fn report(&self) -> Report {
        let mut r = Report::new(
            "blk",
            format!(
                "{} MiB per run in {} KiB blocks, queue depth {}, {} runs per row; image in {} ({}); {}",
                self.bytes >> 20,
                self.bs >> 10,
                self.queue_depth,
                self.runs,
                self.image.parent().unwrap_or(&self.image).display(),
                self.image_on,
                self.placement
            ),
        );
        r.table(self.table());
        let mut chart = self.chart();
        if let Some(s) = &self.small_block {
            r.table(s.table(&self.placement));
            chart.panels.extend(s.panels());
            chart.columns = 1;
        }
        r.set_chart(chart);
        r.set_figures(self.json());
        r
    }

    /// The table: GiB/s per row, median (min-max), spread and share of the
    /// limit; the ratios of medians and what is missing below it.
    fn table(&self) -> Table {
        let mut t = Table::new(
            "",
            vec![
                Column::left("row"),
                Column::right("GiB/s, median (min-max)"),
                Column::right("spread"),
                Column::right("of limit"),
            ],
        );
        for r in &self.rows {
            match (&r.skipped, &r.missing) {
                (Some(_), Some(m)) => t.not_run(r.name.as_str(), m.note()),
                (Some(why), None) => t.not_run(r.name.as_str(), why.as_str()),
                (None, _) => t.row(vec![
                    r.name.clone().into(),
                    Cell::num(r.stats.median, 3).with_range(r.stats.min, r.stats.max),
                    Cell::percent(r.stats.spread * 100.0, 1),
                    Cell::or_na(r.of_limit.map(|v| Cell::percent(v * 100.0, 1))),
                ]),
            }
        }
        let mut notes: Vec<String> = self
            .ratios()
            .into_iter()
            .map(|(what, v)| match v {
                Some(v) => format!("{what}: {:.1}%", v * 100.0),
                None => format!("{what}: n/a"),
            })
            .collect();
        if let Some((what, p)) = self.paired_swiotlb() {
            notes.push(format!(
                "{what}, run by run: median {:.1}% ({:.1}-{:.1}%), spread {:.1}%",
                p.median * 100.0,
                p.min * 100.0,
                p.max * 100.0,
                p.spread * 100.0
            ));
        }
        if let Some(l) = &self.limit {
            notes.extend(l.notes());
        }
        notes.append(&mut t.notes);
        t.notes = notes;
        t
    }

    /// The median of the measured row `name`.
    fn median(&self, name: &str) -> Option<f64> {
        self.rows
            .iter()
            .find(|r| r.name == name && r.measured())
            .map(|r| r.stats.median)
    }

    /// The ratios the experiment is about, from the medians: direct / the
    /// fio limit (n/a without fio; then direct / the own limit as well),
    /// direct-static / direct, iommu / direct, bounce / direct, iopath's
    /// back end / qemu-storage-daemon (both with direct ops; n/a without
    /// it); with the guest rows, the guest's dd on iopath's back end / on
    /// qemu-storage-daemon, and the guest's dd with `swiotlb=force` behind
    /// the vIOMMU / its direct dd, both on iopath's back end.
    pub fn ratios(&self) -> Vec<(&'static str, Option<f64>)> {
        let direct = self.median(&mode_row(DmaMode::Direct));
        let div = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) if b > 0.0 => Some(a / b),
            _ => None,
        };
        let mut v = vec![("direct / fio limit", div(direct, self.median(FIO_LIMIT)))];
        if self.median(OWN_LIMIT).is_some() {
            v.push(("direct / own limit", div(direct, self.median(OWN_LIMIT))));
        }
        v.extend([
            (
                "direct-static / direct",
                div(self.median(&mode_row(DmaMode::DirectStatic)), direct),
            ),
            (
                "iommu / direct",
                div(self.median(&mode_row(DmaMode::Iommu)), direct),
            ),
            (
                "bounce / direct",
                div(self.median(&mode_row(DmaMode::Bounce)), direct),
            ),
            (
                "iopath blk serve / qemu-storage-daemon (dma direct)",
                div(direct, self.median(PEER)),
            ),
        ]);
        if self.rows.iter().any(|r| r.name == GUEST_OURS) {
            v.push((
                "guest dd: iopath blk serve / qemu-storage-daemon",
                div(self.median(GUEST_OURS), self.median(GUEST_PEER)),
            ));
        }
        if self.rows.iter().any(|r| r.name == GUEST_SWIOTLB) {
            v.push((
                SWIOTLB_RATIO,
                div(self.median(GUEST_SWIOTLB), self.median(GUEST_OURS)),
            ));
        }
        v
    }

    /// The guest's swiotlb row over its direct row run by run (the two ran
    /// one after the other in each run): median, min-max and spread of the
    /// per-run ratios, when both rows were measured.
    pub fn paired_swiotlb(&self) -> Option<(&'static str, Stats)> {
        let runs = |name| {
            self.rows
                .iter()
                .find(|r| r.name == name && r.measured())
                .map(|r| &r.runs_gib_per_s)
        };
        let (bounced, direct) = (runs(GUEST_SWIOTLB)?, runs(GUEST_OURS)?);
        let ratios: Vec<f64> = bounced
            .iter()
            .zip(direct)
            .filter(|(_, &d)| d > 0.0)
            .map(|(b, d)| b / d)
            .collect();
        (!ratios.is_empty()).then(|| (SWIOTLB_RATIO, Stats::of(&ratios)))
    }

    /// The report as JSON: every row (a skipped row has null figures and,
    /// when a peer is missing, `missing`), the ratios (null: n/a), the
    /// limit's source and sweep.
    fn json(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).unwrap_or_default();
        let r: serde_json::Map<String, serde_json::Value> = self
            .ratios()
            .into_iter()
            .map(|(k, v)| (k.to_string(), serde_json::json!(v)))
            .collect();
        v["ratios"] = serde_json::Value::Object(r);
        if let Some((what, p)) = self.paired_swiotlb() {
            v["paired_ratios"] = serde_json::json!({ what: p });
        }
        if let Some(l) = &self.limit {
            v["limit"] = l.json();
        }
        if let Some(s) = &self.small_block {
            let r: serde_json::Map<String, serde_json::Value> = s
                .ratios()
                .into_iter()
                .map(|(k, v)| (k, serde_json::json!(v)))
                .collect();
            v["small_block"]["ratios"] = serde_json::Value::Object(r);
        }
        v
    }

    /// The chart: GiB/s per row with min-max whiskers, iopath's modes,
    /// qemu-storage-daemon's bar beside them, the limit as a line.
    fn chart(&self) -> Chart {
        let bars: Vec<Bar> = self.rows[1..]
            .iter()
            .map(|r| {
                let color = if r.name == PEER {
                    PEER_COLOR
                } else if r.name.starts_with("guest") {
                    OTHER
                } else {
                    PRIMARY
                };
                let label = r
                    .name
                    .replace("iopath blk serve, dma ", "")
                    .replace("qemu-storage-daemon (peer), dma direct", "qsd (direct)")
                    .replace(
                        "guest dd (Linux, TCG) on iopath blk serve, swiotlb=force behind vIOMMU",
                        "guest/iopath swiotlb",
                    )
                    .replace("guest dd (Linux, TCG) on iopath blk serve", "guest/iopath")
                    .replace("guest dd (Linux, TCG) on qemu-storage-daemon", "guest/qsd");
                if r.measured() {
                    Bar {
                        label,
                        segments: vec![(0.0, r.stats.median, color)],
                        whisker: Some((r.stats.min, r.stats.max)),
                    }
                } else {
                    Bar {
                        label: format!("{label} (not run)"),
                        segments: Vec::new(),
                        whisker: None,
                    }
                }
            })
            .collect();
        let mut lines = Vec::new();
        if let (Some(l), Some(row)) = (&self.limit, self.rows.first()) {
            lines.push(Line::span(
                format!("{} ({:.2} GiB/s)", l.label(), row.stats.median),
                0,
                bars.len(),
                row.stats.median,
            ));
        }
        let panel = Panel {
            title: format!(
                "{} MiB per run, bs {} KiB, queue depth {}, {} runs; image in {}",
                self.bytes >> 20,
                self.bs >> 10,
                self.queue_depth,
                self.runs,
                self.image_on
            ),
            y_desc: "GiB/s, median (min-max)".into(),
            log: false,
            bars,
            lines,
            legend: vec![
                ("iopath blk serve, per DMA mode".into(), PRIMARY),
                ("qemu-storage-daemon".into(), PEER_COLOR),
            ],
        };
        Chart {
            title: "bench blk: dd through each DMA mode".into(),
            panels: vec![panel],
            columns: 1,
        }
    }
}
