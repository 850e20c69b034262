//! The chart of `iopath bench rpmsg`.

use super::super::{way, RpmsgReport};
use super::short_count;
use crate::report::plot::{At, Bar, Line, Panel, LIMIT, PRIMARY, SECONDARY};
use crate::report::Chart;
use crate::{Latency, Summary};

impl RpmsgReport {
    /// The chart: per placement, legacy vs fd totals per loop count (log
    /// scale, min-max whiskers) with the raw limit as a line, and the echo
    /// round trip's p50/p99 beside the raw ping-pong's; the polling echo,
    /// the scale experiments' and the peer rows' panels.
    pub(super) fn chart(&self) -> Chart {
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
        panels.extend(self.bulk.as_ref().map(|b| b.panel()));
        panels.extend(self.peers_panels());
        Chart {
            title: "bench rpmsg: endpoints the legacy way vs as fds".into(),
            panels,
            columns: 2,
        }
    }
}

/// Echo p50/p99 beside the raw ping-pong's (log scale).
fn echo_panel(title: String, echo: &Latency, limit: &Latency, limit_name: &str) -> Panel {
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
