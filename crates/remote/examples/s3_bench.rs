//! The measurements of bench/s3-bench.sh: sequential throughput and 4 KiB random-read latency
//! of a [`RemoteObject`] through its block cache, cold (a fresh object) and warm (the same
//! reads again). Usage: `s3_bench URL [READS]`; configuration from the AWS environment.
//! Prints one `name value unit` line per figure.

use snapblk_core::ReadAt;
use snapblk_core::rng::Rng;
use snapblk_remote::{RemoteConfig, RemoteObject};
use std::time::Instant;

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).copied().unwrap_or(0.0)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args.next().ok_or("usage: s3_bench URL [READS]")?;
    let reads: usize = args.next().map_or(Ok(2000), |s| s.parse())?;
    let base = RemoteConfig::from_env()?;
    let open = |cache: u64| {
        RemoteObject::open(
            &url,
            &RemoteConfig {
                cache_bytes: cache,
                ..base.clone()
            },
        )
    };
    // Sequential: 1 MiB reads of the whole object, cache large enough to hold it.
    let probe = open(0)?;
    let size = probe.len();
    // BENCH_READAHEAD overrides the readahead (blocks past a sequential read).
    let ra = std::env::var("BENCH_READAHEAD").map_or(Ok(base.readahead_blocks), |s| s.parse())?;
    let o = RemoteObject::open(
        &url,
        &RemoteConfig {
            cache_bytes: size + (1 << 20),
            readahead_blocks: ra,
            ..base.clone()
        },
    )?;
    println!("seq_readahead {ra} blocks of {} bytes", base.block_size);
    let mut buf = vec![0u8; 1 << 20];
    for pass in ["cold", "warm"] {
        let t = Instant::now();
        let mut off = 0;
        while off < size {
            let n = o.read_at(off, &mut buf)?;
            off += n as u64;
        }
        let secs = t.elapsed().as_secs_f64();
        println!(
            "seq_{pass} {:.1} MiB/s",
            size as f64 / secs / (1 << 20) as f64
        );
    }
    println!("seq_requests {} GETs", o.stats().requests);
    // Random 4 KiB reads at 4 KiB-aligned offsets: a fresh object, then the same offsets again.
    // Block sizes of the random reads (BENCH_RAND_BLOCKS, default 4 KiB, where a miss fetches
    // only what it reads, and the default 256 KiB).
    let blocks = std::env::var("BENCH_RAND_BLOCKS").unwrap_or_else(|_| "4096,262144".into());
    for block in blocks.split(',') {
        let block: u64 = block.trim().parse()?;
        let o = RemoteObject::open(
            &url,
            &RemoteConfig {
                cache_bytes: size + (1 << 20),
                block_size: block,
                readahead_blocks: 0,
                ..base.clone()
            },
        )?;
        println!("rand_block_size {block} bytes");
        let mut r = Rng::new(42);
        let offs: Vec<u64> = (0..reads)
            .map(|_| r.next_u64() % (size / 4096) * 4096)
            .collect();
        let mut b = [0u8; 4096];
        let report = |name: &str, lat: &mut Vec<f64>| {
            if lat.is_empty() {
                return;
            }
            let mean = lat.iter().sum::<f64>() / lat.len() as f64;
            lat.sort_by(f64::total_cmp);
            println!("{name}_n {} reads", lat.len());
            println!("{name}_mean {mean:.1} us");
            println!("{name}_p50 {:.1} us", percentile(lat, 0.5));
            println!("{name}_p99 {:.1} us", percentile(lat, 0.99));
        };
        for pass in ["cold", "warm"] {
            // Cold reads split into those that fetched (a miss: one ranged GET) and cache hits.
            let (mut miss, mut hit) = (Vec::new(), Vec::new());
            for &off in &offs {
                let before = o.stats().requests;
                let t = Instant::now();
                o.read_exact_at(off, &mut b)?;
                let us = t.elapsed().as_secs_f64() * 1e6;
                if o.stats().requests > before {
                    miss.push(us);
                } else {
                    hit.push(us);
                }
            }
            report(&format!("rand4k_{block}_{pass}_miss"), &mut miss);
            report(&format!("rand4k_{block}_{pass}_hit"), &mut hit);
        }
        let s = o.stats();
        println!(
            "rand_{block}_stats {} GETs, {} bytes fetched, {} hits, {} misses",
            s.requests, s.bytes_fetched, s.hits, s.misses
        );
    }
    Ok(())
}
