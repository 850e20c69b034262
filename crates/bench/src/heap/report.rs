//! The report writers of `iopath bench heap`: the text table, JSON,
//! Markdown and the chart, from the measured rows in the parent module.

use super::*;

/// The table's columns: (text heading, Markdown heading).
const COLUMNS: [(&str, &str); 9] = [
    ("heap", "heap"),
    ("method", "method"),
    ("alloc ms", "alloc ms"),
    ("read ms", "read ms"),
    ("total ms", "total ms"),
    ("GiB/s", "GiB/s"),
    ("spread", "spread"),
    ("vs limit", "vs limit"),
    ("cache growth", "page cache growth"),
];

/// Where a table goes: the few cells that differ between the two.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Style {
    Text,
    Markdown,
}

/// One row of the table, its cells already formatted.
#[derive(Debug)]
struct TableRow {
    cells: [String; 9],
    /// Requests that fell back to buffered I/O (a note under the text row).
    fallbacks: u64,
}

impl HeapReport {
    fn alloc_summary(&self) -> Summary {
        let gib = self.bytes as f64 / (1u64 << 30) as f64;
        Summary::of(&self.alloc_limit.iter().map(|s| gib / s).collect::<Vec<_>>())
    }

    fn limit_summary(&self) -> Option<Summary> {
        Some(self.limit.summary()).filter(|s| s.median > 0.0)
    }

    /// The table's rows, one cell per column (see [`COLUMNS`]): every heap
    /// x method, the limit, the alloc-only bound. The few cells the text
    /// and Markdown tables write differently follow `style`.
    fn table(&self, style: Style) -> Vec<TableRow> {
        let limit = self.limit_summary();
        let vs = |g: f64| match limit {
            Some(l) => format!("{:.0}%", g / l.median * 100.0),
            None if style == Style::Text => "-".to_string(),
            None => "n/a".to_string(),
        };
        let mut rows = Vec::new();
        for r in &self.rows {
            let g = Summary::of(&r.gib_per_s);
            let method = if r.method == r.used {
                r.method.to_string()
            } else {
                format!("{} ({})", r.method, r.used)
            };
            rows.push(TableRow {
                cells: [
                    r.heap.clone(),
                    method,
                    format!("{:.1}", Summary::of(&r.alloc_ms).median),
                    format!("{:.1}", Summary::of(&r.read_ms).median),
                    format!("{:.1}", Summary::of(&r.total_ms).median),
                    format!("{:.3}", g.median),
                    format!("{:.1}%", g.spread_pct()),
                    vs(g.median),
                    human(r.cache_growth),
                ],
                fallbacks: r.fallbacks,
            });
        }
        if let Some(l) = limit {
            let (name, label) = match (self.limit.is_fio(), style) {
                (true, _) => ("limit", self.limit.label()),
                (false, Style::Text) => ("limit (own)", self.limit.label()),
                (false, Style::Markdown) => ("limit (own, no fio)", self.limit.label()),
            };
            let label = match style {
                Style::Text => label.replace(" bs=", " ").replace(" qd=", " qd"),
                Style::Markdown => label,
            };
            rows.push(TableRow {
                cells: [
                    name.to_string(),
                    label,
                    "-".into(),
                    "-".into(),
                    format!(
                        "{:.1}",
                        self.bytes as f64 / f64::from(1u32 << 30) / l.median * 1e3
                    ),
                    format!("{:.3}", l.median),
                    format!("{:.1}%", l.spread_pct()),
                    "100%".into(),
                    "-".into(),
                ],
                fallbacks: 0,
            });
        }
        let a = self.alloc_summary();
        let alloc_ms = format!("{:.1}", Summary::of(&self.alloc_limit).median * 1e3);
        rows.push(TableRow {
            cells: [
                "alloc only".into(),
                self.alloc_heap.clone(),
                alloc_ms.clone(),
                "-".into(),
                alloc_ms,
                format!("{:.3}", a.median),
                format!("{:.1}%", a.spread_pct()),
                vs(a.median),
                "-".into(),
            ],
            fallbacks: 0,
        });
        rows
    }

