//! The text writer: each table's title, its columns aligned (names left,
//! figures right) two spaces apart, the lines below it; a blank line
//! between tables.

use super::model::Table;
use super::Report;

/// The whole report: the summary line, the tables, the notes.
pub(super) fn report(r: &Report) -> String {
    let mut blocks = vec![r.summary.clone()];
    blocks.extend(r.tables.iter().map(table));
    blocks.push(r.notes.join("\n"));
    blocks.retain(|b| !b.is_empty());
    format!("{}\n", blocks.join("\n\n"))
}

/// One table: title, heading, rows, the lines below (no trailing newline).
fn table(t: &Table) -> String {
    let heading = t.columns.iter().map(|c| c.name.clone()).collect();
    let rows: Vec<Vec<String>> = t
        .rows
        .iter()
        .map(|r| r.iter().map(ToString::to_string).collect())
        .collect();
    let all: Vec<&Vec<String>> = std::iter::once(&heading).chain(&rows).collect();
    let width = |i: usize| all.iter().map(|r| r[i].chars().count()).max().unwrap_or(0);
    let widths: Vec<usize> = (0..t.columns.len()).map(width).collect();
    let line = |row: &Vec<String>| {
        let cells = row
            .iter()
            .zip(&t.columns)
            .zip(&widths)
            .map(|((cell, col), &w)| match col.right {
                true => format!("{cell:>w$}"),
                false => format!("{cell:<w$}"),
            });
        cells.collect::<Vec<_>>().join("  ").trim_end().to_string()
    };
    let title = Some(t.title.clone()).filter(|t| !t.is_empty());
    let lines = title
        .into_iter()
        .chain(all.into_iter().map(line))
        .chain(t.below());
    lines.collect::<Vec<_>>().join("\n")
}

#[cfg(test)]
mod tests {
    use super::super::model::{Cell, Column};
    use super::*;

    #[test]
    fn columns_line_up() {
        let columns = vec![
            Column::left("row"),
            Column::right("GiB/s"),
            Column::left("x"),
        ];
        let mut t = Table::new("title", columns);
        t.row(vec!["a long name".into(), Cell::num(1.5, 2), "".into()]);
        t.row(vec!["b".into(), Cell::num(12.25, 2), "y".into()]);
        t.note("a note");
        let want =
            "title\nrow          GiB/s  x\na long name   1.50\nb            12.25  y\na note";
        assert_eq!(table(&t), want);
    }
}
