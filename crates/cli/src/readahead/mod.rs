//! `snapblk residency` and `snapblk readahead {record,replay,warm,evict}`: a thin layer over
//! snapblk-readahead. [`args`] holds the arguments and their parsers, [`mod@print`] the human and
//! JSON output; this module runs the commands (and `--background`).

mod args;
mod print;

pub use args::{ReadaheadCmd, ResidencyArgs};

use crate::progress::Progress;
use anyhow::{Context, bail};
use args::{EvictArgs, ListFormat, LockArgs, RecordArgs, ReplayArgs, ReplayOpts};
use print::{BAR_WIDTH, backoff_message, print_walk_errors, report_replay};
use snapblk_readahead::{self as ra, BackOff, Limits, ListEntry, Trigger, WalkError, WalkOptions};
use std::io::{IsTerminal, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub fn run_residency(a: ResidencyArgs) -> anyhow::Result<()> {
    let t0 = Instant::now();
    let bars = !a.json && !a.summary && (a.verbose || std::io::stdout().is_terminal());
    let spin = Progress::spinner("measuring residency");
    let rep = ra::scan(
        &a.walk.paths,
        &a.walk.walk_opts(a.threads),
        if bars { BAR_WIDTH as u64 } else { 0 },
    );
    spin.finish();
    let elapsed = t0.elapsed().as_secs_f64();
    print::residency(&rep, a.json, a.summary, bars, elapsed)?;
    fail_on_walk_errors(&rep.errors)
}

pub fn run(c: ReadaheadCmd) -> anyhow::Result<()> {
    match c {
        ReadaheadCmd::Record(a) => run_record(a),
        ReadaheadCmd::Replay(a) => {
            if a.opts.background && std::env::var_os(CHILD_ENV).is_none() {
                return spawn_replay_background(&a);
            }
            let entries = read_list(&a.list)?;
            run_replay(entries, &a.opts)
        }
        ReadaheadCmd::Warm(a) => {
            if a.opts.background && std::env::var_os(CHILD_ENV).is_none() {
                return spawn_background(&a.opts, None);
            }
            // The walk feeds the submitters directly (no list to build and sort first), so the
            // first requests go out with the first files found.
            let w = a.walk.walk_opts(None);
            let opts = a.opts.options();
            let bar = Progress::counter("warm", "files");
            let progress = |d: u64, _t: u64| bar.set(d);
            let watch = |b: BackOff| bar.message(backoff_message("warm", b));
            let watch = bar.visible().then_some(&watch as ra::BackOffWatch<'_>);
            let (rep, errors) =
                ra::warm_tree_watched(&a.walk.paths, &w, &opts, Some(&progress), watch);
            bar.finish();
            print_walk_errors(&errors)?;
            report_replay(&rep, &a.opts, &errors)?;
            fail_on_walk_errors(&errors)?;
            match rep.entries_failed {
                0 => Ok(()),
                1 => bail!("1 file could not be read"),
                n => bail!("{n} files could not be read"),
            }
        }
        ReadaheadCmd::Evict(a) => run_evict(a),
        ReadaheadCmd::Lock(a) => {
            if a.daemon && std::env::var_os(CHILD_ENV).is_none() {
                return spawn_lock_daemon();
            }
            run_lock(&a)
        }
    }
}

/// The line the process holding a lock prints once every page is locked (the daemon's parent
/// waits for it).
const LOCKED: &str = "locked";

/// `readahead lock`: lock, say so, hold until SIGTERM/SIGINT, then unlock and exit 0.
fn run_lock(a: &LockArgs) -> anyhow::Result<()> {
    // Before the walk starts its threads: the signals are then only taken by the wait below.
    let sigs = snapblk_nbd::TermSignals::block().context("blocking SIGINT/SIGTERM")?;
    if let Some(p) = &a.pid_file {
        // The same file as a locked path (an empty one, or one of digits, passes the check
        // below) would be replaced by the pid, then removed at exit.
        let paths: Vec<(&str, &Path)> =
            a.walk.paths.iter().map(|q| ("PATH", q.as_path())).collect();
        crate::outfile::refuse_alias("--pid-file", p, &paths)?;
        refuse_non_pid_file(p)?;
    }
    let locked = ra::lock(&a.walk.paths, &a.walk.walk_opts(None), a.mlockall)?;
    print_walk_errors(&locked.errors)?;
    match locked.errors.len() {
        0 => {}
        1 => bail!("1 path could not be locked"),
        n => bail!("{n} paths could not be locked"),
    }
    let pid_line = format!("{}\n", std::process::id());
    if let Some(p) = &a.pid_file {
        let f = crate::outfile::AtomicFile::create(p)
            .with_context(|| format!("--pid-file {}", p.display()))?;
        f.file()
            .write_all(pid_line.as_bytes())
            .with_context(|| format!("--pid-file {}", p.display()))?;
        f.commit()
            .with_context(|| format!("--pid-file {}", p.display()))?;
    }
    outln!(
        "{LOCKED} {} files, {} (pid {}); SIGTERM or SIGINT unlocks",
        locked.files,
        crate::human::bytes(locked.bytes),
        std::process::id()
    )?;
    while sigs.wait(Duration::from_secs(3600)).is_none() {}
    drop(locked);
    // Only our own pid file: another holder may have replaced it since.
    if let Some(p) = &a.pid_file
        && std::fs::read(p).is_ok_and(|b| b == pid_line.as_bytes())
    {
        let _ = std::fs::remove_file(p);
    }
    Ok(())
}

/// Refuse a `--pid-file` that exists and holds anything but a pid (or nothing): it would be
/// overwritten, then removed at exit.
fn refuse_non_pid_file(p: &Path) -> anyhow::Result<()> {
    let m = match std::fs::metadata(p) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        r => r.with_context(|| format!("--pid-file {}", p.display()))?,
    };
    let is_pid = m.is_file()
        && m.len() <= 32
        && std::fs::read(p).is_ok_and(|b| b.trim_ascii().iter().all(u8::is_ascii_digit));
    if !is_pid {
        bail!(
            "--pid-file {} exists and is not a pid file; refusing to overwrite it",
            p.display()
        );
    }
    Ok(())
}

/// `readahead lock --daemon`: start the holder detached and return once it has locked
/// everything (its first line), or fail with its error.
fn spawn_lock_daemon() -> anyhow::Result<()> {
    use std::io::BufRead;
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe()?;
    let mut child = std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env(CHILD_ENV, "1")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .spawn()
        .context("cannot start the lock daemon")?;
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        std::io::BufReader::new(out).read_line(&mut line)?;
    }
    if line.starts_with(LOCKED) {
        out!("{line}")?;
        return Ok(());
    }
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        use std::io::Read;
        e.read_to_string(&mut err)?;
    }
    let _ = child.wait();
    // The child's own "snapblk: ..." line says why; pass it on without the prefix.
    let why = err
        .lines()
        .last()
        .unwrap_or("")
        .trim_start_matches("snapblk: ");
    for l in err.lines().filter(|l| !l.starts_with("snapblk: ")) {
        errln!("{l}")?;
    }
    bail!("the lock daemon stopped: {why}")
}

