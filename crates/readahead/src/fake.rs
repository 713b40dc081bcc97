//! Stand-ins for the kernel files the pressure back-off reads (/proc/pressure/io,
//! /proc/diskstats, /proc/self/io), for tests: this crate's, through [`ReplayOptions`]' paths,
//! and end-to-end tests of the CLI, through its hidden `--psi-file`, `--diskstats-file` and
//! `--self-io-file`. A real stall cannot be produced on demand without loading the machine.

use crate::ReplayOptions;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The three files, rewritten every 5 ms by a thread until dropped.
pub struct FakePressure {
    /// The fake PSI file in /proc/pressure/io format; point `ReplayOptions::psi_path` at it.
    pub psi: PathBuf,
    /// The fake /proc/diskstats; point `ReplayOptions::diskstats_path` at it.
    pub diskstats: PathBuf,
    /// The fake /proc/self/io (`read_bytes` etc.); point `ReplayOptions::self_io_path` at it.
    pub self_io: PathBuf,
    /// A private directory on tmpfs holding the files, removed on drop (None: they are in the
    /// caller's directory).
    shm_dir: Option<PathBuf>,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    writer: Option<JoinHandle<()>>,
}

#[derive(Default)]
struct State {
    /// Other tasks stall 100 % of the time until then.
    stall_until: Option<Instant>,
    /// Someone else reads the device.
    foreign: bool,
}

/// Writes `text` to `path` atomically (a reader never sees a half-written file).
fn replace_file(path: &Path, text: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

fn psi_text(total_us: u64) -> String {
    format!(
        "some avg10=0.00 avg60=0.00 avg300=0.00 total={total_us}\n\
         full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
    )
}

impl FakePressure {
    /// Creates the files in `dir`, all calm (no stall, no reads by others; this process has
    /// read nothing), and starts rewriting them: while a stall is on ([`Self::stall_for`]) the
    /// "some" total grows with wall time, i.e. 100 % stall; while foreign reads are on
    /// ([`Self::set_foreign`]) the device `dev` (an `st_dev`, e.g. of a file to replay) reads
    /// 1 MiB per 5 ms that this process did not cause.
    ///
    /// The files go to a private directory on /dev/shm when there is one, else to `dir`: a
    /// rename on a disk file system can wait hundreds of milliseconds for the journal while
    /// other tests fsync, and a stale file reads as a shorter stall (that made these tests
    /// fail in about 1 run of 6 of the full unit-test binary).
    pub fn start(dir: &Path, dev: u64) -> std::io::Result<FakePressure> {
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let (major, minor) = (libc::major(dev), libc::minor(dev));
        let disk_text =
            move |sectors: u64| format!("{major} {minor} fake 100 0 {sectors} 10 0 0 0 0 0 0 0\n");
        let shm_dir = Path::new("/dev/shm").join(format!(
            "snapblk-fake-pressure-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Relaxed)
        ));
        let shm_dir = std::fs::create_dir(&shm_dir).is_ok().then_some(shm_dir);
        let at = shm_dir.as_deref().unwrap_or(dir);
        let mut f = FakePressure {
            psi: at.join("fake-pressure-io"),
            diskstats: at.join("fake-diskstats"),
            self_io: at.join("fake-self-io"),
            shm_dir,
            state: Default::default(),
            stop: Default::default(),
            writer: None,
        };
        replace_file(&f.psi, &psi_text(0))?;
        replace_file(&f.diskstats, &disk_text(0))?;
        replace_file(&f.self_io, "rchar: 0\nread_bytes: 0\n")?;
        let (psi, diskstats) = (f.psi.clone(), f.diskstats.clone());
        let (state, stop) = (f.state.clone(), f.stop.clone());
        f.writer = Some(std::thread::spawn(move || {
            let (mut total, mut last, mut sectors) = (0u64, Instant::now(), 0u64);
            while !stop.load(Relaxed) {
                std::thread::sleep(Duration::from_millis(5));
                let now = Instant::now();
                let (stalled, foreign) = match state.lock() {
                    Ok(s) => (s.stall_until.is_some_and(|u| now < u), s.foreign),
                    Err(_) => return,
                };
                if stalled {
                    total += now.duration_since(last).as_micros() as u64;
                }
                last = now;
                // A failed write leaves the previous content: the stall looks shorter, which
                // a test notices.
                let _ = replace_file(&psi, &psi_text(total));
                if foreign {
                    sectors += 2048;
                    let _ = replace_file(&diskstats, &disk_text(sectors));
                }
            }
        }));
        Ok(f)
    }

    /// Other tasks stall 100 % of the time from now for `d` (replacing any earlier stall).
    pub fn stall_for(&self, d: Duration) {
        self.staller()(d)
    }

    /// [`Self::stall_for`] as a callback that outlives this borrow (e.g. a progress callback
    /// moved into another thread).
    pub fn staller(&self) -> impl Fn(Duration) + Send + Sync + 'static {
        let state = self.state.clone();
        move |d| {
            if let Ok(mut s) = state.lock() {
                s.stall_until = Some(Instant::now() + d);
            }
        }
    }

    /// Whether someone else reads the device from now on.
    pub fn set_foreign(&self, on: bool) {
        if let Ok(mut s) = self.state.lock() {
            s.foreign = on;
        }
    }

    /// `opts` with the back-off reading these files.
    pub fn options(&self, opts: ReplayOptions) -> ReplayOptions {
        ReplayOptions {
            psi_path: self.psi.clone(),
            diskstats_path: self.diskstats.clone(),
            self_io_path: self.self_io.clone(),
            ..opts
        }
    }

    /// The CLI's hidden options naming these files.
    pub fn cli_args(&self) -> Vec<String> {
        [
            ("--psi-file", &self.psi),
            ("--diskstats-file", &self.diskstats),
            ("--self-io-file", &self.self_io),
        ]
        .iter()
        .flat_map(|(o, p)| [o.to_string(), p.display().to_string()])
        .collect()
    }
}

impl Drop for FakePressure {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
        if let Some(d) = &self.shm_dir {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sysstat::PsiSampler;

    #[test]
    fn the_fakes_show_a_stall_and_foreign_reads_while_they_are_on() {
        let dir = std::env::temp_dir().join(format!("snapblk-fake-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let dev = libc::makedev(8, 16);
        let fake = FakePressure::start(&dir, dev).unwrap();
        let mut psi = PsiSampler::open(&fake.psi).unwrap();
        let mut foreign = crate::ownstall::ForeignReads::new(&fake.diskstats, &fake.self_io);
        let sample = |psi: &mut PsiSampler, foreign: &mut crate::ownstall::ForeignReads| {
            std::thread::sleep(Duration::from_millis(100));
            (psi.sample().unwrap(), foreign.sample(&[(8, 16)]).unwrap())
        };
        let (calm, none) = sample(&mut psi, &mut foreign);
        assert!(calm < 0.05 && none == 0, "{calm} {none}");
        fake.stall_for(Duration::from_secs(60));
        fake.set_foreign(true);
        let (stall, reads) = sample(&mut psi, &mut foreign);
        assert!(stall > 0.7, "{stall}");
        assert!(reads >= crate::ownstall::FOREIGN_MIN, "{reads}");
        fake.stall_for(Duration::ZERO);
        fake.set_foreign(false);
        sample(&mut psi, &mut foreign);
        let (calm, none) = sample(&mut psi, &mut foreign);
        assert!(calm < 0.05 && none == 0, "{calm} {none}");
        assert_eq!(
            fake.cli_args()[..2],
            ["--psi-file".to_string(), fake.psi.display().to_string()]
        );
        drop(fake);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
