//! The report model: tables of cells, each cell a figure with its unit,
//! the runs behind it and their range, or words. A table lays the same
//! cells out as text, Markdown or JSON; only a cell formats its figure.

use std::fmt;
use std::iter::once;

use serde::Serialize;
use serde_json::{json, Value};

/// A column: its heading, and whether its cells are figures (aligned
/// right in text) or names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    pub(crate) name: String,
    pub(crate) right: bool,
}

impl Column {
    /// A column of names or labels.
    pub fn left(name: impl Into<String>) -> Column {
        let (name, right) = (name.into(), false);
        Column { name, right }
    }

    /// A column of figures.
    pub fn right(name: impl Into<String>) -> Column {
        let (name, right) = (name.into(), true);
        Column { name, right }
    }
}

/// What a figure counts, as its cell writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Unit {
    /// A bare number; the column heading names the unit.
    #[default]
    Plain,
    /// A count or a large figure: thousands separated (`12,345`).
    Grouped,
    /// Percent (`97.5%`).
    Percent,
    /// A ratio (`1.25x`).
    Times,
    /// Microseconds (`6.0 us`), where a column mixes units.
    Micros,
    /// Bytes, in binary units (`32 MiB`).
    Bytes,
}

/// One measured figure: its value (a median over runs, usually), unit and
/// decimals written, the runs' minimum and maximum written `(min-max)`,
/// each run's figure and the samples each run took (round trips, say),
/// which only JSON shows.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Figure {
    pub(crate) value: f64,
    pub(crate) unit: Unit,
    pub(crate) digits: usize,
    pub(crate) range: Option<(f64, f64)>,
    pub(crate) runs: Vec<f64>,
    pub(crate) samples: Vec<u64>,
}

/// One cell of a table.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    /// Words: a row's name, a label.
    Text(String),
    /// A figure.
    Figure(Figure),
    /// Nothing measured here by design (`-`).
    Empty,
    /// A figure this run could not give (`n/a`).
    NotAvailable,
}

impl Cell {
    /// Words.
    pub fn text(s: impl Into<String>) -> Cell {
        Cell::Text(s.into())
    }

    /// A bare number with `digits` decimals.
    pub fn num(value: f64, digits: usize) -> Cell {
        Cell::figure(value, Unit::Plain, digits)
    }

    /// A large number, thousands separated, with `digits` decimals.
    pub fn grouped(value: f64, digits: usize) -> Cell {
        Cell::figure(value, Unit::Grouped, digits)
    }

    /// A percentage (`pct` is already in percent).
    pub fn percent(pct: f64, digits: usize) -> Cell {
        Cell::figure(pct, Unit::Percent, digits)
    }

    /// A ratio, two decimals (`1.25x`).
    pub fn times(ratio: f64) -> Cell {
        Cell::figure(ratio, Unit::Times, 2)
    }

    /// A figure of `unit`; `n/a` when it is not a finite number (a row
    /// with no runs, a ratio over zero).
    pub fn figure(value: f64, unit: Unit, digits: usize) -> Cell {
        match value.is_finite() {
            true => Cell::Figure(Figure {
                value,
                unit,
                digits,
                ..Figure::default()
            }),
            false => Cell::NotAvailable,
        }
    }

    /// The figure with the runs' range `(min-max)` after it.
    pub fn with_range(mut self, min: f64, max: f64) -> Cell {
        if let Cell::Figure(f) = &mut self {
            f.range = (min.is_finite() && max.is_finite()).then_some((min, max));
        }
        self
    }

    /// The figure with the samples each run took.
    pub fn with_samples(mut self, samples: Vec<u64>) -> Cell {
        if let Cell::Figure(f) = &mut self {
            f.samples = samples;
        }
        self
    }

    /// The median of `runs`, which the JSON lists; `n/a` without runs.
    pub fn median(runs: &[f64], unit: Unit, digits: usize) -> Cell {
        let mut c = Cell::figure(crate::Stats::of(runs).median, unit, digits);
        if let Cell::Figure(f) = &mut c {
            f.runs = runs.to_vec();
        }
        c
    }

    /// The median of `runs` with their range written after it.
    pub fn runs(runs: &[f64], unit: Unit, digits: usize) -> Cell {
        let s = crate::Stats::of(runs);
        Cell::median(runs, unit, digits).with_range(s.min, s.max)
    }

    /// `Some` figure as a cell, else `n/a`.
    pub fn or_na(value: Option<Cell>) -> Cell {
        value.unwrap_or(Cell::NotAvailable)
    }

