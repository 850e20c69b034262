//! The report of `iopath bench rpmsg`: per placement the create+destroy
//! table and the echo table, the polling echo, the scale and bulk tables,
//! the peer tables (or a note that they are missing); the chart; every
//! figure as JSON.

use super::cycles::{way, Row, CHUNK, WAYS, WAY_NAMES};
use super::echo::{PollMeasured, ECHO_TURNS};
use super::peers::{
    Driver, PeerPlacement, PeerRow, Remote, OPENAMP_EVENT, OPENAMP_SHM, PEER_WARM, SIZE,
};
use super::{Measured, RpmsgReport};
use crate::report::plot::{Bar, Line, Panel, LIMIT, PEER, PRIMARY, SECONDARY};
use crate::report::{Cell, Chart, Column, Report, Table, Unit};
use crate::{Latency, Summary};

/// What each way does per cycle, in [`WAY_NAMES`] order.
const WAY_WHAT: [&str; WAYS] = [
    "CREATE_EPT, open the node (connect + greeting), destroy through it, close",
    "CREATE_EPT_FD (the endpoint comes back over SCM_RIGHTS), close",
    "raw SOCK_SEQPACKET request/response, two processes, an eventfd passed",
    "the same, a fresh SOCK_SEQPACKET socket passed (created, closed)",
    "limit-s plus what the service must do per endpoint (the passed end's send buffer at the smallest; the kept end watched by epoll until the client's close, read, closed)",
];

/// The note in place of the peer rows without `--openamp`.
const NO_PEERS: &str = "the OpenAMP peer rows (OpenAMP's driver and iopath's endpoint fd and Bus \
API, each against OpenAMP's rpmsg-echo and iopath's remote) are missing: no --openamp DIR \
(build DIR with `scripts/openamp-demo build SRC DIR`)";

impl RpmsgReport {
    /// The report: per placement the create+destroy and echo tables, the
    /// polling echo, the scale and bulk tables, the peer tables.
    pub fn report(&self) -> Report {
        let f = |v: Option<f64>| v.map_or_else(|| "?".into(), |v| format!("{v:.2}"));
        let mut r = Report::new(
            "rpmsg",
            format!(
                "rpmsg endpoints, {} runs, {} echo round trips per row; 1-minute load average {} before, {} after",
                self.runs,
                self.count,
                f(self.loadavg.0),
                f(self.loadavg.1)
            ),
        );
        for m in &self.measured {
            r.table(create_destroy(m, self.runs));
            r.table(latency_table(
                format!(
                    "echo round trip, placement {}: 16 B, {} round trips each, in {ECHO_TURNS} alternating turns",
                    m.placement.name(),
                    self.count
                ),
                &[("endpoint fd (eventfd notify)", &m.echo)],
                &m.echo_limit,
            ));
        }
        if let Some(pm) = &self.poll {
            r.table(poll_table(pm, self.count));
        }
        for t in self.scale.iter().flat_map(|s| s.tables()) {
            r.table(t);
        }
        if let Some(b) = &self.bulk {
            r.table(b.table());
        }
        match &self.peers {
            None => r.note(format!("note: {NO_PEERS}")),
            Some(all) => {
                for (m, place) in all {
                    r.table(self.peer_table(m, place));
                }
            }
        }
        r.set_chart(self.chart());
        r.set_figures(self.json());
        r
    }

    /// The table of one peer placement: round trips/s per pair, p50, p99,
    /// and each pair over OpenAMP's own (by round trips/s and by p50).
    fn peer_table(&self, m: &PeerPlacement, place: &str) -> Table {
        let mut t = Table::new(
            format!(
                "rpmsg peers, placement {} ({place}): {} runs, up to {} strict {SIZE}-byte round trips per row \
                 (at most {} s) after {PEER_WARM} unmeasured, the pairs taking turns; OpenAMP's demo platform \
                 ({OPENAMP_SHM}, a byte per kick on unix:{OPENAMP_EVENT}); OpenAMP from {}",
                m.placement.name(),
                self.runs,
                self.count,
                self.peer_budget.as_secs(),
                self.openamp
                    .as_deref()
                    .map_or_else(|| "-".into(), |d| d.display().to_string())
            ),
            vec![
                Column::left("driver side"),
                Column::left("remote"),
                Column::right("round trips/s, median (min-max)"),
                Column::right("p50 us"),
                Column::right("p99 us"),
                Column::right("/ OpenAMP pair"),
                Column::right("by p50"),
            ],
        );
        let pair = m.row(Driver::OpenAmp, Remote::OpenAmp);
        for r in &m.rows {
            for f in &r.failures {
                t.note(format!(
                    "note: a run of {} <-> {} failed: {f}",
                    r.driver.name(),
                    r.remote.name()
                ));
            }
            if r.runs.is_empty() {
                t.not_run(
                    format!("{} <-> {}", r.driver.name(), r.remote.name()),
                    "every run failed",
                );
                continue;
            }
            let ratio = rate_ratio(r, pair);
            t.row(vec![
                Cell::text(r.driver.name()),
                Cell::text(r.remote.name()),
                Cell::runs(&rates(r), Unit::Grouped, 0),
                Cell::num(median_of(r, |l| l.p50_us), 1),
                Cell::num(median_of(r, |l| l.p99_us), 1),
                Cell::or_na(ratio.map(|(v, lo, hi)| Cell::times(v).with_range(lo, hi))),
                Cell::or_na(p50_ratio(r, pair).map(Cell::times)),
            ]);
        }
        t
    }

