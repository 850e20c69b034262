//! The report of `iopath bench heap`: its tables, chart and figures, from
//! the measured rows in the parent module.

use super::HeapReport;
use crate::report::plot::{Bar, Line, Panel, OTHER, PRIMARY, SECONDARY};
use crate::report::{Cell, Chart, Column, Report, Table};
use crate::Summary;
use iopath_sys::human;

impl HeapReport {
    fn alloc_summary(&self) -> Summary {
        let gib = self.bytes as f64 / f64::from(1u32 << 30);
        Summary::of(&self.alloc_limit.iter().map(|s| gib / s).collect::<Vec<_>>())
    }

    fn limit_summary(&self) -> Option<Summary> {
        let l = self.limit.as_ref()?;
        Some(l.summary()).filter(|s| s.median > 0.0)
    }

    /// The limit's time for the whole load, ms.
    fn limit_ms(&self, l: &Summary) -> f64 {
        self.bytes as f64 / f64::from(1u32 << 30) / l.median * 1e3
    }

    /// The report: the table of every heap x method beside the limit and
    /// the alloc-only bound, the dma-buf table, the notes, the chart and
    /// every figure.
    pub fn report(&self) -> Report {
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
        if self.limit.is_some() {
            r.table(self.table());
        }
        r.table(self.dma_buf_table());
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
        if self.limit.is_some() {
            r.set_chart(self.chart());
        }
        r.set_figures(self.json());
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
        let limit = self.limit_summary();
        let of_limit = |g: f64| Cell::or_na(limit.map(|l| Cell::percent(g / l.median * 100.0, 0)));
        let median = |v: &[f64]| Cell::num(Summary::of(v).median, 1);
        for r in &self.rows {
            let g = Summary::of(&r.gib_per_s);
            let method = if r.method == r.used {
                r.method.to_string()
            } else {
                format!("{} ({})", r.method, r.used)
            };
            if r.fallbacks > 0 {
                t.note(format!(
                    "{} {method}: {} request(s) fell back to buffered",
                    r.heap, r.fallbacks
                ));
            }
            t.row(vec![
                r.heap.clone().into(),
                method.into(),
                median(&r.alloc_ms),
                median(&r.read_ms),
                median(&r.total_ms),
                Cell::num(g.median, 3),
                Cell::percent(g.spread_pct(), 1),
                of_limit(g.median),
                human(r.cache_growth).into(),
            ]);
        }
        let lim = self.limit.as_ref();
        if let (Some(l), Some(s)) = (lim, limit) {
            let name = if l.is_fio() { "limit" } else { "limit (own)" };
            t.row(vec![
                name.into(),
                l.label().into(),
                Cell::Empty,
                Cell::Empty,
                Cell::num(self.limit_ms(&s), 1),
                Cell::num(s.median, 3),
                Cell::percent(s.spread_pct(), 1),
                Cell::percent(100.0, 0),
                Cell::Empty,
            ]);
        }
        let a = self.alloc_summary();
        let alloc_ms = Summary::of(&self.alloc_limit).median * 1e3;
        t.row(vec![
            "alloc only".into(),
            self.alloc_heap.clone().into(),
            Cell::num(alloc_ms, 1),
            Cell::Empty,
            Cell::num(alloc_ms, 1),
            Cell::num(a.median, 3),
            Cell::percent(a.spread_pct(), 1),
            of_limit(a.median),
            Cell::Empty,
        ]);
        for (heap, _, needs) in &self.skipped {
            t.not_run(heap.as_str(), needs.as_str());
        }
        for n in lim.map(|l| l.notes()).unwrap_or_default() {
            t.note(n);
        }
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
        let median = |v: &[f64]| Summary::of(v).median;
        let reference = self
            .dma_buf
            .iter()
            .find(|r| r.label == "udmabuf direct read" && r.missing.is_none())
            .map(|r| median(&r.total_ms));
        let mut first_alloc = None;
        for r in &self.dma_buf {
            if let Some((_, needs)) = &r.missing {
                t.not_run(r.label.as_str(), needs.as_str());
                continue;
            }
            let (a, tot) = (median(&r.alloc_ms), median(&r.total_ms));
            let vs_first = if r.label.ends_with("1st load") {
                first_alloc = Some(a);
                Cell::Empty
            } else if r.label.ends_with("2nd load") {
                Cell::or_na(first_alloc.map(|f| Cell::percent(a / f * 100.0, 2)))
            } else {
                Cell::Empty
            };
            t.row(vec![
                r.label.clone().into(),
                Cell::num(a, 2),
                Cell::num(median(&r.read_ms), 1),
                Cell::num(tot, 1),
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

    /// The chart: one bar per heap x method, allocation time with read
    /// time stacked on it, the alloc-only bound, the limit's time as a
    /// line.
    fn chart(&self) -> Chart {
        let median = |v: &[f64]| Summary::of(v).median;
        let mut bars: Vec<Bar> = self
            .rows
            .iter()
            .map(|r| {
                let (a, rd) = (median(&r.alloc_ms), median(&r.read_ms));
                Bar {
                    label: format!("{} {}", r.heap.replace("memfd:", ""), r.method),
                    segments: vec![(0.0, a, PRIMARY), (a, a + rd, SECONDARY)],
                    whisker: None,
                }
            })
            .collect();
        bars.push(Bar::of(
            "alloc only",
            median(&self.alloc_limit) * 1e3,
            OTHER,
        ));
        let lines = match (&self.limit, self.limit_summary()) {
            (Some(l), Some(s)) => {
                let ms = self.limit_ms(&s);
                let legend = format!("limit: {} ({ms:.0} ms)", l.label());
                vec![Line::span(legend, 0, bars.len(), ms)]
            }
            _ => Vec::new(),
        };
        let panel = Panel {
            title: format!(
                "{} x {} buffers from a cold {} file ({}), medians of {} runs",
                self.buffers,
                human(self.buffer_size as u64),
                human(self.bytes),
                self.fs,
                self.runs
            ),
            y_desc: "ms (lower is faster)".into(),
            log: false,
            bars,
            lines,
            legend: vec![
                ("allocation ms".into(), PRIMARY),
                ("read ms".into(), SECONDARY),
                ("alloc only".into(), OTHER),
            ],
        };
        Chart {
            title: "bench heap: fill buffers from a file".into(),
            panels: vec![panel],
            columns: 1,
        }
    }

    /// Every row, the limit and the bounds, for scripts.
    fn json(&self) -> serde_json::Value {
        let limit = self.limit_summary();
        let median = |v: &[f64]| Summary::of(v).median;
        let rows: Vec<_> = self
            .rows
            .iter()
            .map(|r| {
                let g = Summary::of(&r.gib_per_s);
                serde_json::json!({
                    "heap": r.heap,
                    "method": r.method.name(),
                    "method_used": r.used.name(),
                    "alloc_ms": median(&r.alloc_ms),
                    "read_ms": median(&r.read_ms),
                    "total_ms": median(&r.total_ms),
                    "gib_per_s": g.median,
                    "gib_per_s_runs": g.json(),
                    "spread_pct": g.spread_pct(),
                    "vs_limit": limit.map(|l| g.median / l.median),
                    "cache_growth_bytes": r.cache_growth,
                    "fallbacks": r.fallbacks,
                })
            })
            .collect();
        let lim = self.limit.as_ref();
        let missing: Vec<_> = lim
            .and_then(|l| l.missing())
            .map(|m| serde_json::json!({"row": "limit", "missing": m.json()}))
            .into_iter()
            .collect();
        serde_json::json!({
            "file": self.file,
            "fs": self.fs,
            "bytes": self.bytes,
            "buffers": self.buffers,
            "buffer_size": self.buffer_size,
            "runs": self.runs,
            "rows": rows,
            "limit": lim.map(|l| l.json()),
            "fio_limit": lim.filter(|l| l.is_fio()).map(|l| l.json()),
            "missing": missing,
            "alloc_only": {
                "heap": self.alloc_heap,
                "gib_per_s": self.alloc_summary().median,
                "gib_per_s_runs": self.alloc_summary().json(),
            },
            "loadavg": [self.loadavg.0, self.loadavg.1],
            "skipped": self.skipped.iter().map(|(h, w, _)| serde_json::json!({"heap": h, "reason": w})).collect::<Vec<_>>(),
            "dma_buf_rows": self.dma_buf.iter().map(|r| serde_json::json!({
                "row": r.label,
                "kind": r.kind,
                "alloc_ms": median(&r.alloc_ms),
                "read_ms": median(&r.read_ms),
                "total_ms": median(&r.total_ms),
                "missing": r.missing.as_ref().map(|m| &m.0),
            })).collect::<Vec<_>>(),
        })
    }
}
