//! Where output goes: data (tables, plans, JSON documents) to stdout, where people pipe and
//! redirect it; everything for humans while a command works (progress, per-interval lines,
//! warnings, errors, the end-of-run summary) to stderr. A closed stdout (`backfill show 1 |
//! head -3`) is not an error: the command stops writing and ends quietly.

use std::io::{BufWriter, Write};

use serde::Serialize;

use crate::exit::Error;

/// Maps a write error: a closed pipe becomes [`Error::ClosedPipe`].
fn closed(e: std::io::Error) -> Error {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        Error::ClosedPipe
    } else {
        Error::io("cannot write to stdout", e)
    }
}

/// Writes `text` and a newline to stdout.
pub fn data(text: &str) -> Result<(), Error> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes()).map_err(closed)?;
    out.write_all(b"\n").map_err(closed)?;
    out.flush().map_err(closed)
}

/// Writes one JSON document and a newline to stdout.
pub fn json<T: Serialize + ?Sized>(value: &T) -> Result<(), Error> {
    let stdout = std::io::stdout();
    let mut out = BufWriter::with_capacity(1 << 16, stdout.lock());
    serde_json::to_writer(&mut out, value).map_err(|e| match e.io_error_kind() {
        Some(std::io::ErrorKind::BrokenPipe) => Error::ClosedPipe,
        _ => Error::Internal(format!("cannot write JSON: {e}")),
    })?;
    out.write_all(b"\n").map_err(closed)?;
    out.flush().map_err(closed)
}

/// Writes a line for humans to stderr (a closed stderr is ignored).
pub fn note(text: &str) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{text}");
}

pub use crate::words::{hint, plural, set_invocation, shell_word};
