//! The report writers of `iopath bench rpmsg`: the text table, JSON,
//! Markdown and the chart, from the measured rows in the parent module.

use super::*;

impl RpmsgReport {
    /// Each placement's tables, the polling echo (with `poll`), the peer
    /// rows (or a note that they are missing) and issue 16's goals.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for (t, _) in &self.placements {
            out.push_str(t);
        }
        if let Some(pm) = &self.poll {
            outln!(out, "echo, polling ({}):", pm.place);
            outln!(out, "  endpoint fd (--poll): {}", pm.echo.line());
            outln!(
                out,
                "  floor (the same hops and places, no rpmsg): {}",
                pm.floor.line()
            );
            outln!(
                out,
                "  limit (raw eventfd ping-pong, two processes): {}",
                pm.eventfd.line()
            );
            outln!(
                out,
                "  poll/floor p50: {:.2}x; poll/eventfd limit p50: {:.2}x",
                pm.echo.p50_us / pm.floor.p50_us,
                pm.echo.p50_us / pm.eventfd.p50_us
            );
        }
        if let Some((text, _, _)) = &self.scale {
            out.push_str(text);
        }
        self.peers_text(&mut out);
        out
    }

    /// The tables as Markdown (as in BENCHMARKS.md): per placement the
    /// create+destroy totals beside the limits, then the echo latency
    /// beside the raw ping-pong.
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        let f = |s: &Summary| {
            format!(
                "{} ({}-{})",
                thousands(s.median),
                thousands(s.min),
                thousands(s.max)
            )
        };
        for (m, place) in self.measured.iter().zip(&self.wheres) {
            outln!(
                out,
                "Placement `{}` ({place}), {} runs; totals in microseconds, median (min-max):",
                m.placement.name(),
                self.runs
            );
            outln!(out);
            outln!(out, "| loops | legacy total us | fd total us | legacy/fd | limit total us (eventfd passed) | limit-s total us (socket passed) | limit-w total us (socket, watched) | fd / limit-s | fd / limit-w |");
            outln!(out, "|---:|---|---|---:|---|---|---|---:|---:|");
            for r in &m.rows {
                let [l, fd, lim, ls, lw] = r.totals.each_ref().map(|t| Summary::of(t));
                outln!(
                    out,
                    "| {} | {} | {} | {:.2}x | {} | {} | {} | {:.2}x | {:.2}x |",
                    thousands(r.loops as f64),
                    f(&l),
                    f(&fd),
                    l.median / fd.median,
                    f(&lim),
                    f(&ls),
                    f(&lw),
                    fd.median / ls.median,
                    fd.median / lw.median
                );
            }
            outln!(out);
            echo_table(
                &mut out,
                self.count,
                &[("endpoint fd (eventfd notify)", &m.echo)],
                &m.echo_limit,
            );
        }
        if let Some(pm) = &self.poll {
            outln!(out, "Polling ({}):", pm.place);
            outln!(out);
            echo_table(
                &mut out,
                self.count,
                &[
                    (
                        "endpoint fd, busy-polled, host and remote polling",
                        &pm.echo,
                    ),
                    ("floor: the same hops and places, no rpmsg", &pm.floor),
                ],
                &pm.eventfd,
            );
        }
        if let Some((_, md, _)) = &self.scale {
            out.push_str(md);
            outln!(out);
        }
        self.peers_markdown(&mut out);
        out
    }

    /// Writes the chart: per placement, legacy vs fd totals per loop count
    /// (log scale, min-max whiskers) with the raw limit as a line, and the
    /// echo round trip's p50/p99 beside the raw ping-pong's.
    ///
    /// # Errors
    /// [`Error::Plot`].
    pub fn plot(&self, path: &Path) -> Result<()> {
        use crate::plot::{At, Bar, Line, Panel, LIMIT, PRIMARY, SECONDARY};
        let bar = |label: String, s: Summary, color| Bar {
            label,
            segments: vec![(0.0, s.median, color)],
            whisker: Some((s.min, s.max)),
        };
        let mut panels = Vec::new();
        for m in &self.measured {
            let mut bars = Vec::new();
            let mut limit = Vec::new();
            for (k, r) in m.rows.iter().enumerate() {
                let loops = short_count(r.loops);
                bars.push(bar(
                    format!("legacy {loops}"),
                    Summary::of(&r.totals[way::LEGACY]),
                    SECONDARY,
                ));
                bars.push(bar(
                    format!("fd {loops}"),
                    Summary::of(&r.totals[way::FD]),
                    PRIMARY,
                ));
                let lim = Summary::of(&r.totals[way::LIMIT]).median;
                limit.push((At::Edge(2 * k), lim));
                limit.push((At::Edge(2 * k + 2), lim));
            }
            panels.push(Panel {
                title: format!("create+destroy, placement {}: totals", m.placement.name()),
                y_desc: "total us (log)".into(),
                log: true,
                bars,
                lines: vec![Line {
                    legend: "limit: raw SOCK_SEQPACKET + fd".into(),
                    points: limit,
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
        panels.extend(self.scale_panels.iter().cloned());
        panels.extend(self.peers_panels());
        crate::plot::draw(
            path,
            "bench rpmsg: endpoints the legacy way vs as fds",
            &panels,
            2,
        )
    }

    /// The first placement's `rows`, `limit` and `echo` at the top, every
    /// placement under `placements`, the peer rows under `peers` (or
    /// `peers.missing`), issue 16's goals under `goals`.
    pub fn json(&self) -> serde_json::Value {
        let placements: Vec<serde_json::Value> =
            self.placements.iter().map(|(_, j)| j.clone()).collect();
        let main = &placements[0];
        let mut echo_json = main["echo"].clone();
        if let Some(pm) = &self.poll {
            echo_json["fd_poll"] = serde_json::json!(pm.echo);
            echo_json["poll_floor"] = serde_json::json!(pm.floor);
            echo_json["limit_eventfd_pingpong_poll_phase"] = serde_json::json!(pm.eventfd);
            echo_json["fd_poll_over_floor_p50"] =
                serde_json::json!(pm.echo.p50_us / pm.floor.p50_us);
            echo_json["fd_poll_over_limit_p50"] =
                serde_json::json!(pm.echo.p50_us / pm.eventfd.p50_us);
            echo_json["poll_placement"] = serde_json::json!(pm.place);
        }
        let (peers, goals) = self.peers_json();
        serde_json::json!({
            "runs": self.runs,
            "count": self.count,
            "placement": main["placement"],
            "rows": main["rows"],
            "limit": main["limit"],
            "per_cycle_us": main["per_cycle_us"],
            "fd_over_limit": main["fd_over_limit"],
            "fd_over_limit_socket": main["fd_over_limit_socket"],
            "fd_over_limit_watched": main["fd_over_limit_watched"],
            "echo": echo_json,
            "placements": placements,
            "peers": peers,
            "goals": goals,
            "scale": self.scale.as_ref().map(|(_, _, j)| j),
            "loadavg": [self.loadavg.0, self.loadavg.1],
        })
    }
}

/// One placement's tables and its JSON.
pub(super) fn report(a: &RpmsgConfig, m: &Measured, cpus: &Cpus) -> (String, serde_json::Value) {
    let mut out = String::new();
    let sum = |v: &[f64]| Summary::of(v);
    let rows = &m.rows;
    let mut jrows = Vec::new();
    {
        outln!(out,
            "rpmsg endpoint create+destroy, {}: {} runs; totals: median (min-max); per cycle: median over {CHUNK}-cycle chunks",
            m.placement.describe(cpus, "client", "host, remote and the limit's server"),
            a.runs
        );
        outln!(
            out,
            "{:>7} | {:>25} | {:>23} | {:>9} | {:>23} | {:>43}",
            "loops",
            "legacy total us",
            "fd total us",
            "legacy/fd",
            "limit total us",
            "per cycle us: fd / limit / limit-s / limit-w"
        );
    }
    for r in rows {
        let [l, f, lim, ls, lw] = r.totals.each_ref().map(|t| sum(t));
        let pc: Vec<Summary> = r.chunks.iter().map(|c| sum(c)).collect();
        let fmt = |s: &Summary| format!("{:.0} ({:.0}-{:.0})", s.median, s.min, s.max);
        {
            outln!(
                out,
                "{:>7} | {:>25} | {:>23} | {:>8.2}x | {:>23} | {:>9.1} / {:>5.1} / {:>7.1} / {:>7.1}",
                r.loops,
                fmt(&l),
                fmt(&f),
                l.median / f.median,
                fmt(&lim),
                pc[1].median,
                pc[2].median,
                pc[3].median,
                pc[4].median,
            );
        }
        jrows.push(serde_json::json!({
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
        }));
    }
    let [legacy_pc, fd_pc, rtt, rtt_s, rtt_w] = per_cycle(rows);
    let (echo, lim) = (&m.echo, &m.echo_limit);
    let spread = |s: &Summary| format!("{:.1} us per cycle ({:.1}-{:.1})", s.median, s.min, s.max);
    {
        outln!(
            out,
            "  limit: raw SOCK_SEQPACKET request/response, two processes, an eventfd passed: {}",
            spread(&rtt)
        );
        outln!(
            out,
            "  limit-s: the same, a fresh SOCK_SEQPACKET socket passed (created, closed): {}",
            spread(&rtt_s)
        );
        outln!(
            out,
            "  limit-w: limit-s plus what the service must do per endpoint (the passed end's send buffer at the smallest; the kept end watched by epoll until the client's close, read, closed): {}",
            spread(&rtt_w)
        );
        outln!(
            out,
            "  limit-w / limit-s: {:.2}x",
            rtt_w.median / rtt_s.median
        );
        outln!(out, "  legacy create+open+destroy: {}", spread(&legacy_pc));
        outln!(
            out,
            "  fd create+close: {} = {:.2}x limit, {:.2}x limit-s, {:.2}x limit-w",
            spread(&fd_pc),
            fd_pc.median / rtt.median,
            fd_pc.median / rtt_s.median,
            fd_pc.median / rtt_w.median
        );
        outln!(
            out,
            "  echo round trip, 16 B, {} round trips each, in {ECHO_TURNS} alternating turns:",
            a.count
        );
        outln!(out, "    endpoint fd (eventfd notify): {}", echo.line());
        outln!(
            out,
            "    limit (raw eventfd ping-pong, two processes): {}",
            lim.line()
        );
        outln!(out, "    fd/limit p50: {:.2}x", echo.p50_us / lim.p50_us);
    }
    let json = serde_json::json!({
        "placement": m.placement.name(),
        "where": m.placement.describe(cpus, "client", "host, remote and the limit's server"),
        "rows": jrows,
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
    });
    (out, json)
}

/// 12,345 (integer part).
fn thousands(v: f64) -> String {
    let n = v.round() as u64;
    let d = n.to_string();
    let mut out = String::new();
    for (i, c) in d.chars().enumerate() {
        if i > 0 && (d.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// 1k, 10k, 100k, 1500.
fn short_count(n: u64) -> String {
    if n >= 1000 && n % 1000 == 0 {
        format!("{}k", n / 1000)
    } else {
        n.to_string()
    }
}

/// An echo latency table: each path, then the limit, with p50 / limit.
fn echo_table(out: &mut String, count: u64, paths: &[(&str, &Latency)], limit: &Latency) {
    outln!(out, "| echo round trip, 16 B, {count} round trips | p50 us | p99 us | max us | msgs/s | p50 / limit |");
    outln!(out, "|---|---:|---:|---:|---:|---:|");
    let row = |out: &mut String, name: &str, l: &Latency| {
        outln!(
            out,
            "| {name} | {:.1} | {:.1} | {:.1} | {:.0} | {:.2} |",
            l.p50_us,
            l.p99_us,
            l.max_us,
            l.msgs_per_s,
            l.p50_us / limit.p50_us
        )
    };
    for (name, l) in paths {
        row(out, name, l);
    }
    row(out, "limit: raw eventfd ping-pong, two processes", limit);
    outln!(out);
}

/// Echo p50/p99 beside the raw ping-pong's (log scale).
fn echo_panel(
    title: String,
    echo: &Latency,
    limit: &Latency,
    limit_name: &str,
) -> crate::plot::Panel {
    use crate::plot::{Bar, Panel, LIMIT, PRIMARY};
    let bar = |label: &str, v: f64, color| Bar {
        label: label.into(),
        segments: vec![(0.0, v, color)],
        whisker: None,
    };
    Panel {
        title,
        y_desc: "us (log)".into(),
        log: true,
        bars: vec![
            bar("echo p50", echo.p50_us, PRIMARY),
            bar("raw p50", limit.p50_us, LIMIT),
            bar("echo p99", echo.p99_us, PRIMARY),
            bar("raw p99", limit.p99_us, LIMIT),
        ],
        lines: Vec::new(),
        legend: vec![
            ("endpoint fd echo".into(), PRIMARY),
            (format!("limit: {limit_name}"), LIMIT),
        ],
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

/// Targets of issue 16 ("Done when"), each measured in this run.
#[derive(Debug)]
struct Goal {
    what: String,
    /// The measured ratio (or microseconds), its spread over runs.
    value: Option<(f64, Option<(f64, f64)>)>,
    /// Why there is no value.
    na: Option<String>,
    target: f64,
    /// `>=` (true) or `<=`.
    at_least: bool,
    /// "x" (a ratio) or " us".
    unit: &'static str,
    /// The same ratio by the median round trip, for the round-trip-rate
    /// goals (a figure beside the goal's, not the goal).
    by_p50: Option<f64>,
    /// What the cheapest thing with the same semantics measured in this
    /// run (name, figure in the goal's unit): a target past every floor
    /// is one no implementation meets here.
    floors: Vec<(&'static str, f64)>,
}

impl Goal {
    fn met(&self) -> Option<bool> {
        let (v, _) = self.value?;
        Some(if self.at_least {
            v >= self.target
        } else {
            v <= self.target
        })
    }

    fn target_text(&self) -> String {
        let op = if self.at_least { ">=" } else { "<=" };
        format!("{op} {:.2}{}", self.target, self.unit)
    }

    fn value_text(&self) -> String {
        let aside = self
            .by_p50
            .map_or_else(String::new, |v| format!("; by p50 {v:.2}x"));
        match (&self.value, &self.na) {
            (Some((v, Some((lo, hi)))), _) => {
                format!("{v:.2}{u} ({lo:.2}-{hi:.2}{aside})", u = self.unit)
            }
            (Some((v, None)), _) => format!("{v:.2}{}", self.unit),
            (None, Some(why)) => format!("n/a ({why})"),
            (None, None) => "n/a".into(),
        }
    }

    fn met_text(&self) -> &'static str {
        match self.met() {
            Some(true) => "met",
            Some(false) => "not met",
            None => "n/a",
        }
    }

    /// Whether even the lowest floor misses the target.
    fn past_floor(&self) -> Option<bool> {
        let lowest = self.floors.iter().map(|f| f.1).reduce(f64::min)?;
        Some(if self.at_least {
            lowest < self.target
        } else {
            lowest > self.target
        })
    }

    /// The floors beside the verdict, e.g. `; floor in this run: limit-w
    /// 1.13x (the target is past it)`; empty without one.
    fn floor_text(&self) -> String {
        if self.floors.is_empty() {
            return String::new();
        }
        let list: Vec<String> = self
            .floors
            .iter()
            .map(|(what, v)| format!("{what} {v:.2}{}", self.unit))
            .collect();
        let past = if self.past_floor() == Some(true) {
            " (the target is past it)"
        } else {
            ""
        };
        format!("; floor in this run: {}{past}", list.join(", "))
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "what": self.what,
            "value": self.value.map(|(v, _)| v),
            "spread": self.value.and_then(|(_, s)| s).map(|(lo, hi)| [lo, hi]),
            "target": self.target,
            "op": if self.at_least { ">=" } else { "<=" },
            "unit": self.unit.trim(),
            "met": self.met(),
            "na": self.na,
            "by_p50": self.by_p50,
            "floors": self
                .floors
                .iter()
                .map(|(what, v)| serde_json::json!({ "what": what, "value": v }))
                .collect::<Vec<_>>(),
            "target_past_floor": self.past_floor(),
        })
    }
}

/// A peer row's round trips/s over its runs.
fn rate(r: &peers::PeerRow) -> Summary {
    let v: Vec<f64> = r.runs.iter().map(|l| l.msgs_per_s).collect();
    Summary::of(&v)
}

/// Median over runs of one latency figure.
fn median_of(r: &peers::PeerRow, f: impl Fn(&Latency) -> f64) -> f64 {
    let v: Vec<f64> = r.runs.iter().map(f).collect();
    Summary::of(&v).median
}

/// `a`'s round trips/s over `b`'s: the ratio of the medians, and the
/// spread of the per-run ratios (run i of one against run i of the other:
/// they ran side by side).
fn rate_ratio(a: &peers::PeerRow, b: &peers::PeerRow) -> Option<(f64, Option<(f64, f64)>)> {
    let (ra, rb) = (rate(a), rate(b));
    if a.runs.is_empty() || b.runs.is_empty() || rb.median <= 0.0 {
        return None;
    }
    let per: Vec<f64> = a
        .runs
        .iter()
        .zip(&b.runs)
        .map(|(x, y)| x.msgs_per_s / y.msgs_per_s)
        .collect();
    let s = Summary::of(&per);
    Some((ra.median / rb.median, Some((s.min, s.max))))
}

/// The note in place of the peer rows without `--openamp`.
const PEERS_MISSING: &str =
    "the OpenAMP peer rows (OpenAMP's driver and iopath's endpoint fd and Bus \
API, each against OpenAMP's rpmsg-echo and iopath's remote) are missing: no --openamp DIR \
(build DIR with `scripts/openamp-demo build SRC DIR`)";

impl RpmsgReport {
    /// Adds the scale experiments' tables (before the peer rows and the
    /// goals), their JSON (`scale`) and their goals (256 endpoints against
    /// one, no endpoint starved).
    pub fn add_scale(&mut self, sc: &super::scale::ScaleReport) {
        self.scale = Some((sc.text(), sc.markdown(), sc.json()));
        self.scale_panels = sc.panels();
    }

    /// The 256-endpoint goals, from the scale experiments' JSON.
    fn scale_goals(&self, goals: &mut Vec<Goal>) {
        let row = self.scale.as_ref().and_then(|(_, _, j)| {
            j["echo"]
                .as_array()?
                .iter()
                .find(|r| r["endpoints"] == 256)
                .cloned()
        });
        let na = || {
            Some(if self.scale.is_none() {
                "run with --scale".to_string()
            } else {
                "no 256-endpoint row".to_string()
            })
        };
        let runs = |k: &str| -> Vec<f64> {
            row.as_ref()
                .and_then(|r| r[k].as_array().cloned())
                .unwrap_or_default()
                .iter()
                .filter_map(serde_json::Value::as_f64)
                .collect()
        };
        let vs_one = row
            .as_ref()
            .and_then(|r| r["vs_one"].as_f64())
            .map(|v| (v, None));
        goals.push(Goal {
            what: "one CPU: aggregate round trips/s, 256 endpoints / 1 endpoint".into(),
            na: vs_one.is_none().then(na).flatten(),
            value: vs_one,
            target: 0.9,
            at_least: true,
            unit: "x",
            by_p50: None,
            floors: Vec::new(),
        });
        let (worst, median) = (
            runs("p99_us_worst_endpoint"),
            runs("p99_us_median_endpoint"),
        );
        let per: Vec<f64> = worst.iter().zip(&median).map(|(w, m)| w / m).collect();
        let starve = (!per.is_empty()).then(|| {
            let s = Summary::of(&per);
            (s.median, Some((s.min, s.max)))
        });
        goals.push(Goal {
            what: "one CPU, 256 endpoints: worst endpoint's p99 / median endpoint's p99".into(),
            na: starve.is_none().then(na).flatten(),
            value: starve,
            target: 3.0,
            at_least: false,
            unit: "x",
            by_p50: None,
            floors: Vec::new(),
        });
    }

    /// The load average in words (other work moves every figure, the
    /// spinning OpenAMP pair's most).
    fn load_text(&self) -> String {
        let f = |v: Option<f64>| v.map_or_else(|| "?".into(), |v| format!("{v:.2}"));
        format!(
            "1-minute load average {} before, {} after",
            f(self.loadavg.0),
            f(self.loadavg.1)
        )
    }

    /// The peer placement `p`, if measured.
    fn peer_placement(&self, p: Placement) -> Option<&peers::PeerPlacement> {
        self.peers.as_ref()?.iter().find(|m| m.placement == p)
    }

    /// Issue 16's goals from this run's figures.
    fn goals(&self) -> Vec<Goal> {
        use peers::{Driver, Remote};
        let mut goals = Vec::new();
        let split = self.peer_placement(Placement::Split);
        let na_peers = match (&self.peers, split) {
            (None, _) => Some("no --openamp".to_string()),
            (Some(_), None) => Some("no split peer placement".to_string()),
            _ => None,
        };
        for (driver, target, label) in [
            (Driver::EptFd, 1.0, "endpoint fd"),
            (Driver::Bus, 1.2, "Bus API"),
        ] {
            for remote in [Remote::OpenAmp, Remote::Iopath] {
                let pair = split.map(|m| {
                    (
                        m.row(driver, remote),
                        m.row(Driver::OpenAmp, Remote::OpenAmp),
                    )
                });
                let value = pair.and_then(|(a, b)| rate_ratio(a, b));
                let by_p50 = pair.and_then(|(a, b)| p50_ratio(a, b));
                goals.push(Goal {
                    what: format!(
                        "{label} <-> {} round trips/s / OpenAMP driver <-> rpmsg-echo, remote on its own CPU",
                        remote.name()
                    ),
                    na: value
                        .is_none()
                        .then(|| na_peers.clone().unwrap_or_else(|| "a row failed".into())),
                    value,
                    target,
                    at_least: true,
                    unit: "x",
                    by_p50,
            floors: Vec::new(),
                });
            }
        }
        let one = self.measured.iter().find(|m| m.placement == Placement::One);
        let no_one = || Some("placement one not measured".to_string());
        let echo = one.map(|m| (m.echo.p50_us / m.echo_limit.p50_us, None));
        goals.push(Goal {
            what: "one CPU: endpoint-fd echo p50 / raw eventfd ping-pong p50".into(),
            na: echo.is_none().then(no_one).flatten(),
            value: echo,
            target: 2.5,
            at_least: false,
            unit: "x",
            by_p50: None,
            floors: Vec::new(),
        });
        let cd = one.map(|m| {
            let pc = per_cycle(&m.rows);
            let s = pc[way::LIMIT_S].median;
            (
                (pc[way::FD].median / s, None),
                vec![("limit-w", pc[way::LIMIT_W].median / s)],
            )
        });
        goals.push(Goal {
            what: "one CPU: fd create+destroy / raw fd hand-off (request, fresh socketpair, SCM_RIGHTS, close)".into(),
            na: cd.is_none().then(no_one).flatten(),
            value: cd.as_ref().map(|c| c.0),
            target: 1.1,
            at_least: false,
            unit: "x",
            by_p50: None,
            floors: cd.map(|c| c.1).unwrap_or_default(),
        });
        let poll = self.poll.as_ref().map(|pm| (pm.echo.p50_us, None));
        goals.push(Goal {
            what: "--poll echo p50".into(),
            na: poll.is_none().then(|| "run with --poll".to_string()),
            value: poll,
            target: 6.0,
            at_least: false,
            unit: " us",
            by_p50: None,
            floors: self
                .poll
                .as_ref()
                .map(|pm| vec![("the same hops with no rpmsg", pm.floor.p50_us)])
                .unwrap_or_default(),
        });
        self.scale_goals(&mut goals);
        goals
    }

    /// The peer tables and the goals, as text.
    pub(super) fn peers_text(&self, out: &mut String) {
        match &self.peers {
            None => outln!(out, "note: {PEERS_MISSING}"),
            Some(all) => {
                for (m, place) in all.iter().zip(&self.peer_wheres) {
                    outln!(out, "{}", self.peers_heading(m, place));
                    outln!(
                        out,
                        "  {:<42} {:<20} {:>32} {:>8} {:>8} {:>10} {:>8}",
                        "driver",
                        "remote",
                        "round trips/s median (min-max)",
                        "p50 us",
                        "p99 us",
                        "/ OpenAMP",
                        "by p50"
                    );
                    for r in &m.rows {
                        let c = peer_cells(m, r);
                        outln!(
                            out,
                            "  {:<42} {:<20} {:>32} {:>8} {:>8} {:>10} {:>8}",
                            r.driver.name(),
                            r.remote.name(),
                            c[0],
                            c[1],
                            c[2],
                            c[3],
                            c[4]
                        );
                    }
                    for r in &m.rows {
                        for f in &r.failures {
                            outln!(
                                out,
                                "  note: a run of {} <-> {} failed: {f}",
                                r.driver.name(),
                                r.remote.name()
                            );
                        }
                    }
                }
            }
        }
        outln!(out, "issue 16 goals, from this run ({}):", self.load_text());
        for g in self.goals() {
            outln!(
                out,
                "  {}: {}, goal {}: {}{}",
                g.what,
                g.value_text(),
                g.target_text(),
                g.met_text(),
                g.floor_text()
            );
        }
    }

    fn peers_heading(&self, m: &peers::PeerPlacement, place: &str) -> String {
        format!(
            "rpmsg peers, placement {} ({place}): {} runs, up to {} strict {}-byte round trips per row \
             (at most {} s) after {} unmeasured, the pairs taking turns; OpenAMP's demo platform \
             ({}, a byte per kick on unix:{}); OpenAMP from {}",
            m.placement.name(),
            self.runs,
            self.count,
            peers::SIZE,
            self.peer_budget.as_secs(),
            peers::PEER_WARM,
            peers::OPENAMP_SHM,
            peers::OPENAMP_EVENT,
            self.openamp
                .as_deref()
                .map_or_else(|| "-".into(), |d| d.display().to_string())
        )
    }

    /// The peer tables and the goals, as Markdown.
    pub(super) fn peers_markdown(&self, out: &mut String) {
        match &self.peers {
            None => {
                outln!(out, "Note: {PEERS_MISSING}.");
                outln!(out);
            }
            Some(all) => {
                for (m, place) in all.iter().zip(&self.peer_wheres) {
                    outln!(out, "{}:", self.peers_heading(m, place));
                    outln!(out);
                    outln!(out, "| driver side | remote | round trips/s, median (min-max) | p50 us | p99 us | / OpenAMP pair | by p50 |");
                    outln!(out, "|---|---|---|---:|---:|---:|---:|");
                    for r in &m.rows {
                        let c = peer_cells(m, r);
                        outln!(
                            out,
                            "| {} | {} | {} | {} | {} | {} | {} |",
                            r.driver.name(),
                            r.remote.name(),
                            c[0],
                            c[1],
                            c[2],
                            c[3],
                            c[4]
                        );
                    }
                    outln!(out);
                    for r in &m.rows {
                        for f in &r.failures {
                            outln!(
                                out,
                                "Note: a run of {} <-> {} failed: {f}",
                                r.driver.name(),
                                r.remote.name()
                            );
                            outln!(out);
                        }
                    }
                }
            }
        }
        outln!(
            out,
            "Issue 16's goals, from this run ({}):",
            self.load_text()
        );
        outln!(out);
        outln!(out, "| goal | this run (spread over runs) | target | |");
        outln!(out, "|---|---|---|---|");
        for g in self.goals() {
            outln!(
                out,
                "| {} | {} | {} | {}{} |",
                g.what,
                g.value_text(),
                g.target_text(),
                g.met_text(),
                g.floor_text()
            );
        }
        outln!(out);
    }

    /// `peers` and `goals` for the JSON report.
    pub(super) fn peers_json(&self) -> (serde_json::Value, serde_json::Value) {
        let peers = match &self.peers {
            None => serde_json::json!({ "missing": PEERS_MISSING }),
            Some(all) => {
                let placements: Vec<serde_json::Value> = all
                    .iter()
                    .zip(&self.peer_wheres)
                    .map(|(m, place)| {
                        let pair = m.row(peers::Driver::OpenAmp, peers::Remote::OpenAmp);
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
                                    "round_trips_per_s": rate(r).json(),
                                    "p50_us": median_of(r, |l| l.p50_us),
                                    "p99_us": median_of(r, |l| l.p99_us),
                                    "over_openamp_pair": rate_ratio(r, pair).map(|(v, _)| v),
                                    "over_openamp_pair_by_p50": p50_ratio(r, pair),
                                    "failures": r.failures,
                                })
                            })
                            .collect();
                        serde_json::json!({
                            "placement": m.placement.name(),
                            "where": place,
                            "rows": rows,
                        })
                    })
                    .collect();
                serde_json::json!({
                    "openamp": self.openamp,
                    "size": peers::SIZE,
                    "warm": peers::PEER_WARM,
                    "count": self.count,
                    "budget_s": self.peer_budget.as_secs(),
                    "notify": format!("unix:{}", peers::OPENAMP_EVENT),
                    "shm": peers::OPENAMP_SHM,
                    "placements": placements,
                })
            }
        };
        let goals: Vec<serde_json::Value> = self.goals().iter().map(Goal::json).collect();
        (peers, serde_json::Value::Array(goals))
    }

    /// A chart panel per peer placement: round trips/s per pair.
    pub(super) fn peers_panels(&self) -> Vec<crate::plot::Panel> {
        use crate::plot::{Bar, Panel, PEER, PRIMARY, SECONDARY};
        let Some(all) = &self.peers else {
            return Vec::new();
        };
        all.iter()
            .map(|m| Panel {
                title: format!("peers, placement {}: round trips/s", m.placement.name()),
                y_desc: "round trips/s".into(),
                log: false,
                bars: m
                    .rows
                    .iter()
                    .map(|r| {
                        let s = rate(r);
                        let color = match r.driver {
                            peers::Driver::OpenAmp => PEER,
                            peers::Driver::EptFd => PRIMARY,
                            peers::Driver::Bus => SECONDARY,
                        };
                        Bar {
                            label: format!("{}/{}", r.driver.key(), r.remote.key()),
                            segments: vec![(
                                0.0,
                                if s.median.is_nan() { 0.0 } else { s.median },
                                color,
                            )],
                            whisker: (!s.median.is_nan()).then_some((s.min, s.max)),
                        }
                    })
                    .collect(),
                lines: Vec::new(),
                legend: vec![
                    ("OpenAMP driver".into(), PEER),
                    ("endpoint fd".into(), PRIMARY),
                    ("Bus API".into(), SECONDARY),
                ],
            })
            .collect()
    }
}

/// How much faster `a` is than `b` by the median round trip: `b`'s p50
/// over `a`'s (medians over runs). Unlike round trips/s, it does not
/// count the rare long stall a spinning peer takes when it loses its CPU.
fn p50_ratio(a: &peers::PeerRow, b: &peers::PeerRow) -> Option<f64> {
    if a.runs.is_empty() || b.runs.is_empty() {
        return None;
    }
    Some(median_of(b, |l| l.p50_us) / median_of(a, |l| l.p50_us))
}

/// A peer row's cells: round trips/s, p50, p99, over the OpenAMP pair (by
/// round trips/s and by p50).
fn peer_cells(m: &peers::PeerPlacement, r: &peers::PeerRow) -> [String; 5] {
    if r.runs.is_empty() {
        return [
            "failed".into(),
            "-".into(),
            "-".into(),
            "n/a".into(),
            "n/a".into(),
        ];
    }
    let s = rate(r);
    let pair = m.row(peers::Driver::OpenAmp, peers::Remote::OpenAmp);
    [
        format!(
            "{} ({}-{})",
            thousands(s.median),
            thousands(s.min),
            thousands(s.max)
        ),
        format!("{:.1}", median_of(r, |l| l.p50_us)),
        format!("{:.1}", median_of(r, |l| l.p99_us)),
        rate_ratio(r, pair).map_or_else(|| "n/a".into(), |(v, _)| format!("{v:.2}x")),
        p50_ratio(r, pair).map_or_else(|| "n/a".into(), |v| format!("{v:.2}x")),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn goal(value: f64, target: f64, at_least: bool, floors: Vec<(&'static str, f64)>) -> Goal {
        Goal {
            what: "g".into(),
            value: Some((value, None)),
            na: None,
            target,
            at_least,
            unit: "x",
            by_p50: None,
            floors,
        }
    }

    #[test]
    fn the_verdict_names_the_floors_and_whether_the_target_is_past_them() {
        // The lowest floor decides: 1.08 <= 1.1, so the target is not
        // past the floor even though another floor is.
        let g = goal(1.3, 1.1, false, vec![("limit-u", 1.08), ("limit-w", 1.13)]);
        assert_eq!(g.met(), Some(false));
        assert_eq!(g.past_floor(), Some(false));
        assert_eq!(
            g.floor_text(),
            "; floor in this run: limit-u 1.08x, limit-w 1.13x"
        );
        let g = goal(1.3, 1.1, false, vec![("limit-u", 1.12), ("limit-w", 1.13)]);
        assert_eq!(g.past_floor(), Some(true));
        assert!(g
            .floor_text()
            .ends_with("limit-w 1.13x (the target is past it)"));
        // An at-least goal: past the floor when the floor is below it.
        let g = goal(0.8, 1.0, true, vec![("raw", 0.9)]);
        assert_eq!(g.past_floor(), Some(true));
        // No floor measured: nothing said.
        let g = goal(1.3, 1.1, false, Vec::new());
        assert_eq!(g.past_floor(), None);
        assert_eq!(g.floor_text(), "");
        assert!(g.json()["floors"].as_array().unwrap().is_empty());
    }
}
