//! Locking a mutex whatever a panicking holder left behind.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `m`, ignoring poison. A thread that panicked while holding the lock
/// has already been reported (its panic), and the data iopath keeps under a
/// mutex stays consistent at every unlock point, so the other users of the
/// process carry on rather than panic in turn.
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_mutex_still_locks() {
        let m = std::sync::Arc::new(Mutex::new(vec![1]));
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let mut g = m2.lock().unwrap();
            g.push(2);
            panic!("poison it");
        })
        .join();
        assert!(m.is_poisoned());
        lock(&m).push(3);
        assert_eq!(*lock(&m), [1, 2, 3]);
    }
}