    /// The chart: per placement, legacy vs fd totals per loop count (log
    /// scale, min-max whiskers) with the raw limit as a line, and the echo
    /// round trip's p50/p99 beside the raw ping-pong's; the polling echo,
    /// the scale experiments', the bulk rows' and the peer rows' panels.
    fn chart(&self) -> Chart {
        let mut panels = Vec::new();
        for m in &self.measured {
            let mut bars = Vec::new();
            let mut points = Vec::new();
            for (k, r) in m.rows.iter().enumerate() {
                let loops = match r.loops {
                    n if n >= 1000 && n % 1000 == 0 => format!("{}k", n / 1000),
                    n => n.to_string(),
                };
                bars.push(Bar::runs(
                    format!("legacy {loops}"),
                    &r.totals[way::LEGACY],
                    SECONDARY,
                ));
                bars.push(Bar::runs(
                    format!("fd {loops}"),
                    &r.totals[way::FD],
                    PRIMARY,
                ));
                let lim = Summary::of(&r.totals[way::LIMIT]).median;
                points.extend([(2 * k, lim), (2 * k + 2, lim)]);
            }
            panels.push(Panel {
                title: format!("create+destroy, placement {}: totals", m.placement.name()),
                y_desc: "total us (log)".into(),
                log: true,
                bars,
                lines: vec![Line {
                    legend: "limit: raw SOCK_SEQPACKET + fd".into(),
                    points,
                    color: LIMIT,
                }],
                legend: vec![("legacy".into(), SECONDARY), ("fd".into(), PRIMARY)],
            });
            panels.push(echo_panel(
                format!("echo round trip, placement {}", m.placement.name()),
                &m.echo,
                &m.echo_limit,
                "raw eventfd ping-pong",
            ));
        }
        if let Some(pm) = &self.poll {
            panels.push(echo_panel(
                "echo round trip, polling (limit: the poll floor)".into(),
                &pm.echo,
                &pm.floor,
                "the same hops, no rpmsg",
            ));
        }
        panels.extend(self.scale.iter().flat_map(|s| s.panels()));
        panels.extend(self.bulk.as_ref().map(|b| b.panel()));
        for (m, _) in self.peers.iter().flatten() {
            let color = |d| match d {
                Driver::OpenAmp => PEER,
                Driver::EptFd => PRIMARY,
                Driver::Bus => SECONDARY,
            };
            panels.push(Panel {
                title: format!("peers, placement {}: round trips/s", m.placement.name()),
                y_desc: "round trips/s".into(),
                log: false,
                bars: m
                    .rows
                    .iter()
                    .map(|r| {
                        let label = format!("{}/{}", r.driver.key(), r.remote.key());
                        Bar::runs(label, &rates(r), color(r.driver))
                    })
                    .collect(),
                lines: Vec::new(),
                legend: vec![
                    ("OpenAMP driver".into(), PEER),
                    ("endpoint fd".into(), PRIMARY),
                    ("Bus API".into(), SECONDARY),
                ],
            });
        }
        Chart {
            title: "bench rpmsg: endpoints the legacy way vs as fds".into(),
            panels,
            columns: 2,
        }
    }