    /// The figure's value, if it is one.
    pub fn value(&self) -> Option<f64> {
        match self {
            Cell::Figure(f) => Some(f.value),
            _ => None,
        }
    }

    /// The cell in JSON: its words, `null` for no figure, or an object
    /// with `value` and, when known, `unit`, `min`, `max`, `runs`,
    /// `samples`.
    pub fn json(&self) -> Value {
        let f = match self {
            Cell::Text(s) => return json!(s),
            Cell::Empty | Cell::NotAvailable => return Value::Null,
            Cell::Figure(f) => f,
        };
        let unit = ["", "", "%", "x", "us", "bytes"][f.unit as usize];
        let (min, max) = f.range.unzip();
        let mut v = json!({"value": f.value, "unit": unit, "min": min, "max": max,
                           "runs": f.runs, "samples": f.samples});
        // Leave out what the figure lacks: a unit, a range, runs, samples.
        let lacks = |v: &Value| v.is_null() || v == "" || v.as_array().is_some_and(Vec::is_empty);
        if let Value::Object(m) = &mut v {
            m.retain(|_, v| !lacks(v));
        }
        v
    }
}

impl From<&str> for Cell {
    fn from(s: &str) -> Cell {
        Cell::text(s)
    }
}

impl From<String> for Cell {
    fn from(s: String) -> Cell {
        Cell::Text(s)
    }
}

/// The value with its unit, then the range: `1.5 (1.2-1.8)`; with `{:#}`,
/// the value alone (as a chart writes it beside its bar).
impl fmt::Display for Figure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let num = |v: f64| match self.unit {
            Unit::Grouped => grouped(v, self.digits),
            Unit::Bytes => iopath_sys::human(v as u64),
            _ => format!("{v:.d$}", d = self.digits),
        };
        let unit = ["", "", "%", "x", " us", ""][self.unit as usize];
        write!(f, "{}{unit}", num(self.value))?;
        if let Some((lo, hi)) = self.range.filter(|_| !f.alternate()) {
            write!(f, " ({}-{})", num(lo), num(hi))?;
        }
        Ok(())
    }
}

impl fmt::Display for Cell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cell::Text(s) => f.write_str(s),
            Cell::Figure(x) => x.fmt(f),
            Cell::Empty => f.write_str("-"),
            Cell::NotAvailable => f.write_str("n/a"),
        }
    }
}

/// `v` with `digits` decimals, the integer part's thousands separated by
/// commas: `12,345.6`.
pub fn grouped(v: f64, digits: usize) -> String {
    let s = format!("{:.d$}", v.abs(), d = digits);
    let (int, frac) = s.split_at(s.find('.').unwrap_or(s.len()));
    let int: Vec<char> = int.chars().collect();
    let groups: Vec<String> = int.rchunks(3).rev().map(String::from_iter).collect();
    // No minus before a figure that rounds to zero.
    let minus = v < 0.0 && s.bytes().any(|b| matches!(b, b'1'..=b'9'));
    format!("{}{}{frac}", if minus { "-" } else { "" }, groups.join(","))
}

/// Markdown paragraphs: each followed by a blank line, empty ones left
/// out.
pub(super) fn paragraphs(ps: impl IntoIterator<Item = String>) -> String {
    let ps = ps.into_iter().filter(|p| !p.is_empty());
    ps.map(|p| p + "\n\n").collect()
}

/// A row that did not run: what it needs (the kernel feature, the peer
/// program) and the error it met (JSON only).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct NotRun {
    row: String,
    needs: String,
    why: String,
}

/// A table: a title above (what it shows and how it was measured; may be
/// empty), headed columns, rows of one cell per column; below, the rows
/// that did not run (one line), the ratios the table is about (`label:
/// cell`) and notes (the limit's source, what it compares).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Table {
    pub(crate) title: String,
    pub(crate) columns: Vec<Column>,
    pub(crate) rows: Vec<Vec<Cell>>,
    pub(crate) not_run: Vec<NotRun>,
    pub(crate) figures: Vec<(String, Cell)>,
    pub(crate) notes: Vec<String>,
}

impl Table {
    /// A table titled `title` with `columns` and no rows yet.
    pub fn new(title: impl Into<String>, columns: Vec<Column>) -> Table {
        Table {
            title: title.into(),
            columns,
            ..Table::default()
        }
    }

    /// Adds a row (one cell per column).
    pub fn row(&mut self, cells: Vec<Cell>) {
        debug_assert_eq!(cells.len(), self.columns.len(), "{cells:?}");
        self.rows.push(cells);
    }

