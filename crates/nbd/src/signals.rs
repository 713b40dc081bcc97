//! Termination signals as events: block SIGINT/SIGTERM in every thread (call before spawning
//! any) and wait for them synchronously, so a server can stop cleanly instead of dying mid-I/O.

use std::time::Duration;

/// SIGINT and SIGTERM (and SIGHUP when asked for), blocked for the calling thread and the
/// threads it spawns afterwards.
pub struct TermSignals {
    set: libc::sigset_t,
}

impl TermSignals {
    /// Block SIGINT and SIGTERM in the calling thread (inherited by threads spawned later).
    pub fn block() -> std::io::Result<TermSignals> {
        Self::block_set(&[libc::SIGINT, libc::SIGTERM])
    }

    /// [`TermSignals::block`] plus SIGHUP (a closed terminal), for a command that must clean up
    /// whichever way it is told to end. A signal the process inherited as ignored (SIGHUP
    /// under `nohup`) is left alone: it stays ignored rather than waiting in the set.
    pub fn block_with_hangup() -> std::io::Result<TermSignals> {
        let sigs: Vec<libc::c_int> = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP]
            .into_iter()
            .filter(|&s| !ignored(s))
            .collect();
        Self::block_set(&sigs)
    }

    fn block_set(sigs: &[libc::c_int]) -> std::io::Result<TermSignals> {
        // SAFETY: sigset_t is plain data; sigemptyset initialises it before any other use.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is a valid, exclusively borrowed sigset_t; the signal numbers are valid.
        let r = unsafe {
            libc::sigemptyset(&mut set);
            for &s in sigs {
                libc::sigaddset(&mut set, s);
            }
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut())
        };
        if r != 0 {
            return Err(std::io::Error::from_raw_os_error(r));
        }
        Ok(TermSignals { set })
    }

    /// Wait up to `timeout` for one of the blocked signals; returns the signal number if one arrived.
    pub fn wait(&self, timeout: Duration) -> Option<i32> {
        let ts = libc::timespec {
            tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: `self.set` is an initialised sigset; `ts` is valid for the call; a null
        // siginfo pointer is allowed.
        let r = unsafe { libc::sigtimedwait(&self.set, std::ptr::null_mut(), &ts) };
        (r > 0).then_some(r)
    }
}

/// Whether `sig`'s disposition is SIG_IGN. (Linux keeps a blocked signal pending even when it
/// is ignored, so a blocked set would otherwise take it.)
fn ignored(sig: libc::c_int) -> bool {
    // SAFETY: sigaction is plain data, filled in by the call below.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: a null new action only reads the current one into `old`, a valid, exclusively
    // borrowed sigaction.
    let r = unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) };
    r == 0 && old.sa_sigaction == libc::SIG_IGN
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delivers_sigterm_as_an_event() {
        let s = TermSignals::block().unwrap();
        assert_eq!(s.wait(Duration::from_millis(10)), None);
        // SAFETY: sending a signal that is blocked in this thread to this thread.
        unsafe { libc::pthread_kill(libc::pthread_self(), libc::SIGTERM) };
        assert_eq!(s.wait(Duration::from_secs(5)), Some(libc::SIGTERM));
    }

    /// One test: it changes SIGHUP's disposition for the whole process.
    #[test]
    fn delivers_sighup_when_asked_to_unless_it_is_ignored() {
        let member = |t: &TermSignals, sig| {
            // SAFETY: `t.set` is an initialised sigset.
            unsafe { libc::sigismember(&t.set, sig) == 1 }
        };
        // SAFETY: setting a disposition; nothing in this test binary handles SIGHUP.
        unsafe { libc::signal(libc::SIGHUP, libc::SIG_IGN) };
        let s = TermSignals::block_with_hangup().unwrap();
        // SAFETY: as above, back to the default.
        unsafe { libc::signal(libc::SIGHUP, libc::SIG_DFL) };
        assert!(member(&s, libc::SIGTERM) && !member(&s, libc::SIGHUP));
        let s = TermSignals::block_with_hangup().unwrap();
        assert!(member(&s, libc::SIGHUP));
        // SAFETY: sending a signal that is blocked in this thread to this thread.
        unsafe { libc::pthread_kill(libc::pthread_self(), libc::SIGHUP) };
        assert_eq!(s.wait(Duration::from_secs(5)), Some(libc::SIGHUP));
    }
}
