//! Output to stdout and stderr that reports write errors instead of panicking (`println!`
//! panics on a closed pipe) or swallowing them (`let _ = writeln!(...)`).
//!
//! * `outln!` / `out!` write to stdout, `errln!` / `err!` to stderr; each formats like
//!   `println!`, writes and flushes at once, and returns `io::Result<()>`.
//! * [`stdout()`] is a `Write` for code that streams (`serde_json::to_writer`, `BufWriter`).
//! * [`errln_deferred`] is for callbacks that cannot return an error (progress lines): the first
//!   failure is kept and [`take_deferred`] hands it to `main` when the command ends.
//!
//! Every error is tagged with the stream it happened on ([`StdioError`]), so `main` can tell a
//! closed stdout from a broken socket. The convention ([`exit_status`]): an `EPIPE` on stdout or
//! stderr (the reader went away, e.g. `| head -1`) ends the command quietly with status
//! [`CLOSED_PIPE_STATUS`] (141 = 128 + SIGPIPE, what a shell shows for a process killed by
//! SIGPIPE); any other error, including a full stdout (`> /dev/full`), prints
//! `snapblk: <cause: cause: ...>` once on one line and exits 1.

use std::fmt;
use std::io::{self, Write};
use std::sync::Mutex;

/// Exit status for a closed stdout or stderr: 128 + SIGPIPE, as a shell reports a process
/// killed by SIGPIPE.
pub const CLOSED_PIPE_STATUS: i32 = 141;

/// A standard stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// A write to stdout or stderr failed. Carried inside the returned `io::Error` (same kind) so
/// that callers keep plain `io::Result`s; its `source` is the OS error.
#[derive(Debug)]
pub struct StdioError {
    pub stream: Stream,
    source: io::Error,
}

impl fmt::Display for StdioError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.stream {
            Stream::Stdout => f.write_str("writing to stdout"),
            Stream::Stderr => f.write_str("writing to stderr"),
        }
    }
}

impl std::error::Error for StdioError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

fn tag(stream: Stream, e: io::Error) -> io::Error {
    // Already tagged (a writer wrapped twice): keep it.
    if e.get_ref().is_some_and(|i| i.is::<StdioError>()) {
        return e;
    }
    io::Error::new(e.kind(), StdioError { stream, source: e })
}

/// Writes `args` and flushes. Used by the macros.
pub fn write(stream: Stream, args: fmt::Arguments<'_>, newline: bool) -> io::Result<()> {
    let mut s = args.to_string();
    if newline {
        s.push('\n');
    }
    let r = match stream {
        Stream::Stdout => {
            let mut o = io::stdout().lock();
            o.write_all(s.as_bytes()).and_then(|_| o.flush())
        }
        Stream::Stderr => {
            let mut o = io::stderr().lock();
            o.write_all(s.as_bytes()).and_then(|_| o.flush())
        }
    };
    r.map_err(|e| tag(stream, e))
}

/// `println!` that returns `io::Result<()>`.
macro_rules! outln {
    () => {
        $crate::out::write($crate::out::Stream::Stdout, format_args!(""), true)
    };
    ($($arg:tt)*) => {
        $crate::out::write($crate::out::Stream::Stdout, format_args!($($arg)*), true)
    };
}

/// `print!` that returns `io::Result<()>`.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::out::write($crate::out::Stream::Stdout, format_args!($($arg)*), false)
    };
}

/// `eprintln!` that returns `io::Result<()>`.
macro_rules! errln {
    () => {
        $crate::out::write($crate::out::Stream::Stderr, format_args!(""), true)
    };
    ($($arg:tt)*) => {
        $crate::out::write($crate::out::Stream::Stderr, format_args!($($arg)*), true)
    };
}

/// `eprint!` that returns `io::Result<()>`.
#[allow(unused_macros)]
macro_rules! err {
    ($($arg:tt)*) => {
        $crate::out::write($crate::out::Stream::Stderr, format_args!($($arg)*), false)
    };
}

/// A `Write` on stdout whose errors are tagged as stdout errors.
pub struct Stdout(io::StdoutLock<'static>);

/// Locked stdout for streaming writers (wrap it in a `BufWriter` for many small writes).
pub fn stdout() -> Stdout {
    Stdout(io::stdout().lock())
}

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf).map_err(|e| tag(Stream::Stdout, e))
    }
    fn flush(&mut self) -> io::Result<()> {
        self.0.flush().map_err(|e| tag(Stream::Stdout, e))
    }
}

static DEFERRED: Mutex<Option<io::Error>> = Mutex::new(None);

