//! The text writer: each table's title, its columns aligned (names left,
//! figures right) two spaces apart, its notes; a blank line between
//! tables.

use super::model::{Align, Table};
use super::Report;

/// The whole report: the summary line, the tables, the notes.
pub(super) fn report(r: &Report) -> String {
    let mut blocks = vec![r.summary.clone()];
    blocks.extend(r.tables.iter().map(table));
    if !r.notes.is_empty() {
        blocks.push(r.notes.join("\n"));
    }
    let mut out = blocks
        .into_iter()
        .filter(|b| !b.is_empty())
        .collect::<Vec<_>>()
        .join("\n\n");
    out.push('\n');
    out
}

/// One table: title, heading, rows, notes (no trailing newline).
pub(super) fn table(t: &Table) -> String {
    let cells: Vec<Vec<String>> = t
        .rows
        .iter()
        .map(|r| r.iter().map(ToString::to_string).collect())
        .collect();
    let widths: Vec<usize> = t
        .columns
        .iter()
        .enumerate()
        .map(|(i, c)| {
            cells
                .iter()
                .filter_map(|r| r.get(i))
                .map(|s| s.chars().count())
                .chain([c.name.chars().count()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |row: &mut dyn Iterator<Item = &str>| {
        let mut s = String::new();
        for (i, (cell, col)) in row.zip(&t.columns).enumerate() {
            if i > 0 {
                s.push_str("  ");
            }
            let pad = widths[i].saturating_sub(cell.chars().count());
            match col.align {
                Align::Left => {
                    s.push_str(cell);
                    s.extend(std::iter::repeat_n(' ', pad));
                }
                Align::Right => {
                    s.extend(std::iter::repeat_n(' ', pad));
                    s.push_str(cell);
                }
            }
        }
        s.trim_end().to_string()
    };
    let mut lines = Vec::new();
    if !t.title.is_empty() {
        lines.push(t.title.clone());
    }
    lines.push(line(&mut t.columns.iter().map(|c| c.name.as_str())));
    for r in &cells {
        lines.push(line(&mut r.iter().map(String::as_str)));
    }
    lines.extend(t.not_run_line());
    lines.extend(t.figures.iter().map(|(l, c)| format!("{l}: {c}")));
    lines.extend(t.notes.iter().cloned());
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::super::model::{Cell, Column};
    use super::*;

    #[test]
    fn columns_line_up() {
        let mut t = Table::new(
            "title",
            vec![
                Column::left("row"),
                Column::right("GiB/s"),
                Column::left("x"),
            ],
        );
        t.row(vec!["a long name".into(), Cell::num(1.5, 2), "".into()]);
        t.row(vec!["b".into(), Cell::num(12.25, 2), "y".into()]);
        t.note("a note");
        assert_eq!(
            table(&t),
            "title\n\
             row          GiB/s  x\n\
             a long name   1.50\n\
             b            12.25  y\n\
             a note"
        );
    }
}
