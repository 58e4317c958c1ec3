//! `backfill`: a crash-safe backfill orchestrator for batch data pipelines.
//!
//! The binary is a thin shell over [`commands::run`]. The modules are layers, one a line of the
//! table below, top to bottom:
//!
//! - a module imports only from its own line or from the lines below;
//! - names on one line separated by commas may import one another, one way; names separated by
//!   `|` are siblings that never import each other (a line whose names end with `,` or `|` goes
//!   on to the names of the next line);
//! - no modules import each other, two of them or more in a circle;
//! - no files go round in a circle of imports (a file's imports of the modules it sits in aside).
//!
//! The test `tests/layers.rs` reads this table and every path of `src/` that names the crate, and
//! checks all four. A path that must break one of the first three says why in a comment
//! `layer exception:` on its line or the line above; there is none today.
//!
//! ```text
//! main.rs, log                 parse (clap), run, map the error to an exit code; diagnostics
//! commands/                    one module per subcommand: options in, a session, a read of the
//!                              manifest or the status page, the result to report
//! cli                          clap definitions only
//! session/                     a backfill from launch to outcome: check its tasks, recover,
//!                              plan and lease in chunks, heartbeats, signals, the dispatcher,
//!                              cascades; Outcome decides the recorded state and the exit code
//! serve/                       the status page: HTML, JSON and metrics over HTTP, read-only;
//!                              it reads as list and show do and never starts a session
//! report/                      a pure consumer: views of events and read models into a Sink
//! reads                        the manifest read as list, show and the status page show it:
//!                              owners and workers judged by the lease rule at its clock
//! runner/, notify              tries: bounded concurrency, pools, retries, timeouts, the gate,
//!                              publishes; events with counts (runner::Stats); alert hooks
//! recovery, cascade, estimate, probe
//!                              takeover and repair; what cascades decide; estimates; looking
//!                              at a source again
//! exit                         the error type and its exit codes
//! manifest/ |                  the only code that speaks SQL to the manifest: manifest::Store
//!                              is its typed interface, grouped by role (a read-only handle
//!                              has Reads only), over one dialect layer for SQLite and
//!                              PostgreSQL; the writer thread batches its commits
//! warehouse/                   what a SQL task needs of its warehouse, SQLite or PostgreSQL;
//!                              the runner hands it the manifest's record statement
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

pub(crate) mod cascade;
pub mod cli;
pub mod clock;
pub mod commands;
pub mod crash;
pub(crate) mod environment;
pub(crate) mod estimate;
pub mod exit;
pub(crate) mod fault;
pub mod gate;
pub mod interval;
pub mod limits;
pub mod liveness;
pub mod log;
pub mod manifest;
pub(crate) mod notify;
pub(crate) mod params;
pub(crate) mod pg;
pub mod plan;
pub(crate) mod probe;
pub mod process;
pub mod project;
pub(crate) mod query;
pub(crate) mod reads;
pub(crate) mod recovery;
pub mod report;
pub(crate) mod runner;
pub(crate) mod sample;
pub mod schedule;
pub(crate) mod serve;
pub(crate) mod session;
pub(crate) mod sqlite;
pub mod state;
pub(crate) mod suggest;
pub(crate) mod task;
pub mod warehouse;
pub(crate) mod words;
