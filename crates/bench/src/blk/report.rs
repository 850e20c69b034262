//! The report of `iopath bench blk`: its tables and chart.

use iopath_sys::human;

use super::*;
use crate::report::plot::{Chart, LIMIT, PEER as PEER_COLOR, PRIMARY};
use crate::report::{Cell, Column, Table, Unit};
use crate::Stats;

impl Measured {
    pub(super) fn report(&self) -> Report {
        let c = &self.cfg;
        let mut r = Report::new(
            "blk",
            format!(
                "{} MiB per run in {} KiB blocks, queue depth {}, {} runs per row; image in {} ({}); {}",
                c.size >> 20,
                c.bs >> 10,
                c.queue_depth,
                c.runs,
                self.image.parent().unwrap_or(&self.image).display(),
                self.image_on,
                self.placement
            ),
        );
        r.context(serde_json::json!({"bytes": c.size, "bs": c.bs, "queue_depth": c.queue_depth,
            "runs": c.runs, "image": self.image, "image_on": self.image_on, "placement": self.placement,
            "limit": self.limit.context()}));
        let t = self.table();
        r.chart(self.chart(&t));
        r.table(t);
        if let Some(s) = &self.small {
            let t = s.table(&self.placement);
            s.charts(&t, &self.placement)
                .into_iter()
                .for_each(|c| r.chart(c));
            r.table(t);
        }
        r
    }

    /// The table: GiB/s per row, median (min-max), spread and share of the
    /// limit; below it the ratios of medians and the limit's notes.
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
        let lim = self.median(FIO_LIMIT).or(self.median(OWN_LIMIT));
        for r in &self.rows {
            if let Some(why) = &r.failed {
                t.not_run(r.name.as_str(), why.as_str(), why.as_str());
                continue;
            }
            let s = Stats::of(&r.runs);
            t.row(vec![
                r.name.clone().into(),
                Cell::runs(&r.runs, Unit::Plain, 3),
                Cell::percent(s.spread * 100.0, 1),
                Cell::or_na(
                    lim.filter(|l| *l > 0.0)
                        .map(|l| Cell::percent(s.median / l * 100.0, 1)),
                ),
            ]);
        }
        for (what, v) in self.ratios() {
            t.figure(what, Cell::or_na(v.map(|v| Cell::percent(v * 100.0, 1))));
        }
        t.notes = self.limit.notes();
        t
    }

    /// The median of the measured row `name`.
    fn median(&self, name: &str) -> Option<f64> {
        let r = self
            .rows
            .iter()
            .find(|r| r.name == name && r.failed.is_none());
        Some(Stats::of(&r?.runs).median)
    }

    /// The ratios the experiment is about, from the medians: direct / the
    /// fio limit (n/a without fio; then direct / the own limit as well),
    /// each mode / direct, iopath's back end / qemu-storage-daemon (n/a
    /// without it).
    fn ratios(&self) -> Vec<(&'static str, Option<f64>)> {
        let m = |name: &str| self.median(name);
        let mode = |d| m(&mode_row(d));
        let div = |a: Option<f64>, b: Option<f64>| Some(a? / b.filter(|b| *b > 0.0)?);
        let direct = mode(DmaMode::Direct);
        let mut v = vec![("direct / fio limit", div(direct, m(FIO_LIMIT)))];
        if m(OWN_LIMIT).is_some() {
            v.push(("direct / own limit", div(direct, m(OWN_LIMIT))));
        }
        let (static_, iommu, bounce) = (DmaMode::DirectStatic, DmaMode::Iommu, DmaMode::Bounce);
        v.push(("direct-static / direct", div(mode(static_), direct)));
        v.push(("iommu / direct", div(mode(iommu), direct)));
        v.push(("bounce / direct", div(mode(bounce), direct)));
        let peer = "iopath blk serve / qemu-storage-daemon (dma direct)";
        v.push((peer, div(direct, m(PEER))));
        v
    }

    /// The chart: GiB/s per row with min-max whiskers: the limit, each
    /// DMA mode of iopath's back end, qemu-storage-daemon's.
    fn chart(&self, t: &Table) -> Chart {
        let c = &self.cfg;
        let bs = match c.bs {
            b if b % (1 << 20) == 0 => format!("{}m", b >> 20),
            b if b % 1024 == 0 => format!("{}k", b >> 10),
            b => b.to_string(),
        };
        let title = format!(
            "virtio-blk dd write, {} blocks: GiB/s by DMA mode",
            human(c.bs as u64)
        );
        let about = format!(
            "{} per run, queue depth {}, median (min-max) of {} runs; image in {}; {}",
            human(c.size as u64),
            c.queue_depth,
            c.runs,
            self.image_on,
            self.placement
        );
        let mut chart = Chart::new(format!("blk-{bs}-throughput-by-dma-mode"), title, "GiB/s")
            .about(about, "GiB/s, higher is faster")
            .legend(&[
                ("iopath blk serve, per DMA mode", PRIMARY),
                ("qemu-storage-daemon", PEER_COLOR),
                ("limit", LIMIT),
            ]);
        let v = t.col("GiB/s, median (min-max)");
        for row in &t.rows {
            let name = row[0].to_string();
            let color = match name.as_str() {
                FIO_LIMIT | OWN_LIMIT => LIMIT,
                PEER => PEER_COLOR,
                _ => PRIMARY,
            };
            chart.bar(name, &row[v], color);
        }
        chart
    }
}
