//! Tasks: command tasks (process groups, templating, environment, logs, result JSON).

pub mod command;
pub mod template;
