//! `iopath bench rpmsg` bulk rows: one-way streams of large messages over
//! 64 KiB buffers, beside what the machine does with the same bytes:
//!
//! ```text
//!  endpoint fd  client ─► endpoint service ─► vrings ─► remote "sink"
//!  Bus API      host Bus, TxBuffer built in place ─► vrings ─► remote Bus
//!               in this process, ZeroCopyEndpoint (each message read once)
//!  limits       a bare SOCK_SEQPACKET socket to a raw sink (the fd row's);
//!               one thread's memcpy into a ring-sized area (the Bus row's)
//! ```
//!
//! The senders run on the first CPU, everything else on the second.

mod measure;

use std::time::Duration;

use super::children::{bound, Servers, Setup};
use super::raw::sink::Sinks;
use super::RpmsgConfig;
use crate::error::invalid;
use crate::place::{on_cpu, Cpus, Placement};
use crate::report::plot::{Chart, LIMIT, OTHER, PRIMARY, SECONDARY};
use crate::report::{Cell, Column, Table, Unit};
use crate::{Report, Result, Stats};

/// Buffer size both ways: the largest rpmsg can have.
const BUF: u32 = 64 * 1024;
const RING: u32 = 64;

/// One message size over every run: MB/s per run of each way.
#[derive(Debug, Clone, Default)]
struct BulkRow {
    size: usize,
    fd: Vec<f64>,
    raw: Vec<f64>,
    bus: Vec<f64>,
    memcpy: Vec<f64>,
}

/// Runs the bulk rows, a row per message size of `a.bulk_sizes`,
/// `a.bulk_bytes` streamed each way per row and run, `a.runs` runs: their
/// table and chart.
///
/// # Errors
/// [`crate::Error::Invalid`] for a size out of range; when a child cannot
/// start or a stream loses or garbles a message.
pub(super) fn run(a: &RpmsgConfig, cpus: &Cpus, r: &mut Report) -> Result<()> {
    let (sizes, bytes, runs) = (&a.bulk_sizes, a.bulk_bytes, a.runs);
    let max = (BUF as usize) - iopath_rpmsg::wire::HDR_LEN;
    if sizes.is_empty() || sizes.iter().any(|&s| s == 0 || s > max) {
        invalid!("--bulk-sizes", "give sizes of 1 to {max} bytes");
    }
    let (client_cpu, server_cpu) = Placement::Split.cpus(cpus);
    let setup = Setup::sink("iopath-bench-bulk-", RING, &[], server_cpu);
    let srv = Servers::start(&a.iopath, &setup)?;
    let c = srv.connect()?;
    let mut sinks = Sinks::start(bound(&c, "sink")?, &a.iopath, server_cpu)?;
    let pair = measure::BusPair::start(cpus, client_cpu, server_cpu)?;
    let servers = "host, remote, raw sink and the Bus API's receiver";
    let place = Placement::Split.describe(cpus, "senders", servers);
    on_cpu(client_cpu, cpus, || {
        let mut rows: Vec<BulkRow> = sizes
            .iter()
            .map(|&size| BulkRow {
                size,
                ..BulkRow::default()
            })
            .collect();
        for run in 0..runs {
            for i in crate::turns(rows.len(), run) {
                let (row, msgs) = (&mut rows[i], (bytes / sizes[i] as u64).max(1));
                let mb =
                    |took: Duration| (msgs * row.size as u64) as f64 / took.as_secs_f64() / 1e6;
                // The ways take turns, the order rotating per run.
                for w in crate::turns(4, run) {
                    match w {
                        0 => row.fd.push(mb(sinks.stream(false, msgs, row.size)?)),
                        1 => row.raw.push(mb(sinks.stream(true, msgs, row.size)?)),
                        2 => row.bus.push(mb(pair.stream(msgs, row.size)?)),
                        _ => row.memcpy.push(mb(measure::memcpy(msgs, row.size))),
                    }
                }
            }
        }
        drop(sinks);
        pair.stop();
        let t = table(&place, bytes, runs, &rows);
        r.chart(chart(&place, &t));
        r.table(t);
        Ok(())
    })
}

/// MB/s of each way per message size, and the two ratios to their limits.
fn table(place: &str, bytes: u64, runs: usize, rows: &[BulkRow]) -> Table {
    let range = |v: &[f64]| Cell::runs(v, Unit::Grouped, 0);
    let ratio = |a: &[f64], b: &[f64]| Cell::times(Stats::of(a).median / Stats::of(b).median);
    let mib = bytes >> 20;
    let title = format!("bulk, {place}: one-way streams of {mib} MiB per row over 64 KiB buffers, MB/s, medians (min-max) over {runs} runs");
    let mut t = Table::new(
        title,
        vec![
            Column::left("message"),
            Column::right("endpoint fd"),
            Column::right("raw SOCK_SEQPACKET (limit)"),
            Column::right("fd / raw"),
            Column::right("Bus API, zero-copy receive"),
            Column::right("memcpy, one thread (limit)"),
            Column::right("Bus / memcpy"),
        ],
    );
    for r in rows {
        t.row(vec![
            Cell::text(format!("{} B", r.size)),
            range(&r.fd),
            range(&r.raw),
            ratio(&r.fd, &r.raw),
            range(&r.bus),
            range(&r.memcpy),
            ratio(&r.bus, &r.memcpy),
        ]);
    }
    t
}

/// The chart of `t`: MB/s by message size, each way beside its limit.
fn chart(place: &str, t: &Table) -> Chart {
    let title = "rpmsg bulk one-way streams: MB/s by message size, each way beside its limit";
    let about = format!("64 KiB buffers, {place}; median (min-max) over runs");
    let mut c = Chart::new("rpmsg-bulk-throughput", title, "MB/s")
        .about(about, "MB/s, higher is faster")
        .legend(&[
            ("endpoint fd", PRIMARY),
            ("limit: raw SOCK_SEQPACKET", LIMIT),
            ("Bus API, zero-copy receive", SECONDARY),
            ("limit: memcpy, one thread", OTHER),
        ]);
    let ways = [
        ("endpoint fd", PRIMARY),
        ("raw SOCK_SEQPACKET (limit)", LIMIT),
        ("Bus API, zero-copy receive", SECONDARY),
        ("memcpy, one thread (limit)", OTHER),
    ];
    for row in &t.rows {
        c.group(format!("{} messages", row[0]));
        for (way, color) in ways {
            c.bar(way, &row[t.col(way)], color);
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_make_the_table_and_chart() {
        let rows = [BulkRow {
            size: 4096,
            fd: vec![700.0, 800.0, 900.0],
            raw: vec![1000.0, 1000.0, 1100.0],
            bus: vec![2000.0, 2500.0, 2600.0],
            memcpy: vec![5000.0, 5000.0, 5000.0],
        }];
        let t = table("split", 32 << 20, 3, &rows);
        assert_eq!(t.rows.len(), 1);
        assert_eq!(t.rows[0][3].value(), Some(0.8));
        let (titles, whiskers) = chart("split", &t).bar_titles();
        for v in [
            "endpoint fd: 800",
            "(limit): 1,000",
            "receive: 2,500",
            "(limit): 5,000",
        ] {
            let v = format!("{v} MB/s");
            assert!(titles.iter().any(|t| t.ends_with(&v)), "{v}: {titles:?}");
        }
        assert_eq!(whiskers, 4);
    }
}
