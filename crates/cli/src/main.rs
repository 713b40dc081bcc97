//! `snapblk`: the command-line front end. Each subcommand lives in its own module and is a thin
//! layer over the library crates; errors are reported in one line and a non-zero exit.
//!
//! Exit status: 0 on success; 1 for an error (`snapblk: <cause: cause: ...>` on stderr, once);
//! 141 (128 + SIGPIPE), with nothing printed, when stdout or stderr is a closed pipe (`| head`);
//! 2 for a usage error (clap); 128 + N after signal N (bench). Output goes through [`out`]
//! (`outln!`, `errln!`, `out::stdout()`), whose write errors are errors.

use clap::{Parser, Subcommand};

// First: its macros (`outln!`, `errln!`, ...) are used by the modules below.
#[macro_use]
mod out;

mod bench;
mod cow;
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
mod serve;
mod serve_ublk;

#[derive(Parser)]
#[command(
    name = "snapblk",
    version,
    about = "Userspace block storage for A/B snapshot devices"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Android COW files: create, inspect, verify, apply.
    #[command(subcommand)]
    Cow(cow::CowCmd),
    /// Print a device's properties.
    Info(info::InfoArgs),
    /// Merge a COW into its base in place (resumable).
    Merge(merge::MergeArgs),
    /// Android OTA payloads (payload.bin, bare or in an OTA zip): inspect, extract.
    #[command(subcommand)]
    Ota(ota::OtaCmd),
    /// Export a device over ublk, FUSE or NBD.
    Serve(serve::ServeArgs),
    /// Page-cache residency.
    Residency(readahead::ResidencyArgs),
    /// Record, replay and evict readahead lists.
    #[command(subcommand)]
    Readahead(readahead::ReadaheadCmd),
    /// Load generator (fio/IOzone-style).
    Bench(bench::BenchArgs),
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

fn main() {
    use clap::{CommandFactory, FromArgMatches};
    logger::init();
    let matches = allow_negative_numbers(Cli::command()).get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let res = match cli.cmd {
        Cmd::Cow(c) => cow::run(c),
        Cmd::Info(a) => info::run(a),
        Cmd::Merge(a) => merge::run(a),
        Cmd::Ota(c) => ota::run(c),
        Cmd::Serve(a) => serve::run(a),
        Cmd::Residency(a) => readahead::run_residency(a),
        Cmd::Readahead(c) => readahead::run(c),
        Cmd::Bench(a) => bench::run(a),
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
    }
}
