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

use std::path::Path;

use super::children::{bound, Servers, Setup};
use super::raw::sink::Sinks;
use crate::error::invalid;
use crate::place::{on_cpu, Cpus, Placement};
use crate::report::plot::{Bar, Panel, LIMIT, OTHER, PRIMARY, SECONDARY};
use crate::report::{Cell, Column, Table, Unit};
use crate::{Report, Result, Stats};

/// Buffer size both ways: the largest rpmsg can have.
const BUF: u32 = 64 * 1024;
const RING: u32 = 64;

/// One message size over every run: messages per run, MB/s per run of
/// each way.
#[derive(Debug, Clone)]
struct BulkRow {
    size: usize,
    msgs: u64,
    fd: Vec<f64>,
    raw: Vec<f64>,
    bus: Vec<f64>,
    memcpy: Vec<f64>,
}

/// Runs the bulk rows, a row per message size of `sizes`, `bytes` streamed
/// each way per row and run, `runs` runs: their table and chart panel.
///
/// # Errors
/// [`crate::Error::Invalid`] for a size out of range; when a child cannot
/// start or a stream loses or garbles a message.
pub(super) fn run(
    sizes: &[usize],
    bytes: u64,
    runs: usize,
    iopath: &Path,
    cpus: &Cpus,
    r: &mut Report,
) -> Result<()> {
    let max = (BUF as usize) - iopath_rpmsg::wire::HDR_LEN;
    if sizes.is_empty() || sizes.iter().any(|&s| s == 0 || s > max) {
        invalid!("--bulk-sizes", "give sizes of 1 to {max} bytes");
    }
    let (client_cpu, server_cpu) = Placement::Split.cpus(cpus);
    let (buf, ring) = (format!("{}K", BUF / 1024), RING.to_string());
    let setup = Setup {
        parent: &std::env::temp_dir(),
        prefix: "iopath-bench-bulk-",
        poll: false,
        remote_args: &[
            "--event-idx",
            "--sink",
            "sink",
            "--buf-size",
            &buf,
            "--ring",
            &ring,
        ],
        shm_size: measure::shm_size(),
        remote_cpu: server_cpu,
        host_cpu: server_cpu,
    };
    let srv = Servers::start(iopath, &setup)?;
    let c = srv.connect()?;
    let mut sinks = Sinks::start(bound(&c, "sink")?, iopath, server_cpu)?;
    let pair = measure::BusPair::start(cpus, client_cpu, server_cpu)?;
    let place = Placement::Split.describe(
        cpus,
        "senders",
        "host, remote, raw sink and the Bus API's receiver",
    );
    on_cpu(client_cpu, cpus, || {
        let mut rows: Vec<BulkRow> = sizes
            .iter()
            .map(|&size| BulkRow {
                size,
                msgs: (bytes / size as u64).max(1),
                fd: Vec::new(),
                raw: Vec::new(),
                bus: Vec::new(),
                memcpy: Vec::new(),
            })
            .collect();
        for run in 0..runs {
            for k in 0..rows.len() {
                let n = rows.len();
                let row = &mut rows[(k + run) % n];
                let mb = |took: std::time::Duration| {
                    (row.msgs * row.size as u64) as f64 / took.as_secs_f64() / 1e6
                };
                // The ways take turns, the order rotating per run.
                for w in 0..4 {
                    match (w + run) % 4 {
                        0 => row.fd.push(mb(sinks.stream(false, row.msgs, row.size)?)),
                        1 => row.raw.push(mb(sinks.stream(true, row.msgs, row.size)?)),
                        2 => row.bus.push(mb(pair.stream(row.msgs, row.size)?)),
                        _ => row.memcpy.push(mb(measure::memcpy(row.msgs, row.size))),
                    }
                }
            }
        }
        drop(sinks);
        pair.stop();
        r.table(table(&place, bytes, runs, &rows));
        r.panel(panel(&place, &rows));
        Ok(())
    })
}

/// MB/s of each way per message size, and the two ratios to their limits.
fn table(place: &str, bytes: u64, runs: usize, rows: &[BulkRow]) -> Table {
    let range = |v: &[f64]| Cell::runs(v, Unit::Grouped, 0);
    let ratio = |a: &[f64], b: &[f64]| Cell::times(Stats::of(a).median / Stats::of(b).median);
    let mut t = Table::new(
        format!(
            "bulk, {place}: one-way streams of {} MiB per row over 64 KiB buffers, MB/s, medians (min-max) over {runs} runs",
            bytes >> 20,
        ),
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

/// MB/s by message size: each way beside its limit.
fn panel(place: &str, rows: &[BulkRow]) -> Panel {
    let bars = rows.iter().flat_map(|r| {
        [
            Bar::runs(format!("{} fd", r.size), &r.fd, PRIMARY),
            Bar::runs(format!("{} raw", r.size), &r.raw, LIMIT),
            Bar::runs(format!("{} Bus", r.size), &r.bus, SECONDARY),
            Bar::runs(format!("{} memcpy", r.size), &r.memcpy, OTHER),
        ]
    });
    Panel {
        title: format!("bulk one-way streams, {place}: MB/s by message size"),
        y_desc: "MB/s (log)".into(),
        log: true,
        bars: bars.collect(),
        lines: Vec::new(),
        legend: vec![
            ("endpoint fd".into(), PRIMARY),
            ("limit: raw SOCK_SEQPACKET".into(), LIMIT),
            ("Bus API (zero-copy receive)".into(), SECONDARY),
            ("limit: memcpy, one thread".into(), OTHER),
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_make_the_table_and_panel() {
        let rows = [BulkRow {
            size: 4096,
            msgs: 8192,
            fd: vec![700.0, 800.0, 900.0],
            raw: vec![1000.0, 1000.0, 1100.0],
            bus: vec![2000.0, 2500.0, 2600.0],
            memcpy: vec![5000.0, 5000.0, 5000.0],
        }];
        let p = panel("split", &rows);
        let medians: Vec<f64> = p.bars.iter().map(|b| b.segments[0].1).collect();
        assert_eq!(medians, [800.0, 1000.0, 2500.0, 5000.0]);
        assert_eq!(p.bars[0].whisker, Some((700.0, 900.0)));
        let t = table("split", 32 << 20, 3, &rows);
        assert_eq!(t.rows.len(), 1);
        assert_eq!(t.rows[0][3].value(), Some(0.8));
    }
}