    /// The index of the column headed `name`.
    ///
    /// # Panics
    /// When there is none: the caller named a column its table lacks.
    pub fn col(&self, name: &str) -> usize {
        let i = self.columns.iter().position(|c| c.name == name);
        i.unwrap_or_else(|| panic!("no column {name:?} in {:?}", self.title))
    }

    /// Adds a note below the table.
    pub fn note(&mut self, note: impl Into<String>) {
        self.notes.push(note.into());
    }

    /// Adds a figure below the table.
    pub fn figure(&mut self, label: impl Into<String>, cell: Cell) {
        self.figures.push((label.into(), cell));
    }

    /// Records a row that did not run, what it needs and why.
    pub fn not_run(&mut self, row: impl Into<String>, needs: &str, why: &str) {
        let (row, needs, why) = (row.into(), needs.into(), why.into());
        self.not_run.push(NotRun { row, needs, why });
    }

    /// The lines below the table: one about the rows that did not run,
    /// grouped by what they need (`not run here: ROW: NEED; 4 rows:
    /// NEED`), the figures, the notes.
    pub fn below(&self) -> Vec<String> {
        let mut groups = Vec::new();
        for (i, n) in self.not_run.iter().enumerate() {
            // Each need once, where its first row is.
            let need = |m: &NotRun| m.needs == n.needs;
            if !self.not_run[..i].iter().any(need) {
                groups.push(match self.not_run.iter().filter(|m| need(m)).count() {
                    1 => format!("{}: {}", n.row, n.needs),
                    rows => format!("{rows} rows: {}", n.needs),
                });
            }
        }
        let not_run = (!groups.is_empty()).then(|| format!("not run here: {}", groups.join("; ")));
        // A ratio between rows that did not run says nothing the not-run
        // line does not (JSON keeps it, as null).
        let figures = self.figures.iter().filter(|f| f.1 != Cell::NotAvailable);
        let figures = figures.map(|(l, c)| format!("{l}: {c}"));
        let notes = self.notes.iter().cloned();
        not_run.into_iter().chain(figures).chain(notes).collect()
    }

    /// The table as `iopath bench` prints it: the title, the heading and
    /// rows in columns two spaces apart (names left, figures right), the
    /// lines below (no trailing newline).
    pub(super) fn text(&self) -> String {
        let all = self.cells();
        let width = |i: usize| all.iter().map(|r| r[i].chars().count()).max().unwrap_or(0);
        let widths: Vec<usize> = (0..self.columns.len()).map(width).collect();
        let line = |row: &Vec<String>| {
            let cells = row.iter().zip(&self.columns).zip(&widths);
            let cells = cells.map(|((cell, col), &w)| match col.right {
                true => format!("{cell:>w$}"),
                false => format!("{cell:<w$}"),
            });
            cells.collect::<Vec<_>>().join("  ").trim_end().to_string()
        };
        let title = Some(self.title.clone()).filter(|t| !t.is_empty());
        let rows = all.iter().map(line);
        let lines = title.into_iter().chain(rows).chain(self.below());
        lines.collect::<Vec<_>>().join("\n")
    }

    /// The table as Markdown: its title, a pipe table (figures
    /// right-aligned), each line below, as paragraphs.
    pub(super) fn markdown(&self) -> String {
        let line = |cells: Vec<String>| format!("| {} |", cells.join(" | "));
        // A pipe in a cell would end it.
        let escape = |row: Vec<String>| line(row.iter().map(|c| c.replace('|', "\\|")).collect());
        let mut lines: Vec<String> = self.cells().into_iter().map(escape).collect();
        let align = |c: &Column| String::from(if c.right { "---:" } else { "---" });
        lines.insert(1, line(self.columns.iter().map(align).collect()));
        let table = once(lines.join("\n"));
        paragraphs(once(self.title.clone()).chain(table).chain(self.below()))
    }

    /// The heading and the rows, each cell as it writes itself.
    fn cells(&self) -> Vec<Vec<String>> {
        let heading = self.columns.iter().map(|c| c.name.clone()).collect();
        let row = |r: &Vec<Cell>| r.iter().map(Cell::to_string).collect();
        once(heading).chain(self.rows.iter().map(row)).collect()
    }

