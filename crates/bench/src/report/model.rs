//! The report model: tables of cells, each cell a figure with its unit and
//! the runs' range, or words. The text and Markdown writers lay the same
//! cells out; neither formats a figure itself.

use std::fmt;

/// How a column's cells line up in the text table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    /// Names and labels.
    Left,
    /// Figures.
    Right,
}

/// A column: its heading and alignment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    /// The heading.
    pub name: String,
    /// How its cells line up.
    pub align: Align,
}

impl Column {
    /// A column of names or labels.
    pub fn left(name: impl Into<String>) -> Column {
        Column {
            name: name.into(),
            align: Align::Left,
        }
    }

    /// A column of figures.
    pub fn right(name: impl Into<String>) -> Column {
        Column {
            name: name.into(),
            align: Align::Right,
        }
    }
}

/// What a figure counts, as its cell writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// A bare number; the column heading names the unit.
    Plain,
    /// A count or a large figure: thousands separated (`12,345`).
    Grouped,
    /// Percent (`97.5%`).
    Percent,
    /// A ratio (`1.25x`).
    Times,
    /// Microseconds (`6.0 us`), where a column mixes units.
    Micros,
}

/// One measured figure: its value, unit, decimals and, over several runs,
/// the smallest and largest run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Figure {
    /// The value (a median over runs, usually).
    pub value: f64,
    /// What it counts.
    pub unit: Unit,
    /// Decimals written.
    pub digits: usize,
    /// The runs' minimum and maximum, written `(min-max)`.
    pub range: Option<(f64, f64)>,
}

