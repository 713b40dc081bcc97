//! Small random-read load generator for the ublk benchmark in the VM (where fio is not available):
//! `ublk-loadgen DEV QD SECONDS [BS]` keeps QD O_DIRECT reads of BS bytes (default 4096) at
//! random aligned offsets in flight through io_uring for SECONDS, then prints one JSON line:
//! I/Os, IOPS, and the CPU time of the whole machine (from /proc/stat, so the ublk server and the
//! kernel are included) and of this process, per I/O.

use io_uring::{IoUring, opcode, types};
use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::time::{Duration, Instant};

fn main() {
    if let Err(e) = run() {
        eprintln!("ublk-loadgen: {e}");
        std::process::exit(1);
    }
}

/// Busy and total jiffies of all CPUs.
fn cpu_jiffies() -> std::io::Result<(u64, u64)> {
    let s = std::fs::read_to_string("/proc/stat")?;
    let line = s.lines().next().unwrap_or_default();
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: u64 = v.iter().take(8).sum();
    // idle + iowait are not busy
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    Ok((total - idle, total))
}

fn self_cpu() -> Duration {
    // SAFETY: getrusage fills a zeroed struct.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let a: Vec<String> = std::env::args().collect();
    if a.len() < 4 {
        return Err("usage: ublk-loadgen DEV QD SECONDS [BS]".into());
    }
    let qd: usize = a[2].parse()?;
    let secs: f64 = a[3].parse()?;
    let bs: usize = a.get(4).map_or(Ok(4096), |s| s.parse())?;
    if qd == 0 || qd > 1024 || bs == 0 || !bs.is_multiple_of(512) {
        return Err("QD must be 1..1024 and BS a multiple of 512".into());
    }
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&a[1])?;
    // A block device's size; the file length for regular files.
    let size = match snapblk_core::sys::blkgetsize64(f.as_raw_fd()) {
        Ok(sz) => sz,
        Err(_) => f.metadata()?.len(),
    };
    let blocks = size / bs as u64;
    if blocks == 0 {
        return Err("device smaller than one block".into());
    }
    let layout = std::alloc::Layout::from_size_align(bs * qd, 4096)?;
    // SAFETY: non-zero size; freed at the end.
    let buf = unsafe { std::alloc::alloc(layout) };
    if buf.is_null() {
        return Err("out of memory".into());
    }
    let mut ring = IoUring::new(qd.next_power_of_two() as u32)?;
    let mut seed = 0x9E37_79B9_7F4A_7C15u64 ^ u64::from(std::process::id());
    let mut next_off = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % blocks) * bs as u64
    };
    let fd = types::Fd(f.as_raw_fd());
    let push = |ring: &mut IoUring, slot: usize, off: u64| {
        // SAFETY: slot < qd, so the buffer range lies inside the allocation.
        let p = unsafe { buf.add(slot * bs) };
        let sqe = opcode::Read::new(fd, p, bs as u32)
            .offset(off)
            .build()
            .user_data(slot as u64);
        // SAFETY: the buffer stays allocated until all reads are reaped below.
        unsafe { ring.submission().push(&sqe) }.map_err(|_| "submission queue full")
    };
    let (b0, t0) = cpu_jiffies()?;
    let c0 = self_cpu();
    let start = Instant::now();
    let stop = start + Duration::from_secs_f64(secs);
    for slot in 0..qd {
        push(&mut ring, slot, next_off())?;
    }
    let mut ios = 0u64;
    let mut errors = 0u64;
    let mut inflight = qd;
    while inflight > 0 {
        ring.submit_and_wait(1)?;
        let done: Vec<(u64, i32)> = ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        let now = Instant::now();
        for (slot, res) in done {
            inflight -= 1;
            if res == bs as i32 {
                ios += 1;
            } else {
                errors += 1;
            }
            if now < stop {
                push(&mut ring, slot as usize, next_off())?;
                inflight += 1;
            }
        }
    }
    let wall = start.elapsed().as_secs_f64();
    let c1 = self_cpu();
    let (b1, t1) = cpu_jiffies()?;
    // SAFETY: allocated above with this layout; no reads in flight.
    unsafe { std::alloc::dealloc(buf, layout) };
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let busy_s = (b1 - b0) as f64 / hz;
    let ncpu = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let per_io = |s: f64| if ios > 0 { s * 1e6 / ios as f64 } else { 0.0 };
    println!(
        "{{\"dev\":\"{}\",\"qd\":{},\"bs\":{},\"ios\":{},\"errors\":{},\"wall_s\":{:.3},\"iops\":{:.0},\"sys_busy_cpu_s\":{:.3},\"sys_cpu_us_per_io\":{:.2},\"self_cpu_us_per_io\":{:.2},\"cpu_util\":{:.3},\"total_jiffies\":{}}}",
        a[1],
        qd,
        bs,
        ios,
        errors,
        wall,
        ios as f64 / wall,
        busy_s,
        per_io(busy_s),
        per_io((c1 - c0).as_secs_f64()),
        busy_s / (wall * ncpu),
        t1 - t0
    );
    if errors > 0 {
        return Err(format!("{errors} reads failed").into());
    }
    Ok(())
}