fn read_list(p: &PathBuf) -> anyhow::Result<Vec<ListEntry>> {
    // The background child of `replay - --background` reads the copy of stdin its parent made,
    // and deletes it once parsed.
    if p.as_os_str() == "-"
        && std::env::var_os(CHILD_ENV).is_some()
        && let Some(copy) = std::env::var_os(STDIN_COPY_ENV)
    {
        let copy = PathBuf::from(copy);
        let r = std::fs::File::open(&copy)
            .map(std::io::BufReader::new)
            .with_context(|| format!("stdin copy {}", copy.display()));
        let _ = std::fs::remove_file(&copy);
        return ra::parse_reader(r?, Limits::default()).context("-");
    }
    let r: Box<dyn std::io::BufRead> = if p.as_os_str() == "-" {
        Box::new(std::io::BufReader::new(std::io::stdin()))
    } else {
        Box::new(std::io::BufReader::new(
            std::fs::File::open(p).with_context(|| format!("{}", p.display()))?,
        ))
    };
    ra::parse_reader(r, Limits::default()).with_context(|| format!("{}", p.display()))
}

/// The temporary file a list is written to before it is renamed to `output`: same directory,
/// the whole file name (list.txt and list.jsonl must not share one) plus the pid.
fn list_temp_path(output: &Path) -> anyhow::Result<PathBuf> {
    let Some(name) = output.file_name() else {
        bail!(
            "cannot write the list {}: not a file name",
            output.display()
        );
    };
    if output.is_dir() {
        bail!("cannot write the list {}: Is a directory", output.display());
    }
    let mut tmp_name = name.to_os_string();
    tmp_name.push(format!(".{}.tmp~", std::process::id()));
    Ok(output.with_file_name(tmp_name))
}

