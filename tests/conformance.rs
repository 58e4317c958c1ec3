//! The storage layer's conformance suite: every method of the manifest's role traits
//! (`Reads`, `Ownership`, `Planning`, `Running`, `Publishing`, `Staging`, `Forgetting`), `manifest copy` and
//! the upgrade from every earlier schema, with exact expectations, on each engine that can hold
//! a manifest. An engine conforms when it passes every behaviour here.
//!
//! Each behaviour is one function over an [`support::Engine`] (a fresh manifest: a SQLite file
//! in a temporary folder, or a fresh database of a throwaway PostgreSQL cluster), written
//! through the program's writer thread and read through a read-only handle, as the program
//! does. [`engines!`] makes it a test per engine: `sqlite::NAME` and `postgres::NAME`. The
//! PostgreSQL tests are ignored, and say why, on a machine without PostgreSQL's server
//! binaries (see `tests/parts`).
//!
//! Where the engines differ by design, a behaviour says so: on PostgreSQL "now" is the
//! database's clock (every host's alike), on SQLite the caller's ([`support::Engine::assert_now`]);
//! PostgreSQL reserves run ids ahead and SQLite does not.

#[path = "parts/mod.rs"]
mod parts;
#[path = "pg/mod.rs"]
mod pg;

#[path = "conformance/backfills.rs"]
mod backfills;
#[path = "conformance/copy.rs"]
mod copy;
#[path = "conformance/forgets.rs"]
mod forgets;
#[path = "conformance/leases.rs"]
mod leases;
#[path = "conformance/migrations.rs"]
mod migrations;
#[path = "conformance/plans.rs"]
mod plans;
#[path = "conformance/pools.rs"]
mod pools;
#[path = "conformance/publishes.rs"]
mod publishes;
#[path = "conformance/queries.rs"]
mod queries;
#[path = "conformance/runs.rs"]
mod runs;
#[path = "conformance/staging.rs"]
mod staging;
#[path = "conformance/support.rs"]
mod support;
#[path = "conformance/workers.rs"]
mod workers;
#[path = "conformance/writer.rs"]
mod writer;

/// A test per engine for each behaviour: `stores` take a fresh [`support::Engine`], `kinds`
/// the engine's [`support::Kind`] (they make their manifests themselves). `postgres_bugs` are
/// behaviours PostgreSQL does not conform to yet: their PostgreSQL tests are ignored, naming
/// the bug (`cargo test --test conformance -- --ignored` runs them).
macro_rules! engines {
    (
        stores: [$($module:ident :: $name:ident),* $(,)?],
        kinds: [$($kmodule:ident :: $kname:ident),* $(,)?],
        postgres_bugs: [$($bmodule:ident :: $bname:ident => $bug:literal),* $(,)?] $(,)?
    ) => {
        mod sqlite {
            $(
                #[test]
                fn $name() {
                    crate::$module::$name(&crate::support::Engine::sqlite());
                }
            )*
            $(
                #[test]
                fn $kname() {
                    crate::$kmodule::$kname(crate::support::Kind::Sqlite);
                }
            )*
            $(
                #[test]
                fn $bname() {
                    crate::$bmodule::$bname(&crate::support::Engine::sqlite());
                }
            )*
        }

        mod postgres {
            $(
                #[test]
                #[cfg_attr(
                    missing = "postgres",
                    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
                )]
                fn $name() {
                    crate::$module::$name(&crate::support::Engine::postgres());
                }
            )*
            $(
                #[test]
                #[cfg_attr(
                    missing = "postgres",
                    ignore = "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in PG_BIN or /usr/lib/postgresql/*/bin: sudo apt-get install postgresql"
                )]
                fn $kname() {
                    crate::$kmodule::$kname(crate::support::Kind::Postgres);
                }
            )*
            $(
                #[test]
                #[ignore = $bug]
                fn $bname() {
                    crate::$bmodule::$bname(&crate::support::Engine::postgres());
                }
            )*
        }
    };
}

engines! {
    stores: [
        backfills::a_new_manifest_is_empty_and_has_an_identity,
        backfills::a_backfill_reads_back_every_field_it_was_recorded_with,
        backfills::the_projects_of_a_dag_are_read_from_its_backfills,
        backfills::the_owner_marks_its_plan_and_records_its_definition,
        backfills::a_takeover_fences_the_old_owner_out,
        backfills::a_takeover_judges_the_owner_by_the_lease_rules,
        backfills::a_heartbeat_refreshes_the_owner_and_carries_a_cancel,
        backfills::finishing_a_backfill_records_its_end_and_releases_its_leases,
        leases::a_lease_is_taken_once,
        leases::a_dead_owners_lease_is_stale_and_replaced_once_recovered,
        leases::a_lease_whose_try_may_still_run_stays_held,
        leases::a_remote_lease_expires_with_its_heartbeat,
        leases::releasing_all_keeps_the_intervals_of_runs_in_flight,
        leases::a_batch_holds_what_no_other_live_process_holds,
        plans::a_plan_is_written_in_chunks_and_read_back_in_order,
        plans::planning_reads_what_earlier_runs_computed,
        runs::a_run_and_its_first_try_start_under_the_lease,
        runs::a_start_is_refused_when_lost_busy_halted_or_cancelled,
        runs::a_try_records_every_field_of_its_end,
        runs::a_try_and_its_run_end_together,
        runs::what_a_gone_owner_left_is_ended_once,
        runs::run_ids_are_reserved_ahead_on_postgresql_only,
        runs::a_staged_end_goes_through_the_combined_end,
        runs::values_round_trip_exactly,
        plans::a_large_plan_chunk_is_written_whole,
        pools::pool_slots_are_taken_up_to_the_size_and_freed_when_their_try_ends,
        pools::a_gone_owners_slot_is_freed_once_its_group_is_gone,
        pools::a_pools_rate_bounds_its_starts_in_any_window,
        workers::a_worker_joins_beats_runs_and_ends,
        workers::a_worker_hears_that_its_backfill_ended,
        workers::a_gone_worker_is_taken_away_and_fenced,
        publishes::a_publish_is_an_intent_a_consent_and_a_published_row,
        publishes::an_intent_needs_the_lease_and_a_newer_publish_supersedes_it,
        publishes::a_group_records_every_intent_or_none,
        publishes::a_rollbacks_publication_holds_the_rows_it_put_back,
        staging::staged_outputs_are_promoted_or_discarded_once,
        queries::list_show_and_runs_read_what_was_recorded,
        queries::a_cascade_is_its_first_backfill_and_its_members,
        writer::a_fence_is_checked_again_after_a_takeover_in_the_same_transaction,
        writer::a_failing_job_rolls_back_alone,
        writer::an_interval_is_claimed_once_when_processes_race,
        runs::a_nul_character_round_trips,
        forgets::a_range_is_removed_and_recorded,
        forgets::a_range_in_use_is_not_removed,
        plans::readiness_answers_are_kept_and_not_ready_skips_the_interval,
    ],
    kinds: [
        migrations::every_earlier_schema_upgrades_and_keeps_its_rows,
        migrations::flags_are_booleans_documents_json_and_the_unfinished_tries_index_serves,
    ],
    postgres_bugs: [],
}
