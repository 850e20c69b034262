//! SVG charts, one message each, one file each: a horizontal bar per
//! table row, built from the row's cell, so that its value is written at
//! its end exactly as the table writes it, with the runs' min-max as a
//! whisker where the table has a range. Rows may sit in groups under a
//! heading (a placement, a queue depth). The axis is linear unless the
//! values span more than two orders of magnitude.
//!
//! The layout (where each label, bar and whisker goes) is computed here
//! as a list of marks, which `plotters` then draws on its SVG backend. In
//! the file, each row is its label (`text-anchor="end"`), its bar (a
//! filled `<rect>`, 26 px high, 12 for a thin one), its whisker (a
//! `<polyline>` in [`WHISKER`]'s colour) and its value (the next
//! `<text>`), in that order, for a reader and for a test.
//!
//! Sizes are the SVG's own pixels at its natural width ([`WIDTH`]):
//! titles 24, every other text 16, so that a page showing the chart 800
//! to 1200 wide shows them at 11 to 24 px.

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::model::{Cell, Unit};

/// An sRGB colour, as plotters draws it.
pub use plotters::style::RGBColor;

/// The measured way the chart is about (heap total, iopath's back end, the
/// fd way).
pub const PRIMARY: RGBColor = RGBColor(0x4C, 0x72, 0xB0);
/// The way it is compared with (the legacy way, a sleeping back end), and
/// heap read time.
pub const SECONDARY: RGBColor = RGBColor(0xDD, 0x84, 0x52);
/// A peer's bar (qemu-storage-daemon, libblkio, OpenAMP).
pub const PEER: RGBColor = RGBColor(0x55, 0xA8, 0x68);
/// Bounds that are not the limit (alloc only), heap allocation time.
pub const OTHER: RGBColor = RGBColor(0x8C, 0x8C, 0x8C);
/// The limit measured in the same run.
pub const LIMIT: RGBColor = RGBColor(0xC4, 0x4E, 0x52);
/// Min-max whiskers.
pub const WHISKER: RGBColor = RGBColor(0x20, 0x20, 0x20);

/// `#RRGGBB` as the SVG writes a colour.
pub fn hex(c: RGBColor) -> String {
    format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2)
}

/// The canvas width; the height follows the rows.
pub const WIDTH: f64 = 1200.0;
const PAD: f64 = 24.0;
/// A character's width in em, generous for common sans-serif fonts.
const EM: f64 = 0.6;

/// One bar: its row's label, the table's cell (drawn when a figure), its
/// colour; a thin bar draws a part of the row above (a phase), named by
/// its label before its value.
#[derive(Debug, Clone)]
struct Bar {
    label: String,
    cell: Cell,
    color: RGBColor,
    thin: bool,
}

/// One chart, written as `NAME.svg`: a title that says what it shows, a
/// line on how it was measured, a legend, bars in groups under headings.
#[derive(Debug, Clone, Default)]
pub struct Chart {
    pub(crate) name: String,
    title: String,
    about: String,
    unit: &'static str,
    axis: String,
    legend: Vec<(String, RGBColor)>,
    groups: Vec<(String, Vec<Bar>)>,
}

impl Chart {
    /// An empty chart `name` (the file's stem) titled `title`, its values
    /// in `unit` (written after figures whose cell has no unit of its own).
    pub(crate) fn new(
        name: impl Into<String>,
        title: impl Into<String>,
        unit: &'static str,
    ) -> Chart {
        Chart {
            name: name.into(),
            title: title.into(),
            unit,
            axis: unit.to_string(),
            groups: vec![(String::new(), Vec::new())],
            ..Chart::default()
        }
    }

    /// How it was measured (a line under the title) and the axis caption.
    pub(crate) fn about(mut self, about: impl Into<String>, axis: &str) -> Chart {
        (self.about, self.axis) = (about.into(), axis.into());
        self
    }

    /// The legend: each colour's meaning (drawn when a bar has it).
    pub(crate) fn legend(mut self, entries: &[(&str, RGBColor)]) -> Chart {
        self.legend = entries.iter().map(|(t, c)| (t.to_string(), *c)).collect();
        self
    }

