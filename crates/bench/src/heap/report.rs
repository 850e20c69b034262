//! The report of `iopath bench heap`: its tables and chart.

use iopath_sys::human;
use serde_json::json;

use super::Measured;
use crate::limit::Limit;
use crate::report::plot::{Chart, LIMIT, OTHER, PRIMARY, SECONDARY};
use crate::report::{Cell, Column, Report, Table, Unit};
use crate::Stats;

fn median(v: &[f64]) -> f64 {
    Stats::of(v).median
}

impl Measured {
    /// The report: every heap x method beside the limit and the alloc-only
    /// bound, the dma-buf table, the notes and the chart.
    pub(super) fn report(&self) -> Report {
        let mut r = Report::new(
            "heap",
            format!(
                "{} x {} buffers from {} ({}, {}), {} run(s), each from a cold page cache; medians, spread = (max-min)/median",
                self.buffers,
                human(self.buffer_size as u64),
                self.file.display(),
                human(self.bytes),
                self.fs,
                self.runs
            ),
        );
        r.context(json!({"file": self.file, "fs": self.fs, "bytes": self.bytes, "buffers": self.buffers,
            "buffer_size": self.buffer_size, "runs": self.runs, "loadavg": [self.loadavg.0, self.loadavg.1],
            "limit": self.limit.as_ref().map(|l| l.context())}));
        if self.limit.is_some() {
            let t = self.table();
            r.chart(self.chart(&t));
            r.table(t);
        }
        let t = self.dma_buf_table();
        let c = Chart::new("dma-buf-fill-time", "Filling dma-bufs from a file: time per route", "ms")
            .about(format!("{} from a cold page cache, median of {} runs; the proposal's six rows allocate, then read; iopath's and the pool's overlap the two", human(self.bytes), self.runs), "ms, lower is faster")
            .legend(&[("total", PRIMARY), ("alloc", OTHER), ("read", SECONDARY)]);
        r.chart(load_times(c, &t, |row| row[0].to_string()));
        r.table(t);
        if self.rows.iter().any(|r| r.heap == "memfd:thp") {
            let mode = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
                .ok()
                .and_then(|m| Some(m.split_once('[')?.1.split_once(']')?.0.to_string()));
            if let Some(mode) = mode.filter(|m| m == "never" || m == "deny") {
                r.note(format!(
                    "note: memfd:thp gets no huge pages here (shmem_enabled: {mode})"
                ));
            }
        }
        if self.warm_warnings > 0 {
            r.note(format!(
                "warning: {} run(s) started with more than 1% of the file cached",
                self.warm_warnings
            ));
        }
        if let (Some(a), Some(b)) = self.loadavg {
            r.note(format!(
                "load average (1 min) {a:.2} before, {b:.2} after, on {} CPU(s)",
                std::thread::available_parallelism().map_or(0, |n| n.get())
            ));
        }
        r
    }

    /// The table: every heap x method, the limit, the alloc-only bound.
    fn table(&self) -> Table {
        let mut t = Table::new(
            "",
            vec![
                Column::left("heap"),
                Column::left("method"),
                Column::right("alloc ms"),
                Column::right("read ms"),
                Column::right("total ms"),
                Column::right("GiB/s"),
                Column::right("spread"),
                Column::right("of limit"),
                Column::right("page cache growth"),
            ],
        );
        let load_gib = self.bytes as f64 / f64::from(1u32 << 30);
        // The limit's runs, if it ran.
        let limit = self.limit.as_ref().map(Limit::stats);
        let limit = limit.filter(|s| s.median > 0.0);
        let of_limit = |g: f64| Cell::or_na(limit.map(|l| Cell::percent(g / l.median * 100.0, 0)));
        let ms = |v: &[f64]| Cell::median(v, Unit::Plain, 1);
        let gib = |v: &[f64]| Cell::median(v, Unit::Plain, 3);
        let spread = |v: &[f64]| Cell::percent(Stats::of(v).spread * 100.0, 1);
        for r in &self.rows {
            let method = match r.method == r.used {
                true => r.method.to_string(),
                false => format!("{} ({})", r.method, r.used),
            };
            if r.fallbacks > 0 {
                t.note(format!(
                    "{} {method}: {} request(s) fell back to buffered",
                    r.heap, r.fallbacks
                ));
            }
            let [alloc, read, total] = &r.ms;
            t.row(vec![
                r.heap.clone().into(),
                method.into(),
                ms(alloc),
                ms(read),
                ms(total),
                gib(&r.gib_per_s),
                spread(&r.gib_per_s),
                of_limit(median(&r.gib_per_s)),
                Cell::figure(r.cache_growth as f64, Unit::Bytes, 0),
            ]);
        }
        if let (Some(l), Some(s)) = (&self.limit, limit) {
            t.row(vec![
                if l.is_fio() { "limit" } else { "limit (own)" }.into(),
                l.label().into(),
                Cell::Empty,
                Cell::Empty,
                Cell::num(load_gib / s.median * 1e3, 1),
                gib(l.runs()),
                spread(l.runs()),
                Cell::percent(100.0, 0),
                Cell::Empty,
            ]);
        }
        let alloc: Vec<f64> = self.alloc_limit.iter().map(|s| load_gib / s).collect();
        let alloc_ms = median(&self.alloc_limit) * 1e3;
        t.row(vec![
            "alloc only".into(),
            self.alloc_heap.clone().into(),
            Cell::num(alloc_ms, 1),
            Cell::Empty,
            Cell::num(alloc_ms, 1),
            gib(&alloc),
            spread(&alloc),
            of_limit(median(&alloc)),
            Cell::Empty,
        ]);
        for (heap, needs, why) in &self.skipped {
            t.not_run(heap.as_str(), needs, why);
        }
        t.notes.extend(self.limit.iter().flat_map(|l| l.notes()));
        t.note(format!(
            "alloc only: {} x {} {} buffers allocated and faulted in (MADV_POPULATE_WRITE), no I/O",
            self.buffers,
            human(self.buffer_size as u64),
            self.alloc_heap
        ));
        t
    }

