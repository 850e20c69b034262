//! The tables of one placement (create+destroy per way, echo beside the
//! raw ping-pong) and of the polling echo.

use super::super::cycles::WAY_NAMES;
use super::super::{way, Measured, PollMeasured, CHUNK, ECHO_TURNS, WAYS};
use super::per_cycle;
use crate::report::{Cell, Column, Table};
use crate::{Latency, Summary};

/// What each way does per cycle, in [`WAY_NAMES`] order.
const WAY_WHAT: [&str; WAYS] = [
    "CREATE_EPT, open the node (connect + greeting), destroy through it, close",
    "CREATE_EPT_FD (the endpoint comes back over SCM_RIGHTS), close",
    "raw SOCK_SEQPACKET request/response, two processes, an eventfd passed",
    "the same, a fresh SOCK_SEQPACKET socket passed (created, closed)",
    "limit-s plus what the service must do per endpoint (the passed end's send buffer at the smallest; the kept end watched by epoll until the client's close, read, closed)",
];

/// Create+destroy: one row per way, its total per loop count, its cost per
/// cycle, and the fd way's cost over it.
pub(super) fn create_destroy(m: &Measured, place: &str, runs: usize) -> Table {
    let mut columns = vec![Column::left("way")];
    columns.extend(
        m.rows
            .iter()
            .map(|r| Column::right(format!("{} loops, total us", r.loops))),
    );
    columns.push(Column::right("per cycle us"));
    columns.push(Column::right("fd / way"));
    let mut t = Table::new(
        format!(
            "endpoint create+destroy, placement {} ({place}): {runs} runs; totals median (min-max); per cycle: median (min-max) over {CHUNK}-cycle chunks",
            m.placement.name()
        ),
        columns,
    );
    let pc = per_cycle(&m.rows);
    for w in 0..WAYS {
        let mut cells = vec![Cell::text(WAY_NAMES[w])];
        cells.extend(m.rows.iter().map(|r| {
            let s = Summary::of(&r.totals[w]);
            Cell::grouped(s.median, 0).with_range(s.min, s.max)
        }));
        cells.push(Cell::num(pc[w].median, 1).with_range(pc[w].min, pc[w].max));
        cells.push(Cell::times(pc[way::FD].median / pc[w].median));
        t.row(cells);
    }
    for (name, what) in WAY_NAMES.iter().zip(WAY_WHAT) {
        t.note(format!("{name}: {what}"));
    }
    t
}

/// An echo latency table: each path, then the limit, with p50 / limit.
fn latency_table(title: String, paths: &[(&str, &Latency)], limit: &Latency) -> Table {
    let mut t = Table::new(
        title,
        vec![
            Column::left("path"),
            Column::right("p50 us"),
            Column::right("p99 us"),
            Column::right("max us"),
            Column::right("msgs/s"),
            Column::right("p50 / limit"),
        ],
    );
    let limit_row = ("limit: raw eventfd ping-pong, two processes", limit);
    for (name, l) in paths.iter().chain([&limit_row]) {
        t.row(vec![
            Cell::text(*name),
            Cell::num(l.p50_us, 1),
            Cell::num(l.p99_us, 1),
            Cell::num(l.max_us, 1),
            Cell::grouped(l.msgs_per_s, 0),
            Cell::times(l.p50_us / limit.p50_us),
        ]);
    }
    t
}

/// Echo round trips through the endpoint fd beside the raw ping-pong.
pub(super) fn echo(m: &Measured, count: u64) -> Table {
    latency_table(
        format!(
            "echo round trip, placement {}: 16 B, {count} round trips each, in {ECHO_TURNS} alternating turns",
            m.placement.name()
        ),
        &[("endpoint fd (eventfd notify)", &m.echo)],
        &m.echo_limit,
    )
}

/// The polling echo beside its floor and the raw ping-pong.
pub(super) fn poll(pm: &PollMeasured, count: u64) -> Table {
    let mut t = latency_table(
        format!(
            "echo round trip, polling ({}): 16 B, {count} round trips each",
            pm.place
        ),
        &[
            (
                "endpoint fd, busy-polled, host and remote polling",
                &pm.echo,
            ),
            ("floor: the same hops and places, no rpmsg", &pm.floor),
        ],
        &pm.eventfd,
    );
    t.note(format!(
        "endpoint fd busy-polled / floor, p50: {:.2}x",
        pm.echo.p50_us / pm.floor.p50_us
    ));
    t
}
