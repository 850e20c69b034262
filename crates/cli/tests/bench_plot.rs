//! `iopath bench ... --plot DIR` through the binary: each chart is a file
//! named by what it shows, parses as SVG, is 1200 wide with text of 16 px
//! or more, and each of its bars is a figure of its table as the table
//! prints it (`--markdown`), written beside it, in the table's order.

use std::path::Path;
use std::process::Command;

use iopath_bench::plot::{hex, RGBColor, LIMIT, PEER, PRIMARY, SECONDARY, WHISKER};

const BIN: &str = env!("CARGO_BIN_EXE_iopath");

/// Runs `iopath ARGS --plot DIR --markdown DIR/report.md` and returns the
/// Markdown's tables and the chart files written, by name.
fn bench(args: &[&str], dir: &Path) -> (Vec<MdTable>, Vec<String>) {
    let md = dir.join("report.md");
    let out = Command::new(BIN)
        .args(args)
        .arg("--plot")
        .arg(dir)
        .arg("--markdown")
        .arg(&md)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut charts: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".svg"))
        .collect();
    charts.sort();
    (md_tables(&std::fs::read_to_string(md).unwrap()), charts)
}

/// A Markdown table as written: the paragraph above it, its heading, its
/// rows' cells as printed.
struct MdTable {
    title: String,
    columns: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl MdTable {
    /// The printed cell of `row` under `column`, without its `(min-max)`.
    fn figure<'a>(&self, row: &'a [String], column: &str) -> &'a str {
        let i = self.columns.iter().position(|c| c == column);
        let cell = &row[i.unwrap_or_else(|| panic!("no column {column:?} in {:?}", self.columns))];
        cell.split(" (").next().unwrap()
    }
}

fn md_tables(md: &str) -> Vec<MdTable> {
    let cells = |l: &str| -> Vec<String> {
        let inner = l.trim().trim_start_matches('|').trim_end_matches('|');
        inner
            .split(" | ")
            .map(|c| c.trim().replace("\\|", "|"))
            .collect()
    };
    let (mut out, mut para) = (Vec::new(), String::new());
    let mut lines = md.lines().peekable();
    while let Some(l) = lines.next() {
        if !l.starts_with('|') {
            if !l.is_empty() {
                para = l.to_string();
            }
            continue;
        }
        let columns = cells(l);
        lines.next(); // the alignment row
        let mut rows = Vec::new();
        while let Some(r) = lines.next_if(|r| r.starts_with('|')) {
            rows.push(cells(r));
        }
        let title = std::mem::take(&mut para);
        out.push(MdTable {
            title,
            columns,
            rows,
        });
    }
    out
}

/// The one table whose title starts with `prefix`.
fn table<'a>(tables: &'a [MdTable], prefix: &str) -> &'a MdTable {
    let mut found = tables.iter().filter(|t| t.title.starts_with(prefix));
    let t = found
        .next()
        .unwrap_or_else(|| panic!("no table {prefix:?}"));
    assert!(found.next().is_none(), "two tables {prefix:?}");
    t
}

/// One chart's bars as a reader sees them: each bar (a filled `<rect>`
/// 26 px high, or 12 for a phase) with its fill and `GROUP, ROW: VALUE`
/// (the bold heading above it, the label left of it, the text right of
/// it), and its whiskers; checked readable as it is read.
struct Chart {
    bars: Vec<(String, String)>,
    whiskers: usize,
}

impl Chart {
    fn read(path: &Path) -> Chart {
        let text = std::fs::read_to_string(path).unwrap();
        let doc = roxmltree::Document::parse(&text).unwrap();
        let svg = doc.root_element();
        assert_eq!(svg.tag_name().name(), "svg");
        assert_eq!(svg.attribute("width"), Some("1200"), "{}", path.display());
        let (mut group, mut row, mut bar) = (String::new(), String::new(), None);
        let (mut bars, mut whiskers, mut titles, mut axes) = (Vec::new(), 0, 0, 0);
        for n in doc.descendants() {
            let attr = |a: &str| n.attribute(a).unwrap_or_default();
            match n.tag_name().name() {
                "text" => {
                    let s = n.text().unwrap_or_default().trim().to_string();
                    let size: f64 = attr("font-size").parse().unwrap();
                    let bold = attr("font-weight") == "bold";
                    assert!(size >= 16.0, "{s:?} at {size} px in {}", path.display());
                    if bold && size >= 20.0 {
                        titles += 1;
                    } else if bold {
                        group = s;
                    } else if attr("text-anchor") == "end" {
                        row = s;
                    } else if let Some(fill) = bar.take() {
                        let title = match group.as_str() {
                            "" => format!("{row}: {s}"),
                            g => format!("{g}, {row}: {s}"),
                        };
                        bars.push((fill, title));
                    } else if attr("text-anchor") == "middle" && s.contains(", ") {
                        axes += 1;
                    }
                }
                "rect" if ["26", "12"].contains(&attr("height")) => {
                    bar = Some(attr("fill").to_string());
                }
                "polyline" if attr("stroke") == hex(WHISKER) => whiskers += 1,
                _ => {}
            }
        }
        assert!(titles >= 1 && axes == 1, "{}", path.display());
        Chart { bars, whiskers }
    }

    /// The bars' titles.
    fn titles(&self) -> Vec<&str> {
        self.bars.iter().map(|b| b.1.as_str()).collect()
    }

    fn count(&self, color: RGBColor) -> usize {
        self.bars.iter().filter(|b| b.0 == hex(color)).count()
    }
}

