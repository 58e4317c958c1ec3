//! The bind parameters of SQL tasks: which a statement uses (see
//! [`crate::warehouse::labels`]), and the statement rewritten for PostgreSQL.
//!
//! SQL tasks are written with SQLite's named parameters (`:ds`, `:data_interval_start`, ...)
//! whatever their warehouse, so that one task file reads the same everywhere. PostgreSQL only
//! knows positional parameters (`$1`, `$2`, ...), so a statement for a PostgreSQL warehouse is
//! rewritten once: each known name becomes `$k` and the values are bound, never spliced into
//! the SQL text.
//!
//! The rewrite is a lexer over the statement's bytes, not a pattern match, because a `:` means
//! a parameter only in code: PostgreSQL also writes casts (`x::date`), array slices
//! (`a[1:2]`), and `:` may appear in string literals (`'it''s'`, `E'\''`), quoted
//! identifiers, line and (nested) block comments, and dollar-quoted bodies (`$fn$ ... $fn$`).
//! Every byte that is not a parameter is kept exactly as it was. A statement whose string,
//! comment or dollar quote is never closed keeps its tail unchanged: PostgreSQL reports that
//! syntax error itself, with its own position, better than a guess here could.
//!
//! All the bytes the lexer acts on are ASCII, and every byte of a multi-byte UTF-8 character
//! is at least 0x80, so each cut of the statement falls on a character boundary.

use std::fmt;

/// A named parameter of a SQL task.
///
/// The same five names as the SQLite warehouse's binds, so that a task reads the same for
/// either kind of warehouse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Param {
    /// `:data_interval_start`: the first instant of the interval.
    DataIntervalStart,
    /// `:data_interval_end`: the first instant after the interval.
    DataIntervalEnd,
    /// `:ds`: the local date (DAG timezone) of the interval's start.
    Ds,
    /// `:next_ds`: the local date of the interval's end.
    NextDs,
    /// `:ds_nodash`: `:ds` without its dashes, for names like `events_20260901`.
    DsNodash,
}

impl Param {
    /// Every parameter, in the order the error messages list them.
    pub(crate) const ALL: [Param; 5] = [
        Self::DataIntervalStart,
        Self::DataIntervalEnd,
        Self::Ds,
        Self::NextDs,
        Self::DsNodash,
    ];

    /// The name as a task writes it, with its `:`: what the lexer matches and what the error
    /// messages show.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::DataIntervalStart => ":data_interval_start",
            Self::DataIntervalEnd => ":data_interval_end",
            Self::Ds => ":ds",
            Self::NextDs => ":next_ds",
            Self::DsNodash => ":ds_nodash",
        }
    }

    /// The PostgreSQL type the statement is prepared with for this parameter: declaring it
    /// makes `:ds` compare as a date and `:data_interval_start` as an instant, where an
    /// untyped parameter would take whatever type PostgreSQL infers from its first use (or
    /// fail to infer one, as in `SELECT :ds`).
    pub(crate) fn pg_type(self) -> &'static str {
        match self {
            Self::DataIntervalStart | Self::DataIntervalEnd => "timestamptz",
            Self::Ds | Self::NextDs => "date",
            Self::DsNodash => "text",
        }
    }

    /// The parameter a task wrote as `name` (with its `:`); names are case-sensitive, as in
    /// SQLite.
    fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == name)
    }
}

/// A statement rewritten for PostgreSQL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Positional {
    /// The statement with each named parameter replaced by `$k`, every other byte as it was.
    pub sql: String,
    /// What to bind: `$first` is `params[0]`, `$first + 1` is `params[1]`, ... Each distinct
    /// name appears once, in the order of its first use, and every use of a name shares its
    /// number, so that a value is bound once however often the statement uses it.
    pub params: Vec<Param>,
}

/// Where and why a statement could not be rewritten.
///
/// The offset lets the caller point at the `file:line:col` of the offending parameter inside
/// the task's SQL, as the SQLite warehouse's checks do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ParamError {
    /// Byte offset in the input of the offending parameter's first byte: the `:` of an
    /// unknown name, or the `$` of a positional parameter.
    pub offset: usize,
    /// What is wrong, and what to write instead.
    pub message: String,
}

