//! `backfill`: a crash-safe backfill orchestrator for batch data pipelines.
//!
//! The binary is a thin shell over [`commands::run`]. The modules are layers; a module imports
//! only from the layers below its own, or its own line; no two modules import each other, and no
//! files go round in a circle of imports (checked by the test `tests/layers.rs`, which reads this
//! table and every `crate::` and `super::` path; no exception today):
//!
//! ```text
//! main.rs, log                 parse (clap), run, map the error to an exit code; diagnostics
//! commands/                    one module per subcommand: options in, a session or a read of
//!                              the manifest, the result to report
//! cli                          clap definitions only
//! session/                     a backfill from launch to outcome: check its tasks, recover,
//!                              plan and lease in chunks, heartbeats, signals, the dispatcher,
//!                              cascades; Outcome decides the recorded state and the exit code
//! report/                      a pure consumer: views of events and read models into a Sink
//! runner/, notify              tries: bounded concurrency, pools, retries, timeouts, the gate,
//!                              publishes; events with counts (runner::Stats); alert hooks
//! recovery, cascade, estimate, probe
//!                              takeover and repair; what cascades decide; estimates; looking
//!                              at a source again
//! exit                         the error type and its exit codes
//! manifest/                    the only code that speaks SQL to the manifest: manifest::Store
//!                              is its typed interface, grouped by role (a read-only handle
//!                              has Reads only), over one dialect layer for SQLite and
//!                              PostgreSQL; the writer thread batches its commits
//! warehouse/                   what a SQL task needs of its warehouse, SQLite or PostgreSQL
//! task/, process/              command tasks; the one way to run a child process
//! project/                     backfill.toml and dags/*.toml: raw, validated model, loading
//! pg/                          the PostgreSQL driver layer under the manifest and the
//!                              warehouses: connections, TLS, errors, quoting; a leaf
//! plan, gate, schedule, interval, state, clock, liveness, words, suggest, sqlite, fault,
//! sample, params, query, environment, task::template, limits, crash
//!                              pure logic and the small shared pieces everything uses; what
//!                              the process may open, and a panic that ends it
//! ```
//!
//! The manifest never looks at processes: it is handed a [`liveness::Host`] (the real one is
//! [`process::LOCAL`]). Time for planning comes from [`clock`].

pub mod cascade;
pub mod cli;
pub mod clock;
pub mod commands;
pub mod crash;
pub mod environment;
pub mod estimate;
pub mod exit;
pub mod fault;
pub mod gate;
pub mod interval;
pub mod limits;
pub mod liveness;
pub mod log;
pub mod manifest;
pub mod notify;
pub mod params;
pub mod pg;
pub mod plan;
pub mod probe;
pub mod process;
pub mod project;
pub mod query;
pub mod recovery;
pub mod report;
pub mod runner;
pub mod sample;
pub mod schedule;
pub mod session;
pub mod sqlite;
pub mod state;
pub mod suggest;
pub mod task;
pub mod warehouse;
pub mod words;
