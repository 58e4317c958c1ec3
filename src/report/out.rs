//! Where output goes: data (tables, plans, JSON documents) to stdout, where people pipe and
//! redirect it; everything for humans while a command works (progress, per-interval lines,
//! warnings, errors, the end-of-run summary) to stderr. A closed stdout (`backfill show 1 |
//! head -3`) is not an error: the command stops writing and ends quietly.
//!
//! Views write into a [`Sink`]: the process's stdout and stderr for a command, buffers in tests.
//! Human data is fitted to a width ([`Fit`]): the terminal's when stdout is one, `COLUMNS` when
//! set, no limit otherwise, so that a pipe keeps every character.

use std::io::{BufWriter, Write};

use serde::Serialize;

use crate::exit::Error;

/// Maps a write error: a closed pipe becomes [`Error::ClosedPipe`].
pub(crate) fn closed(e: std::io::Error) -> Error {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        Error::ClosedPipe
    } else {
        Error::io("cannot write to stdout", e)
    }
}

/// Writes `text` and a newline to stdout.
pub(crate) fn data(text: &str) -> Result<(), Error> {
    let mut out = std::io::stdout().lock();
    write_line(&mut out, text)
}

fn write_line(out: &mut dyn Write, text: &str) -> Result<(), Error> {
    out.write_all(text.as_bytes()).map_err(closed)?;
    out.write_all(b"\n").map_err(closed)?;
    out.flush().map_err(closed)
}

/// Writes one JSON document and a newline to stdout.
pub(crate) fn json<T: Serialize + ?Sized>(value: &T) -> Result<(), Error> {
    write_json(&mut std::io::stdout().lock(), value)
}

fn write_json<T: Serialize + ?Sized>(out: &mut dyn Write, value: &T) -> Result<(), Error> {
    let mut out = BufWriter::with_capacity(1 << 16, out);
    serde_json::to_writer(&mut out, value).map_err(|e| match e.io_error_kind() {
        Some(std::io::ErrorKind::BrokenPipe) => Error::ClosedPipe,
        _ => Error::Internal(format!("cannot write JSON: {e}")),
    })?;
    out.write_all(b"\n").map_err(closed)?;
    out.flush().map_err(closed)
}

/// Writes a line for humans to stderr (a closed stderr is ignored).
pub(crate) fn note(text: &str) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{text}");
}

/// How human output fits the screen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Fit {
    /// The width tables and long lines must fit in; `None`: no limit.
    pub width: Option<u16>,
    /// Long cells in full (`-v`); otherwise a cell is cut after [`Fit::CELL_LINES`] lines.
    pub full: bool,
}

impl Fit {
    /// Lines a wrapped cell may take before it is cut with `…`, unless [`Fit::full`].
    pub(crate) const CELL_LINES: usize = 3;

    /// The width of what goes to stdout.
    pub(crate) fn stdout(full: bool) -> Self {
        Self {
            width: width(&console::Term::stdout()),
            full,
        }
    }

    /// The width of what goes to stderr.
    pub(crate) fn stderr(full: bool) -> Self {
        Self {
            width: width(&console::Term::stderr()),
            full,
        }
    }
}

/// Writes a line for people on stderr, wrapped at spaces to its width (see [`Fit::stderr`]), so
/// that a terminal never breaks a word; a closed stderr is ignored.
pub fn say(text: &str) {
    let width = Fit::stderr(false).width.map(usize::from);
    let _ = writeln!(std::io::stderr(), "{}", fitted(text, width));
}

/// `text` wrapped to `width` as people read it (see [`wrap_whole`]), or as it is without one.
pub(crate) fn fitted(text: &str, width: Option<usize>) -> std::borrow::Cow<'_, str> {
    match width {
        Some(width) => wrap_whole(text, width).into(),
        None => text.into(),
    }
}

/// `COLUMNS` when it holds a width, else the terminal's width when `term` is a terminal.
fn width(term: &console::Term) -> Option<u16> {
    columns(std::env::var("COLUMNS").ok().as_deref())
        .or_else(|| term.size_checked().map(|(_rows, cols)| cols))
}

