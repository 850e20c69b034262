//! The scale experiments' report: tables, chart panels and figures, which
//! join the rpmsg report ([`crate::rpmsg::RpmsgReport::add_scale`]).

use std::time::Duration;

use serde_json::json;

use super::{CreateRow, EchoRow, StreamRow};
use crate::report::plot::{Bar, Line, Panel, LIMIT, PRIMARY, SECONDARY};
use crate::report::{Cell, Column, Table, Unit};
use crate::Summary;

/// What the scale experiments measured; its tables, chart panels and
/// figures join the rpmsg report.
#[derive(Debug)]
pub struct ScaleReport {
    pub(super) runs: usize,
    pub(super) echo_time: Duration,
    pub(super) stream_msgs: u64,
    pub(super) wheres: String,
    pub(super) echo: Vec<EchoRow>,
    pub(super) stream: Vec<StreamRow>,
    pub(super) create: CreateRow,
}

impl ScaleReport {
    fn base_aggregate(&self) -> f64 {
        self.echo
            .iter()
            .find(|r| r.endpoints == 1)
            .map_or(f64::NAN, |r| Summary::of(&r.aggregate).median)
    }

    /// The tables: endpoints echoing at once, the one-way stream beside
    /// its raw limit, creating many endpoints.
    pub(crate) fn tables(&self) -> Vec<Table> {
        let range = |v: &[f64], digits| Cell::runs(v, Unit::Grouped, digits);
        let mut echo = Table::new(
            format!(
                "scale, {}: endpoints echoing at once ({:.1} s, 16 B), medians (min-max) over {} runs; the remote offers EVENT_IDX",
                self.wheres,
                self.echo_time.as_secs_f64(),
                self.runs
            ),
            vec![
                Column::right("endpoints"),
                Column::right("round trips/s (aggregate)"),
                Column::right("vs 1 endpoint"),
                Column::right("per-endpoint p99 us, median endpoint"),
                Column::right("worst endpoint's p99 / median's"),
                Column::right("fewest round trips / median's"),
            ],
        );
        let base = self.base_aggregate();
        for r in &self.echo {
            let ratio: Vec<f64> = r
                .p99_max
                .iter()
                .zip(&r.p99_median)
                .map(|(m, d)| m / d.max(1e-9))
                .collect();
            echo.row(vec![
                Cell::grouped(r.endpoints as f64, 0),
                range(&r.aggregate, 0),
                Cell::times(Summary::of(&r.aggregate).median / base),
                range(&r.p99_median, 1),
                range(&ratio, 2),
                range(&r.fewest_share, 2),
            ]);
        }
        let mut stream = Table::new(
            format!(
                "one-way stream: {} messages ({} MiB at most), then SYNC; 64 KiB buffers; medians (min-max)",
                self.stream_msgs,
                super::STREAM_BYTES >> 20
            ),
            vec![
                Column::left("payload"),
                Column::right("endpoint fd msgs/s"),
                Column::right("MB/s"),
                Column::right("raw SOCK_SEQPACKET msgs/s (limit)"),
                Column::right("MB/s"),
                Column::right("endpoint / limit"),
            ],
        );
        for r in &self.stream {
            let mb =
                |v: &[f64]| -> Vec<f64> { v.iter().map(|x| x * r.size as f64 / 1e6).collect() };
            stream.row(vec![
                Cell::text(format!("{} B", r.size)),
                range(&r.ept, 0),
                range(&mb(&r.ept), 1),
                range(&r.raw, 0),
                range(&mb(&r.raw), 1),
                Cell::times(Summary::of(&r.ept).median / Summary::of(&r.raw).median),
            ]);
        }
        let c = &self.create;
        let mut create = Table::new(
            format!(
                "creating {} endpoint fds (held, one control connection)",
                c.endpoints
            ),
            vec![Column::left("what"), Column::left("measured")],
        );
        let each = |secs: f64| {
            format!(
                "{secs:.2} s ({:.1} us each)",
                secs * 1e6 / c.endpoints as f64
            )
        };
        let curve: Vec<String> = c
            .per_thousand_us
            .iter()
            .map(|v| format!("{v:.1}"))
            .collect();
        let [before, full, after] = c.rss_kib;
        let per = full.saturating_sub(before) as f64 / c.endpoints as f64;
        for (what, measured) in [
            ("created in", each(c.create_s)),
            ("us per endpoint, each thousand in turn", curve.join(", ")),
            ("closed and freed in", each(c.destroy_s)),
            (
                "host resident memory: before, all held, after",
                format!("{before} / {full} / {after} KiB ({per:.2} KiB per endpoint)"),
            ),
        ] {
            create.row(vec![what.into(), measured.into()]);
        }
        vec![echo, stream, create]
    }

