//! `iopath bench models`: the model-loading experiment beside its peers
//! (safetensors, Run:ai's model streamer, fastsafetensors), which is a
//! Python script (`scripts/bench-models`, `python/bench/bench_models.py`):
//! run from a source tree, with the arguments passed on.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context, Result};

/// Arguments of `iopath bench models`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Runs scripts/bench-models of the source tree (the current directory's, else
the one this iopath was built from) with ARGS; `iopath bench models --help`
after `--` shows its own options:
  iopath bench models -- --rounds 5 --cpus 0,1
  iopath bench models -- --install          # the torch-based peers, in a venv of their own
Cold, warm and half-warm loads of a 1 GiB model as one file and as 8 shards;
fio's O_DIRECT read and a one-thread copy from a cached mapping are the limits.")]
pub struct ModelsArgs {
    /// Arguments for scripts/bench-models.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub args: Vec<String>,
}

impl ModelsArgs {
    /// Runs the script; its exit status becomes ours.
    pub(super) fn run(&self) -> Result<()> {
        let script = script()?;
        let status = Command::new(&script)
            .args(&self.args)
            .status()
            .with_context(|| format!("running {}", script.display()))?;
        if !status.success() {
            bail!("{} failed ({status})", script.display());
        }
        Ok(())
    }
}

/// `scripts/bench-models` of the current directory, else of the source
/// tree this binary was built from.
fn script() -> Result<PathBuf> {
    let built = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut tried = Vec::new();
    for root in [std::env::current_dir().unwrap_or_default(), built] {
        let s = root.join("scripts/bench-models");
        if s.is_file() {
            return Ok(s);
        }
        tried.push(s.display().to_string());
    }
    bail!(
        "bench models: scripts/bench-models not found (tried {}); run from an iopath source tree",
        tried.join(", ")
    )
}