    /// Starts a group of rows under `heading`.
    pub(crate) fn group(&mut self, heading: impl Into<String>) -> &mut Chart {
        self.groups.retain(|g| !g.1.is_empty());
        self.groups.push((heading.into(), Vec::new()));
        self
    }

    /// A row `label`, its bar at `cell`'s figure.
    pub(crate) fn bar(
        &mut self,
        label: impl Into<String>,
        cell: &Cell,
        color: RGBColor,
    ) -> &mut Chart {
        self.push(label.into(), cell, color, false)
    }

    /// A thin bar under the row, its figure written after `phase`.
    pub(crate) fn thin(&mut self, phase: &str, cell: &Cell, color: RGBColor) -> &mut Chart {
        self.push(phase.into(), cell, color, true)
    }

    fn push(&mut self, label: String, cell: &Cell, color: RGBColor, thin: bool) -> &mut Chart {
        let group = &mut self.groups.last_mut().expect("a chart has a group").1;
        group.push(Bar {
            label,
            cell: cell.clone(),
            color,
            thin,
        });
        self
    }

    /// Appends `other`'s groups (the same chart measured elsewhere).
    pub(crate) fn extend(&mut self, other: Chart) {
        self.groups.retain(|g| !g.1.is_empty());
        self.groups.extend(other.groups);
    }

    fn bars(&self) -> impl Iterator<Item = &Bar> {
        self.groups.iter().flat_map(|g| &g.1)
    }

    /// Whether the chart has no bar to draw.
    pub(crate) fn is_empty(&self) -> bool {
        self.bars().all(|b| b.cell.value().is_none())
    }

    /// A bar's value as its cell writes it (no range), with the unit.
    fn value_text(&self, b: &Bar) -> String {
        let Cell::Figure(f) = &b.cell else {
            return "n/a".into();
        };
        let mut v = format!("{f:#}");
        if matches!(f.unit, Unit::Plain | Unit::Grouped) && !self.unit.is_empty() {
            v = format!("{v} {}", self.unit);
        }
        if b.thin {
            v = format!("{} {v}", b.label);
        }
        v
    }

    /// Each drawn bar as `GROUP, ROW: VALUE` (its value as written beside
    /// it), and how many have a whisker: what a test compares with a table.
    #[cfg(test)]
    pub(crate) fn bar_titles(&self) -> (Vec<String>, usize) {
        let (mut titles, mut whiskers) = (Vec::new(), 0);
        for (heading, bars) in &self.groups {
            let mut row = "";
            for b in bars {
                if !b.thin {
                    row = &b.label;
                }
                let Cell::Figure(f) = &b.cell else { continue };
                whiskers += usize::from(f.range.is_some());
                let group = heading.clone() + if heading.is_empty() { "" } else { ", " };
                titles.push(format!("{group}{row}: {}", self.value_text(b)));
            }
        }
        (titles, whiskers)
    }

    /// The chart as an SVG document, drawn by plotters from [`Chart::layout`].
    pub(crate) fn svg(&self) -> std::result::Result<String, String> {
        let (marks, height) = self.layout();
        let mut svg = String::new();
        let size = (WIDTH as u32, height.ceil() as u32);
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        let e = |e: DrawingAreaErrorKind<_>| e.to_string();
        root.fill(&WHITE).map_err(e)?;
        let px = |(x, y): (f64, f64)| (x.round() as i32, y.round() as i32);
        for m in &marks {
            match m {
                Mark::Rect(at, size, color) => {
                    let corners = [px(*at), px((at.0 + size.0, at.1 + size.1))];
                    root.draw(&Rectangle::new(corners, color.filled()))
                }
                Mark::Line(points, color, width) => {
                    let points: Vec<_> = points.iter().map(|p| px(*p)).collect();
                    root.draw(&PathElement::new(points, color.stroke_width(*width)))
                }
                Mark::Text(at, s, class) => {
                    let (style, above) = class.style();
                    root.draw(&Text::new(s.as_str(), px((at.0, at.1 - above)), style))
                }
            }
            .map_err(e)?;
        }
        root.present().map_err(e)?;
        drop(root);
        Ok(svg)
    }

