//! Lock helpers shared by the crates.

use std::sync::{Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Lock `m`, taking the guard even if a holder panicked: every mutex in snapblk guards data
/// that stays consistent at each unlock (counters, plain bytes, queues of work), and a panic
/// elsewhere must not make a device or a merge unusable.
#[inline]
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// [`RwLock::read`] that takes the guard even if a writer panicked (see [`lock`]).
#[inline]
pub fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|p| p.into_inner())
}

/// [`RwLock::write`] that takes the guard even if a holder panicked (see [`lock`]).
#[inline]
pub fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|p| p.into_inner())
}

/// [`Condvar::wait`] that takes the guard back even if a holder panicked (see [`lock`]).
#[inline]
pub fn wait<'a, T>(cv: &Condvar, g: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    cv.wait(g).unwrap_or_else(|p| p.into_inner())
}

/// [`Mutex::into_inner`] that takes the value even if a holder panicked (see [`lock`]).
#[inline]
pub fn into_inner<T>(m: Mutex<T>) -> T {
    m.into_inner().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_mutex_still_locks() {
        let m = std::sync::Arc::new(Mutex::new(1));
        let m2 = m.clone();
        let r = std::thread::spawn(move || {
            let _g = m2.lock().unwrap();
            panic!("poison it");
        })
        .join();
        assert!(r.is_err());
        assert!(m.is_poisoned());
        *lock(&m) += 1;
        assert_eq!(*lock(&m), 2);
        let m = std::sync::Arc::into_inner(m).unwrap();
        assert_eq!(into_inner(m), 2);
    }

    #[test]
    fn a_poisoned_rwlock_still_reads_and_writes() {
        let l = std::sync::Arc::new(RwLock::new(1));
        let l2 = l.clone();
        let r = std::thread::spawn(move || {
            let _g = l2.write().unwrap();
            panic!("poison it");
        })
        .join();
        assert!(r.is_err());
        assert!(l.is_poisoned());
        *write(&l) += 1;
        assert_eq!(*read(&l), 2);
    }

    #[test]
    fn wait_returns_the_guard() {
        let pair = std::sync::Arc::new((Mutex::new(false), Condvar::new()));
        let p2 = pair.clone();
        let t = std::thread::spawn(move || {
            *lock(&p2.0) = true;
            p2.1.notify_all();
        });
        let mut g = lock(&pair.0);
        while !*g {
            g = wait(&pair.1, g);
        }
        drop(g);
        t.join().unwrap();
    }
}
