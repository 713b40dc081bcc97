//! Lock helpers shared by the crates.

use std::sync::{Mutex, MutexGuard};

/// Lock `m`, taking the guard even if a holder panicked: every mutex in snapblk guards data
/// that stays consistent at each unlock (counters, plain bytes, queues of work), and a panic
/// elsewhere must not make a device or a merge unusable.
#[inline]
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
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
    }
}
