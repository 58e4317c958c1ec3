//! A backfill's record and its ownership: what is recorded reads back as it was, the owner's
//! writes are fenced by its epoch, and a takeover follows the lease rules.

use backfill::clock::End;
use backfill::manifest::backfills::{DagProject, Heartbeat, Owner};
use backfill::manifest::{self, NewBackfill};
use backfill::plan::Reprocess;
use backfill::state::{BackfillKind, BackfillState};

use crate::support::*;

/// A new manifest holds nothing, names itself with an identity that stays, and says which
/// database holds it (PostgreSQL only) and what "now" is for it.
pub fn a_new_manifest_is_empty_and_has_an_identity(m: &Engine) {
    let r = m.read();
    let id = r.identity().unwrap();
    assert!(!id.is_empty());
    assert_eq!(manifest::identity(&m.location).unwrap(), id);
    assert_eq!(
        manifest::open_read_only(&m.location)
            .unwrap()
            .identity()
            .unwrap(),
        id,
        "the identity is made once"
    );
    assert_eq!(r.latest_backfill(None).unwrap(), None);
    assert!(r.list_backfills(None, false).unwrap().is_empty());
    assert!(r.backfill_heads().unwrap().is_empty());
    assert!(r.run_dags().unwrap().is_empty());
    assert!(r.lease_views().unwrap().is_empty());
    assert!(r.pool_slots().unwrap().is_empty());
    assert!(r.needing_audit_files().unwrap().is_empty());
    assert!(r.keeping_staged_tables().unwrap().is_empty());
    assert_eq!(r.first_unfinished_try().unwrap(), 1, "one above every try");
    let f = r.figures().unwrap();
    assert!(f.intervals.is_empty() && f.backfills.is_empty() && f.pool_slots.is_empty());
    assert!(f.last_published.is_empty() && f.rejections.is_empty() && f.merged.is_empty());
    assert_eq!(
        (f.tries_running, f.oldest_heartbeat_ms, f.leases),
        (0, None, 0)
    );
    match m.kind {
        Kind::Sqlite => {
            assert_eq!(r.database_key().unwrap(), None);
            assert_eq!(manifest::database_key(&m.location).unwrap(), None);
        }
        Kind::Postgres => {
            let key = r
                .database_key()
                .unwrap()
                .expect("a PostgreSQL manifest's database");
            assert!(!key.is_empty());
            assert_eq!(manifest::database_key(&m.location).unwrap(), Some(key));
        }
    }
    let local = backfill::clock::now_ms() - 3_600_000;
    let (now, span) = m.timed(|| r.clock_ms(local).unwrap());
    m.assert_now(now, local, span);
    assert_eq!(
        m.schema_version(),
        match m.kind {
            Kind::Sqlite => manifest::MIGRATIONS.last().unwrap().0,
            Kind::Postgres => manifest::postgres::MIGRATIONS.last().unwrap().0,
        }
    );
}

