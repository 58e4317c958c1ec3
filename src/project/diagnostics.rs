//! Diagnostics of the project's files: [`ConfigError`] and its `file:line:column`, the collector
//! of every error of one file (reported in file order), TOML syntax errors, unknown keys and
//! durations, all in the project's words with what to write instead.

use std::fmt;
use std::time::Duration;

use toml::Spanned;

/// A configuration problem with its location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// `path:line:col`, or just the path when the position is unknown.
    pub location: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.location, self.message)
    }
}

/// `file:line:col` of a byte offset (1-based; the column counts characters).
pub(crate) fn location(file: &str, text: &str, offset: usize) -> String {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    format!("{file}:{line}:{col}")
}

/// Where a string value is written in its file, to point at a place inside the value (a
/// mistake in a multi-line `sql` or `command`) as `file:line:col`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct StringAt {
    file: String,
    /// Line and column (1-based, in characters) of the token's first character.
    line: usize,
    col: usize,
    /// The string's token as written, delimiters included.
    token: String,
}

impl StringAt {
    /// The string token at `span` of a file.
    pub(crate) fn new(errs: &FileErrors<'_>, span: std::ops::Range<usize>) -> Self {
        let (line, col) = line_col(&errs.location(span.start));
        Self {
            file: errs.file.to_string(),
            line,
            col,
            token: errs.text.get(span).unwrap_or_default().to_string(),
        }
    }

    /// `file:line:col` of the value's start (its opening delimiter).
    pub(crate) fn start(&self) -> String {
        format!("{}:{}:{}", self.file, self.line, self.col)
    }

    /// `file:line:col` of byte `offset` of the value.
    pub(crate) fn at(&self, offset: usize) -> String {
        let raw = token_offset(&self.token, offset);
        let before = self.token.get(..raw).unwrap_or_default();
        let (line, col) = match before.rsplit_once('\n') {
            Some((above, last)) => (
                self.line + above.matches('\n').count() + 1,
                last.chars().count() + 1,
            ),
            None => (self.line, self.col + before.chars().count()),
        };
        format!("{}:{line}:{col}", self.file)
    }
}

/// The byte offset in a TOML string token as written (`"..."`, `'...'`, `"""..."""` or
/// `'''...'''`, delimiters included) of byte `offset` of the string's value: past the opening
/// delimiter and the newline that may follow a multi-line one, through escapes (`\"`, `\n`,
/// `\u00e9`) and line-ending backslashes. An offset past the value gives the token's end.
pub(crate) fn token_offset(token: &str, offset: usize) -> usize {
    let (open, basic, multi) = if token.starts_with("\"\"\"") {
        (3, true, true)
    } else if token.starts_with("'''") {
        (3, false, true)
    } else {
        (1, token.starts_with('"'), false)
    };
    let b = token.as_bytes();
    let mut raw = open.min(b.len());
    if multi {
        if b[raw..].starts_with(b"\r\n") {
            raw += 2;
        } else if b[raw..].starts_with(b"\n") {
            raw += 1;
        }
    }
    let mut value = 0;
    while raw < b.len() {
        let escape = basic && b[raw] == b'\\';
        if escape && b.get(raw + 1).is_some_and(u8::is_ascii_whitespace) {
            // A line-ending backslash: the newline and the blanks after it are not in the value.
            raw += 1;
            while raw < b.len() && b[raw].is_ascii_whitespace() {
                raw += 1;
            }
            continue;
        }
        if value >= offset {
            break;
        }
        if !escape {
            let len = token
                .get(raw..)
                .and_then(|t| t.chars().next())
                .map_or(1, char::len_utf8);
            raw += len;
            value += len;
            continue;
        }
        let escape = b.get(raw + 1).copied().unwrap_or(b'\\');
        let hex = match escape {
            b'x' => 2,
            b'u' => 4,
            b'U' => 8,
            _ => 0,
        };
        if hex > 0 {
            let code = token
                .get(raw + 2..raw + 2 + hex)
                .and_then(|h| u32::from_str_radix(h, 16).ok())
                .and_then(char::from_u32);
            raw += 2 + hex;
            value += code.map_or(1, char::len_utf8);
        } else {
            raw += 2;
            value += 1;
        }
    }
    raw.min(b.len())
}

/// The line and column of a `file:line:col` location, for ordering; `(0, 0)` without them.
pub(crate) fn line_col(location: &str) -> (usize, usize) {
    let mut parts = location.rsplitn(3, ':');
    let col = parts.next().and_then(|c| c.parse().ok());
    let line = parts.next().and_then(|l| l.parse().ok());
    match (line, col) {
        (Some(line), Some(col)) if parts.next().is_some() => (line, col),
        _ => (0, 0),
    }
}

