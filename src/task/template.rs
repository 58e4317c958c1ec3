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
pub const NAMES: &[&str] = &[
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
pub struct Context<'a> {
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
pub struct IntervalValues {
    pub ds: String,
    pub ds_nodash: String,
    pub start: String,
    pub end: String,
}

impl IntervalValues {
    pub fn new(interval: DataInterval, tz: Tz) -> Self {
        let ds = interval.ds(tz);
        Self {
            ds_nodash: ds.replace('-', ""),
            ds,
            start: rfc3339(interval.start),
            end: rfc3339(interval.end),
        }
    }

    /// The template context of one try.
    pub fn context<'a>(
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

/// Checks syntax and that only known names are used (at load time, before any run).
pub fn check(text: &str) -> Result<(), String> {
    if !has_template(text) {
        return Ok(());
    }
    let env = environment();
    let template = env.template_from_str(text).map_err(|e| {
        format!(
            "cannot read the template `{text}` ({}); write names as {{{{ ds }}}} or {{{{ conf.KEY }}}}",
            e.detail().unwrap_or("syntax error")
        )
    })?;
    let mut unknown: Vec<String> = template
        .undeclared_variables(false)
        .into_iter()
        .filter(|n| !NAMES.contains(&n.as_str()))
        .collect();
    unknown.sort();
    match unknown.first() {
        None => Ok(()),
        Some(name) => {
            let hint = match crate::suggest::closest(name, NAMES) {
                Some(near) => format!("did you mean `{near}`? "),
                None => String::new(),
            };
            Err(format!(
                "unknown template variable `{name}` in `{text}`; {hint}known: {}",
                NAMES.join(", ")
            ))
        }
    }
}

/// The `conf` keys a template uses, as dotted paths below `conf`: `{{ conf.region }}` gives
/// `region`, `{{ conf.db.host }}` gives `db.host`. Sorted; empty when the template cannot be
/// read (which [`check`] reports). A lookup that is not a plain attribute (`conf["x"]`) is not
/// listed.
pub fn conf_keys(text: &str) -> Vec<String> {
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
pub fn render(text: &str, ctx: &Context<'_>) -> Result<String, String> {
    if !has_template(text) {
        return Ok(text.to_string());
    }
    render_with(&environment(), text, ctx)
}

/// Renders a shell line (`command = "..."`, run by `sh -c`): every value a `{{ ... }}` inserts
/// is quoted as one shell word, so `--conf` values cannot inject commands; values such as
/// `2026-09-01` need no quotes and stay as they are. `{{ value | safe }}` inserts the value as
/// is, for a value that is meant to be shell syntax.
pub fn render_shell(text: &str, ctx: &Context<'_>) -> Result<String, String> {
    if !has_template(text) {
        return Ok(text.to_string());
    }
    render_with(&shell_environment(), text, ctx)
}

fn render_with(env: &Environment<'_>, text: &str, ctx: &Context<'_>) -> Result<String, String> {
    env.render_str(text, Value::from(Serde(ctx))).map_err(|e| {
        if e.kind() == ErrorKind::UndefinedError {
            let missing: Vec<String> = conf_keys(text)
                .into_iter()
                .filter(|k| lookup(ctx.conf, k).is_none())
                .map(|k| format!("`conf.{k}`"))
                .collect();
            if !missing.is_empty() {
                let verb = if missing.len() == 1 { "is" } else { "are" };
                return format!(
                    "cannot render `{text}`: {} {verb} undefined: --conf does not give it",
                    missing.join(", ")
                );
            }
            return format!("cannot render `{text}`: it uses an undefined value");
        }
        let detail = e
            .detail()
            .map(str::to_string)
            .unwrap_or_else(|| e.kind().to_string());
        format!("cannot render `{text}`: {detail}")
    })
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
        assert!(
            check("{{ dss }}")
                .unwrap_err()
                .contains("unknown template variable `dss`")
        );
        assert!(check("{{ ds ").is_err());
        assert!(check("{{ conf.anything }} {{ ds }}").is_ok());
        assert_eq!(
            render("{{ conf.region }}-{{ conf.db.host }}", &ctx(&conf)),
            Err("cannot render `{{ conf.region }}-{{ conf.db.host }}`: `conf.db.host`, `conf.region` are undefined: --conf does not give it".to_string())
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
