//! `backfill`: a crash-safe backfill orchestrator for batch data pipelines.

pub mod interval;
pub mod schedule;
pub mod plan;
pub mod project;
pub mod task;
pub mod manifest;
