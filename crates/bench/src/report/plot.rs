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

use std::path::Path;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::model::{Cell, Figure, Unit};
use crate::{Error, Result};

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

/// One bar: its row's label, its figure (as the table's cell holds it;
/// `None`: not measured), its colour; a thin bar draws a part of the row
/// above (a phase), named by its label before its value.
#[derive(Debug, Clone)]
struct Bar {
    label: String,
    figure: Option<Figure>,
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
        let figure = match cell {
            Cell::Figure(f) => Some(f.clone()),
            _ => None,
        };
        let group = &mut self.groups.last_mut().expect("a chart has a group").1;
        group.push(Bar {
            label,
            figure,
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
        self.bars().all(|b| b.figure.is_none())
    }

    /// A bar's value as its cell writes it (no range), with the unit.
    fn value_text(&self, b: &Bar) -> String {
        let Some(f) = &b.figure else {
            return "n/a".into();
        };
        let plain = Figure {
            range: None,
            ..f.clone()
        };
        let v = match f.unit {
            Unit::Plain | Unit::Grouped if !self.unit.is_empty() => {
                format!("{plain} {}", self.unit)
            }
            _ => plain.to_string(),
        };
        match b.thin {
            true => format!("{} {v}", b.label),
            false => v,
        }
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
                let Some(f) = &b.figure else { continue };
                whiskers += usize::from(f.range.is_some());
                let value = self.value_text(b);
                titles.push(match heading.as_str() {
                    "" => format!("{row}: {value}"),
                    h => format!("{h}, {row}: {value}"),
                });
            }
        }
        (titles, whiskers)
    }

    /// Writes the chart into the SVG file `path`.
    ///
    /// # Errors
    /// [`Error::Write`] naming `--plot` when plotters cannot draw it or
    /// the file cannot be written.
    pub(crate) fn draw(&self, path: &Path) -> Result<()> {
        let svg = self.svg().map_err(std::io::Error::other);
        svg.and_then(|svg| std::fs::write(path, svg))
            .map_err(Error::write("--plot", path))
    }

    /// The chart as an SVG document, drawn by plotters from [`Chart::layout`].
    pub(crate) fn svg(&self) -> std::result::Result<String, String> {
        let (marks, height) = self.layout();
        let mut svg = String::new();
        {
            let size = (WIDTH as u32, height.ceil() as u32);
            let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
            let e = |e: DrawingAreaErrorKind<_>| e.to_string();
            root.fill(&WHITE).map_err(e)?;
            let px = |(x, y): (f64, f64)| (x.round() as i32, y.round() as i32);
            for m in &marks {
                match m {
                    Mark::Rect { at, size, color } => {
                        let end = (at.0 + size.0, at.1 + size.1);
                        let fill = color.filled();
                        root.draw(&Rectangle::new([px(*at), px(end)], fill))
                    }
                    Mark::Line {
                        points,
                        color,
                        width,
                    } => {
                        let points: Vec<_> = points.iter().map(|p| px(*p)).collect();
                        root.draw(&PathElement::new(points, color.stroke_width(*width)))
                    }
                    Mark::Text { at, s, class } => {
                        let at = px((at.0, class.centre(at.1)));
                        root.draw(&Text::new(s.as_str(), at, class.style()))
                    }
                }
                .map_err(e)?;
            }
            root.present().map_err(e)?;
        }
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
        for (t, c) in self
            .legend
            .iter()
            .filter(|(_, c)| self.bars().any(|b| b.color == *c))
        {
            let w = width(t) + 48.0;
            if x + w > WIDTH - PAD && x > PAD {
                (x, y) = (PAD, y + 26.0);
            }
            out.push(Mark::rect((x, y - 13.0), (14.0, 14.0), *c));
            text(&mut out, Class::Legend, (x + 20.0, y), t);
            x += w;
        }
        let widest = |f: &dyn Fn(&Bar) -> f64| self.bars().map(f).fold(0.0, f64::max);
        let x0 = PAD + 12.0 + widest(&|b| if b.thin { 0.0 } else { width(&b.label) });
        let x1 = WIDTH - PAD - 10.0 - widest(&|b| width(&self.value_text(b)));
        // A thin bar, a part of its row, draws on the rows' scale.
        let rows = self.bars().filter(|b| !b.thin);
        let scale = Scale::new(rows.filter_map(|b| b.figure.as_ref()), x0, x1);
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
                if let Some(f) = &b.figure {
                    end = scale.x(f.value);
                    let w = (end - x0).max(1.0);
                    marks.push(Mark::rect((x0, cy - h / 2.0), (w, h), b.color));
                    if let Some((lo, hi)) = f.range {
                        let (a, z, c, d) = (scale.x(lo), scale.x(hi), cy - h * 0.3, cy + h * 0.3);
                        let points = vec![(a, c), (a, d), (a, cy), (z, cy), (z, c), (z, d)];
                        marks.push(Mark::Line {
                            points,
                            color: WHISKER,
                            width: 2,
                        });
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
        let line = |a, z, color| Mark::Line {
            points: vec![a, z],
            color,
            width: 1,
        };
        for (v, label) in scale.ticks() {
            let x = scale.x(v);
            out.push(line((x, top), (x, y), RGBColor(0xDD, 0xDD, 0xDD)));
            text(&mut out, Class::Tick, (x, y + 22.0), &label);
        }
        out.push(line((x0, y), (x1, y), RGBColor(0x22, 0x22, 0x22)));
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
    Rect {
        at: (f64, f64),
        size: (f64, f64),
        color: RGBColor,
    },
    Line {
        points: Vec<(f64, f64)>,
        color: RGBColor,
        width: u32,
    },
    /// Text with its baseline at `at`.
    Text {
        at: (f64, f64),
        s: String,
        class: Class,
    },
}

impl Mark {
    fn rect(at: (f64, f64), size: (f64, f64), color: RGBColor) -> Mark {
        Mark::Rect { at, size, color }
    }
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
    /// Its size in px, weight, anchor and grey level: titles 24 px, all
    /// else 16 px.
    fn spec(self) -> (f64, FontStyle, HPos, u8) {
        match self {
            Class::Title => (24.0, FontStyle::Bold, HPos::Left, 0x00),
            Class::Group => (16.0, FontStyle::Bold, HPos::Left, 0x00),
            Class::About => (16.0, FontStyle::Normal, HPos::Left, 0x44),
            Class::Label => (16.0, FontStyle::Normal, HPos::Right, 0x00),
            Class::Tick => (16.0, FontStyle::Normal, HPos::Center, 0x22),
            Class::Legend | Class::Value => (16.0, FontStyle::Normal, HPos::Left, 0x00),
        }
    }

    /// Its plotters style, centred vertically (plotters writes `dy="0.5ex"`)
    /// and sized so that the SVG says `size` (plotters writes a font's size
    /// divided by 1.24).
    fn style(self) -> TextStyle<'static> {
        let (size, style, h, grey) = self.spec();
        let font = FontDesc::new(FontFamily::SansSerif, size * 1.24, style);
        let color = RGBColor(grey, grey, grey);
        font.color(&color).pos(Pos::new(h, VPos::Center))
    }

    /// From a baseline to the centre plotters places text at (half an ex,
    /// about 0.27 em, above it).
    fn centre(self, baseline: f64) -> f64 {
        baseline - 0.27 * self.spec().0
    }
}

/// Where values go on the axis between `x0` and `x1`: linear from zero, or
/// (over more than two orders of magnitude) log from a power of ten below
/// the smallest to one above the largest.
struct Scale {
    lo: f64,
    hi: f64,
    log: bool,
    x0: f64,
    x1: f64,
}

impl Scale {
    fn new<'a>(figures: impl Iterator<Item = &'a Figure>, x0: f64, x1: f64) -> Scale {
        let (mut min, mut max, mut low) = (f64::INFINITY, 0f64, f64::INFINITY);
        for f in figures {
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
        Scale {
            lo,
            hi,
            log,
            x0,
            x1,
        }
    }

    fn x(&self, v: f64) -> f64 {
        let t = match self.log {
            true => (v.max(self.lo) / self.lo).log10() / (self.hi / self.lo).log10(),
            false => v / self.hi,
        };
        self.x0 + t.clamp(0.0, 1.0) * (self.x1 - self.x0)
    }

    /// The ticks and their labels: powers of ten, or a round step.
    fn ticks(&self) -> Vec<(f64, String)> {
        let (mut v, mut t) = (Vec::new(), self.lo);
        while t <= self.hi * (1.0 + 1e-9) {
            v.push((t, short_num(t)));
            t = if self.log {
                t * 10.0
            } else {
                t + step(self.hi)
            };
        }
        v
    }
}

/// A round step (1, 2, 2.5 or 5 times a power of ten) giving about five
/// ticks up to `max`.
fn step(max: f64) -> f64 {
    let mag = 10f64.powf((max / 5.0).log10().floor());
    let f = [1.0, 2.0, 2.5, 5.0]
        .into_iter()
        .find(|f| f * mag >= max / 5.0);
    f.unwrap_or(10.0) * mag
}

/// An axis figure: 2.5M, 400k, 12, 0.75.
fn short_num(v: f64) -> String {
    let trim = |v: f64| {
        let s = format!("{v:.6}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    };
    match v.abs() {
        a if a >= 1e6 => format!("{}M", trim(v / 1e6)),
        a if a >= 1e4 => format!("{}k", trim(v / 1e3)),
        a if a >= 10.0 || a == 0.0 => format!("{v:.0}"),
        _ => trim(v),
    }
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
    let s = s.to_string();
    out.push(Mark::Text { at, s, class });
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
        assert_eq!(
            [step(401.9), step(4.1), step(12_000.0)],
            [100.0, 1.0, 2500.0]
        );
    }

    /// The texts of `class` in drawing order.
    fn texts(marks: &[Mark], class: Class) -> Vec<&str> {
        marks
            .iter()
            .filter_map(|m| match m {
                Mark::Text { s, class: c, .. } if *c == class => Some(s.as_str()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn bars_write_their_cells_and_pick_the_axis() {
        let mut c = Chart::new("c", "t", "ms").legend(&[("total", PRIMARY)]);
        c.bar(
            "a & b",
            &Cell::runs(&[2.0, 1.0, 4.0], Unit::Plain, 1),
            PRIMARY,
        )
        .thin("alloc", &Cell::num(1.25, 2), OTHER)
        .bar("b", &Cell::NotAvailable, PRIMARY);
        let (marks, _) = c.layout();
        assert_eq!(texts(&marks, Class::Label), ["a & b", "b"]);
        assert_eq!(
            texts(&marks, Class::Value),
            ["2.0 ms", "alloc 1.25 ms", "n/a"]
        );
        assert_eq!(texts(&marks, Class::Tick).last(), Some(&"ms"));
        let bars: Vec<_> = marks
            .iter()
            .filter_map(|m| match m {
                Mark::Rect { size, color, .. } if size.1 > 14.0 || size.1 == 12.0 => {
                    Some((size.0, *color))
                }
                _ => None,
            })
            .collect();
        assert_eq!(bars.len(), 2);
        // Linear from 0 to 4: the median 2 is half the 4 the whisker ends at.
        let whisker = marks.iter().find_map(|m| match m {
            Mark::Line { points, color, .. } if *color == WHISKER => Some(points.clone()),
            _ => None,
        });
        let w = whisker.unwrap();
        assert!(
            ((w[3].0 - w[0].0) - (bars[0].0 * 1.5)).abs() < 1e-6,
            "{w:?} {bars:?}"
        );
        let svg = c.svg().unwrap();
        assert!(svg.contains("\na &amp; b\n"), "{svg}");
        assert!(svg.contains("font-size=\"16\""), "{svg}");
        let mut wide = Chart::new("w", "t", "us");
        wide.group("one").bar("x", &Cell::num(5.0, 0), PRIMARY).bar(
            "y",
            &Cell::num(900.0, 0),
            PRIMARY,
        );
        let (marks, _) = wide.layout();
        assert_eq!(texts(&marks, Class::Tick).last(), Some(&"us (log scale)"));
        assert_eq!(texts(&marks, Class::Group), ["one"]);
    }
}
