//! Strict templating of task commands with minijinja: an unknown name is an error, never an
//! empty string.

use chrono_tz::Tz;
use minijinja::value::{Serde, Value};
use minijinja::{Environment, UndefinedBehavior};
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

/// Checks syntax and that only known names are used (at load time, before any run).
pub fn check(text: &str) -> Result<(), String> {
    if !text.contains("{{") && !text.contains("{%") {
        return Ok(());
    }
    let env = environment();
    let template = env.template_from_str(text).map_err(|e| {
        format!(
            "template error in `{text}`: {}",
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
        Some(name) => Err(format!(
            "unknown template variable `{name}` in `{text}`; known: {}",
            NAMES.join(", ")
        )),
    }
}

/// Renders one template. Fails on any undefined name (e.g. a `conf` key not given).
pub fn render(text: &str, ctx: &Context<'_>) -> Result<String, String> {
    if !text.contains("{{") && !text.contains("{%") {
        return Ok(text.to_string());
    }
    let env = environment();
    env.render_str(text, Value::from(Serde(ctx))).map_err(|e| {
        let detail = e
            .detail()
            .map(str::to_string)
            .unwrap_or_else(|| e.to_string());
        format!("cannot render `{text}`: {detail}")
    })
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
    }
}
