//! The report writers of `iopath bench rpmsg`: the text table, JSON,
//! Markdown and the chart, from the measured rows in the parent module.

use super::*;

impl RpmsgReport {
    /// Each placement's tables, then the polling echo (with `poll`).
    pub fn text(&self) -> String {
        let mut out = String::new();
        for (t, _) in &self.placements {
            out.push_str(t);
        }
        if let Some((p, pl, place)) = &self.poll {
            outln!(out, "echo, polling ({place}):");
            outln!(out, "  endpoint fd (--poll): {}", p.line());
            outln!(
                out,
                "  limit (raw eventfd ping-pong, two processes): {}",
                pl.line()
            );
            outln!(out, "  poll/limit p50: {:.2}x", p.p50_us / pl.p50_us);
        }
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
            outln!(out, "| loops | legacy total us | fd total us | legacy/fd | limit total us (eventfd passed) | limit-s total us (socket passed) |");
            outln!(out, "|---:|---|---|---:|---|---|");
            for r in &m.rows {
                let (l, fd) = (Summary::of(&r.legacy), Summary::of(&r.fd));
                outln!(
                    out,
                    "| {} | {} | {} | {:.2}x | {} | {} |",
                    thousands(r.loops as f64),
                    f(&l),
                    f(&fd),
                    l.median / fd.median,
                    f(&Summary::of(&r.limit)),
                    f(&Summary::of(&r.limit_socket))
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
        if let Some((p, pl, place)) = &self.poll {
            outln!(out, "Polling ({place}):");
            outln!(out);
            echo_table(
                &mut out,
                self.count,
                &[("endpoint fd, busy-polled, host and remote polling", p)],
                pl,
            );
        }
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
                    Summary::of(&r.legacy),
                    SECONDARY,
                ));
                bars.push(bar(format!("fd {loops}"), Summary::of(&r.fd), PRIMARY));
                let lim = Summary::of(&r.limit).median;
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
            ));
        }
        if let Some((p, pl, _)) = &self.poll {
            panels.push(echo_panel("echo round trip, polling".into(), p, pl));
        }
        crate::plot::draw(
            path,
            "bench rpmsg: endpoints the legacy way vs as fds",
            &panels,
            2,
        )
    }

    /// The first placement's `rows`, `limit` and `echo` at the top, every
    /// placement under `placements`.
    pub fn json(&self) -> serde_json::Value {
        let placements: Vec<serde_json::Value> =
            self.placements.iter().map(|(_, j)| j.clone()).collect();
        let main = &placements[0];
        let mut echo_json = main["echo"].clone();
        if let Some((p, pl, place)) = &self.poll {
            echo_json["fd_poll"] = serde_json::json!(p);
            echo_json["limit_eventfd_pingpong_poll_phase"] = serde_json::json!(pl);
            echo_json["fd_poll_over_limit_p50"] = serde_json::json!(p.p50_us / pl.p50_us);
            echo_json["poll_placement"] = serde_json::json!(place);
        }
        serde_json::json!({
            "runs": self.runs,
            "count": self.count,
            "placement": main["placement"],
            "rows": main["rows"],
            "limit": main["limit"],
            "per_cycle_us": main["per_cycle_us"],
            "fd_over_limit": main["fd_over_limit"],
            "fd_over_limit_socket": main["fd_over_limit_socket"],
            "echo": echo_json,
            "placements": placements,
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
            "{:>7} | {:>25} | {:>23} | {:>9} | {:>23} | {:>33}",
            "loops",
            "legacy total us",
            "fd total us",
            "legacy/fd",
            "limit total us",
            "per cycle us: fd / limit / limit-s"
        );
    }
    for r in rows {
        let (l, f, lim) = (sum(&r.legacy), sum(&r.fd), sum(&r.limit));
        let pc: Vec<Summary> = r.chunks.iter().map(|c| sum(c)).collect();
        let fmt = |s: &Summary| format!("{:.0} ({:.0}-{:.0})", s.median, s.min, s.max);
        {
            outln!(
                out,
                "{:>7} | {:>25} | {:>23} | {:>8.2}x | {:>23} | {:>9.1} / {:>5.1} / {:>7.1}",
                r.loops,
                fmt(&l),
                fmt(&f),
                l.median / f.median,
                fmt(&lim),
                pc[1].median,
                pc[2].median,
                pc[3].median,
            );
        }
        jrows.push(serde_json::json!({
            "loops": r.loops,
            "legacy_us": l.median, "fd_us": f.median, "limit_us": lim.median,
            "limit_socket_us": sum(&r.limit_socket).median,
            "legacy_us_spread": l.json(), "fd_us_spread": f.json(), "limit_us_spread": lim.json(),
            "legacy_over_fd": l.median / f.median,
            "per_cycle_us": {
                "legacy": pc[0].json(), "fd": pc[1].json(),
                "limit": pc[2].json(), "limit_socket": pc[3].json(),
            },
        }));
    }
    // Per cycle over every chunk of every row.
    let all = |w: usize| {
        let v: Vec<f64> = rows
            .iter()
            .flat_map(|r| r.chunks[w].iter().copied())
            .collect();
        sum(&v)
    };
    let (legacy_pc, fd_pc, rtt, rtt_s) = (all(0), all(1), all(2), all(3));
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
        outln!(out, "  legacy create+open+destroy: {}", spread(&legacy_pc));
        outln!(
            out,
            "  fd create+close: {} = {:.2}x limit, {:.2}x limit-s",
            spread(&fd_pc),
            fd_pc.median / rtt.median,
            fd_pc.median / rtt_s.median
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
        },
        "per_cycle_us": { "legacy": legacy_pc.json(), "fd": fd_pc.json() },
        "fd_over_limit": fd_pc.median / rtt.median,
        "fd_over_limit_socket": fd_pc.median / rtt_s.median,
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
fn echo_panel(title: String, echo: &Latency, limit: &Latency) -> crate::plot::Panel {
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
            ("limit: raw eventfd ping-pong".into(), LIMIT),
        ],
    }
}
