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
            for c in s.charts(&t, &self.placement) {
                r.chart(c);
            }
            r.table(t);
        }
        r
    }

    /// The table: GiB/s per row, median (min-max), spread and share of the
    /// limit; below it the ratios the experiment is about, from the
    /// medians (direct / the fio limit, n/a without fio, then direct / the
    /// own limit as well; each mode / direct; iopath's back end /
    /// qemu-storage-daemon, n/a without it), and the limit's notes.
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
        let percent = |a, b| Cell::or_na(ratio(a, b).map(|q| Cell::percent(q * 100.0, 1)));
        // The median of the measured row `name`.
        let m = |name: &str| {
            let ran = |r: &&Series| r.name == name && r.failed.is_none();
            Some(Stats::of(&self.rows.iter().find(ran)?.runs).median)
        };
        let lim = m(FIO_LIMIT).or(m(OWN_LIMIT));
        for r in &self.rows {
            if let Some(why) = &r.failed {
                t.not_run(r.name.as_str(), why, why);
                continue;
            }
            let s = Stats::of(&r.runs);
            t.row(vec![
                r.name.clone().into(),
                Cell::runs(&r.runs, Unit::Plain, 3),
                Cell::percent(s.spread * 100.0, 1),
                percent(Some(s.median), lim),
            ]);
        }
        let mode = |d| m(&mode_row(d));
        let direct = mode(DmaMode::Direct);
        t.figure("direct / fio limit", percent(direct, m(FIO_LIMIT)));
        if m(OWN_LIMIT).is_some() {
            t.figure("direct / own limit", percent(direct, m(OWN_LIMIT)));
        }
        for d in [DmaMode::DirectStatic, DmaMode::Iommu, DmaMode::Bounce] {
            t.figure(format!("{d} / direct"), percent(mode(d), direct));
        }
        let peer = "iopath blk serve / qemu-storage-daemon (dma direct)";
        t.figure(peer, percent(direct, m(PEER)));
        t.notes = self.limit.notes();
        t
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