/// Every error found in one file, each with its byte offset so that they are reported in the
/// order of the file.
pub(crate) struct FileErrors<'a> {
    pub(crate) file: &'a str,
    pub(crate) text: &'a str,
    found: Vec<(usize, ConfigError)>,
}

impl<'a> FileErrors<'a> {
    pub(crate) fn new(file: &'a str, text: &'a str) -> Self {
        Self {
            file,
            text,
            found: Vec::new(),
        }
    }

    /// An error at a byte offset of the file.
    pub(crate) fn at_offset(&mut self, offset: usize, message: impl Into<String>) {
        let location = self.location(offset);
        self.found.push((
            offset,
            ConfigError {
                location,
                message: message.into(),
            },
        ));
    }

    /// An error at the start of a spanned value or key.
    pub(crate) fn at<T>(&mut self, spanned: &Spanned<T>, message: impl Into<String>) {
        self.at_offset(spanned.span().start, message);
    }

    /// An error about the whole file, reported before those with a position.
    pub(crate) fn in_file(&mut self, message: impl Into<String>) {
        self.found.push((
            0,
            ConfigError {
                location: self.file.to_string(),
                message: message.into(),
            },
        ));
    }

    /// `file:line:col` of a byte offset of this file.
    pub(crate) fn location(&self, offset: usize) -> String {
        location(self.file, self.text, offset)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.found.is_empty()
    }

    /// The errors in file order (errors at one position keep the order they were found in).
    pub(crate) fn into_errors(mut self) -> Vec<ConfigError> {
        self.found.sort_by_key(|(offset, _)| *offset);
        self.found.into_iter().map(|(_, e)| e).collect()
    }
}

/// A TOML syntax error in the project's words, with what to write instead.
pub(crate) fn syntax_error(errs: &mut FileErrors<'_>, e: &toml::de::Error) {
    let span = e.span().unwrap_or(0..0);
    let message = e.message().trim().replace('\n', " ");
    let found = errs
        .text
        .get(span.clone())
        .filter(|s| !s.trim().is_empty())
        .map(str::trim);
    let text = if message.starts_with("duplicate key") {
        match found {
            Some(key) => {
                format!("key `{key}` is set twice in one table; keep one of them")
            }
            None => "a key is set twice in one table; keep one of them".to_string(),
        }
    } else if message.starts_with("string values must be quoted") {
        "not valid TOML: a text value needs double quotes, as in timezone = \"Europe/Berlin\""
            .to_string()
    } else {
        format!(
            "not valid TOML ({message}); write `key = value` lines, text in double quotes, \
             tables as [name] and tasks as [[tasks]]"
        )
    };
    errs.at_offset(span.start, text);
}

/// `unknown key` with the closest known key as a suggestion, or the list of known keys.
pub(crate) fn unknown_key(key: &str, table: &str, known: &[&str]) -> String {
    let place = if table.is_empty() {
        String::new()
    } else {
        format!(" in {table}")
    };
    match crate::suggest::closest(key, known) {
        Some(near) => format!("unknown key `{key}`{place}; did you mean `{near}`?"),
        None => format!(
            "unknown key `{key}`{place}; remove it or use one of: {}",
            known.join(", ")
        ),
    }
}