    /// The chart's panels: aggregate round trips/s and the per-endpoint
    /// p99 as endpoints grow (the curves of the echo rows), and the
    /// one-way stream beside its raw limit; medians with min-max whiskers.
    pub(crate) fn panels(&self) -> Vec<Panel> {
        let bar = Bar::runs;
        let one = self
            .echo
            .first()
            .map_or(0.0, |r| Summary::of(&r.aggregate).median);
        let n = self.echo.len();
        let echo = Panel {
            title: "endpoints echoing at once, one CPU: aggregate round trips/s".into(),
            y_desc: "round trips/s".into(),
            log: false,
            bars: self
                .echo
                .iter()
                .map(|r| bar(format!("{} endpoints", r.endpoints), &r.aggregate, PRIMARY))
                .collect(),
            lines: vec![Line::span("one endpoint's rate".into(), 0, n, one)],
            legend: vec![("aggregate".into(), PRIMARY)],
        };
        let p99 = Panel {
            title: "per-endpoint p99: median endpoint and worst endpoint".into(),
            y_desc: "us (log)".into(),
            log: true,
            bars: self
                .echo
                .iter()
                .flat_map(|r| {
                    [
                        bar(format!("{} median", r.endpoints), &r.p99_median, PRIMARY),
                        bar(format!("{} worst", r.endpoints), &r.p99_max, SECONDARY),
                    ]
                })
                .collect(),
            lines: Vec::new(),
            legend: vec![
                ("median endpoint's p99".into(), PRIMARY),
                ("worst endpoint's p99".into(), SECONDARY),
            ],
        };
        let stream = Panel {
            title: "one-way stream: messages/s".into(),
            y_desc: "messages/s".into(),
            log: false,
            bars: self
                .stream
                .iter()
                .flat_map(|r| {
                    [
                        bar(format!("{} B endpoint", r.size), &r.ept, PRIMARY),
                        bar(format!("{} B raw", r.size), &r.raw, LIMIT),
                    ]
                })
                .collect(),
            lines: Vec::new(),
            legend: vec![
                ("endpoint fd".into(), PRIMARY),
                ("limit: raw SOCK_SEQPACKET".into(), LIMIT),
            ],
        };
        let create = Panel {
            title: format!(
                "creating {} endpoint fds: us per endpoint, each thousand in turn",
                self.create.endpoints
            ),
            y_desc: "us per endpoint".into(),
            log: false,
            bars: self
                .create
                .per_thousand_us
                .iter()
                .enumerate()
                .map(|(k, &us)| bar(format!("{}k", k + 1), &[us], PRIMARY))
                .collect(),
            lines: Vec::new(),
            legend: vec![("endpoint fd create".into(), PRIMARY)],
        };
        vec![echo, p99, stream, create]
    }

    /// Every figure as JSON.
    pub(crate) fn json(&self) -> serde_json::Value {
        let base = self.base_aggregate();
        json!({
            "where": self.wheres,
            "runs": self.runs,
            "echo_time_s": self.echo_time.as_secs_f64(),
            "echo": self.echo.iter().map(|r| json!({
                "endpoints": r.endpoints,
                "aggregate_per_s": r.aggregate,
                "vs_one": Summary::of(&r.aggregate).median / base,
                "p99_us_median_endpoint": r.p99_median,
                "p99_us_worst_endpoint": r.p99_max,
                "fewest_round_trips_share": r.fewest_share,
            })).collect::<Vec<_>>(),
            "stream": self.stream.iter().map(|r| json!({
                "size": r.size,
                "messages": r.msgs,
                "endpoint_msgs_per_s": r.ept,
                "raw_msgs_per_s": r.raw,
            })).collect::<Vec<_>>(),
            "create": {
                "endpoints": self.create.endpoints,
                "create_s": self.create.create_s,
                "destroy_s": self.create.destroy_s,
                "per_thousand_us": self.create.per_thousand_us,
                "host_rss_kib": self.create.rss_kib,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chart_has_a_curve_per_experiment_from_the_rows() {
        let r = ScaleReport {
            runs: 3,
            echo_time: Duration::from_secs(1),
            stream_msgs: 100,
            wheres: String::new(),
            echo: [(1, 40_000.0), (16, 60_000.0), (256, 38_000.0)]
                .into_iter()
                .map(|(endpoints, rate)| EchoRow {
                    endpoints,
                    aggregate: vec![rate - 1000.0, rate, rate + 5000.0],
                    p99_median: vec![10.0, 11.0, 12.0],
                    p99_max: vec![20.0, 21.0, 22.0],
                    fewest_share: vec![1.0; 3],
                })
                .collect(),
            stream: vec![StreamRow {
                size: 16,
                msgs: 100,
                ept: vec![1.0, 2.0, 3.0],
                raw: vec![4.0, 5.0, 6.0],
            }],
            create: CreateRow {
                endpoints: 2000,
                per_thousand_us: vec![30.0, 31.0],
                create_s: 0.06,
                destroy_s: 0.02,
                rss_kib: [1, 2, 2],
            },
        };
        let p = r.panels();
        assert_eq!(p.len(), 4);
        // The echo curve: one bar per endpoint count at its median, the
        // runs' spread as the whisker, one endpoint's rate as the line.
        let medians: Vec<f64> = p[0].bars.iter().map(|b| b.segments[0].1).collect();
        assert_eq!(medians, [40_000.0, 60_000.0, 38_000.0]);
        assert_eq!(p[0].bars[1].whisker, Some((59_000.0, 65_000.0)));
        assert_eq!(p[0].lines.len(), 1);
        assert!(p[0].lines[0].points.iter().all(|&(_, y)| y == 40_000.0));
        // Median and worst endpoint's p99 per count; endpoint and raw per
        // size; one bar per thousand created.
        assert_eq!(p[1].bars.len(), 6);
        assert_eq!(p[1].bars[1].segments[0].1, 21.0);
        let stream: Vec<f64> = p[2].bars.iter().map(|b| b.segments[0].1).collect();
        assert_eq!(stream, [2.0, 5.0]);
        let create: Vec<f64> = p[3].bars.iter().map(|b| b.segments[0].1).collect();
        assert_eq!(create, [30.0, 31.0]);
    }
}
