//! Locking a mutex or an rwlock, and waiting on a condition variable,
//! whatever a panicking holder left behind.

use std::sync::{
    Condvar, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard,
    WaitTimeoutResult,
};
use std::time::Duration;

/// Locks `m`, ignoring poison. A thread that panicked while holding the lock
/// has already been reported (its panic), and the data iopath keeps under a
/// mutex stays consistent at every unlock point, so the other users of the
/// process carry on rather than panic in turn.
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Locks `l` for reading, ignoring poison (as [`lock`]).
pub fn read_lock<T: ?Sized>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(PoisonError::into_inner)
}

/// Locks `l` for writing, ignoring poison (as [`lock`]).
pub fn write_lock<T: ?Sized>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(PoisonError::into_inner)
}

/// Waits on `cv` with `guard`'s mutex, ignoring poison (as [`lock`]).
pub fn wait<'a, T>(cv: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    cv.wait(guard).unwrap_or_else(PoisonError::into_inner)
}

/// Waits on `cv` with `guard`'s mutex for at most `limit`, ignoring poison
/// (as [`lock`]).
pub fn wait_timeout<'a, T>(
    cv: &Condvar,
    guard: MutexGuard<'a, T>,
    limit: Duration,
) -> (MutexGuard<'a, T>, WaitTimeoutResult) {
    cv.wait_timeout(guard, limit)
        .unwrap_or_else(PoisonError::into_inner)
}

/// Waits on `cv` with `guard`'s mutex while `condition` holds, for at most
/// `limit`, ignoring poison (as [`lock`]).
pub fn wait_timeout_while<'a, T, F>(
    cv: &Condvar,
    guard: MutexGuard<'a, T>,
    limit: Duration,
    condition: F,
) -> (MutexGuard<'a, T>, WaitTimeoutResult)
where
    F: FnMut(&mut T) -> bool,
{
    cv.wait_timeout_while(guard, limit, condition)
        .unwrap_or_else(PoisonError::into_inner)
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

    #[test]
    fn a_poisoned_rwlock_still_locks_and_a_condvar_still_waits() {
        let l = std::sync::Arc::new(RwLock::new(1));
        let l2 = l.clone();
        let _ = std::thread::spawn(move || {
            let mut g = l2.write().unwrap();
            *g = 2;
            panic!("poison it");
        })
        .join();
        assert!(l.is_poisoned());
        *write_lock(&l) += 1;
        assert_eq!(*read_lock(&l), 3);

        let m = std::sync::Arc::new(Mutex::new(0));
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let _g = m2.lock().unwrap();
            panic!("poison it");
        })
        .join();
        assert!(m.is_poisoned());
        let cv = Condvar::new();
        let (g, t) = wait_timeout(&cv, lock(&m), Duration::from_millis(1));
        assert!(t.timed_out());
        assert_eq!(*g, 0);
        drop(g);
        let (g, t) = wait_timeout_while(&cv, lock(&m), Duration::from_millis(1), |n| *n == 0);
        assert!(t.timed_out());
        assert_eq!(*g, 0);
        drop(g);
        let (g, t) = wait_timeout_while(&cv, lock(&m), Duration::from_secs(60), |n| *n != 0);
        assert!(!t.timed_out(), "a condition already false does not wait");
        assert_eq!(*g, 0);
    }
}