impl fmt::Display for ParamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ParamError {}

/// Rewrites a statement's named parameters as `$1..$n`.
///
/// An unknown `:name` and a positional `$k` in code are errors (a positional parameter would
/// have no value: only the named ones are bound). Parameters in strings, quoted identifiers,
/// comments and dollar quotes are text and stay as they are.
#[cfg(test)]
pub(crate) fn positional(sql: &str) -> Result<Positional, ParamError> {
    positional_from(sql, 1)
}

/// Rewrites a statement's named parameters as `$first..`, for a statement that is wrapped in
/// one that binds its own parameters first (`$1..$first - 1`). `first` is meant to be at
/// least 1 (PostgreSQL has no `$0`); a number past `usize::MAX` is an error.
pub(crate) fn positional_from(sql: &str, first: usize) -> Result<Positional, ParamError> {
    Lexer::new(sql, first).run()
}

/// An open `(` or `[`, innermost last: whether a `:` may start a parameter depends on the
/// innermost one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Group {
    /// `(`: a parameter may appear, even inside a subscript (`a[f(:ds)]`).
    Paren,
    /// `[` after an expression: a subscript or slice (`a[1:2]`, `a[lo:hi]`), whose `:` is
    /// PostgreSQL's slice, not a parameter.
    Subscript,
    /// `[` of an array constructor (`ARRAY[:ds, :next_ds]`, and the `[` of its nested rows):
    /// its elements are expressions that may be parameters.
    Array,
}

/// The last token in code before the current one (whitespace and comments are skipped), to
/// tell an array constructor's `[` from a subscript's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Prev {
    /// An identifier, keyword or number; `array` is the `ARRAY` keyword in any case.
    Word { array: bool },
    /// `[` or `,`: a `[` right after one of these inside a constructor opens a nested row.
    Separator,
    /// Anything else, or nothing yet.
    Other,
}

/// The rewrite of one statement.
struct Lexer<'a> {
    sql: &'a str,
    bytes: &'a [u8],
    /// Where the next token starts.
    pos: usize,
    /// The input up to here is in `out` already.
    copied: usize,
    out: String,
    first: usize,
    params: Vec<Param>,
    groups: Vec<Group>,
    prev: Prev,
}

impl<'a> Lexer<'a> {
    fn new(sql: &'a str, first: usize) -> Self {
        Self {
            sql,
            bytes: sql.as_bytes(),
            pos: 0,
            copied: 0,
            out: String::with_capacity(sql.len()),
            first,
            params: Vec::new(),
            groups: Vec::new(),
            prev: Prev::Other,
        }
    }

    fn at(&self, i: usize) -> Option<u8> {
        self.bytes.get(i).copied()
    }

    fn run(mut self) -> Result<Positional, ParamError> {
        while let Some(b) = self.at(self.pos) {
            let next = self.at(self.pos + 1);
            match (b, next) {
                (b'\'', _) => {
                    self.pos = self.skip_string(self.pos + 1, false);
                    self.prev = Prev::Other;
                }
                (b'"', _) => {
                    self.pos = self.skip_quoted_identifier(self.pos + 1);
                    self.prev = Prev::Other;
                }
                (b'-', Some(b'-')) => self.pos = self.skip_line_comment(self.pos + 2),
                (b'/', Some(b'*')) => self.pos = self.skip_block_comment(self.pos + 2),
                (b'$', _) => self.dollar()?,
                (b':', _) => self.colon()?,
                (b'(', _) => {
                    self.groups.push(Group::Paren);
                    self.pos += 1;
                    self.prev = Prev::Other;
                }
                (b'[', _) => self.open_bracket(),
                (b')', _) => self.close(Group::Paren),
                (b']', _) => self.close(Group::Subscript),
                (b',', _) => {
                    self.pos += 1;
                    self.prev = Prev::Separator;
                }
                _ if is_word(b) => self.word(),
                _ if b.is_ascii_whitespace() => self.pos += 1,
                _ => {
                    self.pos += 1;
                    self.prev = Prev::Other;
                }
            }
        }
        self.out.push_str(&self.sql[self.copied..]);
        Ok(Positional {
            sql: self.out,
            params: self.params,
        })
    }