/// A width from `COLUMNS`: a positive number.
fn columns(value: Option<&str>) -> Option<u16> {
    value?.trim().parse().ok().filter(|&w: &u16| w > 0)
}

/// Where a view writes: data (stdout for a command), notes for people (stderr), and whether as
/// JSON or fitted to a width.
pub(crate) struct Sink<'a> {
    data: Box<dyn Write + 'a>,
    notes: Box<dyn Write + 'a>,
    /// `--output json`: one JSON document instead of human output.
    pub json: bool,
    pub fit: Fit,
    /// The width notes are wrapped to (see [`wrap`]); `None`: as they are.
    notes_width: Option<u16>,
}

impl Sink<'static> {
    /// The process's stdout and stderr, fitted to stdout's width; `verbose` keeps long cells
    /// whole.
    pub(crate) fn std(json: bool, verbose: bool) -> Self {
        let mut sink = Self::new(
            std::io::stdout().lock(),
            std::io::stderr(),
            json,
            Fit::stdout(verbose),
        );
        sink.notes_width = Fit::stderr(verbose).width;
        sink
    }
}

impl<'a> Sink<'a> {
    pub(crate) fn new(data: impl Write + 'a, notes: impl Write + 'a, json: bool, fit: Fit) -> Self {
        Self {
            data: Box::new(data),
            notes: Box::new(notes),
            json,
            fit,
            notes_width: fit.width,
        }
    }

    /// Writes a line of data, wrapped at spaces to the width.
    pub(crate) fn line(&mut self, text: &str) -> Result<(), Error> {
        match self.fit.width {
            Some(width) => write_line(&mut self.data, &wrap(text, usize::from(width))),
            None => write_line(&mut self.data, text),
        }
    }

    /// Writes text as it is (a table already fitted), then a newline.
    pub(crate) fn text(&mut self, text: &str) -> Result<(), Error> {
        write_line(&mut self.data, text)
    }

    /// Writes one JSON document and a newline.
    pub(crate) fn json<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        write_json(&mut self.data, value)
    }

    /// Writes a line for people, wrapped at spaces to the notes' width (a closed stderr is
    /// ignored).
    pub(crate) fn note(&mut self, text: &str) {
        let width = self.notes_width.map(usize::from);
        let _ = writeln!(self.notes, "{}", fitted(text, width));
    }
}

/// Wraps each line of `text` at spaces so that no line is wider than `width` columns;
/// continuation lines are indented by two spaces. A word wider than the width is cut. Colour
/// codes (ANSI escape sequences) take no width, and are never cut; a span between backquotes
/// (a command to copy) is one word.
pub(crate) fn wrap(text: &str, width: usize) -> String {
    fill(text, width, Cut::Words)
}

/// [`wrap`] for what people read and copy from (notes, progress, errors): a word wider than
/// the width (a path) is never cut but put on a line of its own, which the terminal folds.
pub(crate) fn wrap_whole(text: &str, width: usize) -> String {
    fill(text, width, Cut::Never)
}

/// Whether a word wider than the line is cut.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Cut {
    Words,
    Never,
}

/// The indent of a continuation line.
const INDENT: &str = "  ";

fn fill(text: &str, width: usize, cut: Cut) -> String {
    let width = width.max(INDENT.len() + 1);
    let mut out = String::with_capacity(text.len() + 16);
    for (n, line) in text.split('\n').enumerate() {
        if n > 0 {
            out.push('\n');
        }
        if visible_width(line) <= width {
            out.push_str(line);
            continue;
        }
        // A line of parts (`state · range · reprocess none`) breaks between its parts first,
        // so that a part stays whole where it fits on a line.
        let mut used = 0;
        for (k, part) in line.split(SEPARATOR).enumerate() {
            let w = visible_width(part);
            if k > 0 && used + visible_width(SEPARATOR) + w <= width {
                out.push_str(SEPARATOR);
                used += visible_width(SEPARATOR);
            } else if k > 0 {
                out.push('\n');
                out.push_str(INDENT);
                out.push_str("· ");
                used = INDENT.len() + 2;
            }
            words(part, width, cut, &mut out, &mut used);
        }
    }
    out
}

