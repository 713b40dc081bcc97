//! Termination signals as events: block SIGINT/SIGTERM in every thread (call before spawning
//! any) and wait for them synchronously, so a server can stop cleanly instead of dying mid-I/O.

use std::time::Duration;

/// SIGINT and SIGTERM, blocked for the calling thread and the threads it spawns afterwards.
pub struct TermSignals {
    set: libc::sigset_t,
}

impl TermSignals {
    /// Block SIGINT and SIGTERM in the calling thread (inherited by threads spawned later).
    pub fn block() -> std::io::Result<TermSignals> {
        // SAFETY: sigset_t is plain data; sigemptyset initialises it before any other use.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is a valid, exclusively borrowed sigset_t; the signal numbers are valid.
        let r = unsafe {
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGINT);
            libc::sigaddset(&mut set, libc::SIGTERM);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut())
        };
        if r != 0 {
            return Err(std::io::Error::from_raw_os_error(r));
        }
        Ok(TermSignals { set })
    }

    /// Wait up to `timeout` for SIGINT/SIGTERM; returns the signal number if one arrived.
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
}
