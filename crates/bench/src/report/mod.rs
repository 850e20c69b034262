//! One report model for every experiment, and its writers.
//!
//! ```text
//!   heap / blk / rpmsg measurements --build--> Report
//!        Report = what was measured (one line) + context (sizes, placement,
//!                 the limit's command) + tables + notes + charts (each
//!                 built from a table's cells, one message each)
//!   Report --> text()      aligned columns (what `iopath bench` prints)
//!          --> markdown()  the same tables as Markdown (BENCHMARKS.md)
//!          --> json()      the same tables, every cell with its unit and runs
//!          --> plot(dir)   an SVG file per chart
//!   Files: add(report) each, finish()  --plot DIR, --markdown FILE, --json FILE
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
mod model;
pub mod plot;

use std::iter::once;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

pub(crate) use files::Files;
use model::paragraphs;
pub use model::{grouped, Cell, Column, Figure, Table, Unit};

use crate::{Error, Result};

/// What one experiment measured, ready to print, write or draw.
#[derive(Debug, Clone, Default)]
pub struct Report {
    name: &'static str,
    pub(crate) summary: String,
    context: serde_json::Map<String, Value>,
    tables: Vec<Table>,
    notes: Vec<String>,
    charts: Vec<plot::Chart>,
}

impl Report {
    /// An empty report of experiment `name` (`heap`, `blk`, `rpmsg`: the
    /// key in a combined JSON object) that measured what `summary` says.
    pub fn new(name: &'static str, summary: impl Into<String>) -> Report {
        Report {
            name,
            summary: summary.into(),
            ..Report::default()
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

    /// Adds a chart; one of the same name takes its groups (the same
    /// chart measured at another placement). A chart with no bar is left
    /// out.
    pub(crate) fn chart(&mut self, c: plot::Chart) {
        match self.charts.iter_mut().find(|o| o.name == c.name) {
            _ if c.is_empty() => {}
            Some(o) => o.extend(c),
            None => self.charts.push(c),
        }
    }

    /// The report as `iopath bench` prints it: the summary line, each
    /// table in aligned columns, the notes, a blank line between them.
    pub fn text(&self) -> String {
        let (tables, notes) = (self.tables.iter().map(Table::text), self.notes.join("\n"));
        let blocks = once(self.summary.clone()).chain(tables).chain(once(notes));
        let blocks: Vec<_> = blocks.filter(|b| !b.is_empty()).collect();
        format!("{}\n", blocks.join("\n\n"))
    }

    /// The report as Markdown (as in BENCHMARKS.md): the summary, each
    /// table, the notes, as paragraphs.
    pub fn markdown(&self) -> String {
        let tables: String = self.tables.iter().map(Table::markdown).collect();
        paragraphs([self.summary.clone()]) + &tables + &paragraphs(self.notes.clone())
    }

    /// The report as JSON: `experiment`, `summary`, `context`, `tables`
    /// ([`Table::json`]), `notes`.
    pub fn json(&self) -> Value {
        let tables: Vec<Value> = self.tables.iter().map(Table::json).collect();
        json!({"experiment": self.name, "summary": self.summary, "context": self.context,
               "tables": tables, "notes": self.notes})
    }

    /// Writes each chart into the directory `dir` as `NAME.svg`; returns
    /// the files.
    ///
    /// # Errors
    /// [`Error::Write`] naming `--plot` when plotters cannot draw a chart
    /// or its file cannot be written.
    pub fn plot(&self, dir: &Path) -> Result<Vec<PathBuf>> {
        let draw = |c: &plot::Chart| {
            let path = dir.join(format!("{}.svg", c.name));
            let svg = c.svg().map_err(std::io::Error::other);
            let written = svg.and_then(|svg| std::fs::write(&path, svg));
            written.map_err(Error::write("--plot", &path))?;
            Ok(path)
        };
        self.charts.iter().map(draw).collect()
    }
}
