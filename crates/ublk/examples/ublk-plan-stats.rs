//! What the zero-copy planner makes of random reads of a snapshot, counted on the host (no ublk
//! needed): for `N` reads of `LEN` bytes at random `LEN`-aligned offsets, how many segments each
//! plan has, of which kind, and how many bytes go through the device path; then, by `MODE`,
//! one measured phase to run under callgrind (`--toggle-collect='*measure*'`):
//! `plan` plans every read again, `device` reads every device-planned range through the snapshot
//! device (what the generic path of the server executes for it), `file` reads every other range
//! through the device (what copy mode would pay for it), `none` measures nothing.
//!
//! With a sixth argument `record`, the COW record beside the COW is checked as `serve` does by
//! default, and the whole device is read once through the device first (every block checked,
//! as after the benchmark's warm-up pass), so the phase measures what the record still costs.
//!
//! `cargo run --release -p snapblk-ublk --example ublk-plan-stats -- BASE COW [N] [LEN] [MODE]
//! [record]`

use snapblk_core::QueueExt;
use snapblk_ublk::{ReadPlanner, Segment, SnapshotPlanner};
use std::path::Path;

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() < 3 {
        eprintln!("usage: ublk-plan-stats BASE COW [N] [LEN] [plan|device|file|none] [record]");
        std::process::exit(2);
    }
    let (base, cow) = (Path::new(&a[1]), Path::new(&a[2]));
    let n: usize = a.get(3).and_then(|s| s.parse().ok()).unwrap_or(20_000);
    let len: u32 = a.get(4).and_then(|s| s.parse().ok()).unwrap_or(4096);
    let mode = a.get(5).map_or("none", String::as_str);
    // Without `record`, as `serve --no-record` plans (a record only delays planning until a
    // block is checked).
    let record = a.get(6).is_some_and(|s| s == "record");
    let spec = format!(
        "snapshot:base={},cow={},verify={record},read-only=true",
        base.display(),
        cow.display()
    );
    let mut dev = snapblk::open(&spec, 1).expect("snapshot device");
    let p = SnapshotPlanner::open_with(base, cow, record, None).expect("planner");
    let cap = dev.get_u64("capacity").expect("capacity");
    if record {
        let mut buf = vec![0u8; 1 << 20];
        let q = dev.queue(0, false).expect("queue");
        let mut o = 0;
        while o < cap {
            let l = (cap - o).min(buf.len() as u64) as usize;
            q.read_at(o, &mut buf[..l]).expect("checking read");
            o += l as u64;
        }
    }
    let slots = cap / u64::from(len);
    // Deterministic offsets (an LCG), the same in every mode.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let offs: Vec<u64> = (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((x >> 33) % slots) * u64::from(len)
        })
        .collect();
    let (mut file, mut zero, mut device, mut dev_bytes) = (0u64, 0u64, 0u64, 0u64);
    let mut hist = std::collections::BTreeMap::<usize, u64>::new();
    let mut merged_away = 0u64;
    let mut dev_offs = Vec::new();
    let mut file_offs = Vec::new();
    let mut plan = Vec::new();
    for &o in &offs {
        plan.clear();
        p.plan(o, len, &mut plan).expect("plan");
        *hist.entry(plan.len()).or_default() += 1;
        let mut any_dev = false;
        for (i, s) in plan.iter().enumerate() {
            match *s {
                Segment::File {
                    file: f,
                    offset,
                    len: l,
                } => {
                    file += 1;
                    // Would coalesce with the previous segment (same file, contiguous).
                    if let Some(Segment::File {
                        file: pf,
                        offset: po,
                        len: pl,
                    }) = i.checked_sub(1).map(|j| plan[j])
                        && pf == f
                        && po + u64::from(pl) == offset
                    {
                        merged_away += 1;
                    }
                    let _ = l;
                }
                Segment::Zero { .. } => zero += 1,
                Segment::Device { len: l, .. } => {
                    device += 1;
                    dev_bytes += u64::from(l);
                    any_dev = true;
                }
            }
        }
        if any_dev {
            dev_offs.push(o);
        } else {
            file_offs.push(o);
        }
    }
    println!(
        "{n} reads of {len} B: segments per plan {hist:?}; file {file}, zero {zero}, device {device} \
         ({:.1} % of the reads touch the device, {dev_bytes} bytes); adjacent file segments that \
         would coalesce: {merged_away}",
        100.0 * dev_offs.len() as f64 / n as f64
    );
    let count = measure(&p, &mut dev, mode, len, &offs, &dev_offs, &file_offs);
    println!("mode {mode}: {count} operations measured");
}

/// The measured phase (the only function callgrind collects with `--toggle-collect`).
#[inline(never)]
fn measure(
    p: &SnapshotPlanner,
    dev: &mut snapblk_core::Blkio,
    mode: &str,
    len: u32,
    offs: &[u64],
    dev_offs: &[u64],
    file_offs: &[u64],
) -> usize {
    let mut buf = vec![0u8; len as usize];
    let q = dev.queue(0, false).expect("queue");
    let mut plan = Vec::new();
    let mut read = |list: &[u64]| {
        for &o in list {
            q.read_at(o, &mut buf).expect("device read");
        }
        list.len()
    };
    match mode {
        "plan" => {
            for &o in offs {
                plan.clear();
                p.plan(o, len, &mut plan).expect("plan");
            }
            offs.len()
        }
        "device" => read(dev_offs),
        "file" => read(file_offs),
        _ => 0,
    }
}
