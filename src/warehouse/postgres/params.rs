//! The bind parameters of SQL tasks, rewritten for PostgreSQL.
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
pub enum Param {
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
    pub const ALL: [Param; 5] = [
        Self::DataIntervalStart,
        Self::DataIntervalEnd,
        Self::Ds,
        Self::NextDs,
        Self::DsNodash,
    ];

    /// The name as a task writes it, with its `:`: what the lexer matches and what the error
    /// messages show.
    pub fn name(self) -> &'static str {
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
    pub fn pg_type(self) -> &'static str {
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
pub struct Positional {
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
pub struct ParamError {
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
pub fn positional(sql: &str) -> Result<Positional, ParamError> {
    positional_from(sql, 1)
}

/// Rewrites a statement's named parameters as `$first..`, for a statement that is wrapped in
/// one that binds its own parameters first (`$1..$first - 1`). `first` is meant to be at
/// least 1 (PostgreSQL has no `$0`); a number past `usize::MAX` is an error.
pub fn positional_from(sql: &str, first: usize) -> Result<Positional, ParamError> {
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
mod tests {
    use super::*;
    use proptest::prelude::*;

    const KNOWN: &str = ":data_interval_start, :data_interval_end, :ds, :next_ds, :ds_nodash";

    /// The rewritten statement, or the panic message naming the input.
    fn sql(input: &str) -> String {
        positional(input)
            .unwrap_or_else(|e| panic!("{input:?}: {e:?}"))
            .sql
    }

    /// The input unchanged: nothing in it is a parameter.
    fn unchanged(input: &str) {
        assert_eq!(
            positional(input),
            Ok(Positional {
                sql: input.to_string(),
                params: vec![],
            }),
            "{input:?}"
        );
    }

    fn err(input: &str) -> ParamError {
        positional(input).expect_err(input)
    }

    /// Each `$k` of the output (`k` counted from `first`) back as its name: the input again,
    /// when the input itself has no `$` followed by a digit.
    fn named(p: &Positional, first: usize) -> String {
        let mut out = String::new();
        let mut rest = p.sql.as_str();
        while let Some(i) = rest.find('$') {
            out.push_str(&rest[..i]);
            let digits = rest[i + 1..]
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len() - i - 1);
            if digits == 0 {
                out.push('$');
            } else {
                let k: usize = rest[i + 1..i + 1 + digits].parse().unwrap();
                out.push_str(p.params[k - first].name());
            }
            rest = &rest[i + 1 + digits..];
        }
        out.push_str(rest);
        out
    }

    /// The distinct numbers `$k` in a statement.
    fn numbers(sql: &str) -> std::collections::BTreeSet<usize> {
        let mut found = std::collections::BTreeSet::new();
        for (i, _) in sql.match_indices('$') {
            let digits: String = sql[i + 1..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            if let Ok(k) = digits.parse() {
                found.insert(k);
            }
        }
        found
    }

    fn has_positional(input: &str) -> bool {
        input
            .as_bytes()
            .windows(2)
            .any(|w| w[0] == b'$' && w[1].is_ascii_digit())
    }

    #[test]
    fn a_parameter_right_after_a_word_stays_a_parameter() {
        let p = positional("SELECT:ds, CASE WHEN x THEN:next_ds END").unwrap();
        assert_eq!(p.sql, "SELECT $1, CASE WHEN x THEN $2 END");
    }

    #[test]
    fn names_and_types() {
        let table: Vec<_> = Param::ALL.map(|p| (p.name(), p.pg_type())).into();
        assert_eq!(
            table,
            [
                (":data_interval_start", "timestamptz"),
                (":data_interval_end", "timestamptz"),
                (":ds", "date"),
                (":next_ds", "date"),
                (":ds_nodash", "text"),
            ]
        );
        for p in Param::ALL {
            assert_eq!(Param::from_name(p.name()), Some(p));
        }
        assert_eq!(Param::from_name("ds"), None);
        assert_eq!(Param::from_name(":DS"), None);
    }

    #[test]
    fn every_parameter_becomes_a_number_in_order_of_first_use() {
        let got = positional(
            "SELECT * FROM t WHERE ts >= :data_interval_start AND ts < :data_interval_end \
             AND d BETWEEN :ds AND :next_ds AND s = :ds_nodash",
        )
        .unwrap();
        assert_eq!(
            got.sql,
            "SELECT * FROM t WHERE ts >= $1 AND ts < $2 AND d BETWEEN $3 AND $4 AND s = $5"
        );
        assert_eq!(got.params, Param::ALL);
    }

    #[test]
    fn repeated_names_share_a_number() {
        let got = positional(":next_ds, :ds, :next_ds, :ds,:ds").unwrap();
        assert_eq!(got.sql, "$1, $2, $1, $2,$2");
        assert_eq!(got.params, [Param::NextDs, Param::Ds]);
    }

    #[test]
    fn numbering_starts_at_first() {
        let got = positional_from("x = :ds AND y = :next_ds OR z = :ds", 3).unwrap();
        assert_eq!(got.sql, "x = $3 AND y = $4 OR z = $3");
        assert_eq!(got.params, [Param::Ds, Param::NextDs]);
        assert_eq!(positional("a :ds"), positional_from("a :ds", 1));
        assert_eq!(positional_from("no params", 7).unwrap().sql, "no params");
    }

    #[test]
    fn a_number_past_usize_max_is_an_error_not_a_panic() {
        let max = usize::MAX;
        assert_eq!(positional_from(":ds", max).unwrap().sql, format!("${max}"));
        let e = positional_from(":ds, :next_ds", max).unwrap_err();
        assert_eq!(e.offset, 5);
        assert!(e.message.contains("too large"), "{e}");
    }

    #[test]
    fn casts_are_not_parameters() {
        assert_eq!(sql(":ds::date"), "$1::date");
        assert_eq!(sql("(:ds)::date + 1"), "($1)::date + 1");
        assert_eq!(sql("x::text = :ds_nodash"), "x::text = $1");
        unchanged("x::text");
        unchanged("'2026-01-01'::date");
        unchanged("x::timestamptz::date");
        unchanged("x :: date");
        unchanged("x:::ds");
        unchanged("x::::ds");
        assert_eq!(sql(":ds:: date"), "$1:: date");
    }

    #[test]
    fn colons_that_start_no_name_stay() {
        unchanged("f(a := 1, b => 2)");
        unchanged("SELECT :1, : ds, ':'");
        unchanged("x:");
        unchanged(":");
        unchanged("data ? 'key' AND data ?| array['a']");
    }

    #[test]
    fn string_literals_are_text() {
        unchanged("'a:ds'");
        unchanged("'it''s :ds'");
        unchanged("'' || ':ds' || ''''");
        assert_eq!(sql("'it''s' || :ds || 'x:ds'"), "'it''s' || $1 || 'x:ds'");
        unchanged("U&':ds' N':ds' B'01' X':ds'");
        unchanged("'$1' || '$$'");
    }

    #[test]
    fn escape_strings_use_backslashes() {
        unchanged(r"E'\':ds'");
        unchanged(r"e'\' :ds'");
        unchanged(r"E'\\'':ds'");
        assert_eq!(sql(r"E'\\' || :ds"), r"E'\\' || $1");
        assert_eq!(sql(r"E'a\'b' = :ds"), r"E'a\'b' = $1");
        // Not an E-string: the `e` ends an identifier, or is part of a number.
        assert_eq!(sql(r"some'\' || :ds || '\'"), r"some'\' || $1 || '\'");
        assert_eq!(sql(r"xE'\' :ds"), r"xE'\' $1");
        assert_eq!(sql(r"1e'\' :ds"), r"1e'\' $1");
    }

    #[test]
    fn quoted_identifiers_are_text() {
        unchanged(r#""col:ds""#);
        unchanged(r#""a"":ds""#);
        assert_eq!(sql(r#""a""b" = :ds"#), r#""a""b" = $1"#);
        assert_eq!(sql(r#""x'" = :ds"#), r#""x'" = $1"#);
    }

    #[test]
    fn line_comments_are_text_to_the_end_of_the_line() {
        assert_eq!(sql("-- :ds\n:ds"), "-- :ds\n$1");
        assert_eq!(sql("-- :ds\r:ds"), "-- :ds\r$1");
        assert_eq!(sql("x -- ' :ds\n= :ds -- :dss"), "x -- ' :ds\n= $1 -- :dss");
        unchanged("-- :ds");
        assert_eq!(sql("1 - -:ds"), "1 - -$1");
    }

    #[test]
    fn block_comments_nest() {
        unchanged("/* :ds */");
        assert_eq!(sql("/* /* :ds */ :ds */ :ds"), "/* /* :ds */ :ds */ $1");
        assert_eq!(sql("/* ' */ :ds /* \" */"), "/* ' */ $1 /* \" */");
        assert_eq!(sql("/**/:ds/***/"), "/**/$1/***/");
        assert_eq!(sql("/*/ :ds */ :ds"), "/*/ :ds */ $1");
        assert_eq!(sql("a/:ds"), "a/$1");
    }

    #[test]
    fn dollar_quotes_are_text() {
        unchanged("$$ :ds $$");
        unchanged("$fn$ :ds $fn$");
        unchanged("$fn$ $$ :ds $$ $fn$");
        unchanged("$_1é$ :ds '$1 $_1é$");
        assert_eq!(sql("$$ :ds $$ || :ds"), "$$ :ds $$ || $1");
        assert_eq!(sql("$a$ :ds $b$ :ds $a$ :ds"), "$a$ :ds $b$ :ds $a$ $1");
        // A closing tag may follow other text right away.
        assert_eq!(sql("$a$ x$a$ :ds"), "$a$ x$a$ $1");
        assert_eq!(sql("$a$ $xa$ :ds $a$ :ds"), "$a$ $xa$ :ds $a$ $1");
        // `$` inside an identifier starts no quote.
        assert_eq!(sql("a$$ :ds"), "a$$ $1");
        assert_eq!(sql("a$b$ :ds"), "a$b$ $1");
        assert_eq!(sql("$ :ds"), "$ $1");
        assert_eq!(sql("$x :ds"), "$x $1");
    }

    #[test]
    fn positional_parameters_are_an_error_in_code_only() {
        let e = err("SELECT $1");
        assert_eq!(e.offset, 7);
        assert_eq!(
            e.message,
            format!("use the named parameters {KNOWN} instead of `$1`")
        );
        assert_eq!(e.to_string(), e.message);
        let e = err(":ds + $12::int");
        assert_eq!(e.offset, 6);
        assert!(e.message.ends_with("instead of `$12`"), "{e}");
        assert_eq!(err("a[$1:2]").offset, 2);
        unchanged("'$1' \"$1\" -- $1\n/* $1 */ $$ $1 $$ E'\\'$1'");
        unchanged("a$1 + b$2");
    }

    #[test]
    fn unknown_names_are_an_error_at_their_colon() {
        let e = err("SELECT * FROM t WHERE d = :dss");
        assert_eq!(
            e,
            ParamError {
                offset: 26,
                message: format!("unknown bind parameter `:dss`; use {KNOWN}"),
            }
        );
        assert_eq!(err(":ds = :DS").offset, 6);
        assert_eq!(err("'é' || :été").offset, 8);
        assert!(err("'é' || :été").message.contains("`:été`"));
        // The name runs on as SQLite's does.
        assert!(err(":dsé").message.contains("`:dsé`"));
        assert!(err(":ds$x").message.contains("`:ds$x`"));
        assert!(err(":ds_").message.contains("`:ds_`"));
        assert!(err(":ds1").message.contains("`:ds1`"));
    }

    #[test]
    fn the_first_problem_is_reported() {
        assert_eq!(err(":nope $1").offset, 0);
        assert_eq!(err("$1 :nope").offset, 0);
    }

    #[test]
    fn slices_are_not_parameters() {
        unchanged("a[1:2]");
        unchanged("a[lo:hi]");
        unchanged("a[:hi] || a[lo:] || a[:]");
        unchanged("a[1:2][3:n]");
        unchanged("(f(x))[lo:hi]");
        unchanged("'{}'::int[] || a[x[1]:y]");
        assert_eq!(sql("a[1:2] = :ds"), "a[1:2] = $1");
        assert_eq!(sql("a[f(:ds):2]"), "a[f($1):2]");
        assert_eq!(sql("a[1:2)] = :ds"), "a[1:2)] = $1");
    }

    #[test]
    fn array_constructors_take_parameters() {
        assert_eq!(
            sql("d = ANY(ARRAY[:ds, :next_ds])"),
            "d = ANY(ARRAY[$1, $2])"
        );
        assert_eq!(sql("array [[:ds], [:next_ds]]"), "array [[$1], [$2]]");
        assert_eq!(sql("ARRAY[:ds, a[1:n]]"), "ARRAY[$1, a[1:n]]");
        assert_eq!(sql("ARRAY[:ds][1:n]"), "ARRAY[$1][1:n]");
        assert_eq!(sql("a[ARRAY[:ds]]"), "a[ARRAY[$1]]");
        unchanged("my_array[1:n]");
    }

    #[test]
    fn non_ascii_text_is_kept_byte_for_byte() {
        assert_eq!(
            sql("SELECT 'é' AS été, \"ü:ds\" FROM 日本 WHERE d = :ds -- ☃ :ds\n/* ✓ */"),
            "SELECT 'é' AS été, \"ü:ds\" FROM 日本 WHERE d = $1 -- ☃ :ds\n/* ✓ */"
        );
        assert_eq!(sql("é:ds"), "é $1");
        assert_eq!(sql("(:ds)é"), "($1)é");
        assert_eq!(sql("$é$ :ds $é$:ds"), "$é$ :ds $é$ $1");
    }

    #[test]
    fn unterminated_quotes_keep_their_tail() {
        unchanged("'abc :ds");
        unchanged("'abc'' :ds");
        unchanged(r"E'abc\' :ds");
        unchanged("E'\\");
        unchanged("\"abc :ds");
        unchanged("/* :ds");
        unchanged("/* /* :ds */ :ds");
        unchanged("$$ :ds");
        unchanged("$fn$ :ds $fn :ds $$");
        unchanged("-- :ds");
        assert_eq!(sql(":ds 'x :ds"), "$1 'x :ds");
        assert_eq!(sql(":ds $a$ é :ds"), "$1 $a$ é :ds");
    }

    #[test]
    fn empty_and_trivial_inputs() {
        unchanged("");
        unchanged("SELECT 1");
        unchanged("'");
        unchanged("\"");
        unchanged("$");
        unchanged("/*");
        unchanged("/");
        unchanged("-");
        unchanged("E");
        unchanged("[");
        unchanged("]");
        unchanged(")");
    }

    /// A piece that uses no parameter in code.
    fn text(s: String) -> (String, Vec<Param>) {
        (s, vec![])
    }

    /// One piece of a statement, and the parameters it uses in code.
    fn piece() -> impl Strategy<Value = (String, Vec<Param>)> {
        let param = || proptest::sample::select(Param::ALL.to_vec());
        prop_oneof![
            param().prop_map(|p| (p.name().to_string(), vec![p])),
            param().prop_map(|p| (format!("{}::date", p.name()), vec![p])),
            (param(), param())
                .prop_map(|(a, b)| (format!("ARRAY[{}, ({})]", a.name(), b.name()), vec![a, b])),
            param().prop_map(|p| (format!("a[f({}):n]", p.name()), vec![p])),
            "[a-z_é][a-z0-9_é]{0,6}".prop_map(text),
            "[0-9]{1,4}".prop_map(text),
            proptest::sample::select(vec![
                "x::text",
                "'2026-01-01'::date",
                "a[1:2]",
                "a[lo:hi]",
                "f(a := 1)",
                "=",
                ",",
                "||",
                "$$ $$",
            ])
            .prop_map(|s| text(s.to_string())),
            "([a-z :é$\"*/-]|''){0,10}".prop_map(|s| text(format!("'{s}'"))),
            r"([a-z :é$]|\\'|\\\\|''){0,8}".prop_map(|s| text(format!("E'{s}'"))),
            "([a-z :é$'*/-]|\"\"){0,8}".prop_map(|s| text(format!("\"{s}\""))),
            "[a-z :é$'\"*/]{0,10}".prop_map(|s| text(format!("--{s}\n"))),
            ("[a-z :é$'\"-]{0,8}", "[a-z :é$'\"-]{0,8}")
                .prop_map(|(a, b)| text(format!("/*{a}/* {b} */{a}*/"))),
            ("(|fn|_é1)", "[a-z :é'\"*/-]{0,10}")
                .prop_map(|(tag, s)| text(format!("${tag}${s}${tag}$"))),
        ]
    }

    /// A statement of pieces separated by whitespace, and the distinct parameters it uses in
    /// code, in order of first use.
    fn statement() -> impl Strategy<Value = (String, Vec<Param>)> {
        proptest::collection::vec(
            (
                piece(),
                proptest::sample::select(vec![" ", "\n", "\t", "  "]),
            ),
            0..12,
        )
        .prop_map(|pieces| {
            let mut sql = String::new();
            let mut params = Vec::new();
            for ((text, used), sep) in pieces {
                sql.push_str(&text);
                sql.push_str(sep);
                for p in used {
                    if !params.contains(&p) {
                        params.push(p);
                    }
                }
            }
            (sql, params)
        })
    }

    /// What holds for every input: an error points at a `:` or `$` of the input, and a
    /// rewrite maps back to its input.
    fn check_any(input: &str, first: usize) -> Result<(), TestCaseError> {
        match positional_from(input, first) {
            Err(e) => {
                prop_assert!(input.is_char_boundary(e.offset));
                prop_assert!(matches!(input.as_bytes()[e.offset], b':' | b'$'), "{e:?}");
            }
            Ok(p) => {
                for (i, a) in p.params.iter().enumerate() {
                    prop_assert!(!p.params[..i].contains(a));
                }
                if !has_positional(input) {
                    // A space may go in front of a parameter right after a word.
                    let loose = |s: &str| s.replace(" :", ":");
                    prop_assert_eq!(loose(&named(&p, first)), loose(input));
                }
            }
        }
        Ok(())
    }

    proptest! {
        #[test]
        fn never_panics_on_any_string(input in any::<String>(), first in 1_usize..1000) {
            check_any(&input, first)?;
        }

        #[test]
        fn never_panics_on_sql_like_noise(
            input in "([:$'\"eE\\\\/*\\[\\](),a-z0-9_ é\n-]|:ds|:next_ds|\\$\\$|/\\*|\\*/|--){0,40}",
            first in 1_usize..4,
        ) {
            check_any(&input, first)?;
        }

        #[test]
        fn never_panics_near_usize_max(input in "[:a-z_ $1]{0,30}", back in 0_usize..6) {
            let _ = positional_from(&input, usize::MAX - back);
        }

        #[test]
        fn statements_map_back_to_their_input(
            (input, expected) in statement(),
            first in 1_usize..100,
        ) {
            let got = positional_from(&input, first)
                .map_err(|e| TestCaseError::fail(format!("{input:?}: {e:?}")))?;
            prop_assert_eq!(&got.params, &expected, "{:?} -> {:?}", input, got.sql);
            let want: std::collections::BTreeSet<_> = (first..first + expected.len()).collect();
            prop_assert_eq!(numbers(&got.sql), want, "{:?}", got.sql);
            prop_assert_eq!(named(&got, first), input.clone());
            prop_assert_eq!(positional(&input).map(|p| p.params), Ok(expected));
        }
    }
}