    /// The table and its notes, as `iopath bench heap` prints them.
    pub fn text(&self) -> String {
        let mut out = String::new();
        outln!(
            out,
            "{} x {} buffers from {} ({}, {}), {} run(s), each from a cold page cache",
            self.buffers,
            human(self.buffer_size as u64),
            self.file.display(),
            human(self.bytes),
            self.fs,
            self.runs
        );
        let line = |c: &[String; 9]| {
            format!(
                "{:<14} {:<16} {:>9} {:>9} {:>9} {:>7} {:>7} {:>9} {:>13}",
                c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8]
            )
        };
        outln!(out, "{}", line(&COLUMNS.map(|(text, _)| text.to_string())));
        for r in self.table(Style::Text) {
            outln!(out, "{}", line(&r.cells));
            if r.fallbacks > 0 {
                outln!(
                    out,
                    "{:<31} ({} request(s) fell back to buffered)",
                    "",
                    r.fallbacks
                );
            }
        }
        for n in self.limit.notes() {
            outln!(out, "{n}");
        }
        outln!(
            out,
            "alloc only: {} x {} {} buffers allocated and faulted in (MADV_POPULATE_WRITE), no I/O",
            self.buffers,
            human(self.buffer_size as u64),
            self.alloc_heap
        );
        if let (Some(a), Some(b)) = self.loadavg {
            outln!(
                out,
                "load average (1 min) {a:.2} before, {b:.2} after, on {} CPU(s)",
                std::thread::available_parallelism().map_or(0, |n| n.get())
            );
        }
        for (h, why) in &self.skipped {
            outln!(out, "skipped heap {h}: {why}");
        }
        if self.rows.iter().any(|r| r.heap == "memfd:thp") {
            if let Ok(mode) =
                std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
            {
                if mode.contains("[never]") || mode.contains("[deny]") {
                    outln!(
                        out,
                        "note: memfd:thp gets no huge pages here (shmem_enabled: {})",
                        mode.trim()
                    );
                }
            }
        }
        if self.warm_warnings > 0 {
            outln!(
                out,
                "warning: {} run(s) started with more than 1% of the file cached",
                self.warm_warnings
            );
        }
        out
    }

    /// The table as Markdown (as in BENCHMARKS.md), then its notes.
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        outln!(
            out,
            "{} x {} buffers from a {} file on {}, {} run(s), each from a cold page cache; medians, spread = (max-min)/median.",
            self.buffers,
            human(self.buffer_size as u64),
            human(self.bytes),
            self.fs,
            self.runs
        );
        outln!(out);
        let row = |c: &[String]| format!("| {} |", c.join(" | "));
        outln!(out, "{}", row(&COLUMNS.map(|(_, md)| md.to_string())));
        outln!(out, "|---|---|---:|---:|---:|---:|---:|---:|---:|");
        for r in self.table(Style::Markdown) {
            outln!(out, "{}", row(&r.cells));
        }
        outln!(out);
        for n in self.limit.notes() {
            outln!(out, "{n}");
            outln!(out);
        }
        for (h, why) in &self.skipped {
            outln!(out, "skipped heap {h}: {why}");
            outln!(out);
        }
        out
    }

    /// Writes the chart: one bar per heap x method, allocation time with
    /// read time stacked on it, the alloc-only bound, the limit's time as a
    /// line.
    ///
    /// # Errors
    /// [`Error::Plot`].
    pub fn plot(&self, path: &Path) -> Result<()> {
        use crate::plot::{Bar, Line, Panel, OTHER, PRIMARY, SECONDARY};
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
            lines.push(Line::across(
                format!("limit: {} ({ms:.0} ms)", self.limit.label()),
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
        crate::plot::draw(path, "bench heap: fill buffers from a file", &[panel], 1)
    }

    /// Every row, the limit and the bounds, for scripts.
    pub fn json(&self) -> serde_json::Value {
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
        })
    }
}