    /// Where everything goes: title, about, legend, then under the axis's
    /// grid the bars, a row (36 px) or thin row (20 px) each. Returns the
    /// marks in drawing order and the canvas's height.
    fn layout(&self) -> (Vec<Mark>, f64) {
        let (mut out, mut y) = (Vec::new(), PAD);
        for line in wrap(&self.title, 24.0) {
            y += 30.0;
            text(&mut out, Class::Title, (PAD, y), &line);
        }
        for line in wrap(&self.about, 16.0) {
            y += 23.0;
            text(&mut out, Class::About, (PAD, y), &line);
        }
        y += 32.0;
        let mut x = PAD;
        let legend = self.legend.iter();
        for (t, c) in legend.filter(|(_, c)| self.bars().any(|b| b.color == *c)) {
            let w = width(t) + 48.0;
            if x + w > WIDTH - PAD && x > PAD {
                (x, y) = (PAD, y + 26.0);
            }
            out.push(Mark::Rect((x, y - 13.0), (14.0, 14.0), *c));
            text(&mut out, Class::Legend, (x + 20.0, y), t);
            x += w;
        }
        let widest = |f: &dyn Fn(&Bar) -> f64| self.bars().map(f).fold(0.0, f64::max);
        let x0 = PAD + 12.0 + widest(&|b| if b.thin { 0.0 } else { width(&b.label) });
        let x1 = WIDTH - PAD - 10.0 - widest(&|b| width(&self.value_text(b)));
        // A thin bar, a part of its row, draws on the rows' scale.
        let rows = self.bars().filter(|b| !b.thin);
        let scale = Scale::new(rows.map(|b| &b.cell));
        let x = |v| x0 + scale.at(v) * (x1 - x0);
        let (top, mut marks) = (y + 20.0, Vec::new());
        y = top;
        for (heading, bars) in &self.groups {
            if !heading.is_empty() {
                y += 30.0;
                text(&mut marks, Class::Group, (PAD, y - 8.0), heading);
            }
            for b in bars {
                let (pitch, h) = if b.thin { (20.0, 12.0) } else { (36.0, 26.0) };
                let (cy, mut end) = (y + pitch / 2.0, x0);
                if !b.thin {
                    text(&mut marks, Class::Label, (x0 - 12.0, cy + 5.5), &b.label);
                }
                if let Cell::Figure(f) = &b.cell {
                    end = x(f.value);
                    let w = (end - x0).max(1.0);
                    marks.push(Mark::Rect((x0, cy - h / 2.0), (w, h), b.color));
                    if let Some((lo, hi)) = f.range {
                        let (a, z, c, d) = (x(lo), x(hi), cy - h * 0.3, cy + h * 0.3);
                        let points = vec![(a, c), (a, d), (a, cy), (z, cy), (z, c), (z, d)];
                        marks.push(Mark::Line(points, WHISKER, 2));
                        end = end.max(z);
                    }
                }
                let value = self.value_text(b);
                text(&mut marks, Class::Value, (end + 8.0, cy + 5.5), &value);
                y += pitch;
            }
            y += 6.0;
        }
        // The grid under the marks, the axis below them.
        let line = |a, z, grey| Mark::Line(vec![a, z], RGBColor(grey, grey, grey), 1);
        for v in scale.ticks() {
            out.push(line((x(v), top), (x(v), y), 0xDD));
            text(&mut out, Class::Tick, (x(v), y + 22.0), &short_num(v));
        }
        out.push(line((x0, y), (x1, y), 0x22));
        let log = if scale.log { " (log scale)" } else { "" };
        let axis = format!("{}{log}", self.axis);
        text(&mut out, Class::Tick, ((x0 + x1) / 2.0, y + 48.0), &axis);
        out.extend(marks);
        (out, y + 48.0 + PAD)
    }
}

/// What the layout places, in SVG pixels.
#[derive(Debug, Clone, PartialEq)]
enum Mark {
    /// A filled rectangle: its top left corner, size and colour.
    Rect((f64, f64), (f64, f64), RGBColor),
    /// A line through points: the points, its colour and width.
    Line(Vec<(f64, f64)>, RGBColor, u32),
    /// A text with its baseline at a point.
    Text((f64, f64), String, Class),
}

