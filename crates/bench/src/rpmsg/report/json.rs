//! The figures of `iopath bench rpmsg` for scripts: per placement its
//! rows, limits and echo; the first placement's also at the top; the
//! polling echo, the peer rows, the scale experiments and the targets.

use super::super::{Measured, RpmsgReport};
use super::per_cycle;
use crate::place::Cpus;
use crate::Summary;

/// One placement's figures: its rows, limits, per-cycle costs and echo.
pub(in crate::rpmsg) fn placement_json(m: &Measured, cpus: &Cpus) -> serde_json::Value {
    let sum = |v: &[f64]| Summary::of(v);
    let rows = &m.rows;
    let mut jrows = Vec::new();
    for r in rows {
        let [l, f, lim, ls, lw] = r.totals.each_ref().map(|t| sum(t));
        let pc: Vec<Summary> = r.chunks.iter().map(|c| sum(c)).collect();
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
    serde_json::json!({
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
    })
}

impl RpmsgReport {
    /// The first placement's `rows`, `limit` and `echo` at the top, every
    /// placement under `placements`, the peer rows under `peers` (or
    /// `peers.missing`), the targets under `targets`.
    pub(super) fn json(&self) -> serde_json::Value {
        let placements = &self.placements;
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
        let targets: Vec<serde_json::Value> = self
            .targets()
            .iter()
            .map(super::targets::Target::json)
            .collect();
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
            "peers": self.peers_json(),
            "targets": targets,
            "scale": self.scale.as_ref().map(|(_, j)| j),
            "bulk": self.bulk.as_ref().map(|b| b.json()),
            "loadavg": [self.loadavg.0, self.loadavg.1],
        })
    }
}
