//! The files `iopath bench` writes when asked, and only then: each
//! experiment's charts (`--plot DIR`), the tables as one Markdown document
//! (`--markdown FILE`), every figure as one JSON object (`--json FILE`).

use std::path::{Path, PathBuf};

use super::Report;
use crate::{Error, Outputs, Result};

/// What to write, and the reports written so far.
#[derive(Debug, Default)]
pub(crate) struct Files {
    plot: Option<PathBuf>,
    markdown: Option<PathBuf>,
    json: Option<PathBuf>,
    /// Each report with the charts drawn for it.
    done: Vec<(Report, Vec<PathBuf>)>,
}

impl Files {
    /// The files `out` asks for; JSON on stdout (`--json -`) is none.
    pub(crate) fn new(out: &Outputs) -> Files {
        Files {
            plot: out.plot.clone(),
            markdown: out.markdown.clone(),
            json: out.json.clone().filter(|j| j != Path::new("-")),
            done: Vec::new(),
        }
    }

    /// Refuses, before any experiment runs, a place that cannot be
    /// written ([`Error::Write`] naming the option): a probe file is made
    /// and removed in the plot directory (made too) and in each file's; an
    /// existing file must open for writing (left as it is).
    pub(crate) fn check(&self) -> Result<()> {
        if let Some(dir) = &self.plot {
            let made = std::fs::create_dir_all(dir).and_then(|()| probe(dir));
            made.map_err(Error::write("--plot", dir))?;
        }
        for (option, file) in [("--markdown", &self.markdown), ("--json", &self.json)] {
            let Some(file) = file else { continue };
            let dir = file.parent().filter(|d| !d.as_os_str().is_empty());
            let writable = match file.exists() {
                true => std::fs::OpenOptions::new().write(true).open(file).map(drop),
                false => probe(dir.unwrap_or(Path::new("."))),
            };
            writable.map_err(Error::write(option, file))?;
        }
        Ok(())
    }

    /// Adds an experiment's report and draws its charts now (with a plot
    /// directory), so that a later experiment's failure keeps them.
    pub(crate) fn add(&mut self, r: Report) -> Result<&Report> {
        let charts = match &self.plot {
            None => Vec::new(),
            Some(dir) => {
                std::fs::create_dir_all(dir).map_err(Error::write("--plot", dir))?;
                r.plot(dir)?
            }
        };
        self.done.push((r, charts));
        Ok(&self.done[self.done.len() - 1].0)
    }

    /// Every figure: one report's own object, or an object with one key
    /// per experiment.
    pub(crate) fn json(&self) -> serde_json::Value {
        match &self.done[..] {
            [(r, _)] => r.json(),
            all => all.iter().map(|(r, _)| (r.name, r.json())).collect(),
        }
    }

    /// The Markdown document: the command line, then each report (under a
    /// heading when there are several) with its charts linked relative to
    /// the document.
    pub(crate) fn markdown(&self, command: &str) -> String {
        let base = self.markdown.as_deref().and_then(Path::parent);
        let base = base.unwrap_or(Path::new(""));
        let mut md = format!("Command: `{command}`\n\n");
        for (r, charts) in &self.done {
            if self.done.len() > 1 {
                md.push_str(&format!("### {}\n\n", r.name));
            }
            md.push_str(&r.markdown());
            for c in charts {
                let name = c.file_stem().unwrap_or_default().to_string_lossy();
                md.push_str(&format!("![{name}]({})\n\n", relative(c, base).display()));
            }
        }
        md
    }

    /// Writes the Markdown document (`command`: the command line it
    /// names) and the JSON file, as asked; returns a line per file written
    /// (`chart: PATH`, `markdown: PATH`, `json: PATH`).
    pub(crate) fn finish(&self, command: &str) -> Result<Vec<String>> {
        let charts = self.done.iter().flat_map(|(_, c)| c);
        let mut lines: Vec<_> = charts.map(|c| format!("chart: {}", c.display())).collect();
        if let Some(file) = &self.markdown {
            let written = std::fs::write(file, self.markdown(command));
            written.map_err(Error::write("--markdown", file))?;
            lines.push(format!("markdown: {}", file.display()));
        }
        if let Some(file) = &self.json {
            let written = std::fs::write(file, format!("{}\n", self.json()));
            written.map_err(Error::write("--json", file))?;
            lines.push(format!("json: {}", file.display()));
        }
        Ok(lines)
    }
}

/// Creates and removes a file in `dir`: whether files can be made there.
fn probe(dir: &Path) -> std::io::Result<()> {
    let mut probe = tempfile::Builder::new();
    let file = probe.prefix(".iopath-bench-probe").tempfile_in(dir)?;
    file.close()
}

/// `path` relative to `base` when it lies under it (else as given).
fn relative(path: &Path, base: &Path) -> PathBuf {
    let abs = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let (p, b) = (abs(path), abs(base));
    p.strip_prefix(&b).map(Path::to_path_buf).unwrap_or(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_report_is_its_own_json_several_are_keyed() {
        let mut f = Files::default();
        f.add(Report::new("heap", "a")).unwrap();
        assert_eq!(f.json()["summary"], "a");
        f.add(Report::new("blk", "b")).unwrap();
        assert_eq!(f.json()["blk"]["summary"], "b");
        let md = f.markdown("iopath bench");
        assert!(md.starts_with("Command: `iopath bench`\n\n### heap\n\na\n\n### blk"));
    }

    #[test]
    fn charts_link_relative_to_the_document() {
        let d = tempfile::tempdir().unwrap();
        let rel = relative(&d.path().join("c/heap.svg"), d.path());
        assert_eq!(rel, Path::new("c/heap.svg"));
    }
}