/// A request with every field given.
fn full_request() -> NewBackfill {
    NewBackfill {
        dag_id: "orders".into(),
        from_arg: "today-30d".into(),
        to_arg: "yesterday".into(),
        range_start: start(0),
        range_end: start(30),
        reprocess: Reprocess::Changed,
        max_active_runs: 7,
        run_backwards: true,
        allow_drift: true,
        conf: r#"{"region": "eu", "n": 3}"#.into(),
        kind: BackfillKind::Stage,
        source_backfill: None,
        tasks: Some(vec!["extract".into(), "load".into()]),
        max_failures: Some(5),
        cascade: Some("changed".into()),
        cascade_of: None,
        sample: Some(9),
        definition: Some(r#"{"tasks": ["extract", "load"]}"#.into()),
        batch_size: Some(12),
        project: Some("shop".into()),
        warehouses: Some(r#"{"main": "/data/w.db"}"#.into()),
        atomic: true,
        wait_ready: Some(7_200_000),
        require_ready: true,
    }
}

/// A backfill reads back with every field it was recorded with, its owner's process, and the
/// state of a backfill whose plan is still being written; one recorded with nothing optional
/// reads back with nothing.
pub fn a_backfill_reads_back_every_field_it_was_recorded_with(m: &Engine) {
    let ctx = alive();
    let (owner, span) = m.timed(|| insert(m, full_request(), &ctx));
    assert_eq!(owner, Owner::of(1, 0));
    let b = m.read().backfill(1).unwrap().expect("backfill 1");
    let want = full_request();
    assert_eq!(
        (
            b.id,
            &b.dag_id,
            &b.from_arg,
            &b.to_arg,
            b.range_start,
            b.range_end
        ),
        (
            1,
            &want.dag_id,
            &want.from_arg,
            &want.to_arg,
            want.range_start,
            want.range_end
        )
    );
    assert_eq!(b.reprocess, Reprocess::Changed);
    assert_eq!(
        (b.max_active_runs, b.run_backwards, b.allow_drift, &b.conf),
        (7, true, true, &want.conf)
    );
    assert_eq!((b.kind, b.source_backfill), (BackfillKind::Stage, None));
    assert_eq!(b.tasks, want.tasks);
    assert_eq!(
        (b.max_failures, &b.cascade, b.cascade_of, b.sample),
        (Some(5), &want.cascade, None, Some(9))
    );
    assert_eq!(
        (
            &b.definition,
            b.batch_size,
            &b.project,
            &b.warehouses,
            b.atomic
        ),
        (
            &want.definition,
            Some(12),
            &want.project,
            &want.warehouses,
            true
        )
    );
    assert_eq!((b.wait_ready, b.require_ready), (Some(7_200_000), true));
    // Its owner: this process, alive, running, its plan still to be written.
    assert_eq!(
        (b.state, b.owner_pid, b.owner_start, b.owner_host.as_deref()),
        (
            BackfillState::Running,
            Some(LIVE_PID),
            Some(LIVE_START),
            Some(HERE)
        )
    );
    assert_eq!((b.epoch, b.planning, b.cancel_requested), (0, true, false));
    assert_eq!(b.finished_at, None);
    m.assert_now(b.created_at, ctx.now_ms, span);
    assert_eq!(b.heartbeat_at, Some(b.created_at));
    assert!(b.owner_alive(&other()));
    assert_eq!(
        b.conf_json().unwrap(),
        serde_json::json!({"region": "eu", "n": 3})
    );

    // Nothing optional: nothing read back. A promote names its staged backfill.
    let promote = NewBackfill {
        kind: BackfillKind::Promote,
        source_backfill: Some(1),
        ..request("orders")
    };
    assert_eq!(insert(m, promote, &ctx), Owner::of(2, 0));
    let p = m.read().backfill(2).unwrap().unwrap();
    assert_eq!(
        (p.kind, p.source_backfill),
        (BackfillKind::Promote, Some(1))
    );
    assert_eq!(
        (p.reprocess, p.run_backwards, p.allow_drift),
        (Reprocess::None, false, false)
    );
    assert_eq!(
        (&p.tasks, p.max_failures, &p.cascade, p.cascade_of),
        (&None, None, &None, None)
    );
    assert_eq!((p.sample, &p.definition, p.batch_size), (None, &None, None));
    assert_eq!((&p.project, &p.warehouses, p.atomic), (&None, &None, false));
    assert_eq!((p.wait_ready, p.require_ready), (None, false));
    assert_eq!(p.conf, "{}");

    let r = m.read();
    assert!(r.backfill(3).unwrap().is_none());
    assert_eq!(r.latest_backfill(None).unwrap(), Some(2));
    assert_eq!(
        r.latest_backfill(Some(BackfillKind::Stage)).unwrap(),
        Some(1)
    );
    assert_eq!(
        r.latest_backfill(Some(BackfillKind::Promote)).unwrap(),
        Some(2)
    );
    assert_eq!(
        r.latest_backfill(Some(BackfillKind::Rollback)).unwrap(),
        None
    );
    assert_eq!(
        r.backfill_heads().unwrap(),
        [
            (1, "orders".to_string(), BackfillState::Running),
            (2, "orders".to_string(), BackfillState::Running)
        ]
    );
    assert_eq!(
        r.promoting(1).unwrap(),
        Some(2),
        "a running promote of backfill 1"
    );
    assert_eq!(r.promoting(2).unwrap(), None);
}

/// The projects whose backfills of a DAG the manifest holds, oldest first, with their first
/// and last backfill, how many, and the warehouses recorded (the greatest); backfills recorded
/// without a project and other DAGs' are left out.
pub fn the_projects_of_a_dag_are_read_from_its_backfills(m: &Engine) {
    let ctx = alive();
    let of = |project: Option<&str>, warehouses: Option<&str>, dag: &str| NewBackfill {
        project: project.map(str::to_string),
        warehouses: warehouses.map(str::to_string),
        ..request(dag)
    };
    insert(m, of(None, None, "d"), &ctx);
    insert(m, of(Some("beta"), Some(r#"{"b": 1}"#), "d"), &ctx);
    insert(m, of(Some("alpha"), Some(r#"{"a": 1}"#), "d"), &ctx);
    insert(m, of(Some("alpha"), Some(r#"{"a": 2}"#), "d"), &ctx);
    insert(m, of(Some("gamma"), None, "other"), &ctx);
    insert(m, of(Some("beta"), None, "d"), &ctx);
    assert_eq!(
        m.read().dag_projects("d").unwrap(),
        [
            DagProject {
                project: "beta".into(),
                first: 2,
                last: 6,
                backfills: 2,
                warehouses: Some(r#"{"b": 1}"#.into()),
            },
            DagProject {
                project: "alpha".into(),
                first: 3,
                last: 4,
                backfills: 2,
                warehouses: Some(r#"{"a": 2}"#.into()),
            },
        ]
    );
    assert!(m.read().dag_projects("none").unwrap().is_empty());
}

/// The owner marks its plan complete and records what its DAG computes now; nobody else can.
pub fn the_owner_marks_its_plan_and_records_its_definition(m: &Engine) {
    let owner = insert(m, request("d"), &alive());
    m.ok(move |s| s.mark_planned(owner));
    m.ok(move |s| s.record_definition(owner, r#"{"v": 2}"#));
    let b = m.read().backfill(owner.backfill_id).unwrap().unwrap();
    assert!(!b.planning);
    assert_eq!(b.definition.as_deref(), Some(r#"{"v": 2}"#));
    let stranger = Owner::of(owner.backfill_id, 1);
    assert_fenced(m.write(move |s| s.record_definition(stranger, "{}")), 1);
    assert_fenced(m.write(move |s| s.mark_planned(stranger)), 1);
    let missing = Owner::of(99, 0);
    assert_fenced(m.write(move |s| s.fence(missing).map(|_| ())), 99);
    assert_eq!(
        m.read().backfill(1).unwrap().unwrap().definition.as_deref(),
        Some(r#"{"v": 2}"#)
    );
}

/// Once another process takes a backfill over from its gone owner (a new epoch), every write of
/// the old owner is refused and changes nothing; the new owner's are taken. A takeover of a
/// backfill whose owner is alive changes nothing.
pub fn a_takeover_fences_the_old_owner_out(m: &Engine) {
    let old = planned(m, request("d"), 2, &dead());
    let before = m.read().backfill(1).unwrap().unwrap();
    let taker = other();
    let (new, span) = m.timed(|| {
        let c = taker.clone();
        m.ok(move |s| s.take_ownership(1, &c, true))
    });
    assert_eq!(new, Some(Owner::of(1, 1)));
    let b = m.read().backfill(1).unwrap().unwrap();
    assert_eq!(b.epoch, 1);
    assert_eq!(b.state, BackfillState::Running);
    assert_eq!(
        (b.owner_pid, b.owner_start, b.owner_host.as_deref()),
        (Some(OTHER_LIVE_PID), Some(LIVE_START + 1), Some(HERE))
    );
    assert!(!b.cancel_requested);
    assert_eq!(b.finished_at, None);
    m.assert_now(b.heartbeat_at.unwrap(), taker.now_ms, span);
    assert_eq!(b.created_at, before.created_at);

    // The old owner, should it wake up: refused everything, and nothing it asked is recorded.
    assert_fenced(m.write(move |s| s.fence(old).map(|_| ())), 1);
    assert_fenced(
        m.write(move |s| s.heartbeat(old, backfill::clock::now_ms())),
        1,
    );
    assert_fenced(m.write(move |s| s.record_definition(old, "{}")), 1);
    assert_fenced(m.write(move |s| s.mark_planned(old)), 1);
    assert_fenced(
        m.write(move |s| s.finish_backfill(old, BackfillState::Completed, End::now())),
        1,
    );
    let (rows, ctx) = (run_rows([5]), alive());
    assert_fenced(
        m.write(move |s| s.insert_plan_chunk(s.fence(old)?, "d", &rows, &ctx)),
        1,
    );
    assert_fenced(
        m.step(move |s| {
            s.start_run_and_try(
                s.fence(old)?,
                "d",
                day(0),
                backfill::clock::now_ms(),
                TIMEOUT_MS,
                "t",
                1,
                LOG,
                None,
            )
        }),
        1,
    );
    let after_refusals = m.read().backfill(1).unwrap().unwrap();
    assert_eq!(after_refusals.state, BackfillState::Running);
    assert_eq!(after_refusals.definition, None);
    assert_eq!(after_refusals.heartbeat_at, b.heartbeat_at);
    assert_eq!(m.read().planned_starts(1).unwrap().len(), 2);
    assert_eq!(m.int("SELECT COUNT(*) FROM runs"), 0);

    // The new owner acts.
    let fenced = m.ok(move |s| s.fence(Owner::of(1, 1)));
    assert_eq!(fenced.owner(), Owner::of(1, 1));
    assert_eq!(fenced.backfill_id(), 1);
    // Its owner runs: nobody takes it over now.
    let c = alive();
    assert_eq!(m.ok(move |s| s.take_ownership(1, &c, true)), None);
    assert_eq!(m.read().backfill(1).unwrap().unwrap().epoch, 1);
}

/// Whether an owner is gone follows the lease rules: an owner of this host by its process (a
/// process that runs is alive whatever its heartbeat, a dead one is gone whatever its
/// heartbeat), an owner of another host by its heartbeat alone (alive within the lease timeout,
/// gone past it or once watched silent for a whole timeout). Without `me`, a takeover ends a
/// running backfill as cancelled; a finished one keeps its state and end.
pub fn a_takeover_judges_the_owner_by_the_lease_rules(m: &Engine) {
    let judge = other();
    let take = |id: i64, ctx: &backfill::manifest::leases::LeaseCtx, me: bool| {
        let c = ctx.clone();
        m.ok(move |s| s.take_ownership(id, &c, me))
    };
    // 1: of this host, its process alive, its heartbeat long expired.
    insert(m, request("d"), &alive());
    assert_eq!(take(1, &expired(&judge), false), None);
    // 2: of this host, its process dead, its heartbeat fresh.
    insert(m, request("d"), &dead());
    assert_eq!(take(2, &judge, false), Some(Owner::of(2, 1)));
    // 3: of another host, its heartbeat fresh; then watched silent; 4: expired.
    insert(m, request("d"), &remote());
    assert_eq!(take(3, &judge, false), None);
    let heartbeat = m.read().backfill(3).unwrap().unwrap().heartbeat_at;
    let (taken, span) = m.timed(|| take(3, &judge.with_silent(heartbeat), false));
    assert_eq!(taken, Some(Owner::of(3, 1)));
    insert(m, request("d"), &remote());
    assert_eq!(take(4, &expired(&judge), false), Some(Owner::of(4, 1)));

    // Taken without `me`: cancelled, ended now (never before its creation), owner kept.
    let b = m.read().backfill(3).unwrap().unwrap();
    assert_eq!((b.state, b.epoch), (BackfillState::Cancelled, 1));
    assert_eq!(b.owner_host.as_deref(), Some(ELSEWHERE));
    let finished = b.finished_at.expect("ended by the takeover");
    m.assert_now(finished, judge.now_ms.max(b.created_at), span);
    assert!(finished >= b.created_at);

    // A finished backfill: a new epoch, its state and end kept.
    let five = insert(m, request("d"), &alive());
    m.ok(move |s| s.finish_backfill(five, BackfillState::Completed, after(4_000)));
    let done = m.read().backfill(5).unwrap().unwrap();
    assert_eq!(take(5, &judge, false), Some(Owner::of(5, 1)));
    let after_take = m.read().backfill(5).unwrap().unwrap();
    assert_eq!(
        (after_take.state, after_take.finished_at, after_take.epoch),
        (BackfillState::Completed, done.finished_at, 1)
    );
    // Taken again, with `me`: it runs again, as this process's.
    assert_eq!(take(5, &judge, true), Some(Owner::of(5, 2)));
    let again = m.read().backfill(5).unwrap().unwrap();
    assert_eq!(
        (again.state, again.finished_at),
        (BackfillState::Running, None)
    );
    assert_eq!(again.owner_pid, Some(OTHER_LIVE_PID));
    // No such backfill: nothing to take.
    assert_eq!(take(42, &judge, true), None);
    let states: Vec<_> = m
        .read()
        .backfill_heads()
        .unwrap()
        .into_iter()
        .map(|h| h.2)
        .collect();
    use BackfillState::*;
    assert_eq!(states, [Running, Cancelled, Cancelled, Cancelled, Running]);
}

/// An owner's heartbeat refreshes its record and carries what it must do: carry on, or stop
/// once a cancel was requested.
pub fn a_heartbeat_refreshes_the_owner_and_carries_a_cancel(m: &Engine) {
    let owner = insert(m, request("d"), &alive());
    let now = backfill::clock::now_ms() + 50;
    let (beat, span) = m.timed(|| m.ok(move |s| s.heartbeat(owner, now)));
    assert_eq!(beat, Heartbeat::Carry);
    let b = m.read().backfill(1).unwrap().unwrap();
    m.assert_now(b.heartbeat_at.unwrap(), now, span);
    assert!(!b.cancel_requested);
    m.ok(|s| s.request_cancel(1));
    assert!(m.read().backfill(1).unwrap().unwrap().cancel_requested);
    assert_eq!(
        m.ok(move |s| s.heartbeat(owner, backfill::clock::now_ms())),
        Heartbeat::CancelRequested
    );
    // A cancel asked of no backfill changes nothing.
    m.ok(|s| s.request_cancel(7));
    assert_eq!(m.read().latest_backfill(None).unwrap(), Some(1));
}

/// The owner records the end of its backfill: its state, its end (the creation plus the time
/// this process measured, when the clock jumped meanwhile; else now) and a last heartbeat; its
/// leases go, but those of runs still in progress; and it may write nothing more.
pub fn finishing_a_backfill_records_its_end_and_releases_its_leases(m: &Engine) {
    let owner = planned(m, request("d"), 3, &alive());
    start_run(m, owner, "d", 0, "t");
    let end = after(7_000);
    let (_, span) = m.timed(|| m.ok(move |s| s.finish_backfill(owner, BackfillState::Failed, end)));
    let b = m.read().backfill(1).unwrap().unwrap();
    assert_eq!(b.state, BackfillState::Failed);
    assert_eq!(b.finished_at, Some(b.created_at + 7_000));
    m.assert_now(b.heartbeat_at.unwrap(), end.now_ms, span);
    let held: Vec<i64> = (0..3)
        .filter(|&d| m.read().holds_lease(1, "d", start(d)).unwrap())
        .collect();
    assert_eq!(
        held,
        [0],
        "the interval of the run in progress stays leased"
    );
    assert_fenced(
        m.write(move |s| s.heartbeat(owner, backfill::clock::now_ms())),
        1,
    );
    assert_fenced(
        m.write(move |s| s.finish_backfill(owner, BackfillState::Completed, End::now())),
        1,
    );

    // An end measured without a jump of the clock: now.
    let second = insert(m, request("e"), &alive());
    let created = m.read().backfill(2).unwrap().unwrap().created_at;
    let end = End {
        now_ms: backfill::clock::now_ms(),
        elapsed_ms: Some(0),
    };
    let (_, span) =
        m.timed(|| m.ok(move |s| s.finish_backfill(second, BackfillState::Completed, end)));
    let b = m.read().backfill(2).unwrap().unwrap();
    m.assert_now(b.finished_at.unwrap(), end.now_ms.max(created), span);
    assert_eq!(b.state, BackfillState::Completed);
}