    /// The dma-buf table: the proposal's six rows, iopath's routes and the
    /// pool's two loads, with totals as ratios to `udmabuf direct read`
    /// (the reviewers' route), so that a slow guest's figures still compare.
    fn dma_buf_table(&self) -> Table {
        let mut t = Table::new(
            "dma-bufs filled from a file",
            vec![
                Column::left("row"),
                Column::right("alloc ms"),
                Column::right("read ms"),
                Column::right("total ms"),
                Column::right("total / udmabuf direct read"),
                Column::right("alloc / 1st load's"),
            ],
        );
        let reference = self
            .dma_buf
            .iter()
            .find(|r| r.label == "udmabuf direct read" && r.missing.is_none())
            .map(|r| median(&r.ms[2]));
        let mut first_alloc = None;
        for r in &self.dma_buf {
            if let Some((why, needs)) = &r.missing {
                t.not_run(r.label.as_str(), needs, why);
                continue;
            }
            let [alloc, read, total] = &r.ms;
            let (a, tot) = (median(alloc), median(total));
            if r.label.ends_with("1st load") {
                first_alloc = Some(a);
            }
            let vs_first = match r.label.ends_with("2nd load") {
                true => Cell::or_na(first_alloc.map(|f| Cell::percent(a / f * 100.0, 2))),
                false => Cell::Empty,
            };
            t.row(vec![
                r.label.clone().into(),
                Cell::median(alloc, Unit::Plain, 2),
                Cell::median(read, Unit::Plain, 1),
                Cell::median(total, Unit::Plain, 1),
                Cell::or_na(reference.map(|x| Cell::num(tot / x, 2))),
                vs_first,
            ]);
        }
        t.note(
            "the six rows allocate and fill one buffer after the other, as the \
             DMA_BUF_IOCTL_RW_FILE proposal measured them; iopath and pool rows run \
             iopath's loader (allocation overlapped with the reads); udmabuf reads go \
             into the memfd under the dma-buf",
        );
        t
    }

    /// The chart: per heap x method the measured total, allocation and
    /// read time under it (they overlap: the loader allocates while it
    /// reads), the limit's and alloc only's totals as bars of their own.
    fn chart(&self, t: &Table) -> Chart {
        let title = format!(
            "Loading a {} file into {} x {} buffers: time by heap and method",
            human(self.bytes),
            self.buffers,
            human(self.buffer_size as u64)
        );
        let about = format!(
            "{}, cold page cache, median of {} runs; alloc and read overlap, the total is measured",
            self.fs, self.runs
        );
        let c = Chart::new("heap-load-time-by-method", title, "ms")
            .about(about, "ms, lower is faster")
            .legend(&[
                ("total", PRIMARY),
                ("alloc (overlaps read)", OTHER),
                ("read (overlaps alloc)", SECONDARY),
                ("limit: fio O_DIRECT read", LIMIT),
            ]);
        load_times(c, t, |row| format!("{} {}", row[0], row[1]))
    }
}

/// `c` with a bar per row of `t` (labelled by `label`) at its total ms,
/// its alloc and read ms as thin bars under it; a limit's row in the
/// limit's colour, an alloc-only row in alloc's, each at its total alone.
fn load_times(mut c: Chart, t: &Table, label: impl Fn(&[Cell]) -> String) -> Chart {
    let [alloc, read, total] = ["alloc ms", "read ms", "total ms"].map(|n| t.col(n));
    for row in &t.rows {
        let name = row[0].to_string();
        if name.starts_with("limit") {
            c.bar(format!("{name}, {}", row[1]), &row[total], LIMIT);
        } else if name == "alloc only" {
            c.bar(format!("{name}, {}", row[1]), &row[total], OTHER);
        } else {
            c.bar(label(row), &row[total], PRIMARY)
                .thin("alloc", &row[alloc], OTHER)
                .thin("read", &row[read], SECONDARY);
        }
    }
    c
}
