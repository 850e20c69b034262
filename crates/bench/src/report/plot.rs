//! SVG charts drawn with `plotters`: panels of bars, stacked or with
//! min-max whiskers, and lines for the limits. Each kind of mark has its
//! own colour, so that a reader, or a test parsing the SVG, can tell a
//! bar (a filled `<rect>`) from a limit or a whisker (`<polyline>`s).

use std::path::Path;

use plotters::coord::ranged1d::{Ranged, SegmentValue, SegmentedCoord, ValueFormatter};
use plotters::coord::types::RangedCoordusize;
use plotters::prelude::*;

pub use plotters::style::RGBColor;

use crate::{Error, Result, Stats};

/// Heap: allocation time; blk: iopath's back end; rpmsg: the fd way.
pub const PRIMARY: RGBColor = RGBColor(0x4C, 0x72, 0xB0);
/// Heap: read time stacked on the allocation; rpmsg: the legacy way.
pub const SECONDARY: RGBColor = RGBColor(0xDD, 0x84, 0x52);
/// A peer's bar (qemu-storage-daemon).
pub const PEER: RGBColor = RGBColor(0x55, 0xA8, 0x68);
/// Rows run by a guest, and bounds that are not the limit (alloc only).
pub const OTHER: RGBColor = RGBColor(0x8C, 0x8C, 0x8C);
/// The limit: its line, or its bar where the limit is a row of its own
/// (the raw ping-pong beside the echo).
pub const LIMIT: RGBColor = RGBColor(0xC4, 0x4E, 0x52);
/// Min-max whiskers.
pub const WHISKER: RGBColor = RGBColor(0x20, 0x20, 0x20);

/// `#RRGGBB` as the SVG backend writes a colour.
pub fn hex(c: RGBColor) -> String {
    format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2)
}

/// One bar: stacked segments (from, to, colour), an optional min-max
/// whisker.
#[derive(Debug, Clone)]
pub(crate) struct Bar {
    pub label: String,
    pub segments: Vec<(f64, f64, RGBColor)>,
    pub whisker: Option<(f64, f64)>,
}

impl Bar {
    /// A bar of height `v`.
    pub fn of(label: impl Into<String>, v: f64, color: RGBColor) -> Bar {
        Bar {
            label: label.into(),
            segments: vec![(0.0, v, color)],
            whisker: None,
        }
    }

    /// A bar at the median of `runs`, their min-max as its whisker; no bar
    /// (the label only) without runs.
    pub fn runs(label: impl Into<String>, runs: &[f64], color: RGBColor) -> Bar {
        let s = Stats::of(runs);
        let mut b = Bar::of(label, s.median, color);
        b.whisker = Some((s.min, s.max));
        if runs.is_empty() {
            (b.segments, b.whisker) = (Vec::new(), None);
        }
        b
    }
}

/// A line over the bars (a limit), with its legend text: points at the
/// left edges of bars (the number of bars: the right edge of the last).
#[derive(Debug, Clone)]
pub(crate) struct Line {
    pub legend: String,
    pub points: Vec<(usize, f64)>,
    pub color: RGBColor,
}

