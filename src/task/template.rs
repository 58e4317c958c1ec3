//! Strict templating of task commands with minijinja: an unknown name is an error, never an
//! empty string. A shell line is rendered with every inserted value quoted as one shell word
//! ([`render_shell`]), unless the template marks it `| safe`.

use std::collections::BTreeSet;

use chrono_tz::Tz;
use minijinja::value::{Serde, Value};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, UndefinedBehavior};
use serde::Serialize;

use crate::interval::{DataInterval, rfc3339};

/// Names a command template may use.
pub(crate) const NAMES: &[&str] = &[
    "ds",
    "ds_nodash",
    "data_interval_start",
    "data_interval_end",
    "dag_id",
    "task_id",
    "run_id",
    "try_number",
    "conf",
];

/// What a template sees for one task try.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Context<'a> {
    pub ds: &'a str,
    pub ds_nodash: &'a str,
    pub data_interval_start: &'a str,
    pub data_interval_end: &'a str,
    pub dag_id: &'a str,
    pub task_id: &'a str,
    pub run_id: &'a str,
    pub try_number: u32,
    pub conf: &'a serde_json::Value,
}

/// An interval's values as templates and the `BACKFILL_*` environment see them.
#[derive(Debug, Clone)]
pub(crate) struct IntervalValues {
    pub ds: String,
    pub ds_nodash: String,
    pub start: String,
    pub end: String,
}

impl IntervalValues {
    pub(crate) fn new(interval: DataInterval, tz: Tz) -> Self {
        let ds = interval.ds(tz);
        Self {
            ds_nodash: ds.replace('-', ""),
            ds,
            start: rfc3339(interval.start),
            end: rfc3339(interval.end),
        }
    }

    /// The template context of one try.
    pub(crate) fn context<'a>(
        &'a self,
        dag_id: &'a str,
        task_id: &'a str,
        run_id: &'a str,
        try_number: u32,
        conf: &'a serde_json::Value,
    ) -> Context<'a> {
        Context {
            ds: &self.ds,
            ds_nodash: &self.ds_nodash,
            data_interval_start: &self.start,
            data_interval_end: &self.end,
            dag_id,
            task_id,
            run_id,
            try_number,
            conf,
        }
    }
}

fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env
}

/// The auto-escape mode of shell lines: every value printed by `{{ ... }}` becomes one word.
const SHELL: &str = "shell";

/// An environment that quotes every inserted value as one shell word (`| safe` opts out).
fn shell_environment() -> Environment<'static> {
    let mut env = environment();
    env.set_auto_escape_callback(|_| AutoEscape::Custom(SHELL.into()));
    env.set_formatter(|out, state, value| {
        let quote = matches!(state.auto_escape(), AutoEscape::Custom(mode) if mode == SHELL);
        if !quote || value.is_safe() {
            return minijinja::escape_formatter(out, state, value);
        }
        let text = value.to_string();
        let word = shlex::try_quote(&text).map_err(|_| {
            Error::new(
                ErrorKind::InvalidOperation,
                "a value holds a NUL byte, which no shell word can carry",
            )
        })?;
        out.write_str(&word).map_err(Error::from)
    });
    env
}

fn has_template(text: &str) -> bool {
    text.contains("{{") || text.contains("{%")
}

/// A mistake in a template, found before any run: what is wrong, and where in the template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TemplateError {
    /// Byte offset in the template of the mistake (of the line, for a syntax error).
    pub offset: usize,
    pub message: String,
}

/// Checks syntax and that only known names are used (at load time, before any run): every
/// unknown name, each at its first use, in the order of the template. The messages do not
/// repeat the template; the offsets say where the mistakes are.
pub(crate) fn check(text: &str) -> Result<(), Vec<TemplateError>> {
    if !has_template(text) {
        return Ok(());
    }
    let env = environment();
    let template = env.template_from_str(text).map_err(|e| {
        vec![TemplateError {
            offset: line_start(text, e.line().unwrap_or(1)),
            message: format!(
                "cannot read the template ({}); write names as {{{{ ds }}}} or {{{{ conf.KEY }}}}",
                e.detail().unwrap_or("syntax error")
            ),
        }]
    })?;
    let mut errors: Vec<TemplateError> = template
        .undeclared_variables(false)
        .into_iter()
        .filter(|n| !NAMES.contains(&n.as_str()))
        .map(|name| {
            let hint = match crate::suggest::closest(&name, NAMES) {
                Some(near) => format!("did you mean `{near}`? "),
                None => String::new(),
            };
            TemplateError {
                offset: first_use(text, &name).unwrap_or(0),
                message: format!(
                    "unknown template variable `{name}`; {hint}known: {}",
                    NAMES.join(", ")
                ),
            }
        })
        .collect();
    if errors.is_empty() {
        return Ok(());
    }
    errors.sort_by_key(|e| e.offset);
    Err(errors)
}