/// What separates the parts of a line (see [`wrap`]).
const SEPARATOR: &str = " · ";

/// `text`'s words: split at spaces, but a span from a word that opens a backquote to the word
/// that closes it is one word.
fn tokens(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut open: Option<String> = None;
    for word in text.split(' ') {
        match open.take() {
            Some(mut span) => {
                span.push(' ');
                span.push_str(word);
                if word.contains('`') {
                    out.push(span);
                } else {
                    open = Some(span);
                }
            }
            None if word.matches('`').count() % 2 == 1 => open = Some(word.to_string()),
            None => out.push(word.to_string()),
        }
    }
    // A backquote never closed: its words stay words.
    if let Some(span) = open {
        out.extend(span.split(' ').map(String::from));
    }
    out
}

/// Writes `text` onto `out`, whose last line is `used` columns wide, wrapped at spaces to
/// `width` (see [`wrap`]).
fn words(text: &str, width: usize, cut: Cut, out: &mut String, used: &mut usize) {
    for (k, word) in tokens(text).iter().enumerate() {
        let w = visible_width(word);
        if k > 0 && *used + 1 + w <= width {
            out.push(' ');
            *used += 1;
        } else if k > 0 {
            out.push('\n');
            out.push_str(INDENT);
            *used = INDENT.len();
        }
        if cut == Cut::Never {
            out.push_str(word);
            *used += w;
            continue;
        }
        // A colour code goes with the character after it (a reset, with the one before),
        // so that a cut word keeps each character's colour.
        let mut held = String::new();
        for (piece, pw) in pieces(word) {
            if pw == 0 && !matches!(piece, "\x1b[0m" | "\x1b[m") {
                held.push_str(piece);
                continue;
            }
            if pw > 0 && *used + pw > width {
                out.push('\n');
                out.push_str(INDENT);
                *used = INDENT.len();
            }
            out.push_str(&held);
            held.clear();
            out.push_str(piece);
            *used += pw;
        }
        out.push_str(&held);
    }
}

/// How many columns `text` takes on a terminal: its characters' widths (two for a wide one, none
/// for a combining mark, eight for a tab at most), less its colour codes.
pub(crate) fn visible_width(text: &str) -> usize {
    pieces(text).map(|(_, w)| w).sum()
}

/// `text` as its characters, each with its width, and its ANSI escape sequences (`ESC [`, then
/// parameters, up to a final byte from `@` to `~`; width 0), in order.
fn pieces(text: &str) -> impl Iterator<Item = (&str, usize)> {
    use unicode_width::UnicodeWidthChar;
    let mut rest = text;
    std::iter::from_fn(move || {
        let c = rest.chars().next()?;
        let (len, width) = match rest.strip_prefix("\x1b[") {
            Some(code) => {
                let end = code
                    .find(|c: char| ('@'..='~').contains(&c))
                    .map_or(code.len(), |k| k + 1);
                (2 + end, 0)
            }
            None if c == '\t' => (1, 8),
            None => (c.len_utf8(), c.width().unwrap_or(0)),
        };
        let (piece, after) = rest.split_at(len);
        rest = after;
        Some((piece, width))
    })
}