    /// The table in JSON: `title`, `columns` (headings), `rows` (arrays of
    /// cells), `not_run` (`row`, `needs`, `why`), `figures` (by label),
    /// `notes`.
    pub fn json(&self) -> Value {
        let columns: Vec<&str> = self.columns.iter().map(|c| c.name.as_str()).collect();
        let cells = |r: &Vec<Cell>| r.iter().map(Cell::json).collect::<Vec<_>>();
        let rows: Vec<_> = self.rows.iter().map(cells).collect();
        let figures = self.figures.iter().map(|(l, c)| (l.clone(), c.json()));
        json!({"title": self.title, "columns": columns, "rows": rows, "not_run": self.not_run,
               "figures": figures.collect::<serde_json::Map<_, _>>(), "notes": self.notes})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_write_their_figures() {
        let (runs, mib) = ([3.0, 1.0, 2.0], 1048576.0);
        let wide = Cell::grouped(12_345.4, 0).with_range(9_999.6, 1_234_567.0);
        let cells = [
            (Cell::num(1.23456, 3), "1.235"),
            (Cell::percent(97.54, 1), "97.5%"),
            (Cell::times(1.256), "1.26x"),
            (Cell::figure(6.04, Unit::Micros, 1), "6.0 us"),
            (Cell::figure(32.0 * mib, Unit::Bytes, 0), "32 MiB"),
            (wide, "12,345 (10,000-1,234,567)"),
            (Cell::num(f64::NAN, 1), "n/a"),
            (Cell::num(1.0, 1).with_range(f64::NAN, 2.0), "1.0"),
            (Cell::Empty, "-"),
            (Cell::or_na(None), "n/a"),
            (Cell::runs(&runs, Unit::Plain, 0), "2 (1-3)"),
            (Cell::median(&runs, Unit::Plain, 0), "2"),
            (Cell::runs(&[], Unit::Plain, 0), "n/a"),
        ];
        for (cell, want) in cells {
            assert_eq!(cell.to_string(), want);
        }
    }

    #[test]
    fn cells_in_json_keep_unit_runs_and_samples() {
        let c = Cell::runs(&[3.0, 1.0, 2.0], Unit::Percent, 0).with_samples(vec![5, 6, 7]);
        let want = json!({"value": 2.0, "unit": "%", "min": 1.0, "max": 3.0,
                          "runs": [3.0, 1.0, 2.0], "samples": [5, 6, 7]});
        assert_eq!(c.json(), want);
        assert_eq!(Cell::num(1.5, 1).json(), json!({"value": 1.5}));
        assert_eq!(Cell::text("a").json(), json!("a"));
        assert_eq!(Cell::NotAvailable.json(), Value::Null);
    }

    #[test]
    fn rows_not_run_are_one_line_grouped_by_need() {
        let mut t = Table::new("t", vec![Column::left("row")]);
        assert!(t.below().is_empty());
        t.not_run("a", "/dev/udmabuf", "");
        t.not_run("b", "fio", "");
        t.not_run("c", "/dev/udmabuf", "no such file");
        t.figure("r", Cell::times(2.0));
        let want = ["not run here: 2 rows: /dev/udmabuf; b: fio", "r: 2.00x"];
        assert_eq!(t.below(), want);
        assert_eq!(t.json()["not_run"][2]["why"], "no such file");
    }

    #[test]
    fn columns_line_up() {
        let (row, x) = (Column::left("row"), Column::left("x"));
        let mut t = Table::new("title", vec![row, Column::right("GiB/s"), x]);
        t.row(vec!["a long name".into(), Cell::num(1.5, 2), "".into()]);
        t.row(vec!["b".into(), Cell::num(12.25, 2), "y".into()]);
        t.note("a note");
        let want =
            "title\nrow          GiB/s  x\na long name   1.50\nb            12.25  y\na note";
        assert_eq!(t.text(), want);
    }

    #[test]
    fn a_pipe_table_between_paragraphs() {
        let mut t = Table::new("title", vec![Column::left("row"), Column::right("x")]);
        t.row(vec!["a|b".into(), Cell::times(1.0)]);
        t.note("note");
        let want = "title\n\n| row | x |\n| --- | ---: |\n| a\\|b | 1.00x |\n\nnote\n\n";
        assert_eq!(t.markdown(), want);
    }

    #[test]
    fn grouping() {
        assert_eq!(grouped(0.0, 0), "0");
        assert_eq!(grouped(999.0, 0), "999");
        assert_eq!(grouped(1000.0, 0), "1,000");
        assert_eq!(grouped(1_234_567.891, 2), "1,234,567.89");
        assert_eq!(grouped(-1234.0, 0), "-1,234");
        assert_eq!(grouped(-0.2, 0), "0");
    }
}