/// The longest duration a file may give: a year. Longer is a typo, and would overflow the
/// clock arithmetic of timeouts.
pub(crate) const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// Reads a duration such as `30s`, `5m` or `1h 30m`; the error says why not, in a sentence that
/// follows "key `KEY`: ".
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let why = match humantime::parse_duration(text) {
        Ok(d) if d > MAX_DURATION => format!("`{text}` is longer than a year"),
        Ok(d) => return Ok(d),
        Err(e) => {
            let reason = match e {
                humantime::DurationError::Empty => "it is empty".to_string(),
                humantime::DurationError::UnknownUnit { unit, .. } if unit.is_empty() => {
                    "a number needs a unit".to_string()
                }
                humantime::DurationError::UnknownUnit { unit, .. } => {
                    format!("`{unit}` is not a unit of time")
                }
                humantime::DurationError::NumberOverflow => "the number is too large".to_string(),
                humantime::DurationError::InvalidCharacter(_)
                | humantime::DurationError::NumberExpected(_) => {
                    "expected a whole number followed by a unit".to_string()
                }
            };
            format!("cannot read `{text}` as a duration: {reason}")
        }
    };
    Err(format!(
        "{why}; write it like \"30s\", \"5m\" or \"1h 30m\" (units: ms, s, m, h, d)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::suggest::closest;

    #[test]
    fn locations_count_lines_and_characters_from_one() {
        let text = "a = 1\nbé = \"x\"\n";
        assert_eq!(location("f.toml", text, 0), "f.toml:1:1");
        assert_eq!(location("f.toml", text, 6), "f.toml:2:1");
        // After `bé = `: 5 characters, 6 bytes.
        assert_eq!(location("f.toml", text, 12), "f.toml:2:6");
        // Inside a multi-byte character and past the end: never a panic.
        assert_eq!(location("f.toml", text, 8), "f.toml:2:2");
        assert_eq!(location("f.toml", text, 999), "f.toml:3:1");
        assert_eq!(line_col("dags/a.toml:12:3"), (12, 3));
        assert_eq!(line_col("dags/a.toml"), (0, 0));
    }

    #[test]
    fn offsets_in_a_string_value_map_to_the_token_as_written() {
        // The value, the token, and a byte of the value with the byte of the token it is at.
        for (token, value_at, token_at) in [
            ("\"abc\"", 1, 2),
            ("'a\\b'", 2, 3),
            ("\"a\\\"b\"", 2, 4),
            ("\"\\u00e9x\"", 2, 7),
            ("\"\\tx\"", 1, 3),
            ("\"\"\"\nab\ncd\"\"\"", 3, 7),
            ("\"\"\"\r\nab\"\"\"", 1, 6),
            ("\"\"\"ab \\\n   cd\"\"\"", 3, 11),
            ("'''\na\\nb'''", 3, 7),
            ("\"ab\"", 9, 4),
        ] {
            assert_eq!(token_offset(token, value_at), token_at, "{token:?}");
        }
    }

    #[test]
    fn a_place_in_a_string_value_has_its_own_line_and_column() {
        let text = "sql = \"\"\"\nSELECT 1\n  FROM \\\"t\\\"\n\"\"\"\n";
        let errs = FileErrors::new("f.toml", text);
        let start = text.find("\"\"\"").unwrap();
        let end = text.rfind("\"\"\"").unwrap() + 3;
        let at = StringAt::new(&errs, start..end);
        assert_eq!(at.start(), "f.toml:1:7");
        assert_eq!(at.at(0), "f.toml:2:1");
        // `"t"` is written `\"t\"`: the value's `t` is the file's 10th character.
        assert_eq!(at.at("SELECT 1\n  FROM \"".len()), "f.toml:3:10");
        let one_line = FileErrors::new("f.toml", "sql = \"SELECT x\"");
        assert_eq!(StringAt::new(&one_line, 6..16).at(7), "f.toml:1:15");
    }

    #[test]
    fn errors_come_out_in_file_order() {
        let mut errs = FileErrors::new("f.toml", "a = 1\nb = 2\n");
        errs.at_offset(6, "second");
        errs.at_offset(0, "first");
        errs.in_file("whole file");
        let errors = errs.into_errors();
        let messages: Vec<_> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(
            messages,
            [
                "f.toml:1:1: first",
                "f.toml: whole file",
                "f.toml:2:1: second"
            ]
        );
    }

    #[test]
    fn unknown_keys_suggest_the_nearest_known_key() {
        let known = ["retries", "retry_delay", "timeout"];
        assert_eq!(
            unknown_key("retires", "[[tasks]]", &known),
            "unknown key `retires` in [[tasks]]; did you mean `retries`?"
        );
        assert_eq!(
            unknown_key("colour", "", &known),
            "unknown key `colour`; remove it or use one of: retries, retry_delay, timeout"
        );
        assert_eq!(closest("TIMEOUT", &known), Some("timeout"));
    }

    #[test]
    fn durations_are_read_or_explained() {
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        for (text, reason) in [
            (
                "soon",
                "cannot read `soon` as a duration: expected a whole number",
            ),
            ("5", "a number needs a unit"),
            ("5 parsecs", "`parsecs` is not a unit of time"),
            ("", "it is empty"),
            ("99999999999999999999s", "the number is too large"),
            ("2y", "`2y` is longer than a year"),
        ] {
            let e = parse_duration(text).unwrap_err();
            assert!(e.contains(reason), "{text}: {e}");
            assert!(e.ends_with("(units: ms, s, m, h, d)"), "{e}");
        }
    }
}