    /// The end of a string literal whose body starts at `i`: after its closing quote, or the
    /// end of the input when it is never closed. A doubled quote is a quote; in an E-string a
    /// backslash escapes the next byte (a multi-byte character's other bytes are never a
    /// quote or a backslash, so skipping one byte of it is enough).
    fn skip_string(&self, mut i: usize, backslash_escapes: bool) -> usize {
        while let Some(b) = self.at(i) {
            match b {
                b'\\' if backslash_escapes => i += 2,
                b'\'' if self.at(i + 1) == Some(b'\'') => i += 2,
                b'\'' => return i + 1,
                _ => i += 1,
            }
        }
        self.bytes.len()
    }

    /// The end of a quoted identifier whose body starts at `i` (`""` is a quote in it).
    fn skip_quoted_identifier(&self, mut i: usize) -> usize {
        while let Some(b) = self.at(i) {
            match b {
                b'"' if self.at(i + 1) == Some(b'"') => i += 2,
                b'"' => return i + 1,
                _ => i += 1,
            }
        }
        self.bytes.len()
    }

    /// The end of a line comment whose text starts at `i`: its line break, which is code again.
    fn skip_line_comment(&self, i: usize) -> usize {
        self.bytes
            .get(i..)
            .and_then(|rest| rest.iter().position(|&b| b == b'\n' || b == b'\r'))
            .map_or(self.bytes.len(), |n| i + n)
    }

