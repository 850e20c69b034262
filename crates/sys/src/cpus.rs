//! Process placement: which CPUs a thread, and the processes it starts,
//! run on. See sched_setaffinity(2).
//!
//! A child inherits the affinity of the thread that forks it, so pinning
//! the thread around the spawn places the child.

use std::cell::Cell;
use std::io;

use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};

/// The CPUs this process may run on.
#[derive(Debug, Clone)]
pub struct Cpus {
    allowed: CpuSet,
    ids: Vec<usize>,
}

thread_local! {
    /// What "not pinned" means for a child spawned from a pinned thread.
    static ALL_CPUS: Cell<Option<CpuSet>> = const { Cell::new(None) };
}

impl Cpus {
    /// Reads this thread's affinity (call before pinning anything).
    ///
    /// # Errors
    /// When the affinity cannot be read or holds no CPU.
    pub fn get() -> io::Result<Cpus> {
        let allowed = sched_getaffinity(None)?;
        let ids: Vec<usize> = (0..CpuSet::MAX_CPU)
            .filter(|&i| allowed.is_set(i))
            .collect();
        if ids.is_empty() {
            return Err(io::Error::other("no CPU in this process's affinity mask"));
        }
        ALL_CPUS.with(|c| c.set(Some(allowed)));
        Ok(Cpus { allowed, ids })
    }

    /// Two distinct CPUs if there are two (else the one twice).
    pub fn pair(&self) -> (usize, usize) {
        (self.ids[0], *self.ids.get(1).unwrap_or(&self.ids[0]))
    }

    /// Runs `f` with the calling thread (and the threads it starts) pinned
    /// to `cpu`, then unpins it.
    ///
    /// # Errors
    /// When the affinity cannot be set.
    pub fn on<T>(&self, cpu: Option<usize>, f: impl FnOnce() -> T) -> io::Result<T> {
        pin(cpu, &self.allowed)?;
        let r = f();
        pin(None, &self.allowed)?;
        Ok(r)
    }
}

/// Pins the calling thread to `cpu`, or to all of `all` with `None`.
fn pin(cpu: Option<usize>, all: &CpuSet) -> io::Result<()> {
    let mut set = *all;
    if let Some(c) = cpu {
        set = CpuSet::new();
        set.set(c);
    }
    Ok(sched_setaffinity(None, &set)?)
}

/// Runs `spawn` with the calling thread pinned to `cpu` (`None`: every
/// CPU this process may use, as [`Cpus::get`] read them), then restores the
/// thread's own affinity: the child `spawn` starts runs on `cpu`.
///
/// # Errors
/// When the affinity cannot be read or set.
pub fn spawn_on<T>(cpu: Option<usize>, spawn: impl FnOnce() -> T) -> io::Result<T> {
    let mine = sched_getaffinity(None)?;
    pin(cpu, &ALL_CPUS.with(Cell::get).unwrap_or(mine))?;
    let child = spawn();
    sched_setaffinity(None, &mine)?;
    Ok(child)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pinned_thread_and_its_child_run_on_one_cpu_then_on_all_again() {
        let cpus = Cpus::get().unwrap();
        let (a, _) = cpus.pair();
        let only_a = |set: CpuSet| (0..CpuSet::MAX_CPU).all(|i| set.is_set(i) == (i == a));
        let inside = cpus
            .on(Some(a), || sched_getaffinity(None).unwrap())
            .unwrap();
        assert!(only_a(inside));
        assert_eq!(sched_getaffinity(None).unwrap(), cpus.allowed);
        let child = spawn_on(Some(a), || {
            std::process::Command::new("sh")
                .args(["-c", "grep Cpus_allowed_list /proc/self/status"])
                .output()
        });
        let out = child.unwrap().unwrap();
        let list = String::from_utf8_lossy(&out.stdout);
        assert_eq!(list.split_whitespace().last(), Some(a.to_string().as_str()));
        assert_eq!(sched_getaffinity(None).unwrap(), cpus.allowed);
    }
}
