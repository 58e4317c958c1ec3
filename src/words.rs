//! How the product words things, for every layer: plurals, and the complete commands its
//! hints tell the user to paste (with the `-C` and `--manifest` this process was given).

/// `1 interval`, `2 intervals`.
pub fn plural(n: impl Into<i64>, one: &str, many: &str) -> String {
    let n = n.into();
    format!("{n} {}", if n == 1 { one } else { many })
}

/// `12,345`.
pub(crate) fn thousands(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3 + 1);
    if n < 0 {
        out.push('-');
    }
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `backfill` with the options that name the project and the manifest, as this process was
/// given them: every hint that tells the user to run something starts with it, so that it can
/// be pasted where the command was typed.
static INVOCATION: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Records `-C` and `--manifest` as given (once, when the command starts).
pub fn set_invocation(project_dir: Option<&std::path::Path>, manifest: Option<&std::path::Path>) {
    let mut words = vec!["backfill".to_string()];
    for (flag, path) in [("-C", project_dir), ("--manifest", manifest)] {
        if let Some(p) = path {
            words.push(flag.into());
            words.push(shell_word(&p.display().to_string()));
        }
    }
    let _ = INVOCATION.set(words.join(" "));
}

/// A complete command to paste: `backfill [-C DIR] [--manifest PATH] REST`.
pub fn hint(rest: &str) -> String {
    format!(
        "{} {rest}",
        INVOCATION.get().map_or("backfill", String::as_str)
    )
}

/// Quotes a word for a POSIX shell when it needs it.
pub fn shell_word(word: &str) -> String {
    shlex::try_quote(word).map_or_else(|_| word.to_string(), |q| q.into_owned())
}

/// What is left of a wait, in whole seconds rounded up, as people read it: `1h 59m 58s`.
pub(crate) fn duration_left(d: std::time::Duration) -> String {
    duration_short(d.saturating_add(std::time::Duration::from_nanos(999_999_999)))
}

/// A duration in whole seconds, as people read it: `1h 59m 58s`, `0s`.
pub(crate) fn duration_short(d: std::time::Duration) -> String {
    humantime::format_duration(std::time::Duration::from_secs(d.as_secs())).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_written_with_thousands_separators() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(-1_234_567), "-1,234,567");
        assert_eq!(thousands(i64::MIN), "-9,223,372,036,854,775,808");
    }
}