/// Fails now, before anything is evicted or recorded, if the list could not be written: the
/// temporary file is created and removed again (before the first snapshot, so it is not seen
/// as a file written during the recording). Errors name the output path, not the temporary.
fn check_list_writable(output: &Path) -> anyhow::Result<()> {
    let tmp = list_temp_path(output)?;
    refuse_non_list(output)?;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .with_context(|| format!("cannot write the list {}", output.display()))?;
    let _ = std::fs::remove_file(&tmp);
    Ok(())
}

/// Refuse an `-o` that exists and is not a readahead list (empty, or a text list's header, or
/// a JSON Lines list's first entry): a mistyped `-o disk.img` would replace the image.
fn refuse_non_list(output: &Path) -> anyhow::Result<()> {
    use std::io::Read;
    let f = match std::fs::File::open(output) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        r => r.with_context(|| format!("cannot write the list {}", output.display()))?,
    };
    let mut head = Vec::with_capacity(64);
    f.take(64)
        .read_to_end(&mut head)
        .with_context(|| format!("cannot write the list {}", output.display()))?;
    let is_list = head.is_empty()
        || head.starts_with(b"# snapblk-readahead-list ")
        || head.starts_with(b"{\"path\":");
    if !is_list {
        bail!(
            "-o {} exists and is not a readahead list; refusing to overwrite it (remove it first or choose another name)",
            output.display()
        );
    }
    Ok(())
}