/// Like `errln!` for callbacks that cannot return an error: the first failure is kept for
/// [`take_deferred`] (later lines are still attempted; they fail the same way).
pub fn errln_deferred(args: fmt::Arguments<'_>) {
    if let Err(e) = write(Stream::Stderr, args, true)
        && let Ok(mut d) = DEFERRED.lock()
    {
        d.get_or_insert(e);
    }
}

/// `eprint!` counterpart of [`errln_deferred`].
pub fn err_deferred(args: fmt::Arguments<'_>) {
    if let Err(e) = write(Stream::Stderr, args, false)
        && let Ok(mut d) = DEFERRED.lock()
    {
        d.get_or_insert(e);
    }
}

/// The first error a deferred write met, if any.
pub fn take_deferred() -> Option<io::Error> {
    DEFERRED.lock().ok().and_then(|mut d| d.take())
}

/// The stdio error in `e`'s chain, if any.
fn stdio_error(e: &anyhow::Error) -> Option<&StdioError> {
    e.chain().find_map(|c| {
        c.downcast_ref::<StdioError>().or_else(|| {
            c.downcast_ref::<io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|i| i.downcast_ref::<StdioError>())
        })
    })
}

/// True when `e` was caused by writing to stdout (a JSON verdict would go there too).
pub fn is_stdout_error(e: &anyhow::Error) -> bool {
    stdio_error(e).is_some_and(|s| s.stream == Stream::Stdout)
}

/// With `--json`, a command that fails still prints a JSON document on stdout:
/// `{"schema": SCHEMA, "ok": false, "error": "..."}` (the error also goes to stderr, as
/// always), except for an error writing stdout itself.
pub fn json_verdict<T>(json: bool, schema: &str, r: anyhow::Result<T>) -> anyhow::Result<T> {
    json_on_error(json, r, |e| {
        let doc = serde_json::json!({ "schema": schema, "ok": false, "error": format!("{e:#}") });
        serde_json::to_string_pretty(&doc).unwrap_or_default()
    })
}

/// With `json`, when `r` failed other than by writing stdout, print the document `doc` makes of
/// the error on stdout ([`json_verdict`]'s, or a command's own verdict). A document that cannot
/// be written (stdout closed) must not replace the command's own error, which stderr still gets.
pub fn json_on_error<T>(
    json: bool,
    r: anyhow::Result<T>,
    doc: impl FnOnce(&anyhow::Error) -> String,
) -> anyhow::Result<T> {
    if let (true, Err(e)) = (json, &r)
        && !is_stdout_error(e)
    {
        let _ = write(Stream::Stdout, format_args!("{}", doc(e)), true);
    }
    r
}

/// True when `e` was caused by a closed stdout or stderr (`EPIPE`).
pub fn is_closed_pipe(e: &anyhow::Error) -> bool {
    stdio_error(e).is_some_and(|s| s.source.kind() == io::ErrorKind::BrokenPipe)
}

/// Reports a command's error and returns the exit status (see the module docs): quietly
/// [`CLOSED_PIPE_STATUS`] for a closed stdout/stderr, else `snapblk: <chain>` on one line and 1.
pub fn exit_status(e: &anyhow::Error) -> i32 {
    if is_closed_pipe(e) {
        return CLOSED_PIPE_STATUS;
    }
    // stderr itself may be what failed (full): nothing more can be said then.
    let _ = write(Stream::Stderr, format_args!("snapblk: {e:#}"), true);
    1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn broken(stream: Stream) -> anyhow::Error {
        let e = tag(stream, io::Error::from(io::ErrorKind::BrokenPipe));
        anyhow::Error::new(e).context("printing the report")
    }

    #[test]
    fn closed_pipe_is_recognised_through_context() {
        assert!(is_closed_pipe(&broken(Stream::Stdout)));
        assert!(is_closed_pipe(&broken(Stream::Stderr)));
        let other = anyhow::Error::new(io::Error::from(io::ErrorKind::BrokenPipe));
        assert!(
            !is_closed_pipe(&other),
            "an untagged EPIPE (socket) is not stdio"
        );
    }

    #[test]
    fn chain_names_the_stream_once() {
        let e = anyhow::Error::new(tag(Stream::Stdout, io::Error::from_raw_os_error(28)));
        assert_eq!(
            format!("{e:#}"),
            "writing to stdout: No space left on device (os error 28)"
        );
        assert!(!is_closed_pipe(&e));
        let twice = tag(Stream::Stderr, tag(Stream::Stdout, io::Error::other("x")));
        assert_eq!(twice.to_string(), "writing to stdout");
    }
}
