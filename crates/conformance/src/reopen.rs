//! Checks that need fresh instances of the target, not the one the suite runs on: the caller
//! gives a way to open it again ([`drop_unreaped`]).

use crate::Outcome;
use snapblk_core::{Blkio, Completion, Op, ReqFlags, Request};

/// Reads submitted on each instance and never reaped.
const REQUESTS: usize = 8;
/// Instances opened and dropped before the file descriptors are first counted (a library may
/// open some once per process, on its first use).
const WARM_UP: usize = 3;

/// Open the target `rounds` times (after a few warm-up opens); each time start one queue, submit
/// reads without reaping their completions, and drop the instance, as a caller closing a
/// device with I/O done but not collected does (QEMU on shutdown). The process's open file
/// descriptors must not grow: a driver that leaks a queue's completion list, its eventfds or
/// its ring on that path fails. `open` gives a connected (not started) instance.
pub fn drop_unreaped(
    open: &mut dyn FnMut() -> Result<Blkio, snapblk_core::Error>,
    rounds: usize,
) -> Outcome {
    let mut cycle = || -> Result<(), String> {
        let mut b = open().map_err(|e| format!("open: {e}"))?;
        one_drop(&mut b)
    };
    for _ in 0..WARM_UP {
        if let Err(e) = cycle() {
            return Outcome::Fail(e);
        }
    }
    // A driver may let go of some files just after its drop (a remote driver's worker ending
    // a request and closing its connection): the fewest of a few counts, and after the
    // rounds, counts for up to 5 s until they are back within the slack. A leak never is.
    let settled = |limit: Option<usize>| -> std::io::Result<usize> {
        let mut least = open_fds()?;
        for _ in 0..100 {
            if limit.is_some_and(|l| least <= l) {
                break;
            }
            if limit.is_none() && least == open_fds()? {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
            least = least.min(open_fds()?);
        }
        Ok(least)
    };
    let before = match settled(None) {
        Ok(n) => n,
        Err(e) => return Outcome::Skip(format!("cannot count open files: {e}")),
    };
    for _ in 0..rounds {
        if let Err(e) = cycle() {
            return Outcome::Fail(e);
        }
    }
    // One descriptor of slack per ten rounds for a library's lazily opened files; a leak of
    // even one descriptor per instance is ten times that.
    let slack = before + rounds / 10;
    let after = match settled(Some(slack)) {
        Ok(n) => n,
        Err(e) => return Outcome::Skip(format!("cannot count open files: {e}")),
    };
    if after > slack {
        return Outcome::Fail(format!(
            "open file descriptors grew from {before} to {after} over {rounds} instances \
             dropped with {REQUESTS} unreaped reads each"
        ));
    }
    Outcome::Pass(format!(
        "{rounds} instances dropped with {REQUESTS} unreaped reads each; open files {before} → {after}"
    ))
}

/// Start one queue of `b`, submit [`REQUESTS`] reads into a mapped region, reap none, drop `b`.
fn one_drop(b: &mut Blkio) -> Result<(), String> {
    b.set_int("num-queues", 1)
        .map_err(|e| format!("num-queues=1: {e}"))?;
    b.start().map_err(|e| format!("start: {e}"))?;
    let bs = b
        .get_int("request-alignment")
        .map_err(|e| format!("request-alignment: {e}"))?
        .max(512) as usize;
    let align = b
        .get_u64("mem-region-alignment")
        .map_err(|e| format!("mem-region-alignment: {e}"))?
        .max(1) as usize;
    let cap = b
        .get_u64("capacity")
        .map_err(|e| format!("capacity: {e}"))?;
    let len = (REQUESTS * bs).div_ceil(align) * align;
    let region = b
        .alloc_mem_region(len)
        .map_err(|e| format!("alloc_mem_region: {e}"))?;
    b.map_mem_region(&region)
        .map_err(|e| format!("map_mem_region: {e}"))?;
    let blocks = (cap / bs as u64).max(1);
    let q = b.queue(0, false).ok_or("the instance has no queue 0")?;
    for i in 0..REQUESTS {
        let req = Request::new(
            Op::Read {
                offset: (i as u64 % blocks) * bs as u64,
                buf: (region.addr as usize + i * bs) as *mut u8,
                len: bs,
            },
            i,
            ReqFlags::NONE,
        );
        // SAFETY: block-sized slices of a region mapped to `b`; the region is freed by `b`'s
        // drop after its queues, which wait for requests still in flight.
        unsafe { q.enqueue(req) };
    }
    // Submit, reap nothing.
    let mut none: [Completion; 0] = [];
    q.do_io(&mut none, 0, None, None)
        .map_err(|e| format!("do_io: {e}"))?;
    Ok(())
}

fn open_fds() -> std::io::Result<usize> {
    Ok(std::fs::read_dir("/proc/self/fd")?.count())
}
