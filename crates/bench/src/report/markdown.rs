//! The Markdown writer: the same tables as the text writer, as pipe
//! tables (figures right-aligned), each title and line below a paragraph.

use super::model::{Column, Table};
use super::Report;

/// The whole report: the summary, the tables, the notes, as paragraphs.
pub(super) fn report(r: &Report) -> String {
    let mut out = String::new();
    paragraph(&mut out, &r.summary);
    for t in &r.tables {
        table(&mut out, t);
    }
    for n in &r.notes {
        paragraph(&mut out, n);
    }
    out
}

fn paragraph(out: &mut String, s: &str) {
    if !s.is_empty() {
        out.push_str(s);
        out.push_str("\n\n");
    }
}

fn table(out: &mut String, t: &Table) {
    paragraph(out, &t.title);
    let row = |cells: Vec<String>| format!("| {} |\n", cells.join(" | "));
    // A pipe in a cell would end it.
    let escape = |s: String| s.replace('|', "\\|");
    let name = |c: &Column| escape(c.name.clone());
    let align = |c: &Column| if c.right { "---:" } else { "---" };
    out.push_str(&row(t.columns.iter().map(name).collect()));
    out.push_str(&row(t.columns.iter().map(|c| align(c).into()).collect()));
    for r in &t.rows {
        out.push_str(&row(r.iter().map(|c| escape(c.to_string())).collect()));
    }
    out.push('\n');
    for line in t.below() {
        paragraph(out, &line);
    }
}

#[cfg(test)]
mod tests {
    use super::super::model::Cell;
    use super::*;

    #[test]
    fn a_pipe_table_between_paragraphs() {
        let mut t = Table::new("title", vec![Column::left("row"), Column::right("x")]);
        t.row(vec!["a|b".into(), Cell::times(1.0)]);
        t.note("note");
        let mut out = String::new();
        table(&mut out, &t);
        assert_eq!(
            out,
            "title\n\n| row | x |\n| --- | ---: |\n| a\\|b | 1.00x |\n\nnote\n\n"
        );
    }
}
