//! `backfill`: a crash-safe backfill orchestrator for batch data pipelines.
//!
//! The binary is a thin shell over [`commands::run`]; the modules follow the product's
//! vocabulary: schedules and intervals, the plan, the runner, tasks, processes, the gate,
//! warehouses, the manifest, recovery and reports.

pub mod cascade;
pub mod cli;
pub mod clock;
pub mod commands;
pub mod estimate;
pub mod exit;
pub mod fault;
pub mod gate;
pub mod interval;
pub mod liveness;
pub mod log;
pub mod manifest;
pub mod notify;
pub mod plan;
pub mod probe;
pub mod process;
pub mod project;
pub mod recovery;
pub mod report;
pub mod runner;
pub mod schedule;
pub mod session;
pub mod sqlite;
pub mod state;
pub mod suggest;
pub mod task;
pub mod warehouse;
pub mod words;
