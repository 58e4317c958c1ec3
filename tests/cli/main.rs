//! End-to-end tests: the real `backfill` binary against projects in temporary folders.

mod airflow;
mod atomic;
mod bad_input;
mod batches;
mod cascade;
mod changes;
mod clocks;
mod environment;
mod example;
mod faults;
mod forget;
mod gate;
mod guard_rails;
mod hosts;
mod identity;
mod interrupt;
mod join;
mod limits;
mod merge;
mod merge_pg;
mod network;
mod one_worker;
mod operations;
#[path = "../parts/mod.rs"]
mod parts;
#[path = "../pg/mod.rs"]
mod pg;
mod pg_manifest;
mod postgres;
#[expect(
    clippy::duplicate_mod,
    reason = "the PostgreSQL warehouse suite runs twice: against a target without a key and against one with a primary key"
)]
#[path = "postgres.rs"]
mod postgres_keyed;
mod read_only;
mod readme;
mod ready;
mod removed;
mod reports;
mod reprocess;
mod rules;
mod running;
mod sample;
mod serve;
mod staging;
mod support;
mod tables;
mod tls;
mod warehouse_lock;