#[test]
fn heap_chart_draws_totals_as_measured_and_the_phases_beside_them() {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "bench",
        "heap",
        "--size",
        "8M",
        "--buffer-size",
        "1M",
        "--runs",
        "1",
        "--heaps",
        "memfd",
        "--methods",
        "auto,direct,buffered",
    ];
    let (tables, charts) = bench(&args, dir.path());
    assert!(
        charts.contains(&"heap-load-time-by-method.svg".into()),
        "{charts:?}"
    );
    let t = &tables[0];
    let mut want = Vec::new();
    for r in &t.rows {
        let total = t.figure(r, "total ms");
        if r[0].starts_with("limit") || r[0] == "alloc only" {
            want.push(format!("{}, {}: {total} ms", r[0], r[1]));
            continue;
        }
        let row = format!("{} {}", r[0], r[1]);
        want.push(format!("{row}: {total} ms"));
        want.push(format!("{row}: alloc {} ms", t.figure(r, "alloc ms")));
        want.push(format!("{row}: read {} ms", t.figure(r, "read ms")));
    }
    let c = Chart::read(&dir.path().join("heap-load-time-by-method.svg"));
    assert_eq!(c.titles(), want);
    // Three heap x method totals, the limit as a bar of its own.
    assert_eq!(c.count(PRIMARY), 3);
    assert_eq!(c.count(LIMIT), 1);
}

#[test]
fn blk_chart_has_each_rows_median_and_range() {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "bench",
        "blk",
        "--size",
        "16M",
        "--runs",
        "2",
        "--small-count",
        "0",
    ];
    let (tables, charts) = bench(&args, dir.path());
    assert_eq!(charts, ["blk-8m-throughput-by-dma-mode.svg"]);
    let t = &tables[0];
    let want: Vec<String> = t
        .rows
        .iter()
        .map(|r| format!("{}: {} GiB/s", r[0], t.figure(r, "GiB/s, median (min-max)")))
        .collect();
    let c = Chart::read(&dir.path().join(&charts[0]));
    assert_eq!(c.titles(), want);
    assert_eq!(c.whiskers, t.rows.len());
    let modes = t
        .rows
        .iter()
        .filter(|r| r[0].starts_with("iopath blk serve"));
    assert_eq!(c.count(PRIMARY), modes.count());
    assert_eq!(c.count(LIMIT), 1);
    let peer = t
        .rows
        .iter()
        .any(|r| r[0].starts_with("qemu-storage-daemon"));
    assert_eq!(c.count(PEER), usize::from(peer));
    if !peer {
        iopath_testkit::skip(
            iopath_testkit::Feature::Package("qemu-utils"),
            "the qemu-storage-daemon row was skipped: no peer bar to check",
        );
    }
}

#[test]
fn rpmsg_charts_are_create_destroy_per_cycle_and_echo_latency() {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "bench",
        "rpmsg",
        "--loops",
        "200,300",
        "--runs",
        "1",
        "--count",
        "200",
        "--placement",
        "one",
        "--bulk-mib",
        "0",
    ];
    let (tables, charts) = bench(&args, dir.path());
    let want = [
        "rpmsg-echo-latency.svg",
        "rpmsg-endpoint-create-destroy.svg",
    ];
    assert_eq!(charts, want);
    // A bar per way at its cost per cycle, named as its table row.
    let t = table(&tables, "endpoint create+destroy, placement one");
    let c = Chart::read(&dir.path().join(&charts[1]));
    assert_eq!(c.bars.len(), t.rows.len());
    for (r, title) in t.rows.iter().zip(c.titles()) {
        let (row, value) = title.rsplit_once(": ").unwrap();
        assert!(
            row.starts_with(&format!("placement one, {}", r[0])),
            "{title}"
        );
        assert_eq!(value, format!("{} us", t.figure(r, "per cycle us")));
    }
    assert_eq!((c.count(SECONDARY), c.count(PRIMARY)), (1, 1));
    assert_eq!(c.whiskers, t.rows.len());
    // Echo: each path's p50, then each path's p99, the limit among them.
    let t = table(&tables, "echo round trip, placement one");
    let c = Chart::read(&dir.path().join(&charts[0]));
    let mut want = Vec::new();
    for p in ["p50", "p99"] {
        for r in &t.rows {
            let short = r[0].split([',', ':', '(']).next().unwrap().trim();
            let v = t.figure(r, &format!("{p} us"));
            want.push(format!("placement one, {short}, {p}: {v} us"));
        }
    }
    assert_eq!(c.titles(), want);
    assert_eq!((c.count(PRIMARY), c.count(LIMIT)), (2, 2));
}

#[test]
fn blk_small_block_charts_are_iops_by_depth_one_per_direction() {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "bench",
        "blk",
        "--size",
        "16M",
        "--runs",
        "1",
        "--modes",
        "direct",
        "--small-count",
        "256",
        "--small-runs",
        "1",
    ];
    let (tables, charts) = bench(&args, dir.path());
    let want = [
        "blk-4k-random-read-iops.svg",
        "blk-4k-random-write-iops.svg",
        "blk-8m-throughput-by-dma-mode.svg",
    ];
    assert_eq!(charts, want);
    let t = table(&tables, "4 KiB random I/O");
    for op in ["read", "write"] {
        let mut want = Vec::new();
        for qd in ["1", "32"] {
            let rows = t.rows.iter().filter(|r| r[1] == op && r[2] == qd);
            for r in rows {
                let iops = t.figure(r, "IOPS, median (min-max)");
                want.push(format!("queue depth {qd}, {}: {iops} IOPS", r[0]));
            }
        }
        assert!(want.len() >= 2 * 5, "{want:?}");
        let c = Chart::read(&dir.path().join(format!("blk-4k-random-{op}-iops.svg")));
        assert_eq!(c.titles(), want);
        let fio = want.iter().filter(|w| w.contains(", fio ")).count();
        assert_eq!(c.count(LIMIT), fio, "fio's rows in the limit's colour");
    }
}
