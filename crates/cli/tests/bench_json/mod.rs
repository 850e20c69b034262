//! Reading a report of `iopath bench --json`: its tables by title, a
//! table's rows by their first cell, a row's cells by column heading.
#![allow(dead_code)] // each test file uses some of them

use serde_json::Value;

/// Every table of `report` whose title starts with `title`.
pub fn tables<'a>(report: &'a Value, title: &str) -> Vec<&'a Value> {
    let all = report["tables"].as_array().expect("a report has tables");
    all.iter()
        .filter(|t| t["title"].as_str().unwrap().starts_with(title))
        .collect()
}

/// The first table of `report` whose title starts with `title`.
pub fn table<'a>(report: &'a Value, title: &str) -> &'a Value {
    let found = tables(report, title).first().copied();
    found.unwrap_or_else(|| panic!("no table {title:?} in {report}"))
}

/// The rows of `t`.
pub fn rows(t: &Value) -> &Vec<Value> {
    t["rows"].as_array().unwrap()
}

/// The row of `t` whose first cell is `name`, if it ran.
pub fn row<'a>(t: &'a Value, name: &str) -> Option<&'a Value> {
    rows(t).iter().find(|r| r[0] == name)
}

/// The first row of `t` whose first cell starts with `prefix`, if it ran.
pub fn row_like<'a>(t: &'a Value, prefix: &str) -> Option<&'a Value> {
    rows(t)
        .iter()
        .find(|r| r[0].as_str().is_some_and(|s| s.starts_with(prefix)))
}

/// The entry of a row of `t` that did not run (`row`, `needs`, `why`)
/// whose name starts with `prefix`.
pub fn not_run<'a>(t: &'a Value, prefix: &str) -> Option<&'a Value> {
    let all = t["not_run"].as_array().unwrap();
    all.iter()
        .find(|n| n["row"].as_str().unwrap().starts_with(prefix))
}

/// The cell of `row` (of `t`) under the column headed `column`.
pub fn cell<'a>(t: &Value, row: &'a Value, column: &str) -> &'a Value {
    let columns = t["columns"].as_array().unwrap();
    let i = columns.iter().position(|c| c == column);
    &row[i.unwrap_or_else(|| panic!("no column {column:?} in {t}"))]
}

/// The value of the figure in `row` (of `t`) under `column`.
pub fn value(t: &Value, row: &Value, column: &str) -> f64 {
    let c = cell(t, row, column);
    c["value"]
        .as_f64()
        .unwrap_or_else(|| panic!("no figure under {column:?} in {row}"))
}

/// The runs behind the figure in `row` (of `t`) under `column`.
pub fn runs(t: &Value, row: &Value, column: &str) -> Vec<f64> {
    let c = cell(t, row, column);
    let runs = c["runs"]
        .as_array()
        .unwrap_or_else(|| panic!("no runs under {column:?} in {row}"));
    runs.iter().map(|r| r.as_f64().unwrap()).collect()
}
