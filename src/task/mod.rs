//! Tasks: command tasks (process groups, templating, environment, logs, result JSON).

pub(crate) mod cleanup;
pub(crate) mod command;
pub(crate) mod template;