pub use crate::words::{hint, plural, set_invocation, shell_word};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_holds_a_positive_width_or_nothing() {
        assert_eq!(columns(Some("120")), Some(120));
        assert_eq!(columns(Some(" 80\n")), Some(80));
        assert_eq!(columns(Some("0")), None);
        assert_eq!(columns(Some("wide")), None);
        assert_eq!(columns(None), None);
    }

    #[test]
    fn wrap_keeps_every_word_and_no_line_is_wider_than_asked() {
        let text = "created 2026-01-05T10:00:00Z · finished 2026-01-05T10:01:00Z · 4 intervals: 4 to run (2 succeeded, 1 failed)";
        let wrapped = wrap(text, 40);
        assert!(
            wrapped.lines().all(|l| l.chars().count() <= 40),
            "{wrapped}"
        );
        let words = |t: &str| t.split_whitespace().collect::<Vec<_>>().join(" ");
        assert_eq!(words(&wrapped), words(text));
        assert_eq!(wrap("short", 40), "short");
        assert_eq!(
            wrap(&"x".repeat(25), 10),
            "xxxxxxxxxx\n  xxxxxxxx\n  xxxxxxx"
        );
    }

    #[test]
    fn what_people_copy_is_never_cut() {
        let path = "/tmp/project/.backfill/logs/sales/export/20260102T230000Z.run3.try1.log";
        let note = format!("failed 2026-01-03: as written above; log: {path}");
        assert_eq!(
            wrap_whole(&note, 40),
            format!("failed 2026-01-03: as written above;\n  log:\n  {path}")
        );
        // A command between backquotes is one word, however wide.
        let rerun =
            "rerun the failures with `backfill create --dag sales --reprocess-behavior failed`";
        assert_eq!(
            wrap_whole(rerun, 30),
            "rerun the failures with\n  `backfill create --dag sales --reprocess-behavior failed`"
        );
        // A backquote never closed leaves the words as they are.
        assert_eq!(wrap_whole("a `b c d e f", 6), "a `b c\n  d e\n  f");
    }

    #[test]
    fn widths_are_the_terminals() {
        assert_eq!(visible_width("日本"), 4);
        assert_eq!(visible_width("e\u{301}"), 1);
        assert_eq!(visible_width("a\tb"), 10);
        // A code ends at its final byte, whatever it is (a bracketed paste mark here).
        assert_eq!(visible_width("\x1b[200~text"), 4);
        assert_eq!(visible_width("\x1b[1;31mred\x1b[0m"), 3);
    }

    #[test]
    fn a_line_of_parts_breaks_between_its_parts() {
        let header = "backfill 1 of sales: failed · 2026-01-01 to 2026-01-04 · reprocess none · max active runs 1";
        assert_eq!(
            wrap(header, 60),
            "backfill 1 of sales: failed · 2026-01-01 to 2026-01-04\n  · reprocess none · max active runs 1"
        );
        // A part wider than the line wraps at its words.
        let long = format!("short · {}", "word ".repeat(12).trim_end());
        let wrapped = wrap(&long, 20);
        assert!(wrapped.lines().all(|l| visible_width(l) <= 20), "{wrapped}");
        assert!(
            wrapped.starts_with("short\n  · word word word"),
            "{wrapped}"
        );
    }

    #[test]
    fn colour_codes_take_no_width_and_are_never_cut() {
        let cell = "\x1b[32m#\x1b[0m";
        let week = cell.repeat(7);
        let line = format!("2026-09-01  {week} {week} {week} {week} {week} {week} {week} {week}");
        // 12 + 8 weeks of 7 cells and their spaces: 75 columns, one line at 80.
        assert_eq!(visible_width(&line), 75);
        assert_eq!(wrap(&line, 80), line);
        let wrapped = wrap(&line, 40);
        assert!(
            wrapped.lines().all(|l| visible_width(l) <= 40),
            "{wrapped:?}"
        );
        assert_eq!(wrapped.matches(cell).count(), 56, "{wrapped:?}");
        assert_eq!(wrap(&cell.repeat(12), 5).matches(cell).count(), 12);
        assert!(
            wrap(&cell.repeat(12), 5)
                .lines()
                .all(|l| visible_width(l) <= 5)
        );
    }

    #[test]
    fn a_closed_pipe_is_its_own_error() {
        struct Closed;
        impl Write for Closed {
            fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
                Err(std::io::ErrorKind::BrokenPipe.into())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut sink = Sink::new(Closed, std::io::sink(), false, Fit::default());
        assert!(matches!(sink.line("x"), Err(Error::ClosedPipe)));
        assert!(matches!(sink.json(&[1, 2]), Err(Error::ClosedPipe)));
        let mut sink = Sink::new(Vec::new(), Closed, false, Fit::default());
        sink.note("a closed stderr is ignored");
    }
}
