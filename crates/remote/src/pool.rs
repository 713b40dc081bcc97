//! The worker pool of one `s3` / `http` device: at most `max` threads, started when work
//! arrives and no thread is free, taking tasks in submission order; a thread idle for
//! [`IDLE_EXIT`] exits, so a device that is open but unread holds no threads. Dropping the pool
//! (the device and all its queues gone) tells the threads to stop: an idle one exits at once, a
//! busy one after its task, which by then only finds its queue gone (no buffer is touched, no
//! HTTP attempt is retried).

use snapblk_core::sync::lock;
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

/// How long a worker waits for a task before it exits.
pub(crate) const IDLE_EXIT: Duration = Duration::from_secs(30);

/// A unit of work.
pub(crate) type Task = Box<dyn FnOnce() + Send>;

struct State {
    tasks: VecDeque<Task>,
    /// Threads running (busy or idle).
    threads: usize,
    /// Threads waiting for a task.
    idle: usize,
    stop: bool,
}

struct Inner {
    state: Mutex<State>,
    cv: Condvar,
    max: usize,
    idle_exit: Duration,
}

/// A bounded pool of threads.
pub(crate) struct Pool {
    inner: Arc<Inner>,
}

impl Pool {
    /// A pool of at most `max` threads (at least one); none is started yet.
    pub(crate) fn new(max: usize) -> Pool {
        Pool::with_idle_exit(max, IDLE_EXIT)
    }

    /// [`Pool::new`] whose threads exit after `idle_exit` without a task.
    pub(crate) fn with_idle_exit(max: usize, idle_exit: Duration) -> Pool {
        Pool {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    tasks: VecDeque::new(),
                    threads: 0,
                    idle: 0,
                    stop: false,
                }),
                cv: Condvar::new(),
                max: max.max(1),
                idle_exit,
            }),
        }
    }

    /// Run `task` on a pool thread, starting one if every thread is busy and the pool is not
    /// full. When no thread exists and none can be started, the task runs here, now.
    pub(crate) fn submit(&self, task: Task) {
        let mut s = lock(&self.inner.state);
        s.tasks.push_back(task);
        if s.idle >= s.tasks.len() || s.threads >= self.inner.max {
            drop(s);
            self.inner.cv.notify_one();
            return;
        }
        let inner = self.inner.clone();
        let started = std::thread::Builder::new()
            .name("snapblk-remote".into())
            .spawn(move || work(&inner));
        match started {
            Ok(_) => s.threads += 1,
            Err(e) => {
                log::warn!("s3/http driver: cannot start a worker thread: {e}");
                if s.threads == 0 {
                    let task = s.tasks.pop_back();
                    drop(s);
                    if let Some(t) = task {
                        t();
                    }
                    return;
                }
            }
        }
        drop(s);
        self.inner.cv.notify_one();
    }

    /// What tests watch of the pool after it is dropped.
    #[cfg(test)]
    pub(crate) fn watch(&self) -> PoolWatch {
        PoolWatch(self.inner.clone())
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let tasks = {
            let mut s = lock(&self.inner.state);
            s.stop = true;
            std::mem::take(&mut s.tasks)
        };
        // Tasks left over belong to queues that are gone (each queue holds the pool).
        drop(tasks);
        self.inner.cv.notify_all();
    }
}

/// One thread's loop: run tasks until the pool stops or none comes for `idle_exit`.
fn work(inner: &Inner) {
    loop {
        let task = {
            let mut s = lock(&inner.state);
            loop {
                if let Some(t) = s.tasks.pop_front() {
                    break Some(t);
                }
                if s.stop {
                    s.threads -= 1;
                    break None;
                }
                s.idle += 1;
                let (g, t) = inner
                    .cv
                    .wait_timeout(s, inner.idle_exit)
                    .unwrap_or_else(PoisonError::into_inner);
                s = g;
                s.idle -= 1;
                if t.timed_out() && s.tasks.is_empty() {
                    // A task submitted later starts a thread again (`threads` is below max).
                    s.threads -= 1;
                    break None;
                }
            }
        };
        match task {
            Some(t) => t(),
            None => return,
        }
    }
}

/// A view of a pool's thread count that outlives the pool.
#[cfg(test)]
pub(crate) struct PoolWatch(Arc<Inner>);

#[cfg(test)]
impl PoolWatch {
    /// Threads still running.
    pub(crate) fn threads(&self) -> usize {
        lock(&self.0.state).threads
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use snapblk_core::sync::wait;
    use std::sync::mpsc;

    #[test]
    fn runs_every_task_on_at_most_max_threads_and_stops_when_dropped() {
        let pool = Pool::new(3);
        let watch = pool.watch();
        let (tx, rx) = mpsc::channel();
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        for i in 0..10 {
            let (tx, gate) = (tx.clone(), gate.clone());
            pool.submit(Box::new(move || {
                let mut open = lock(&gate.0);
                while !*open {
                    open = wait(&gate.1, open);
                }
                tx.send(i).unwrap();
            }));
        }
        assert_eq!(
            watch.threads(),
            3,
            "the pool starts no more than max threads"
        );
        *lock(&gate.0) = true;
        gate.1.notify_all();
        let mut got: Vec<i32> = (0..10).map(|_| rx.recv().unwrap()).collect();
        got.sort();
        assert_eq!(got, (0..10).collect::<Vec<_>>());
        drop(pool);
        while watch.threads() > 0 {
            std::thread::yield_now();
        }
    }

    #[test]
    fn idle_threads_exit_and_new_work_starts_one_again() {
        let pool = Pool::with_idle_exit(2, Duration::from_millis(20));
        let watch = pool.watch();
        let (tx, rx) = mpsc::channel();
        for i in 0..2 {
            let tx = tx.clone();
            pool.submit(Box::new(move || tx.send(i).unwrap()));
        }
        let mut got: Vec<i32> = (0..2).map(|_| rx.recv().unwrap()).collect();
        got.sort();
        assert_eq!(got, [0, 1]);
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while watch.threads() > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "idle threads never exited"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        pool.submit(Box::new(move || tx.send(7).unwrap()));
        assert_eq!(
            rx.recv().unwrap(),
            7,
            "a task after the threads exited still runs"
        );
    }
}