/// One cell of a table.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    /// Words: a row's name, a label, a verdict.
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

    /// Microseconds with `digits` decimals (`6.0 us`).
    pub fn micros(us: f64, digits: usize) -> Cell {
        Cell::figure(us, Unit::Micros, digits)
    }

    /// A figure of `unit`; `n/a` when it is not a finite number (a row
    /// with no runs, a ratio over zero).
    pub fn figure(value: f64, unit: Unit, digits: usize) -> Cell {
        if value.is_finite() {
            Cell::Figure(Figure {
                value,
                unit,
                digits,
                range: None,
            })
        } else {
            Cell::NotAvailable
        }
    }

    /// The figure with the runs' range `(min-max)` after it.
    pub fn with_range(self, min: f64, max: f64) -> Cell {
        match self {
            Cell::Figure(f) if min.is_finite() && max.is_finite() => Cell::Figure(Figure {
                range: Some((min, max)),
                ..f
            }),
            other => other,
        }
    }

    /// The median of `runs` with their range; `n/a` without runs.
    pub fn runs(runs: &[f64], unit: Unit, digits: usize) -> Cell {
        let s = crate::Summary::of(runs);
        Cell::figure(s.median, unit, digits).with_range(s.min, s.max)
    }

    /// `Some` figure as a cell, else `n/a`.
    pub fn or_na(value: Option<Cell>) -> Cell {
        value.unwrap_or(Cell::NotAvailable)
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

impl fmt::Display for Figure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let num = |v: f64| match self.unit {
            Unit::Grouped => grouped(v, self.digits),
            _ => format!("{v:.d$}", d = self.digits),
        };
        let unit = match self.unit {
            Unit::Plain | Unit::Grouped => "",
            Unit::Percent => "%",
            Unit::Times => "x",
            Unit::Micros => " us",
        };
        write!(f, "{}{unit}", num(self.value))?;
        if let Some((lo, hi)) = self.range {
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
    let (int, frac) = s
        .split_once('.')
        .map_or((&s[..], None), |(i, f)| (i, Some(f)));
    let mut out = String::new();
    if v < 0.0 && s.bytes().any(|b| b.is_ascii_digit() && b != b'0') {
        out.push('-');
    }
    for (i, c) in int.chars().enumerate() {
        if i > 0 && (int.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if let Some(frac) = frac {
        out.push('.');
        out.push_str(frac);
    }
    out
}

/// A table: a title above, headed columns, rows of cells, notes below.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Table {
    /// What the table shows and how it was measured (one line; may be
    /// empty).
    pub title: String,
    /// The columns.
    pub columns: Vec<Column>,
    /// The rows, one cell per column.
    pub rows: Vec<Vec<Cell>>,
    /// Lines below the table: the limit's source, what it compares.
    pub notes: Vec<String>,
    /// The rows that did not run, each with what it needs (the kernel
    /// feature, the peer program, or why it failed): written as one line.
    pub not_run: Vec<(String, String)>,
}

impl Table {
    /// A table titled `title` with `columns` and no rows yet.
    pub fn new(title: impl Into<String>, columns: Vec<Column>) -> Table {
        Table {
            title: title.into(),
            columns,
            rows: Vec::new(),
            notes: Vec::new(),
            not_run: Vec::new(),
        }
    }

    /// Adds a row (one cell per column).
    pub fn row(&mut self, cells: Vec<Cell>) {
        debug_assert_eq!(cells.len(), self.columns.len(), "{cells:?}");
        self.rows.push(cells);
    }

    /// Adds a note below the table.
    pub fn note(&mut self, note: impl Into<String>) {
        self.notes.push(note.into());
    }

    /// Records a row that did not run and what it needs.
    pub fn not_run(&mut self, row: impl Into<String>, needs: impl Into<String>) {
        self.not_run.push((row.into(), needs.into()));
    }

    /// The one line about the rows that did not run, grouped by what they
    /// need (`None`: every row ran): `not run here: ROW: NEED; 4 rows: NEED`.
    pub fn not_run_line(&self) -> Option<String> {
        let mut needs: Vec<(&str, Vec<&str>)> = Vec::new();
        for (row, need) in &self.not_run {
            match needs.iter_mut().find(|(n, _)| n == need) {
                Some((_, rows)) => rows.push(row),
                None => needs.push((need, vec![row])),
            }
        }
        let groups: Vec<String> = needs
            .iter()
            .map(|(need, rows)| match rows[..] {
                [row] => format!("{row}: {need}"),
                _ => format!("{} rows: {need}", rows.len()),
            })
            .collect();
        (!groups.is_empty()).then(|| format!("not run here: {}", groups.join("; ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_write_their_figures() {
        assert_eq!(Cell::num(1.23456, 3).to_string(), "1.235");
        assert_eq!(Cell::percent(97.54, 1).to_string(), "97.5%");
        assert_eq!(Cell::times(1.256).to_string(), "1.26x");
        assert_eq!(Cell::micros(6.04, 1).to_string(), "6.0 us");
        assert_eq!(
            Cell::grouped(12_345.4, 0)
                .with_range(9_999.6, 1_234_567.0)
                .to_string(),
            "12,345 (10,000-1,234,567)"
        );
        assert_eq!(Cell::num(f64::NAN, 1).to_string(), "n/a");
        assert_eq!(
            Cell::num(1.0, 1).with_range(f64::NAN, 2.0).to_string(),
            "1.0"
        );
        assert_eq!(Cell::Empty.to_string(), "-");
        assert_eq!(Cell::or_na(None).to_string(), "n/a");
        assert_eq!(
            Cell::runs(&[3.0, 1.0, 2.0], Unit::Plain, 0).to_string(),
            "2 (1-3)"
        );
        assert_eq!(Cell::runs(&[], Unit::Plain, 0).to_string(), "n/a");
    }

    #[test]
    fn rows_not_run_are_one_line_grouped_by_need() {
        let mut t = Table::new("t", vec![Column::left("row")]);
        assert_eq!(t.not_run_line(), None);
        t.not_run("a", "/dev/udmabuf");
        t.not_run("b", "fio");
        t.not_run("c", "/dev/udmabuf");
        assert_eq!(
            t.not_run_line().unwrap(),
            "not run here: 2 rows: /dev/udmabuf; b: fio"
        );
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
