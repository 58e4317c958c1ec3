//! `backfill`: a crash-safe backfill orchestrator for batch data pipelines.

pub mod interval;
pub mod schedule;