/// A kind of text, which sets its size, weight, anchor and colour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Title,
    About,
    Legend,
    Group,
    Label,
    Value,
    Tick,
}

impl Class {
    /// Its plotters style (titles 24 px, all else 16), centred vertically
    /// (plotters writes `dy="0.5ex"`) and sized so that the SVG says the
    /// size (plotters writes a font's size divided by 1.24); and how far
    /// above the baseline that centre is (half an ex, about 0.27 em).
    fn style(self) -> (TextStyle<'static>, f64) {
        let (size, weight, h, grey) = match self {
            Class::Title => (24.0, FontStyle::Bold, HPos::Left, 0x00),
            Class::Group => (16.0, FontStyle::Bold, HPos::Left, 0x00),
            Class::About => (16.0, FontStyle::Normal, HPos::Left, 0x44),
            Class::Label => (16.0, FontStyle::Normal, HPos::Right, 0x00),
            Class::Tick => (16.0, FontStyle::Normal, HPos::Center, 0x22),
            Class::Legend | Class::Value => (16.0, FontStyle::Normal, HPos::Left, 0x00),
        };
        let font = FontDesc::new(FontFamily::SansSerif, size * 1.24, weight);
        let style = font.color(&RGBColor(grey, grey, grey));
        (style.pos(Pos::new(h, VPos::Center)), 0.27 * size)
    }
}

/// Where values go along the axis: linear from zero, or (over more than
/// two orders of magnitude) log from a power of ten below the smallest to
/// one above the largest.
struct Scale {
    lo: f64,
    hi: f64,
    log: bool,
}

impl Scale {
    fn new<'a>(cells: impl Iterator<Item = &'a Cell>) -> Scale {
        let (mut min, mut max, mut low) = (f64::INFINITY, 0f64, f64::INFINITY);
        for c in cells {
            let Cell::Figure(f) = c else { continue };
            let (a, z) = f.range.unwrap_or((f.value, f.value));
            max = max.max(f.value).max(z);
            if f.value > 0.0 {
                min = min.min(f.value);
                low = low.min(f.value).min(if a > 0.0 { a } else { f.value });
            }
        }
        max = if max > 0.0 { max } else { 1.0 };
        let log = min.is_finite() && max / min > 100.0;
        let pow10 = |e: f64| 10f64.powf(e);
        let (lo, hi) = match log {
            true => (pow10(low.log10().floor()), pow10(max.log10().ceil())),
            false => (0.0, (max / step(max)).ceil() * step(max)),
        };
        Scale { lo, hi, log }
    }

    /// How far along the axis `v` goes, from 0 to 1.
    fn at(&self, v: f64) -> f64 {
        let t = match self.log {
            true => (v.max(self.lo) / self.lo).log10() / (self.hi / self.lo).log10(),
            false => v / self.hi,
        };
        t.clamp(0.0, 1.0)
    }

    /// The ticks: powers of ten, or a round step.
    fn ticks(&self) -> Vec<f64> {
        let step = step(self.hi);
        let next = |t: f64| match self.log {
            true => t * 10.0,
            false => t + step,
        };
        let ticks = std::iter::successors(Some(self.lo), |&t| Some(next(t)));
        ticks.take_while(|&t| t <= self.hi * (1.0 + 1e-9)).collect()
    }
}

/// A round step (1, 2, 2.5 or 5 times a power of ten) giving about five
/// ticks up to `max`.
fn step(max: f64) -> f64 {
    let mag = 10f64.powf((max / 5.0).log10().floor());
    let enough = |f: &f64| f * mag >= max / 5.0;
    let f = [1.0, 2.0, 2.5, 5.0].into_iter().find(enough);
    f.unwrap_or(10.0) * mag
}

/// An axis figure: 2.5M, 400k, 12, 0.75.
fn short_num(v: f64) -> String {
    let (v, unit) = match v.abs() {
        a if a >= 1e6 => (v / 1e6, "M"),
        a if a >= 1e4 => (v / 1e3, "k"),
        a if a >= 10.0 || a == 0.0 => return format!("{v:.0}"),
        _ => (v, ""),
    };
    let s = format!("{v:.6}");
    format!("{}{unit}", s.trim_end_matches('0').trim_end_matches('.'))
}