    /// The first placement's `rows`, `limit` and `echo` at the top, every
    /// placement under `placements`, the peer rows under `peers` (or
    /// `peers.missing`), the scale experiments and bulk rows.
    fn json(&self) -> serde_json::Value {
        let placements: Vec<serde_json::Value> = self.measured.iter().map(placement_json).collect();
        let main = &placements[0];
        let mut echo = main["echo"].clone();
        if let Some(pm) = &self.poll {
            echo["fd_poll"] = serde_json::json!(pm.echo);
            echo["poll_floor"] = serde_json::json!(pm.floor);
            echo["limit_eventfd_pingpong_poll_phase"] = serde_json::json!(pm.eventfd);
            echo["fd_poll_over_floor_p50"] = serde_json::json!(pm.echo.p50_us / pm.floor.p50_us);
            echo["fd_poll_over_limit_p50"] = serde_json::json!(pm.echo.p50_us / pm.eventfd.p50_us);
            echo["poll_placement"] = serde_json::json!(pm.place);
        }
        let mut v = serde_json::json!({
            "runs": self.runs,
            "count": self.count,
            "echo": echo,
            "placements": placements,
            "peers": self.peers_json(),
            "scale": self.scale.as_ref().map(|s| s.json()),
            "bulk": self.bulk.as_ref().map(|b| b.json()),
            "loadavg": [self.loadavg.0, self.loadavg.1],
        });
        for k in [
            "placement",
            "rows",
            "limit",
            "per_cycle_us",
            "fd_over_limit",
            "fd_over_limit_socket",
            "fd_over_limit_watched",
        ] {
            v[k] = main[k].clone();
        }
        v
    }

    /// `peers` for the JSON report: every peer placement's rows, or
    /// `missing`.
    fn peers_json(&self) -> serde_json::Value {
        let Some(all) = &self.peers else {
            return serde_json::json!({ "missing": NO_PEERS });
        };
        let placements: Vec<serde_json::Value> = all
            .iter()
            .map(|(m, place)| {
                let pair = m.row(Driver::OpenAmp, Remote::OpenAmp);
                let rows: Vec<serde_json::Value> = m
                    .rows
                    .iter()
                    .map(|r| {
                        serde_json::json!({
                            "driver": r.driver.key(),
                            "remote": r.remote.key(),
                            "driver_name": r.driver.name(),
                            "remote_name": r.remote.name(),
                            "runs": r.runs,
                            "round_trips_per_s": Summary::of(&rates(r)).json(),
                            "p50_us": median_of(r, |l| l.p50_us),
                            "p99_us": median_of(r, |l| l.p99_us),
                            "over_openamp_pair": rate_ratio(r, pair).map(|(v, _, _)| v),
                            "over_openamp_pair_by_p50": p50_ratio(r, pair),
                            "failures": r.failures,
                        })
                    })
                    .collect();
                serde_json::json!({ "placement": m.placement.name(), "where": place, "rows": rows })
            })
            .collect();
        serde_json::json!({
            "openamp": self.openamp,
            "size": SIZE,
            "warm": PEER_WARM,
            "count": self.count,
            "budget_s": self.peer_budget.as_secs(),
            "notify": format!("unix:{OPENAMP_EVENT}"),
            "shm": OPENAMP_SHM,
            "placements": placements,
        })
    }
}

/// Each way's per-cycle microseconds over every chunk of every row.
fn per_cycle(rows: &[Row]) -> [Summary; WAYS] {
    std::array::from_fn(|w| {
        let v: Vec<f64> = rows
            .iter()
            .flat_map(|r| r.chunks[w].iter().copied())
            .collect();
        Summary::of(&v)
    })
}

