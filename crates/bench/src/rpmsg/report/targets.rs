//! The targets of `iopath bench rpmsg`: each ratio or latency this run
//! measured beside the figure it should reach, within it or not, and the
//! floor measured beside it (the cheapest thing with the same semantics).

use super::super::peers::{Driver, PeerPlacement, Remote};
use super::super::{way, RpmsgReport};
use super::peers::{p50_ratio, rate_ratio};
use super::per_cycle;
use crate::report::{Cell, Column, Table, Unit};
use crate::{Placement, Summary};

/// A target for a ratio or a latency, beside its figure from this run.
#[derive(Debug)]
pub(super) struct Target {
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
    /// targets (a figure beside the target's, not the target).
    by_p50: Option<f64>,
    /// What the cheapest thing with the same semantics measured in this
    /// run (name, figure in the target's unit): a target past every floor
    /// is one no implementation meets here.
    floors: Vec<(&'static str, f64)>,
}

impl Target {
    /// Whether this run's figure is within the target (`None`: no figure).
    fn within(&self) -> Option<bool> {
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

    /// This run's figure, with its spread over runs; or why there is none.
    fn value_cell(&self) -> Cell {
        let unit = if self.unit == "x" {
            Unit::Times
        } else {
            Unit::Micros
        };
        match (&self.value, &self.na) {
            (Some((v, range)), _) => {
                let c = Cell::figure(*v, unit, 2);
                match range {
                    Some((lo, hi)) => c.with_range(*lo, *hi),
                    None => c,
                }
            }
            (None, Some(why)) => Cell::text(format!("n/a ({why})")),
            (None, None) => Cell::NotAvailable,
        }
    }

    fn within_text(&self) -> &'static str {
        match self.within() {
            Some(true) => "within",
            Some(false) => "not within",
            None => "n/a",
        }
    }

    /// What stands beside the figure: the ratio by p50, the floors.
    fn beside_text(&self) -> String {
        let by_p50 = self.by_p50.map(|v| format!("by p50 {v:.2}x"));
        let floor = self.floor_text();
        let floor = floor.trim_start_matches("; ");
        by_p50
            .into_iter()
            .chain((!floor.is_empty()).then(|| floor.to_string()))
            .collect::<Vec<_>>()
            .join("; ")
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

    pub(super) fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "what": self.what,
            "value": self.value.map(|(v, _)| v),
            "spread": self.value.and_then(|(_, s)| s).map(|(lo, hi)| [lo, hi]),
            "target": self.target,
            "op": if self.at_least { ">=" } else { "<=" },
            "unit": self.unit.trim(),
            "within": self.within(),
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

impl RpmsgReport {
    /// The peer placement `p`, if measured.
    fn peer_placement(&self, p: Placement) -> Option<&PeerPlacement> {
        self.peers.as_ref()?.iter().find(|m| m.placement == p)
    }

    /// The targets, each with its figure from this run.
    pub(super) fn targets(&self) -> Vec<Target> {
        let mut targets = Vec::new();
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
                targets.push(Target {
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
        targets.push(Target {
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
        targets.push(Target {
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
        targets.push(Target {
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
        self.scale_targets(&mut targets);
        self.bulk_targets(&mut targets);
        targets
    }

    /// The bulk targets: the endpoint fd at 4 KiB against the raw socket,
    /// the Bus API at 64 KiB against memcpy (or 2 GB/s).
    fn bulk_targets(&self, targets: &mut Vec<Target>) {
        let b = self.bulk.as_ref();
        let na = |what: &str| {
            Some(if b.is_none() {
                "run without --bulk-mib 0".to_string()
            } else {
                format!("no {what} row")
            })
        };
        let fd = b.and_then(|b| b.ratios(4096)).map(|(fd, _)| (fd, None));
        targets.push(Target {
            what: "bulk: endpoint fd MB/s / raw SOCK_SEQPACKET MB/s, 4096-byte messages".into(),
            na: fd.is_none().then(|| na("4096-byte")).flatten(),
            value: fd,
            target: 0.7,
            at_least: true,
            unit: "x",
            by_p50: None,
            floors: Vec::new(),
        });
        let big = 65520;
        // Either of the next two meets the goal.
        let bus = b.and_then(|b| b.ratios(big)).map(|(_, bus)| (bus, None));
        targets.push(Target {
            what: "bulk: Bus API MB/s / one-thread memcpy MB/s, 65520-byte messages (or the next)"
                .into(),
            na: bus.is_none().then(|| na("65520-byte")).flatten(),
            value: bus,
            target: 0.5,
            at_least: true,
            unit: "x",
            by_p50: None,
            floors: Vec::new(),
        });
        let gb = b
            .and_then(|b| b.bus_mb_s(big))
            .map(|mb| (mb / 2000.0, None));
        targets.push(Target {
            what: "bulk: Bus API MB/s / 2000 MB/s, 65520-byte messages (or the one before)".into(),
            na: gb.is_none().then(|| na("65520-byte")).flatten(),
            value: gb,
            target: 1.0,
            at_least: true,
            unit: "x",
            by_p50: None,
            floors: Vec::new(),
        });
    }

    /// The 256-endpoint targets, from the scale experiments' figures.
    fn scale_targets(&self, targets: &mut Vec<Target>) {
        let row = self.scale.as_ref().and_then(|(_, j)| {
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
        targets.push(Target {
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
        targets.push(Target {
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
}

/// The targets as a table.
pub(super) fn table(targets: &[Target], load: &str) -> Table {
    let mut t = Table::new(
        format!("targets, from this run ({load})"),
        vec![
            Column::left("ratio or latency"),
            Column::right("this run (spread over runs)"),
            Column::left("target"),
            Column::left("within"),
            Column::left("beside it"),
        ],
    );
    for g in targets {
        t.row(vec![
            Cell::text(g.what.clone()),
            g.value_cell(),
            Cell::text(g.target_text()),
            Cell::text(g.within_text()),
            Cell::text(g.beside_text()),
        ]);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(value: f64, target: f64, at_least: bool, floors: Vec<(&'static str, f64)>) -> Target {
        Target {
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
        let g = target(1.3, 1.1, false, vec![("limit-u", 1.08), ("limit-w", 1.13)]);
        assert_eq!(g.within(), Some(false));
        assert_eq!(g.past_floor(), Some(false));
        assert_eq!(
            g.floor_text(),
            "; floor in this run: limit-u 1.08x, limit-w 1.13x"
        );
        let g = target(1.3, 1.1, false, vec![("limit-u", 1.12), ("limit-w", 1.13)]);
        assert_eq!(g.past_floor(), Some(true));
        assert!(g
            .floor_text()
            .ends_with("limit-w 1.13x (the target is past it)"));
        // An at-least target: past the floor when the floor is below it.
        let g = target(0.8, 1.0, true, vec![("raw", 0.9)]);
        assert_eq!(g.past_floor(), Some(true));
        // No floor measured: nothing said.
        let g = target(1.3, 1.1, false, Vec::new());
        assert_eq!(g.past_floor(), None);
        assert_eq!(g.floor_text(), "");
        assert!(g.json()["floors"].as_array().unwrap().is_empty());
    }
}
