//! `snapblk`: the command-line front end. Each subcommand lives in its own module and is a thin
//! layer over the library crates; errors are reported in one line and a non-zero exit.
//!
//! Exit status: 0 on success; 1 for an error (`snapblk: <cause: cause: ...>` on stderr, once);
//! 141 (128 + SIGPIPE), with nothing printed, when stdout or stderr is a closed pipe (`| head`);
//! 2 for a usage error (clap); 128 + N after signal N (bench, remote put). Output goes through
//! [`out`] (`outln!`, `errln!`, `out::stdout()`), whose write errors are errors.

use clap::{Parser, Subcommand};

// First: its macros (`outln!`, `errln!`, ...) are used by the modules below.
#[macro_use]
mod out;

mod bench;
mod clidoc;
mod cow;
mod ctl;
mod devout;
mod human;
mod info;
mod logger;
mod merge;
mod ota;
mod ota_gen;
mod ota_sig;
mod outfile;
mod progress;
mod readahead;
mod remote;
mod serve;
mod serve_ops;
mod serve_ublk;

#[derive(Parser)]
#[command(
    name = "snapblk",
    version = clidoc::VERSION,
    about = "Userspace block storage for A/B snapshot devices"
)]
struct Cli {
    /// Draw no progress bars (by default they are drawn on stderr when it is a terminal).
    #[arg(long, global = true)]
    quiet: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Android COW files: create, inspect, verify, record, apply.
    #[command(subcommand)]
    Cow(cow::CowCmd),
    /// Print a device's properties.
    Info(info::InfoArgs),
    /// Merge a COW into its base in place (resumable).
    Merge(merge::MergeArgs),
    /// Android OTA payloads (payload.bin, bare or in an OTA zip): inspect, extract, apply.
    #[command(subcommand)]
    Ota(ota::OtaCmd),
    /// Export a device over ublk, FUSE or NBD.
    Serve(serve::ServeArgs),
    /// Ask a running `serve --control PATH` for its status or stats, or steer its merge.
    Ctl(ctl::CtlArgs),
    /// Show how much of files is in the page cache (like vmtouch).
    Residency(readahead::ResidencyArgs),
    /// Record, replay and evict readahead lists; warm or evict whole trees.
    #[command(subcommand)]
    Readahead(readahead::ReadaheadCmd),
    /// Load generator (fio/IOzone-style).
    Bench(bench::BenchArgs),
    /// Print a shell completion script (bash, zsh, fish) on stdout.
    Completions(clidoc::CompletionsArgs),
    /// Write a man page per command into a directory.
    Man(clidoc::ManArgs),
    /// Objects on S3 or an S3-compatible store: put, get, stat (docs/remote.md).
    #[command(subcommand)]
    Remote(remote::RemoteCmd),
}

/// Every option that takes a value accepts a negative number as its value, in every
/// subcommand: `--level -1` (a valid zstd level) works like `--level=-1`, and a negative value
/// of an unsigned option is reported by that option's parser as out of range instead of as
/// clap's "unexpected argument '-1'".
fn allow_negative_numbers(cmd: clap::Command) -> clap::Command {
    cmd.mut_args(|a| {
        if a.get_action().takes_values() {
            a.allow_negative_numbers(true)
        } else {
            a
        }
    })
    .mut_subcommands(allow_negative_numbers)
}

/// The whole command tree as `snapblk` parses it, with every help's example.
fn cli_command() -> clap::Command {
    use clap::CommandFactory;
    clidoc::with_examples(allow_negative_numbers(Cli::command()))
}

fn main() {
    use clap::FromArgMatches;
    logger::init();
    let matches = cli_command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    progress::set_quiet(cli.quiet);
    let res = match cli.cmd {
        Cmd::Cow(c) => cow::run(c),
        Cmd::Info(a) => info::run(a),
        Cmd::Merge(a) => merge::run(a),
        Cmd::Ota(c) => ota::run(c),
        Cmd::Serve(a) => serve::run(a),
        Cmd::Ctl(a) => ctl::run(a),
        Cmd::Residency(a) => readahead::run_residency(a),
        Cmd::Readahead(c) => readahead::run(c),
        Cmd::Bench(a) => bench::run(a),
        Cmd::Completions(a) => clidoc::completions(a, cli_command()),
        Cmd::Man(a) => clidoc::man(a, cli_command()),
        Cmd::Remote(c) => remote::run(c),
    };
    // A write to stderr that a callback could not report fails the command too.
    let res = res.and_then(|()| match out::take_deferred() {
        Some(e) => Err(e.into()),
        None => Ok(()),
    });
    if let Err(e) = res {
        std::process::exit(out::exit_status(&e));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// clap's own consistency checks over every subcommand, with negative numbers allowed
    /// (an argument that takes no value must not get the setting).
    #[test]
    fn command_tree_is_consistent() {
        allow_negative_numbers(Cli::command()).debug_assert();
        cli_command().debug_assert();
    }

    /// What `--help` must teach, for `cmd` (at `path`) and every subcommand: a one-line
    /// purpose, an example, the meaning of every option and argument.
    fn lessons_missing(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
        let name = format!("snapblk{path}");
        match cmd.get_about().map(|a| a.to_string()) {
            Some(a) if !a.trim().is_empty() && !a.contains('\n') => {}
            a => missing.push(format!("{name}: purpose {a:?} is not one line")),
        }
        let after = cmd
            .get_after_help()
            .map(|h| h.to_string())
            .unwrap_or_default();
        if !after.contains("Example:\n  snapblk") {
            missing.push(format!("{name}: no example"));
        }
        for arg in cmd.get_arguments() {
            let id = arg.get_id().as_str();
            if !matches!(id, "help" | "version") && arg.get_help().is_none() {
                missing.push(format!("{name}: {id} has no description"));
            }
            if arg.get_short() == Some('r') && arg.get_long() != Some("recursive") {
                missing.push(format!("{name}: -r is --{id}, not --recursive"));
            }
        }
        for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
            lessons_missing(sub, &format!("{path} {}", sub.get_name()), missing);
        }
    }

    #[test]
    fn every_help_has_purpose_example_and_option_meanings() {
        let mut cmd = cli_command();
        cmd.build();
        let mut missing = Vec::new();
        lessons_missing(&cmd, "", &mut missing);
        assert!(missing.is_empty(), "{}", missing.join("\n"));
    }

    /// Every example parses, as the command it is the example of.
    #[test]
    fn examples_parse_as_their_command() {
        for (path, ex) in clidoc::EXAMPLES {
            let argv: Vec<&str> = ex.split(" > ").next().unwrap().split(' ').collect();
            let m = cli_command()
                .try_get_matches_from(&argv)
                .unwrap_or_else(|e| panic!("{ex}: {e}"));
            if path.is_empty() {
                continue;
            }
            let (mut got, mut at) = (Vec::new(), &m);
            let want: Vec<&str> = path.split(' ').collect();
            while let Some((n, sub)) = at.subcommand()
                && got.len() < want.len()
            {
                got.push(n);
                at = sub;
            }
            assert_eq!(got, want, "{ex}");
        }
    }
}
