//! `iopath bench ... --plot DIR` through the binary: each SVG parses as
//! XML and holds one mark per table row and the limit's line.

use std::path::Path;
use std::process::Command;

use bench_json::{not_run, row_like, rows, runs, table, tables};
use iopath_bench::plot::{hex, RGBColor, LIMIT, OTHER, PEER, PRIMARY, SECONDARY, WHISKER};

mod bench_json;

const BIN: &str = env!("CARGO_BIN_EXE_iopath");

/// Runs `iopath ARGS --plot DIR --json` and returns its JSON.
fn bench(args: &[&str], dir: &Path) -> serde_json::Value {
    let out = Command::new(BIN)
        .args(args)
        .arg("--plot")
        .arg(dir)
        .arg("--json")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The marks of one SVG: filled rectangles and polylines, by colour.
struct Marks {
    rects: Vec<String>,
    polylines: Vec<String>,
}

impl Marks {
    fn read(path: &Path) -> Marks {
        let text = std::fs::read_to_string(path).unwrap();
        let doc = roxmltree::Document::parse(&text).unwrap();
        assert_eq!(doc.root_element().tag_name().name(), "svg");
        let of = |tag: &str, attr: &str| -> Vec<String> {
            doc.descendants()
                .filter(|n| n.tag_name().name() == tag)
                .filter_map(|n| n.attribute(attr).map(str::to_string))
                .collect()
        };
        Marks {
            rects: of("rect", "fill"),
            polylines: of("polyline", "stroke"),
        }
    }

    fn bars(&self, color: RGBColor) -> usize {
        self.rects.iter().filter(|c| **c == hex(color)).count()
    }

    fn lines(&self, color: RGBColor) -> usize {
        self.polylines.iter().filter(|c| **c == hex(color)).count()
    }
}

#[test]
fn heap_chart_has_a_split_bar_per_row_and_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let v = bench(
        &[
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
        ],
        dir.path(),
    );
    // The heap x method rows, not the two bounds.
    let bound =
        |r: &&serde_json::Value| r[0] == "limit" || r[0] == "limit (own)" || r[0] == "alloc only";
    let rows = rows(&v["tables"][0]).iter().filter(|r| !bound(r)).count();
    assert_eq!(rows, 3);
    let m = Marks::read(&dir.path().join("heap.svg"));
    // Each heap x method: allocation and read time, stacked.
    assert_eq!(m.bars(PRIMARY), rows);
    assert_eq!(m.bars(SECONDARY), rows);
    // The alloc-only bound and the limit line.
    assert_eq!(m.bars(OTHER), 1);
    assert_eq!(m.lines(LIMIT), 1);
}

#[test]
fn blk_chart_has_a_bar_and_whisker_per_row_and_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let v = bench(
        &[
            "bench",
            "blk",
            "--size",
            "16M",
            "--runs",
            "1",
            "--small-count",
            "0",
        ],
        dir.path(),
    );
    let t = &v["tables"][0];
    let measured = |name: &str| row_like(t, name).is_some();
    // Every row, measured or not.
    let names = rows(t)
        .iter()
        .map(|r| &r[0])
        .chain(t["not_run"].as_array().unwrap().iter().map(|n| &n["row"]));
    let modes = names
        .filter(|n| n.as_str().unwrap().starts_with("iopath blk serve"))
        .count();
    assert_eq!(modes, 4);
    let m = Marks::read(&dir.path().join("blk.svg"));
    assert_eq!(m.bars(PRIMARY), modes);
    let peer = usize::from(measured("qemu-storage-daemon"));
    if peer == 0 {
        iopath_testkit::skip(
            iopath_testkit::Feature::Package("qemu-utils"),
            "the qemu-storage-daemon row was skipped: no peer bar to check",
        );
    }
    assert_eq!(m.bars(PEER), peer);
    assert_eq!(m.lines(WHISKER), modes + peer);
    assert_eq!(m.lines(LIMIT), 1);
}

#[test]
fn rpmsg_chart_has_both_ways_per_loop_count_the_limit_and_echo() {
    let dir = tempfile::tempdir().unwrap();
    let v = bench(
        &[
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
        ],
        dir.path(),
    );
    // The loop counts: a column each in the create+destroy table.
    let t = table(&v, "endpoint create+destroy");
    let columns = t["columns"].as_array().unwrap();
    let rows = columns
        .iter()
        .filter(|c| c.as_str().unwrap().ends_with(" loops, total us"))
        .count();
    assert_eq!(rows, 2);
    assert_eq!(tables(&v, "endpoint create+destroy").len(), 1);
    let m = Marks::read(&dir.path().join("rpmsg.svg"));
    // legacy and fd per loop count, echo p50/p99 beside the raw ping-pong's.
    assert_eq!(m.bars(SECONDARY), rows);
    assert_eq!(m.bars(PRIMARY), rows + 2);
    assert_eq!(m.bars(LIMIT), 2);
    assert_eq!(m.lines(WHISKER), 2 * rows);
    assert_eq!(m.lines(LIMIT), 1);
}

#[test]
fn blk_small_block_table_measures_every_iopath_row_and_charts_by_depth() {
    let dir = tempfile::tempdir().unwrap();
    let v = bench(
        &[
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
        ],
        dir.path(),
    );
    let s = table(&v, "4 KiB random I/O");
    // Two directions; eight rows (libblkio's three among them) at depths
    // 1 and 32, two queues at 32: measured, or not run.
    let not_run_rows = s["not_run"].as_array().unwrap().len();
    assert_eq!(rows(s).len() + not_run_rows, 2 * (8 * 2 + 1), "{s}");
    assert!(not_run(s, "iopath blk serve").is_none(), "{s}");
    for r in rows(s) {
        if !r[0].as_str().unwrap().starts_with("iopath blk serve") {
            continue;
        }
        let run = |k| runs(s, r, k)[0];
        for k in ["IOPS, median (min-max)", "p50", "p99", "CPU per request"] {
            assert!(run(k) > 0.0, "{k} of {r}");
        }
        assert!(run("p99") >= run("p50"), "{r}");
    }
    let ratios = s["figures"].as_object().unwrap();
    assert!(
        ratios["read qd 1: adaptive / sleeping, IOPS"]["value"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    assert!(ratios.contains_key("read qd 1: --poll / qemu-storage-daemon, IOPS"));
    assert!(ratios.contains_key("read qd 32: blk serve sleeping, iopath / libblkio, IOPS"));
    // The chart: the dd panel, then IOPS by depth for reads and writes.
    let svg = std::fs::read_to_string(dir.path().join("blk.svg")).unwrap();
    assert!(svg.contains("4 KiB random read: IOPS by queue depth"));
    assert!(svg.contains("4 KiB random write: IOPS by queue depth"));
}
