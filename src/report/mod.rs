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

pub mod cells;
pub mod dags;
pub mod diff;
#[cfg(test)]
mod fixtures;
pub mod grid;
pub mod label;
pub mod list;
pub mod out;
pub mod plan;
pub mod progress;
pub mod runs;
pub mod show;
pub mod stale;
pub mod summary;

pub use label::Labeler;
pub use progress::Reporter;
pub use summary::{Rerun, Summary, rerun_command, summary};
