//! What the command line says about itself: the version line (with the commit, from
//! `build.rs`), the example every `--help` ends with, `snapblk completions SHELL` and
//! `snapblk man DIR`. All are generated from the one clap definition in `main.rs`.

use anyhow::{Context as _, Result};
use clap::{Args, Command};
use std::io::Write as _;
use std::path::PathBuf;

/// `snapblk --version`: the package version and the commit it was built from.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("SNAPBLK_GIT_COMMIT"),
    ")"
);

#[derive(Args)]
pub struct CompletionsArgs {
    /// The shell: bash, zsh or fish (also elvish, powershell).
    #[arg(value_enum)]
    shell: clap_complete::Shell,
}

#[derive(Args)]
pub struct ManArgs {
    /// Directory for snapblk.1 and one snapblk-SUB[-SUB].1 per subcommand (created if missing).
    dir: PathBuf,
}

/// One example per command, by its path below `snapblk` (space-separated, "" for the top).
/// Every entry parses (a unit test runs them through clap).
pub const EXAMPLES: &[(&str, &str)] = &[
    (
        "",
        "snapblk cow create --old old.img --new new.img -o update.cow",
    ),
    (
        "cow",
        "snapblk cow verify update.cow --base old.img --expect new.img",
    ),
    (
        "cow create",
        "snapblk cow create --old old.img --new new.img -o update.cow",
    ),
    ("cow inspect", "snapblk cow inspect update.cow --json"),
    (
        "cow verify",
        "snapblk cow verify update.cow --base old.img --expect new.img",
    ),
    (
        "cow record",
        "snapblk cow record update.cow --old old.img --new new.img",
    ),
    (
        "cow apply",
        "snapblk cow apply update.cow --base old.img -o new.img",
    ),
    ("info", "snapblk info disk.img --json"),
    ("merge", "snapblk merge update.cow --base old.img"),
    ("ota", "snapblk ota info ota.zip"),
    ("ota info", "snapblk ota info ota.zip --json"),
    (
        "ota extract",
        "snapblk ota extract ota.zip -o images/ --partitions system,vendor",
    ),
    (
        "ota apply",
        "snapblk ota apply incremental.zip --source old/ -o new/",
    ),
    (
        "ota cow",
        "snapblk ota cow incremental.zip --source old/ -o cows/ --verify",
    ),
    (
        "ota serve",
        "snapblk ota serve incremental.zip --source old/ --nbd 10809",
    ),
    (
        "ota generate",
        "snapblk ota generate --source old/ --target new/ -o payload.bin",
    ),
    (
        "serve",
        "snapblk serve --base old.img --cow update.cow --nbd 127.0.0.1:10809",
    ),
    ("ctl", "snapblk ctl /run/snapblk.sock stats"),
    ("residency", "snapblk residency -r /usr/lib"),
    ("readahead", "snapblk readahead replay boot.list"),
    (
        "readahead record",
        "snapblk readahead record -o boot.list --scope /usr -- ls /usr/bin",
    ),
    ("readahead replay", "snapblk readahead replay boot.list"),
    ("readahead warm", "snapblk readahead warm -r /usr/lib"),
    ("readahead evict", "snapblk readahead evict -r /usr/lib"),
    (
        "readahead lock",
        "snapblk readahead lock -r /usr/lib/firmware --daemon --pid-file /run/snapblk-lock.pid",
    ),
    (
        "bench",
        "snapblk bench null:size=1G --rw randread --bs 4k --iodepth 32",
    ),
    ("bench file", "snapblk bench file /tmp"),
    ("bench overwrite", "snapblk bench overwrite /tmp --mb 64"),
    (
        "bench fgbg",
        "snapblk bench fgbg --bg-read big.img --fg-cmd true",
    ),
    (
        "remote",
        "snapblk remote put update.cow s3://updates/2026-11/update.cow",
    ),
    (
        "remote put",
        "snapblk remote put update.cow s3://updates/2026-11/update.cow",
    ),
    (
        "remote get",
        "snapblk remote get s3://updates/2026-11/update.cow update.cow",
    ),
    (
        "remote stat",
        "snapblk remote stat s3://updates/2026-11/update.cow",
    ),
    (
        "completions",
        "snapblk completions bash > /etc/bash_completion.d/snapblk",
    ),
    ("man", "snapblk man /usr/local/share/man/man1"),
];

/// Ends the help of `cmd` and of every subcommand with its example from [`EXAMPLES`]
/// (after any text the command has there already).
pub fn with_examples(cmd: Command) -> Command {
    add_examples(cmd, "")
}

fn add_examples(cmd: Command, path: &str) -> Command {
    let cmd = match EXAMPLES.iter().find(|(p, _)| *p == path) {
        Some((_, ex)) => {
            let before = cmd
                .get_after_help()
                .map(|h| format!("{h}\n\n"))
                .unwrap_or_default();
            cmd.after_help(format!("{before}Example:\n  {ex}"))
        }
        None => cmd,
    };
    cmd.mut_subcommands(|sub| {
        let p = match path {
            "" => sub.get_name().to_string(),
            _ => format!("{path} {}", sub.get_name()),
        };
        add_examples(sub, &p)
    })
}

/// `snapblk completions SHELL`: the completion script on stdout.
pub fn completions(a: CompletionsArgs, mut cmd: Command) -> Result<()> {
    let mut buf = Vec::new();
    clap_complete::generate(a.shell, &mut cmd, "snapblk", &mut buf);
    let mut o = crate::out::stdout();
    o.write_all(&buf)?;
    o.flush()?;
    Ok(())
}

/// `snapblk man DIR`: one roff page per command into DIR (`snapblk.1`, `snapblk-cow.1`,
/// `snapblk-cow-create.1`, ...).
pub fn man(a: ManArgs, cmd: Command) -> Result<()> {
    std::fs::create_dir_all(&a.dir).with_context(|| format!("creating {}", a.dir.display()))?;
    clap_mangen::generate_to(cmd, &a.dir)
        .with_context(|| format!("writing man pages into {}", a.dir.display()))?;
    outln!("man pages written into {}", a.dir.display())?;
    Ok(())
}