/// Create+destroy: one row per way, its total per loop count, its cost per
/// cycle, and the fd way's cost over it (over limit-s and limit-w: the fd
/// way against the cheapest hand-off with the same semantics).
fn create_destroy(m: &Measured, runs: usize) -> Table {
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
            "endpoint create+destroy, placement {} ({}): {runs} runs; totals median (min-max); per cycle: median (min-max) over {CHUNK}-cycle chunks",
            m.placement.name(),
            m.place
        ),
        columns,
    );
    let pc = per_cycle(&m.rows);
    for w in 0..WAYS {
        let mut cells = vec![Cell::text(WAY_NAMES[w])];
        cells.extend(
            m.rows
                .iter()
                .map(|r| Cell::runs(&r.totals[w], Unit::Grouped, 0)),
        );
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

/// The polling echo beside its floor and the raw ping-pong.
fn poll_table(pm: &PollMeasured, count: u64) -> Table {
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

/// Echo p50/p99 beside the raw ping-pong's (log scale).
fn echo_panel(title: String, echo: &Latency, limit: &Latency, limit_name: &str) -> Panel {
    Panel {
        title,
        y_desc: "us (log)".into(),
        log: true,
        bars: vec![
            Bar::of("echo p50", echo.p50_us, PRIMARY),
            Bar::of("raw p50", limit.p50_us, LIMIT),
            Bar::of("echo p99", echo.p99_us, PRIMARY),
            Bar::of("raw p99", limit.p99_us, LIMIT),
        ],
        lines: Vec::new(),
        legend: vec![
            ("endpoint fd echo".into(), PRIMARY),
            (format!("limit: {limit_name}"), LIMIT),
        ],
    }
}

/// One placement's figures: its rows, limits, per-cycle costs and echo.
fn placement_json(m: &Measured) -> serde_json::Value {
    let rows: Vec<serde_json::Value> = m
        .rows
        .iter()
        .map(|r| {
            let [l, f, lim, ls, lw] = r.totals.each_ref().map(|t| Summary::of(t));
            let pc: Vec<Summary> = r.chunks.iter().map(|c| Summary::of(c)).collect();
            serde_json::json!({
                "loops": r.loops,
                "legacy_us": l.median, "fd_us": f.median, "limit_us": lim.median,
                "limit_socket_us": ls.median,
                "limit_watched_us": lw.median,
                "legacy_us_spread": l.json(), "fd_us_spread": f.json(), "limit_us_spread": lim.json(),
                "legacy_over_fd": l.median / f.median,
                "per_cycle_us": {
                    "legacy": pc[0].json(), "fd": pc[1].json(),
                    "limit": pc[2].json(), "limit_socket": pc[3].json(),
                    "limit_watched": pc[4].json(),
                },
            })
        })
        .collect();
    let [legacy_pc, fd_pc, rtt, rtt_s, rtt_w] = per_cycle(&m.rows);
    let (echo, lim) = (&m.echo, &m.echo_limit);
    serde_json::json!({
        "placement": m.placement.name(),
        "where": m.place,
        "rows": rows,
        "limit": {
            "what": "raw SOCK_SEQPACKET request/response with an fd (an eventfd) passed, two processes",
            "rtt_us": rtt.median, "rtt_us_spread": rtt.json(),
            "socket_rtt_us": rtt_s.median, "socket_rtt_us_spread": rtt_s.json(),
            "watched_socket_rtt_us": rtt_w.median, "watched_socket_rtt_us_spread": rtt_w.json(),
            "watched_over_socket": rtt_w.median / rtt_s.median,
        },
        "per_cycle_us": { "legacy": legacy_pc.json(), "fd": fd_pc.json() },
        "fd_over_limit": fd_pc.median / rtt.median,
        "fd_over_limit_socket": fd_pc.median / rtt_s.median,
        "fd_over_limit_watched": fd_pc.median / rtt_w.median,
        "echo": {
            "size": 16, "fd": echo, "limit_eventfd_pingpong": lim,
            "fd_over_limit_p50": echo.p50_us / lim.p50_us,
        },
    })
}

/// A peer row's round trips/s, per run.
fn rates(r: &PeerRow) -> Vec<f64> {
    r.runs.iter().map(|l| l.msgs_per_s).collect()
}

/// Median over runs of one latency figure.
fn median_of(r: &PeerRow, f: impl Fn(&Latency) -> f64) -> f64 {
    Summary::of(&r.runs.iter().map(f).collect::<Vec<_>>()).median
}

/// How much faster `a` is than `b` by the median round trip: `b`'s p50
/// over `a`'s (medians over runs). Unlike round trips/s, it does not
/// count the rare long stall a spinning peer takes when it loses its CPU.
fn p50_ratio(a: &PeerRow, b: &PeerRow) -> Option<f64> {
    (!a.runs.is_empty() && !b.runs.is_empty())
        .then(|| median_of(b, |l| l.p50_us) / median_of(a, |l| l.p50_us))
}

/// `a`'s round trips/s over `b`'s: the ratio of the medians, and the range
/// of the per-run ratios (run i of one against run i of the other: they
/// ran side by side).
fn rate_ratio(a: &PeerRow, b: &PeerRow) -> Option<(f64, f64, f64)> {
    let rb = Summary::of(&rates(b)).median;
    if a.runs.is_empty() || b.runs.is_empty() || rb <= 0.0 {
        return None;
    }
    let per: Vec<f64> = a
        .runs
        .iter()
        .zip(&b.runs)
        .map(|(x, y)| x.msgs_per_s / y.msgs_per_s)
        .collect();
    let s = Summary::of(&per);
    Some((Summary::of(&rates(a)).median / rb, s.min, s.max))
}
