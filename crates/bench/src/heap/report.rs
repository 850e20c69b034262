//! The report of `iopath bench heap`: its table, chart and figures, from
//! the measured rows in the parent module.

use super::*;
use crate::report::plot::{Bar, Line, Panel, OTHER, PRIMARY, SECONDARY};
use crate::report::{Cell, Chart, Column, Report, Table};

impl HeapReport {
    fn alloc_summary(&self) -> Summary {
        let gib = self.bytes as f64 / (1u64 << 30) as f64;
        Summary::of(&self.alloc_limit.iter().map(|s| gib / s).collect::<Vec<_>>())
    }

    fn limit_summary(&self) -> Option<Summary> {
        Some(self.limit.summary()).filter(|s| s.median > 0.0)
    }

    /// The report: the table of every heap x method beside the limit and
    /// the alloc-only bound, its notes, the chart and every figure.
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
        if self.seed_only {
            r.table(self.seed_table());
            r.set_figures(self.json());
            return r;
        }
        r.table(self.table());
        r.table(self.seed_table());
        for (h, why) in &self.skipped {
            r.note(format!("skipped heap {h}: {why}"));
        }
        if self.rows.iter().any(|r| r.heap == "memfd:thp") {
            if let Ok(mode) =
                std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
            {
                if mode.contains("[never]") || mode.contains("[deny]") {
                    r.note(format!(
                        "note: memfd:thp gets no huge pages here (shmem_enabled: {})",
                        mode.trim()
                    ));
                }
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
        r.set_chart(self.chart());
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
        if let Some(l) = limit {
            let name = if self.limit.is_fio() {
                "limit"
            } else {
                "limit (own)"
            };
            t.row(vec![
                name.into(),
                self.limit.label().into(),
                Cell::Empty,
                Cell::Empty,
                Cell::num(
                    self.bytes as f64 / f64::from(1u32 << 30) / l.median * 1e3,
                    1,
                ),
                Cell::num(l.median, 3),
                Cell::percent(l.spread_pct(), 1),
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
        for n in self.limit.notes() {
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
    fn seed_table(&self) -> Table {
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
            .seed
            .iter()
            .find(|r| r.label == "udmabuf direct read" && r.missing.is_none())
            .map(|r| median(&r.total_ms));
        let mut first_alloc = None;
        for r in &self.seed {
            if let Some(why) = &r.missing {
                t.row(vec![
                    r.label.clone().into(),
                    Cell::NotAvailable,
                    Cell::NotAvailable,
                    Cell::NotAvailable,
                    Cell::NotAvailable,
                    Cell::Empty,
                ]);
                t.note(format!("{}: missing: {why}", r.label));
                continue;
            }
            let (a, rd, tot) = (median(&r.alloc_ms), median(&r.read_ms), median(&r.total_ms));
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
                Cell::num(rd, 1),
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
        let mut bars: Vec<Bar> = self
            .rows
            .iter()
            .map(|r| {
                let a = Summary::of(&r.alloc_ms).median;
                let rd = Summary::of(&r.read_ms).median;
                Bar {
                    label: format!("{} {}", r.heap.replace("memfd:", ""), r.method),
                    segments: vec![(0.0, a, PRIMARY), (a, a + rd, SECONDARY)],
                    whisker: None,
                }
            })
            .collect();
        let alloc_ms = Summary::of(&self.alloc_limit).median * 1e3;
        bars.push(Bar {
            label: "alloc only".into(),
            segments: vec![(0.0, alloc_ms, OTHER)],
            whisker: None,
        });
        let mut lines = Vec::new();
        if let Some(l) = self.limit_summary() {
            let ms = self.bytes as f64 / f64::from(1u32 << 30) / l.median * 1e3;
            lines.push(Line::span(
                format!("limit: {} ({ms:.0} ms)", self.limit.label()),
                0,
                bars.len(),
                ms,
            ));
        }
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
        let rows: Vec<_> = self
            .rows
            .iter()
            .map(|r| {
                let g = Summary::of(&r.gib_per_s);
                serde_json::json!({
                    "heap": r.heap,
                    "method": r.method.name(),
                    "method_used": r.used.name(),
                    "alloc_ms": Summary::of(&r.alloc_ms).median,
                    "read_ms": Summary::of(&r.read_ms).median,
                    "total_ms": Summary::of(&r.total_ms).median,
                    "gib_per_s": g.median,
                    "gib_per_s_runs": g.json(),
                    "spread_pct": g.spread_pct(),
                    "vs_limit": limit.map(|l| g.median / l.median),
                    "cache_growth_bytes": r.cache_growth,
                    "fallbacks": r.fallbacks,
                })
            })
            .collect();
        serde_json::json!({
            "file": self.file,
            "fs": self.fs,
            "bytes": self.bytes,
            "buffers": self.buffers,
            "buffer_size": self.buffer_size,
            "runs": self.runs,
            "rows": rows,
            "limit": self.limit.json(),
            "fio_limit": if self.limit.is_fio() { self.limit.json() } else { serde_json::Value::Null },
            "missing": match &self.limit.source {
                crate::limit::Source::Own { missing, .. } => vec![serde_json::json!({"row": "limit", "missing": missing.json()})],
                crate::limit::Source::Fio { .. } => Vec::new(),
            },
            "alloc_only": {
                "heap": self.alloc_heap,
                "gib_per_s": self.alloc_summary().median,
                "gib_per_s_runs": self.alloc_summary().json(),
            },
            "loadavg": [self.loadavg.0, self.loadavg.1],
            "skipped": self.skipped.iter().map(|(h, w)| serde_json::json!({"heap": h, "reason": w})).collect::<Vec<_>>(),
            "dma_buf_rows": self.seed.iter().map(|r| serde_json::json!({
                "row": r.label,
                "kind": r.kind,
                "alloc_ms": Summary::of(&r.alloc_ms).median,
                "read_ms": Summary::of(&r.read_ms).median,
                "total_ms": Summary::of(&r.total_ms).median,
                "missing": r.missing,
            })).collect::<Vec<_>>(),
        })
    }
}