/// The width of `s` in pixels at 16 px, estimated.
fn width(s: &str) -> f64 {
    s.chars().count() as f64 * 16.0 * EM
}

/// `s` in lines that fit the canvas at font size `size`.
fn wrap(s: &str, size: f64) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    let fits = |l: &str, w: &str| (l.len() + 1 + w.len()) as f64 * size * EM <= WIDTH - 2.0 * PAD;
    for word in s.split_whitespace() {
        match lines.last_mut() {
            Some(l) if fits(l, word) => *l = format!("{l} {word}"),
            _ => lines.push(word.to_string()),
        }
    }
    lines
}

/// A text of `class` with its baseline at `at`.
fn text(out: &mut Vec<Mark>, class: Class, at: (f64, f64), s: &str) {
    out.push(Mark::Text(at, s.to_string(), class));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_figures_and_steps() {
        assert_eq!(short_num(2_500_000.0), "2.5M");
        assert_eq!(short_num(400_000.0), "400k");
        assert_eq!(short_num(1500.0), "1500");
        assert_eq!(short_num(0.75), "0.75");
        assert_eq!(short_num(0.001), "0.001");
        assert_eq!(short_num(0.0), "0");
        assert_eq!(hex(LIMIT), "#C44E52");
        let steps = [step(401.9), step(4.1), step(12_000.0)];
        assert_eq!(steps, [100.0, 1.0, 2500.0]);
    }

    /// The texts of `class` in drawing order.
    fn texts(marks: &[Mark], class: Class) -> Vec<&str> {
        let texts = marks.iter().filter_map(|m| match m {
            Mark::Text(_, s, c) if *c == class => Some(s.as_str()),
            _ => None,
        });
        texts.collect()
    }

    #[test]
    fn bars_write_their_cells_and_pick_the_axis() {
        let mut c = Chart::new("c", "t", "ms").legend(&[("total", PRIMARY)]);
        let runs = Cell::runs(&[2.0, 1.0, 4.0], Unit::Plain, 1);
        c.bar("a & b", &runs, PRIMARY)
            .thin("alloc", &Cell::num(1.25, 2), OTHER)
            .bar("b", &Cell::NotAvailable, PRIMARY);
        let (marks, _) = c.layout();
        assert_eq!(texts(&marks, Class::Label), ["a & b", "b"]);
        let values = ["2.0 ms", "alloc 1.25 ms", "n/a"];
        assert_eq!(texts(&marks, Class::Value), values);
        assert_eq!(texts(&marks, Class::Tick).last(), Some(&"ms"));
        let bars = marks.iter().filter_map(|m| match m {
            Mark::Rect(_, (w, h), color) if *h > 14.0 || *h == 12.0 => Some((*w, *color)),
            _ => None,
        });
        let bars: Vec<_> = bars.collect();
        assert_eq!(bars.len(), 2);
        // Linear from 0 to 4: the median 2 is half the 4 the whisker ends at.
        let whisker = marks.iter().find_map(|m| match m {
            Mark::Line(points, color, _) if *color == WHISKER => Some(points.clone()),
            _ => None,
        });
        let w = whisker.unwrap();
        let (span, bar) = (w[3].0 - w[0].0, bars[0].0);
        assert!((span - bar * 1.5).abs() < 1e-6, "{w:?} {bars:?}");
        let svg = c.svg().unwrap();
        assert!(svg.contains("\na &amp; b\n"), "{svg}");
        assert!(svg.contains("font-size=\"16\""), "{svg}");
        let mut log = Chart::new("w", "t", "us");
        let (x, y) = (Cell::num(5.0, 0), Cell::num(900.0, 0));
        log.group("one").bar("x", &x, PRIMARY).bar("y", &y, PRIMARY);
        let (marks, _) = log.layout();
        assert_eq!(texts(&marks, Class::Tick).last(), Some(&"us (log scale)"));
        assert_eq!(texts(&marks, Class::Group), ["one"]);
    }
}