impl Line {
    /// A limit's horizontal line at `y` over bars `from..to`.
    pub fn span(legend: String, from: usize, to: usize, y: f64) -> Line {
        Line {
            legend,
            points: vec![(from, y), (to, y)],
            color: LIMIT,
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Panel {
    pub title: String,
    pub y_desc: String,
    pub log: bool,
    pub bars: Vec<Bar>,
    pub lines: Vec<Line>,
    /// Legend entries for the bars' colours.
    pub legend: Vec<(String, RGBColor)>,
}

/// Draws `panels` in a grid of `cols` columns under `title` into the SVG
/// file `path`.
pub(crate) fn draw(path: &Path, title: &str, panels: &[Panel], cols: usize) -> Result<()> {
    let err = |reason: String| Error::Plot {
        path: path.to_path_buf(),
        reason,
    };
    let cols = cols.max(1);
    let rows = panels.len().div_ceil(cols).max(1);
    let widest = panels.iter().map(|p| p.bars.len()).max().unwrap_or(1);
    let w = (cols * (140 + 95 * widest).max(760)) as u32;
    let h = (60 + rows * 420) as u32;
    let root = SVGBackend::new(path, (w, h)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
    let root = root
        .titled(title, ("sans-serif", 20))
        .map_err(|e| err(e.to_string()))?;
    for (p, area) in panels.iter().zip(root.split_evenly((rows, cols)).iter()) {
        panel(p, area).map_err(err)?;
    }
    root.present().map_err(|e| err(e.to_string()))
}

fn panel<DB: DrawingBackend>(
    p: &Panel,
    area: &DrawingArea<DB, plotters::coord::Shift>,
) -> std::result::Result<(), String>
where
    DB::ErrorType: 'static,
{
    let n = p.bars.len().max(1);
    let ys = p
        .bars
        .iter()
        .flat_map(|b| {
            b.segments
                .iter()
                .flat_map(|&(a, z, _)| [a, z])
                .chain(b.whisker.into_iter().flat_map(|(a, z)| [a, z]))
        })
        .chain(
            p.lines
                .iter()
                .flat_map(|l| l.points.iter().map(|&(_, y)| y)),
        );
    let (mut lo, mut hi) = (f64::INFINITY, 0f64);
    for y in ys {
        hi = hi.max(y);
        if y > 0.0 {
            lo = lo.min(y);
        }
    }
    if !hi.is_finite() || hi <= 0.0 {
        hi = 1.0;
    }
    let mut b = ChartBuilder::on(area);
    b.caption(&p.title, ("sans-serif", 15))
        .margin(12)
        .margin_top(40)
        .x_label_area_size(48)
        .y_label_area_size(70);
    // A segmented range covers its end too: 0..n-1 gives n segments.
    let x = (0..n.saturating_sub(1)).into_segmented();
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    if p.log {
        let lo = if lo.is_finite() {
            lo / 2.0
        } else {
            hi / 1000.0
        };
        let mut c = b
            .build_cartesian_2d(x, (lo..hi * 2.0).log_scale())
            .map_err(e)?;
        marks(&mut c, p, lo).map_err(e)?;
    } else {
        let mut c = b.build_cartesian_2d(x, 0f64..hi * 1.15).map_err(e)?;
        marks(&mut c, p, 0.0).map_err(e)?;
    }
    // The legend: coloured text, top left under the caption (no marks, so
    // bars and lines stay one per row).
    let mut x0 = 80;
    let entries = p
        .legend
        .iter()
        .map(|(t, c)| (format!("■ {t}"), *c))
        .chain(p.lines.iter().map(|l| (format!("— {}", l.legend), l.color)));
    for (text, color) in entries {
        let style = TextStyle::from(("sans-serif", 12).into_font()).color(&color);
        area.draw(&Text::new(text.clone(), (x0, 24), style))
            .map_err(e)?;
        x0 += 18 + 7 * text.chars().count() as i32;
    }
    Ok(())
}

/// The mesh, the bars, their whiskers and the lines of `p`, every value
/// at least `lo` (the bottom of a log axis).
fn marks<DB, Y>(
    c: &mut ChartContext<'_, DB, Cartesian2d<SegmentedCoord<RangedCoordusize>, Y>>,
    p: &Panel,
    lo: f64,
) -> std::result::Result<(), DrawingAreaErrorKind<DB::ErrorType>>
where
    DB: DrawingBackend,
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let labels: Vec<&str> = p.bars.iter().map(|b| b.label.as_str()).collect();
    let fmt = |v: &SegmentValue<usize>| match v {
        SegmentValue::CenterOf(i) => labels.get(*i).copied().unwrap_or_default().to_string(),
        _ => String::new(),
    };
    c.configure_mesh()
        .disable_x_mesh()
        .x_labels(p.bars.len().max(1))
        .x_label_formatter(&fmt)
        .y_labels(8)
        .y_label_formatter(&|v| short_num(*v))
        .y_desc(&p.y_desc)
        .label_style(("sans-serif", 11))
        .draw()?;
    for (i, bar) in p.bars.iter().enumerate() {
        for &(a, z, color) in &bar.segments {
            let corners = [
                (SegmentValue::Exact(i), a.max(lo)),
                (SegmentValue::Exact(i + 1), z.max(lo)),
            ];
            let mut r = Rectangle::new(corners, color.filled());
            r.set_margin(0, 0, 8, 8);
            c.draw_series(std::iter::once(r))?;
        }
        if let Some((a, z)) = bar.whisker {
            let at = SegmentValue::CenterOf(i);
            let w = vec![(at.clone(), a.max(lo)), (at, z.max(lo))];
            c.draw_series(std::iter::once(PathElement::new(
                w,
                WHISKER.stroke_width(2),
            )))?;
        }
    }
    for l in &p.lines {
        let pts: Vec<_> = l
            .points
            .iter()
            .map(|&(i, y)| (SegmentValue::Exact(i), y.max(lo)))
            .collect();
        c.draw_series(std::iter::once(PathElement::new(
            pts,
            l.color.stroke_width(2),
        )))?;
    }
    Ok(())
}

/// An axis figure: 2.5M, 400k, 12, 0.75.
fn short_num(v: f64) -> String {
    let trim = |v: f64| {
        let s = format!("{v:.2}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    };
    let a = v.abs();
    if a >= 1e6 {
        format!("{}M", trim(v / 1e6))
    } else if a >= 1e4 {
        format!("{}k", trim(v / 1e3))
    } else if a >= 10.0 || a == 0.0 {
        format!("{v:.0}")
    } else {
        trim(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_figures() {
        assert_eq!(short_num(2_500_000.0), "2.5M");
        assert_eq!(short_num(400_000.0), "400k");
        assert_eq!(short_num(1500.0), "1500");
        assert_eq!(short_num(0.75), "0.75");
        assert_eq!(short_num(0.0), "0");
        assert_eq!(hex(LIMIT), "#C44E52");
    }
}
