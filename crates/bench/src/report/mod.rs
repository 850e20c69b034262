//! One report model for every experiment, and its writers.
//!
//! ```text
//!   heap / blk / rpmsg results --build--> Report
//!        Report = what was measured (one line)
//!               + tables (title, columns, rows of cells, notes)
//!               + notes + chart panels + figures (JSON for scripts)
//!   Report --> text()      aligned columns (what `iopath bench` prints)
//!          --> markdown()  the same tables as Markdown (BENCHMARKS.md)
//!          --> json()      every figure, one object
//!          --> plot(path)  SVG chart
//!   Files::write(reports)  --plot DIR, --markdown FILE, --json FILE
//! ```
//!
//! A cell is a figure (value, unit, decimals, the runs' min-max) or words;
//! the text and Markdown writers lay out the same cells, so every
//! experiment's tables read alike in both.
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
//! ```

mod files;
mod markdown;
mod model;
pub mod plot;
mod text;

use std::path::Path;

pub use files::{Files, Written};
pub use model::{grouped, Align, Cell, Column, Figure, Table, Unit};

use crate::Result;

/// An experiment's chart: panels in a grid.
#[derive(Debug, Clone, Default)]
pub(crate) struct Chart {
    /// The title over every panel.
    pub title: String,
    /// The panels, left to right, top to bottom.
    pub panels: Vec<plot::Panel>,
    /// Panels per row.
    pub columns: usize,
}

/// What one experiment measured, ready to print, write or draw.
#[derive(Debug, Clone)]
pub struct Report {
    name: &'static str,
    summary: String,
    tables: Vec<Table>,
    notes: Vec<String>,
    chart: Chart,
    figures: serde_json::Value,
}

impl Report {
    /// An empty report of experiment `name` (`heap`, `blk`, `rpmsg`: the
    /// chart's file name and the key in a combined JSON object) that
    /// measured what `summary` says.
    pub fn new(name: &'static str, summary: impl Into<String>) -> Report {
        Report {
            name,
            summary: summary.into(),
            tables: Vec::new(),
            notes: Vec::new(),
            chart: Chart::default(),
            figures: serde_json::Value::Null,
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

    /// Sets the figures for scripts (what [`Report::json`] returns).
    pub fn set_figures(&mut self, figures: serde_json::Value) {
        self.figures = figures;
    }

    /// Sets the chart.
    pub(crate) fn set_chart(&mut self, chart: Chart) {
        self.chart = chart;
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

    /// Every figure, for scripts.
    pub fn json(&self) -> serde_json::Value {
        self.figures.clone()
    }

    /// Draws the chart into the SVG file `path`.
    ///
    /// # Errors
    /// [`crate::Error::Plot`] when it cannot be drawn or written.
    pub fn plot(&self, path: &Path) -> Result<()> {
        plot::draw(
            path,
            &self.chart.title,
            &self.chart.panels,
            self.chart.columns,
        )
    }
}
