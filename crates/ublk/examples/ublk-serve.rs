//! Minimal stand-alone ublk server over a snapblk device spec, for the VM tests while
//! `snapblk serve` is assembled: `ublk-serve SPEC [copy|user-copy|zero-copy] [QUEUES] [DEPTH] [ID]`.
//! Prints one JSON readiness line on stdout, serves until SIGINT/SIGTERM.

use snapblk_ublk::{Config, DataPath};

fn main() {
    if let Err(e) = run() {
        eprintln!("ublk-serve: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let a: Vec<String> = std::env::args().collect();
    let spec = a
        .get(1)
        .ok_or("usage: ublk-serve SPEC [MODE] [QUEUES] [DEPTH] [ID]")?;
    let path = match a.get(2).map(String::as_str).unwrap_or("copy") {
        "copy" => DataPath::Copy,
        "user-copy" => DataPath::UserCopy,
        "zero-copy" => DataPath::ZeroCopy,
        m => return Err(format!("unknown mode {m}").into()),
    };
    let queues: u16 = a.get(3).map_or(Ok(1), |s| s.parse())?;
    let depth: u16 = a.get(4).map_or(Ok(64), |s| s.parse())?;
    let id: Option<u32> = a.get(5).map(|s| s.parse()).transpose()?;
    let stop = snapblk_ublk::block_stop_signals()?;
    let dev = snapblk::open(spec, i32::from(queues))?;
    let planner = snapblk_ublk::planner_for(&dev);
    let cfg = Config {
        queues,
        depth,
        path,
        id,
        ..Config::default()
    };
    snapblk_ublk::serve(
        dev,
        &cfg,
        planner,
        |r| {
            println!(
                "{{\"ready\":true,\"dev\":\"{}\",\"id\":{},\"mode\":\"{}\",\"recovered\":{},\"planned_reads\":{}}}",
                r.bdev,
                r.dev_id,
                r.path.name(),
                r.recovered,
                r.planned_reads
            );
        },
        stop,
    )?;
    Ok(())
}
