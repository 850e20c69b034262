//! One report model for every experiment, and its writers.
//!
//! ```text
//!   heap / blk / rpmsg measurements --build--> Report
//!        Report = what was measured (one line) + context (sizes, placement,
//!                 the limit's command) + tables + notes + chart panels
//!   Report --> text()      aligned columns (what `iopath bench` prints)
//!          --> markdown()  the same tables as Markdown (BENCHMARKS.md)
//!          --> json()      the same tables, every cell with its unit and runs
//!          --> plot(path)  SVG chart
//!   Files::write(reports)  --plot DIR, --markdown FILE, --json FILE
//! ```
//!
//! ```
//! use iopath_bench::report::{Cell, Column, Report, Table};
//! let mut t = Table::new("two rows", vec![Column::left("row"), Column::right("GiB/s")]);
//! t.row(vec!["limit".into(), Cell::num(2.5, 3).with_range(2.4, 2.6)]);
//! t.row(vec!["ours".into(), Cell::NotAvailable]);
//! let mut r = Report::new("demo", "a demo, 3 runs");
//! r.table(t);
//! assert!(r.text().contains("limit  2.500 (2.400-2.600)"));
//! assert!(r.markdown().contains("| ours | n/a |"));
//! assert_eq!(r.json()["tables"][0]["rows"][0][1]["max"], 2.6);
//! ```

mod files;
mod markdown;
mod model;
pub mod plot;
mod text;

use std::path::Path;

use serde_json::{json, Value};

pub(crate) use files::Files;
pub use model::{grouped, Cell, Column, Figure, NotRun, Table, Unit};

use crate::Result;

/// What one experiment measured, ready to print, write or draw.
#[derive(Debug, Clone)]
pub struct Report {
    name: &'static str,
    pub(crate) summary: String,
    context: serde_json::Map<String, Value>,
    tables: Vec<Table>,
    notes: Vec<String>,
    /// The chart's title, its panels (left to right, top to bottom) and
    /// panels per row.
    pub(crate) chart: (String, Vec<plot::Panel>, usize),
}

impl Report {
    /// An empty report of experiment `name` (`heap`, `blk`, `rpmsg`: the
    /// chart's file name and the key in a combined JSON object) that
    /// measured what `summary` says.
    pub fn new(name: &'static str, summary: impl Into<String>) -> Report {
        Report {
            name,
            summary: summary.into(),
            context: serde_json::Map::new(),
            tables: Vec::new(),
            notes: Vec::new(),
            chart: (String::new(), Vec::new(), 1),
        }
    }

    /// Adds a table after the others.
    pub fn table(&mut self, t: Table) {
        self.tables.push(t);
    }

    /// Adds a note after the tables.
    pub fn note(&mut self, note: impl Into<String>) {
        self.notes.push(note.into());
    }

    /// Records what the figures were measured on (sizes, placement, the
    /// limit's command), for JSON: the keys of the object `v`.
    pub fn context(&mut self, v: Value) {
        if let Value::Object(m) = v {
            self.context.extend(m);
        }
    }

    pub(crate) fn panel(&mut self, p: plot::Panel) {
        self.chart.1.push(p);
    }

    /// The experiment's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The report as `iopath bench` prints it: aligned columns.
    pub fn text(&self) -> String {
        text::report(self)
    }

    /// The report as Markdown (as in BENCHMARKS.md).
    pub fn markdown(&self) -> String {
        markdown::report(self)
    }

    /// The report as JSON: `experiment`, `summary`, `context`, `tables`
    /// ([`Table::json`]), `notes`.
    pub fn json(&self) -> Value {
        json!({
            "experiment": self.name,
            "summary": self.summary,
            "context": self.context,
            "tables": self.tables.iter().map(Table::json).collect::<Vec<_>>(),
            "notes": self.notes,
        })
    }

    /// Draws the chart into the SVG file `path`.
    ///
    /// # Errors
    /// [`crate::Error::Plot`] when it cannot be drawn or written.
    pub fn plot(&self, path: &Path) -> Result<()> {
        let (title, panels, columns) = &self.chart;
        plot::draw(path, title, panels, *columns)
    }
}