    /// The end of a block comment whose text starts at `i`. Block comments nest in PostgreSQL
    /// (unlike SQLite): `/* /* */ :ds */` is one comment.
    fn skip_block_comment(&self, mut i: usize) -> usize {
        let mut depth = 1_usize;
        while let Some(b) = self.at(i) {
            match (b, self.at(i + 1)) {
                (b'/', Some(b'*')) => {
                    depth += 1;
                    i += 2;
                }
                (b'*', Some(b'/')) => {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        return i;
                    }
                }
                _ => i += 1,
            }
        }
        self.bytes.len()
    }

    /// An identifier, keyword or number, and an E-string when it is a lone `E` right before a
    /// quote (the `e` of `some'x'` or of `1e'x'` does not start one).
    fn word(&mut self) {
        let start = self.pos;
        let end = self.end_of(start, is_word);
        let word = &self.bytes[start..end];
        if matches!(word, b"E" | b"e") && self.at(end) == Some(b'\'') {
            self.pos = self.skip_string(end + 1, true);
            self.prev = Prev::Other;
        } else {
            self.pos = end;
            self.prev = Prev::Word {
                array: word.eq_ignore_ascii_case(b"array"),
            };
        }
    }

    /// `$` in code: a positional parameter (an error), a dollar quote, or a lone `$`. It is
    /// never part of an identifier here, as `word` takes the `$`s inside identifiers (`a$1`).
    fn dollar(&mut self) -> Result<(), ParamError> {
        let start = self.pos;
        self.prev = Prev::Other;
        if self.at(start + 1).is_some_and(|b| b.is_ascii_digit()) {
            let end = self.end_of(start + 1, |b| b.is_ascii_digit());
            return Err(ParamError {
                offset: start,
                message: format!(
                    "use the named parameters {} instead of `{}`",
                    known_names(),
                    &self.sql[start..end]
                ),
            });
        }
        let mut tag_end = start + 1;
        if self.at(tag_end).is_some_and(is_tag_start) {
            tag_end = self.end_of(tag_end, is_tag_char);
        }
        if self.at(tag_end) != Some(b'$') {
            self.pos = start + 1;
            return Ok(());
        }
        let body = tag_end + 1;
        let delimiter = &self.bytes[start..body];
        self.pos = self
            .bytes
            .get(body..)
            .and_then(|rest| rest.windows(delimiter.len()).position(|w| w == delimiter))
            .map_or(self.bytes.len(), |n| body + n + delimiter.len());
        Ok(())
    }

    /// `:` in code: a named parameter, unless it is part of `::` (a cast) or a slice's `:`.
    fn colon(&mut self) -> Result<(), ParamError> {
        let start = self.pos;
        let colons = self.end_of(start, |b| b == b':');
        self.prev = Prev::Other;
        let named = colons == start + 1
            && self.at(colons).is_some_and(is_name_start)
            && self.groups.last() != Some(&Group::Subscript);
        if !named {
            self.pos = colons;
            return Ok(());
        }
        // The name runs as far as SQLite's would (`:dsé`, `:ds$x` are one unknown name rather
        // than `:ds` followed by text), and ends before an ASCII byte or at the end.
        let end = self.end_of(colons, is_word);
        let name = &self.sql[start..end];
        let param = Param::from_name(name).ok_or_else(|| ParamError {
            offset: start,
            message: format!("unknown bind parameter `{name}`; use {}", known_names()),
        })?;
        let index = match self.params.iter().position(|&p| p == param) {
            Some(index) => index,
            None => {
                self.params.push(param);
                self.params.len() - 1
            }
        };
        let number = self.first.checked_add(index).ok_or_else(|| ParamError {
            offset: start,
            message: format!(
                "`{name}` would be parameter number {} + {index}, which is too large",
                self.first
            ),
        })?;
        self.out.push_str(&self.sql[self.copied..start]);
        // `SELECT:ds` is a keyword and a parameter to SQLite; `SELECT$1` would be one
        // identifier to PostgreSQL.
        if self
            .out
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$')
        {
            self.out.push(' ');
        }
        self.out.push('$');
        self.out.push_str(&number.to_string());
        self.copied = end;
        self.pos = end;
        Ok(())
    }

    /// `[`: an array constructor's after `ARRAY` (or right inside one, for its nested rows),
    /// otherwise a subscript.
    fn open_bracket(&mut self) {
        let array = match self.prev {
            Prev::Word { array } => array,
            Prev::Separator => self.groups.last() == Some(&Group::Array),
            Prev::Other => false,
        };
        self.groups.push(if array {
            Group::Array
        } else {
            Group::Subscript
        });
        self.pos += 1;
        self.prev = Prev::Separator;
    }

    /// `)` or `]` (`kind` is `Paren` or `Subscript`): closes the innermost group of its kind
    /// and whatever unclosed groups are inside it. A stray one closes nothing.
    fn close(&mut self, kind: Group) {
        let matches = |g: &Group| match kind {
            Group::Paren => *g == Group::Paren,
            Group::Subscript | Group::Array => *g != Group::Paren,
        };
        if let Some(i) = self.groups.iter().rposition(matches) {
            self.groups.truncate(i);
        }
        self.pos += 1;
        self.prev = Prev::Other;
    }

    /// Where the run of bytes matching `f` that starts at `i` ends.
    fn end_of(&self, i: usize, f: impl Fn(u8) -> bool) -> usize {
        self.bytes
            .get(i..)
            .and_then(|rest| rest.iter().position(|&b| !f(b)))
            .map_or(self.bytes.len(), |n| i + n)
    }
}

/// A byte of an identifier or number: ASCII letters, digits, `_`, `$`, and every byte of a
/// non-ASCII character (which PostgreSQL and SQLite both take as letters).
fn is_word(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'$' || b >= 0x80
}

/// A byte that may start a parameter's name: a letter or `_` (`:1` is not a name).
fn is_name_start(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_' || b >= 0x80
}

/// A byte that may start a dollar quote's tag (not a digit: `$1` is a parameter).
fn is_tag_start(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_' || b >= 0x80
}

/// A byte of a dollar quote's tag (no `$`: it ends the tag).
fn is_tag_char(b: u8) -> bool {
    is_tag_start(b) || b.is_ascii_digit()
}

/// `:data_interval_start, :data_interval_end, :ds, :next_ds, :ds_nodash`, for the messages.
fn known_names() -> String {
    Param::ALL.map(Param::name).join(", ")
}

#[cfg(test)]
mod tests;
