//! Tasks: command tasks (process groups, templating, environment, logs, result JSON).

pub mod cleanup;
pub mod command;
pub mod template;
