//! Turns what happened into what people and programs read. A pure consumer: each view takes
//! runner events or a read model and writes into an [`std::io::Write`] (through [`out::Sink`]
//! for data), so that it is tested with synthetic input; the commands hand it stdout and
//! stderr. One file per view:
//!
//! - [`progress`]: the progress bar or plain lines while a backfill runs;
//! - [`summary`]: the end of a run, its failures and the command that reruns them;
//! - [`plan`]: the dry run; [`list`], [`show`], [`runs`], [`stale`], [`dags`], [`diff`]: the
//!   read commands' tables and JSON documents;
//! - [`cells`]: one cell per interval, for `show --grid` and the status page;
//!
//! built on [`grid`] (the human table, fitted to the terminal's width), [`label`] (how an
//! interval is written) and [`out`] (where output goes, closed pipes).

pub(crate) mod cells;
pub(crate) mod dags;
pub(crate) mod diff;
#[cfg(test)]
mod fixtures;
pub(crate) mod grid;
pub(crate) mod label;
pub(crate) mod list;
pub mod out;
pub(crate) mod plan;
pub(crate) mod progress;
pub(crate) mod runs;
pub(crate) mod show;
pub(crate) mod stale;
pub(crate) mod summary;
pub(crate) mod unlike;

pub(crate) use label::Labeler;
pub(crate) use progress::Reporter;
pub(crate) use summary::{Rerun, rerun_command, summary};