/// Writes the list atomically (temporary file, then rename), so a replay never sees a
/// half-written list; on failure the temporary file is removed and the error names `output`.
fn write_list(output: &Path, entries: &[ListEntry], jsonl: bool) -> anyhow::Result<()> {
    let tmp = list_temp_path(output)?;
    let written = (|| -> std::io::Result<()> {
        // A new file, never one found at that name: a link planted there since the check
        // would have its target truncated and then named as the list.
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        let mut w = std::io::BufWriter::new(f);
        if jsonl {
            ra::write_jsonl(&mut w, entries)?;
        } else {
            ra::write_text(&mut w, entries)?;
        }
        w.flush()?;
        std::fs::rename(&tmp, output)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.with_context(|| format!("cannot write the list {}", output.display()))
}

fn run_record(a: RecordArgs) -> anyhow::Result<()> {
    check_list_writable(&a.output)?;
    let scopes = record_scopes(&a)?;
    let w = WalkOptions {
        recursive: true,
        ..Default::default()
    };
    let mut cmd;
    let trigger = match (a.duration, a.cmd.split_first()) {
        // Bounded by parse_duration, so the conversion cannot panic.
        (Some(d), _) => Trigger::Duration(Duration::from_secs_f64(d)),
        (None, Some((prog, args))) => {
            cmd = record_command(prog, args, a.json)?;
            Trigger::Command(&mut cmd)
        }
        (None, None) => bail!("give a command (after --) or --duration SECS"),
    };
    // Say what record is doing in each phase: evicting and scanning a large scope take
    // seconds. While a command runs, its own output has the terminal (nothing drawn over it);
    // a time window shows that it is recording.
    let is_cmd = matches!(trigger, Trigger::Command(_));
    let spin = std::cell::RefCell::new(Progress::spinner_hidden());
    let mut on_phase = |ph: ra::RecordPhase| {
        let mut s = spin.borrow_mut();
        s.finish();
        *s = match ph {
            ra::RecordPhase::Evicting => Progress::spinner("record: evicting the scope's pages"),
            ra::RecordPhase::ScanningBefore => {
                Progress::spinner("record: scanning what is cached before")
            }
            ra::RecordPhase::Window if is_cmd => Progress::spinner_hidden(),
            ra::RecordPhase::Window => Progress::spinner("recording (the time window)"),
            ra::RecordPhase::ScanningAfter => {
                Progress::spinner("record: scanning what was read during the window")
            }
        };
    };
    let rec = ra::record_with(&scopes, &w, a.evict_first, a.trace, trigger, &mut on_phase);
    spin.into_inner().finish();
    let rec = rec?;
    let jsonl = match a.format {
        Some(ListFormat::Jsonl) => true,
        Some(ListFormat::Text) => false,
        None => a
            .output
            .extension()
            .is_some_and(|e| e == "jsonl" || e == "json"),
    };
    write_list(&a.output, &rec.entries, jsonl)?;
    print::record(&rec, &a.output, a.json)?;
    if let Some(st) = rec.status
        && !st.success()
    {
        bail!("recorded command failed: {st}");
    }
    Ok(())
}

/// The trees `record` snapshots: `--scope`s, else `/` (refused with `--evict-first`).
fn record_scopes(a: &RecordArgs) -> anyhow::Result<Vec<PathBuf>> {
    if !a.scopes.is_empty() {
        return Ok(a.scopes.clone());
    }
    if a.evict_first {
        bail!(
            "--evict-first without --scope would evict every file on the machine (the \
             default scope is /); name the trees to evict with --scope PATH (--scope / if \
             you really mean all of them)"
        );
    }
    Ok(vec![PathBuf::from("/")])
}

/// The command `record` runs. With `json`, stdout is exactly one JSON document: the command's
/// output goes to stderr (like time(1) keeps its own report apart from the command's).
fn record_command(
    prog: &std::ffi::OsString,
    args: &[std::ffi::OsString],
    json: bool,
) -> anyhow::Result<std::process::Command> {
    let mut cmd = std::process::Command::new(prog);
    cmd.args(args);
    if json {
        let err = std::io::stderr()
            .as_fd()
            .try_clone_to_owned()
            .context("duplicating stderr for the command's output")?;
        cmd.stdout(err);
    }
    Ok(cmd)
}

const CHILD_ENV: &str = "SNAPBLK_READAHEAD_BACKGROUND_CHILD";

/// Where the parent of `replay - --background` left its copy of stdin for the child.
const STDIN_COPY_ENV: &str = "SNAPBLK_READAHEAD_STDIN_LIST";

/// `replay --background`: the list is parsed here, so a bad list is an error now rather than
/// in a log. A list on stdin cannot be re-read by the detached child (its stdin is /dev/null),
/// so it is copied to a private temporary file (mode 0600, O_EXCL) that the child reads and
/// deletes.
fn spawn_replay_background(a: &ReplayArgs) -> anyhow::Result<()> {
    if a.list.as_os_str() != "-" {
        read_list(&a.list)?;
        return spawn_background(&a.opts, None);
    }
    let (path, mut f) = private_temp_file("snapblk-replay", "list")?;
    let copied = std::io::copy(&mut std::io::stdin().lock(), &mut f)
        .and_then(|_| f.sync_all())
        .context("copying the list from stdin")
        .and_then(|_| read_list(&path).context("-"));
    let spawned = copied.and_then(|_| spawn_background(&a.opts, Some(&path)));
    if spawned.is_err() {
        let _ = std::fs::remove_file(&path);
    }
    spawned
}

/// Creates a new file only this user can read in the temp directory (tempfile: 0600,
/// O_EXCL), kept on disk for the background child.
fn private_temp_file(prefix: &str, ext: &str) -> anyhow::Result<(PathBuf, std::fs::File)> {
    let dir = std::env::temp_dir();
    let t = tempfile::Builder::new()
        .prefix(&format!("{prefix}-"))
        .suffix(&format!(".{ext}"))
        .tempfile_in(&dir)
        .with_context(|| format!("cannot create a temporary file in {}", dir.display()))?;
    let (f, path) = t.keep().context("keeping the temporary list")?;
    Ok((path, f))
}

/// Re-executes this command detached (new process group, stdio to the log) and returns.
/// `stdin_copy`: the list the child is to read instead of its stdin.
fn spawn_background(o: &ReplayOpts, stdin_copy: Option<&Path>) -> anyhow::Result<()> {
    let exe = std::env::current_exe()?;
    let args: Vec<_> = std::env::args_os().skip(1).collect();
    let log = match &o.log {
        Some(p) => std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
            .with_context(|| format!("{}", p.display()))?,
        None => std::fs::File::create("/dev/null")?,
    };
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new(exe);
    if let Some(p) = stdin_copy {
        cmd.env(STDIN_COPY_ENV, p);
    }
    let child = cmd
        .args(args)
        .env(CHILD_ENV, "1")
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .spawn()
        .context("cannot start the background replay")?;
    outln!("{}", child.id())?;
    Ok(())
}

fn run_replay(entries: Vec<ListEntry>, o: &ReplayOpts) -> anyhow::Result<()> {
    let opts = o.options();
    // The library counts entries done; the submitters take them in list order, so the bytes
    // of the first `done` entries are the bytes done (the bar's rate and time left follow).
    let mut upto = Vec::with_capacity(entries.len() + 1);
    upto.push(0u64);
    for e in &entries {
        let b = match &e.extent {
            ra::Extent::Ranges(r) => r.total_bytes(),
            // A classic whole-file line has no recorded size: the file's own (a stat).
            ra::Extent::Whole => e.identity.map_or_else(
                || std::fs::metadata(&e.path).map_or(0, |m| m.len()),
                |i| i.size,
            ),
        };
        upto.push(upto[upto.len() - 1].saturating_add(b));
    }
    let bar = Progress::bytes(upto[entries.len()], "replay");
    let progress = |d: u64, _t: u64| bar.set(upto[(d as usize).min(entries.len())]);
    let watch = |b: BackOff| bar.message(backoff_message("replay", b));
    let watch = bar.visible().then_some(&watch as ra::BackOffWatch<'_>);
    let rep = ra::replay_watched(&entries, &opts, Some(&progress), watch);
    bar.finish();
    report_replay(&rep, o, &[])
}

fn run_evict(a: EvictArgs) -> anyhow::Result<()> {
    let t0 = Instant::now();
    let rep = ra::evict(&a.walk.paths, &a.walk.walk_opts(None));
    let elapsed = t0.elapsed().as_secs_f64();
    print::evict(&rep, a.json, elapsed)?;
    match rep.errors.len() {
        0 => {}
        1 => bail!("1 file could not be evicted"),
        n => bail!("{n} files could not be evicted"),
    }
    Ok(())
}

/// Fails a command whose paths could not all be read (like `evict`), after its report.
fn fail_on_walk_errors(errors: &[WalkError]) -> anyhow::Result<()> {
    match errors.len() {
        0 => Ok(()),
        1 => bail!("1 path could not be read"),
        n => bail!("{n} paths could not be read"),
    }
}