/// The byte offset at which 1-based line `line` of `text` starts (the end, past its last line).
fn line_start(text: &str, line: usize) -> usize {
    if line <= 1 {
        return 0;
    }
    text.match_indices('\n')
        .nth(line - 2)
        .map_or(text.len(), |(i, _)| i + 1)
}

/// The byte offset of the first use of variable `name` in a template: the name as a word inside
/// `{{ ... }}` or `{% ... %}`, outside string literals and comments, and not an attribute
/// (`conf.name`), a filter (`| name`) or a test (`is name`).
fn first_use(text: &str, name: &str) -> Option<usize> {
    let b = text.as_bytes();
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut i = 0;
    while i + 1 < b.len() {
        let close: &[u8] = match (b[i], b[i + 1]) {
            (b'{', b'{') => b"}}",
            (b'{', b'%') => b"%}",
            (b'{', b'#') => b"#}",
            _ => {
                i += 1;
                continue;
            }
        };
        let comment = b[i + 1] == b'#';
        i += 2;
        let mut prev: &[u8] = b"";
        while i < b.len() && !b[i..].starts_with(close) {
            let c = b[i];
            if comment {
                i += 1;
            } else if c == b'"' || c == b'\'' {
                i += 1;
                while i < b.len() && b[i] != c {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
                prev = b"\"";
            } else if word(c) && !c.is_ascii_digit() {
                let start = i;
                while i < b.len() && word(b[i]) {
                    i += 1;
                }
                let found = &b[start..i];
                if found == name.as_bytes() && !matches!(prev, b"." | b"|" | b"is") {
                    return Some(start);
                }
                prev = found;
            } else if word(c) {
                while i < b.len() && word(b[i]) {
                    i += 1;
                }
                prev = b"0";
            } else {
                if !c.is_ascii_whitespace() {
                    prev = &b[i..=i];
                }
                i += 1;
            }
        }
        i += 2;
    }
    None
}

/// The `conf` keys a template uses, as dotted paths below `conf`: `{{ conf.region }}` gives
/// `region`, `{{ conf.db.host }}` gives `db.host`. Sorted; empty when the template cannot be
/// read (which [`check`] reports). A lookup that is not a plain attribute (`conf["x"]`) is not
/// listed.
pub(crate) fn conf_keys(text: &str) -> Vec<String> {
    if !has_template(text) {
        return Vec::new();
    }
    let env = environment();
    let Ok(template) = env.template_from_str(text) else {
        return Vec::new();
    };
    let keys: BTreeSet<String> = template
        .undeclared_variables(true)
        .into_iter()
        .filter_map(|name| name.strip_prefix("conf.").map(str::to_string))
        .collect();
    // `conf.a.b` also looks up `conf.a`: keep only the longest paths.
    keys.iter()
        .filter(|k| {
            !keys
                .iter()
                .any(|longer| longer.len() > k.len() && longer.starts_with(&format!("{k}.")))
        })
        .cloned()
        .collect()
}

/// Renders one template as is: for an element of an array command (one argument, no shell).
/// Fails on any undefined name (e.g. a `conf` key not given).
pub(crate) fn render(text: &str, ctx: &Context<'_>) -> Result<String, String> {
    if !has_template(text) {
        return Ok(text.to_string());
    }
    render_with(&environment(), text, ctx)
}

/// Renders a shell line (`command = "..."`, run by `sh -c`): every value a `{{ ... }}` inserts
/// is quoted as one shell word, so `--conf` values cannot inject commands; values such as
/// `2026-09-01` need no quotes and stay as they are. `{{ value | safe }}` inserts the value as
/// is, for a value that is meant to be shell syntax.
pub(crate) fn render_shell(text: &str, ctx: &Context<'_>) -> Result<String, String> {
    if !has_template(text) {
        return Ok(text.to_string());
    }
    render_with(&shell_environment(), text, ctx)
}

fn render_with(env: &Environment<'_>, text: &str, ctx: &Context<'_>) -> Result<String, String> {
    env.render_str(text, Value::from(Serde(ctx))).map_err(|e| {
        let what = rendered(text, e.line());
        if e.kind() == ErrorKind::UndefinedError {
            let missing: Vec<String> = conf_keys(text)
                .into_iter()
                .filter(|k| lookup(ctx.conf, k).is_none())
                .map(|k| format!("`conf.{k}`"))
                .collect();
            if !missing.is_empty() {
                let verb = if missing.len() == 1 { "is" } else { "are" };
                return format!(
                    "cannot render {what}: {} {verb} undefined: --conf does not give it",
                    missing.join(", ")
                );
            }
            return format!("cannot render {what}: it uses an undefined value");
        }
        let detail = e
            .detail()
            .map(str::to_string)
            .unwrap_or_else(|| e.kind().to_string());
        format!("cannot render {what}: {detail}")
    })
}

/// A template as a one-line message names it: the template itself when it is one line, else
/// the line of the error, so that a message never spreads a long command over many lines.
fn rendered(text: &str, line: Option<usize>) -> String {
    if !text.trim_end().contains('\n') {
        return format!("`{}`", text.trim_end());
    }
    match line.and_then(|n| Some((n, text.lines().nth(n.checked_sub(1)?)?))) {
        Some((n, at)) => format!("line {n} of the template (`{}`)", at.trim()),
        None => "the template".to_string(),
    }
}

/// The value at a dotted path of `conf`.
fn lookup<'v>(conf: &'v serde_json::Value, path: &str) -> Option<&'v serde_json::Value> {
    path.split('.').try_fold(conf, |at, key| at.get(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(conf: &serde_json::Value) -> Context<'_> {
        Context {
            ds: "2026-09-01",
            ds_nodash: "20260901",
            data_interval_start: "2026-09-01T00:00:00Z",
            data_interval_end: "2026-09-02T00:00:00Z",
            dag_id: "d",
            task_id: "t",
            run_id: "7",
            try_number: 2,
            conf,
        }
    }

    #[test]
    fn renders_known_names_and_conf() {
        let conf = serde_json::json!({"region": "eu"});
        assert_eq!(
            render(
                "{{ ds }}/{{ ds_nodash }}/{{ conf.region }}/{{ try_number }}",
                &ctx(&conf)
            ),
            Ok("2026-09-01/20260901/eu/2".to_string())
        );
    }

    #[test]
    fn unknown_names_fail_instead_of_rendering_empty() {
        let conf = serde_json::json!({});
        assert!(
            render("{{ conf.region }}", &ctx(&conf))
                .unwrap_err()
                .contains("undefined")
        );
        assert_eq!(
            check("{{ dss }}").unwrap_err()[0].message,
            "unknown template variable `dss`; did you mean `ds`? known: ds, ds_nodash, data_interval_start, data_interval_end, dag_id, task_id, run_id, try_number, conf"
        );
        assert!(check("{{ ds ").is_err());
        assert!(check("{{ conf.anything }} {{ ds }}").is_ok());
        assert_eq!(
            render("{{ conf.region }}-{{ conf.db.host }}", &ctx(&conf)),
            Err("cannot render `{{ conf.region }}-{{ conf.db.host }}`: `conf.db.host`, `conf.region` are undefined: --conf does not give it".to_string())
        );
    }

    #[test]
    fn each_unknown_name_is_found_where_it_is_first_used() {
        let offsets = |text: &str| -> Vec<(usize, String)> {
            check(text)
                .unwrap_err()
                .into_iter()
                .map(|e| {
                    (
                        e.offset,
                        e.message.split(';').next().unwrap_or("").to_string(),
                    )
                })
                .collect()
        };
        let text = "{# dss #} echo {{ 'dss' }} {{ \"d\\\"ss\" | dss }} {{ conf.dss }}\n{{ dss }} {% if x is dss %}{{ ds }}{% endif %}";
        let at = text.find("{{ dss }}").unwrap() + 3;
        let x = text.find("if x").unwrap() + 3;
        assert_eq!(
            offsets(text),
            [
                (at, "unknown template variable `dss`".to_string()),
                (x, "unknown template variable `x`".to_string()),
            ]
        );
        // A syntax error is at the start of its line.
        let e = check("echo\n{{ ds }}\n{{ ds ").unwrap_err();
        assert_eq!(e.len(), 1);
        assert!(
            e[0].message.starts_with("cannot read the template ("),
            "{e:?}"
        );
        assert_eq!(e[0].offset, "echo\n{{ ds }}\n".len());
    }

    #[test]
    fn a_multi_line_template_that_cannot_render_names_its_line_not_the_whole_text() {
        let conf = serde_json::json!({});
        assert_eq!(
            render_shell("echo start\necho {{ ds | nosuch }}\necho end\n", &ctx(&conf)),
            Err("cannot render line 2 of the template (`echo {{ ds | nosuch }}`): filter nosuch is unknown".to_string())
        );
        assert_eq!(
            render("echo {{ ds | nosuch }}", &ctx(&conf)),
            Err("cannot render `echo {{ ds | nosuch }}`: filter nosuch is unknown".to_string())
        );
    }

    #[test]
    fn shell_lines_quote_each_value_as_one_word() {
        let conf = serde_json::json!({"x": "a; touch PWNED #", "q": "it's", "n": 3, "e": ""});
        let ctx = ctx(&conf);
        assert_eq!(
            render_shell("echo {{ conf.x }}", &ctx),
            Ok("echo 'a; touch PWNED #'".to_string())
        );
        assert_eq!(
            render_shell("echo {{ conf.q }} {{ conf.e }}", &ctx),
            Ok("echo \"it's\" ''".to_string())
        );
        // Plain values need no quotes and stay as they are.
        assert_eq!(
            render_shell(
                "run --day {{ ds }} --from {{ data_interval_start }} -n {{ conf.n }}",
                &ctx
            ),
            Ok("run --day 2026-09-01 --from 2026-09-01T00:00:00Z -n 3".to_string())
        );
        // `| safe` inserts the value as is; text around values is never touched.
        assert_eq!(
            render_shell("echo {{ conf.x | safe }} && echo '{{ ds }}'", &ctx),
            Ok("echo a; touch PWNED # && echo '2026-09-01'".to_string())
        );
        // A filter's result is a value like any other.
        assert_eq!(
            render_shell("echo {{ conf.x | upper }}", &ctx),
            Ok("echo 'A; TOUCH PWNED #'".to_string())
        );
        // Arrays render as is: each element is one argument, without a shell.
        assert_eq!(
            render("{{ conf.x }}", &ctx),
            Ok("a; touch PWNED #".to_string())
        );
    }

    #[test]
    fn a_quoted_value_reaches_the_shell_as_one_argument() {
        let dir = tempfile::tempdir().unwrap();
        for value in [
            "a; touch PWNED #",
            "it's",
            "$(touch PWNED)",
            "`touch PWNED`",
            "a\nb",
            "\"x\" 'y'",
            "*",
            "",
        ] {
            let conf = serde_json::json!({"x": value});
            let line = render_shell("printf '%s|' {{ conf.x }}", &ctx(&conf)).unwrap();
            let out = std::process::Command::new("sh")
                .args(["-c", &line])
                .current_dir(dir.path())
                .output()
                .unwrap();
            assert_eq!(
                String::from_utf8_lossy(&out.stdout),
                format!("{value}|"),
                "{line}"
            );
        }
        assert!(!dir.path().join("PWNED").exists());
    }

    #[test]
    fn conf_keys_lists_the_keys_a_template_uses() {
        assert_eq!(conf_keys("{{ conf.region }}"), ["region"]);
        assert_eq!(
            conf_keys(
                "{{ conf.db.host }} {{ conf.region | upper }} {% if conf.flag %}x{% endif %} {{ ds }}"
            ),
            ["db.host", "flag", "region"]
        );
        assert!(conf_keys("no template").is_empty());
        assert!(conf_keys("{{ conf['x'] }} {{ broken").is_empty());
    }
}
