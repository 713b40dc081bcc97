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
    /// whichever way it is told to end.
    pub fn block_with_hangup() -> std::io::Result<TermSignals> {
        Self::block_set(&[libc::SIGINT, libc::SIGTERM, libc::SIGHUP])
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

    #[test]
    fn delivers_sighup_when_asked_to() {
        let s = TermSignals::block_with_hangup().unwrap();
        // SAFETY: sending a signal that is blocked in this thread to this thread.
        unsafe { libc::pthread_kill(libc::pthread_self(), libc::SIGHUP) };
        assert_eq!(s.wait(Duration::from_secs(5)), Some(libc::SIGHUP));
    }
}
