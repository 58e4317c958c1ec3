//! Publishes: the intent recorded before the warehouse is touched, the manifest's consent
//! asked inside the warehouse's transaction, and the published partition afterwards.

use backfill::manifest::backfills::Owner;
use backfill::manifest::publishes::{Current, Publication};
use backfill::manifest::{NewBackfill, TryRecord};
use backfill::plan::RunState;
use backfill::state::{BackfillKind, TryState, Verdict};
use rusqlite::types::Value;

use crate::support::*;

/// What a gate that passed an output records with the intent.
fn judged(rows: i64) -> TryRecord {
    TryRecord {
        rows: Some(rows),
        fingerprint: Some(format!("fp-{rows}")),
        source_rows: Some(rows + 1),
        previous_rows: Some(rows - 1),
        verdict: Some(Verdict::Published),
        reasons: Some("warning: grew".into()),
        source_fingerprint: Some("src".into()),
        promoted_from: None,
        restored_from: None,
        restore_key: Some(17),
        rows_inserted: Some(1),
        rows_updated: Some(2),
        rows_deleted: Some(3),
        rows_unchanged: Some(4),
        ..TryRecord::new(TryState::Succeeded)
    }
}

/// A try that decided to publish records its intent (with what the gate judged and its audit
/// file) only while its backfill holds the interval; the manifest consents to the publish of
/// a running try with an intent, its holder's lease and its owner's current epoch; once
/// published, the partition names the try, and the try's end closes the intent.
pub fn a_publish_is_an_intent_a_consent_and_a_published_row(m: &Engine) {
    let owner = planned(m, request("d"), 2, &alive());
    let (run, t) = start_run(m, owner, "d", 0, "t");
    let r = m.read();
    assert!(!r.is_publishing(t).unwrap());
    assert!(
        !r.may_publish(t, Some(owner), true).unwrap(),
        "no intent yet"
    );
    assert!(
        r.may_publish(t, Some(owner), false).unwrap(),
        "a publish that records itself"
    );
    let rec = judged(5);
    assert!(m.ok(move |s| s.record_publish_intent(s.fence(owner)?, t, Some("/audit/t.db"), &rec)));
    assert!(r.is_publishing(t).unwrap());
    assert!(!r.is_publishing(t + 100).unwrap(), "no such try");
    assert!(r.needing_audit_files().unwrap().contains(&t));
    let pending = r.pending_publishes(owner).unwrap();
    assert_eq!(pending.len(), 1);
    let p = &pending[0];
    assert_eq!(
        (p.try_id, p.run_id, p.dag_id.as_str(), p.task_id.as_str()),
        (t, run, "d", "t")
    );
    assert_eq!(p.interval, day(0));
    assert_eq!(
        (p.audit_path.as_deref(), p.audit_table.as_deref()),
        (Some("/audit/t.db"), None)
    );
    let got = &p.record;
    let want = judged(5);
    assert_eq!(
        (
            got.rows,
            &got.fingerprint,
            got.source_rows,
            got.previous_rows
        ),
        (
            want.rows,
            &want.fingerprint,
            want.source_rows,
            want.previous_rows
        )
    );
    assert_eq!(
        (&got.verdict, &got.reasons, &got.source_fingerprint),
        (&want.verdict, &want.reasons, &want.source_fingerprint)
    );
    assert_eq!(
        (got.promoted_from, got.restored_from, got.restore_key),
        (None, None, Some(17))
    );
    assert_eq!(got.merged(), Some([1, 2, 3, 4]));

    // The consent: the owner at its epoch, or anyone (recovery); not a stranger.
    assert!(r.may_publish(t, Some(owner), true).unwrap());
    assert!(r.may_publish(t, None, true).unwrap());
    assert!(
        !r.may_publish(t, Some(Owner::of(1, 1)), true).unwrap(),
        "a stale epoch"
    );
    assert!(
        !r.may_publish(t, Some(Owner::of(2, 0)), true).unwrap(),
        "another backfill"
    );
    let as_worker = Owner {
        worker: Some(1),
        ..owner
    };
    assert!(
        !r.may_publish(t, Some(as_worker), true).unwrap(),
        "not a worker's try"
    );
    assert!(!r.may_publish(t + 100, None, true).unwrap(), "no such try");

    // Published.
    let now = backfill::clock::now_ms();
    let (_, span) = m.timed(|| {
        m.ok(move |s| {
            s.mark_published(
                &Publication {
                    try_id: t,
                    dag_id: "d",
                    task_id: "t",
                    interval: day(0),
                    rows: 5,
                    fingerprint: Some("fp-5"),
                },
                now,
            )
        })
    });
    assert_eq!(
        r.published("d", "t", start(0)).unwrap(),
        Some((t, 5, Some("fp-5".into())))
    );
    assert_eq!(r.published("d", "t", start(1)).unwrap(), None);
    assert_eq!(r.published("d", "u", start(0)).unwrap(), None);
    assert_eq!(
        r.current_publication("d", "t", start(0)).unwrap(),
        Some(Current {
            try_id: t,
            rows: 5,
            content: Some(t),
            fingerprint: Some("fp-5".into()),
        })
    );
    let published_at = m.int("SELECT published_at FROM published");
    m.assert_now(published_at, now, span);
    assert_eq!(
        m.rows("SELECT dag_id, task_id, interval_start, interval_end, try_id, rows FROM published"),
        [vec![
            Value::Text("d".into()),
            Value::Text("t".into()),
            Value::Integer(start(0)),
            Value::Integer(start(1)),
            Value::Integer(t),
            Value::Integer(5),
        ]]
    );
    assert!(
        r.may_publish(t, Some(owner), true).unwrap(),
        "its own publication is not newer"
    );

    // The try's end closes the intent: nothing is pending, no consent is given again.
    end_run(m, owner, (run, t), RunState::Succeeded, judged(5));
    assert!(!r.is_publishing(t).unwrap());
    assert!(r.pending_publishes(owner).unwrap().is_empty());
    assert!(!r.needing_audit_files().unwrap().contains(&t));
    assert!(!r.may_publish(t, None, false).unwrap(), "no longer running");
    let f = r.figures().unwrap();
    assert_eq!(f.last_published, [("d".to_string(), start(1))]);
    assert_eq!(f.merged, [("d".to_string(), [1, 2, 3, 4])]);
    assert_eq!(
        r.published_starts("d", start(0), start(9)).unwrap(),
        [(start(0), 5)]
    );
}

/// An intent is refused to a try whose backfill no longer holds its interval, and to a try that
/// is not running; a recorded intent loses the manifest's consent once the lease is gone or a
/// newer try of the same task and interval was published (a superseded intent).
pub fn an_intent_needs_the_lease_and_a_newer_publish_supersedes_it(m: &Engine) {
    let owner = planned(m, request("d"), 2, &alive());
    let (run, t1) = start_run(m, owner, "d", 0, "t");
    assert!(m.ok(move |s| s.record_publish_intent(s.fence(owner)?, t1, None, &judged(1))));
    // A retry of the same task, published first.
    let now = backfill::clock::now_ms();
    let t2 = m
        .ok(move |s| s.start_try(s.fence(owner)?, run, "t", 2, "/logs/2", now))
        .unwrap();
    assert!(m.ok(move |s| s.record_publish_intent(s.fence(owner)?, t2, None, &judged(2))));
    let publish = move |t: i64, rows: i64| {
        move |s: &dyn backfill::manifest::Store| {
            s.mark_published(
                &Publication {
                    try_id: t,
                    dag_id: "d",
                    task_id: "t",
                    interval: day(0),
                    rows,
                    fingerprint: None,
                },
                backfill::clock::now_ms(),
            )
        }
    };
    m.ok(publish(t2, 2));
    let r = m.read();
    assert!(!r.may_publish(t1, Some(owner), true).unwrap(), "superseded");
    assert!(!r.may_publish(t1, None, true).unwrap());
    assert!(r.may_publish(t2, Some(owner), true).unwrap());
    assert_eq!(
        r.published("d", "t", start(0)).unwrap(),
        Some((t2, 2, None))
    );
    // Its intent stays recorded, for recovery to settle.
    assert!(r.is_publishing(t1).unwrap());
    assert_eq!(
        r.pending_publishes(owner)
            .unwrap()
            .iter()
            .map(|p| p.try_id)
            .collect::<Vec<_>>(),
        [t1, t2]
    );

    // The lease gone: no consent, and no new intent.
    let (_, t3) = start_run(m, owner, "d", 1, "t");
    m.ok(|s| s.release_lease(1, "d", start(1)));
    assert!(!r.try_holds_lease(t3).unwrap());
    assert!(!m.ok(move |s| s.record_publish_intent(s.fence(owner)?, t3, Some("/a"), &judged(3))));
    assert!(!r.is_publishing(t3).unwrap());
    assert!(!r.may_publish(t3, None, false).unwrap());
    m.ok(|s| s.release_lease(1, "d", start(0)));
    assert!(!r.may_publish(t2, Some(owner), true).unwrap());
    // A try that ended records no intent.
    let c = alive();
    m.ok(move |s| s.take_leases(1, "d", &mut std::iter::once(day(0)), &c));
    m.ok(move |s| s.end_try(t2, &TryRecord::new(TryState::Failed), after(2_000)));
    assert!(!m.ok(move |s| s.record_publish_intent(s.fence(owner)?, t2, None, &judged(4))));
}

/// The outputs of one warehouse transaction record their intents together, or none of them
/// when one may no longer publish.
pub fn a_group_records_every_intent_or_none(m: &Engine) {
    let owner = planned(m, request("d"), 3, &alive());
    let (_, a) = start_run(m, owner, "d", 0, "t");
    let (_, b) = start_run(m, owner, "d", 1, "t");
    let (_, c) = start_run(m, owner, "d", 2, "t");
    let group = vec![(a, Some("/a".to_string()), judged(1)), (b, None, judged(2))];
    assert!(m.ok(move |s| s.record_group_intent(s.fence(owner)?, &group)));
    let r = m.read();
    assert!(r.is_publishing(a).unwrap() && r.is_publishing(b).unwrap());
    assert_eq!(
        m.rows(&format!(
            "SELECT id, audit_path, rows FROM task_tries WHERE id IN ({a}, {b}) ORDER BY id"
        )),
        [
            vec![
                Value::Integer(a),
                Value::Text("/a".into()),
                Value::Integer(1)
            ],
            vec![Value::Integer(b), Value::Null, Value::Integer(2)],
        ]
    );
    // One of them ended: none is recorded.
    m.ok(move |s| s.end_try(b, &TryRecord::new(TryState::Failed), after(2_000)));
    let group = vec![(c, None, judged(3)), (b, None, judged(2))];
    assert!(!m.ok(move |s| s.record_group_intent(s.fence(owner)?, &group)));
    assert!(!r.is_publishing(c).unwrap());
    // One of them lost its lease: none is recorded.
    m.ok(|s| s.release_lease(1, "d", start(0)));
    let group = vec![(c, None, judged(3)), (a, None, judged(1))];
    assert!(!m.ok(move |s| s.record_group_intent(s.fence(owner)?, &group)));
    assert!(!r.is_publishing(c).unwrap());
    assert!(
        m.ok(move |s| s.record_group_intent(s.fence(owner)?, &[])),
        "an empty group"
    );
}

/// A rollback's publication holds the rows of the try it put back; the gate's history reads
/// a task's published partitions before an interval, newest first.
pub fn a_rollbacks_publication_holds_the_rows_it_put_back(m: &Engine) {
    let owner = planned(m, request("d"), 3, &alive());
    let mut tries = Vec::new();
    for d in 0..3 {
        let ids = start_run(m, owner, "d", d, "t");
        let rows = 10 * (d + 1);
        m.ok(move |s| {
            s.mark_published(
                &Publication {
                    try_id: ids.1,
                    dag_id: "d",
                    task_id: "t",
                    interval: day(d),
                    rows,
                    fingerprint: None,
                },
                backfill::clock::now_ms(),
            )
        });
        end_run(
            m,
            owner,
            ids,
            RunState::Succeeded,
            record(TryState::Succeeded),
        );
        tries.push(ids.1);
    }
    let r = m.read();
    assert_eq!(
        r.published_history("d", "t", start(3), 10).unwrap(),
        [30, 20, 10]
    );
    assert_eq!(r.published_history("d", "t", start(2), 1).unwrap(), [20]);
    assert!(
        r.published_history("d", "t", start(0), 10)
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        r.published_starts("d", start(1), start(2)).unwrap(),
        [(start(1), 20), (start(2), 30)]
    );
    let rollback = NewBackfill {
        kind: BackfillKind::Rollback,
        ..request("d")
    };
    let back = planned_days(m, rollback, [1], &alive());
    let ids = start_run(m, back, "d", 1, "t");
    let mut rec = record(TryState::Succeeded);
    rec.verdict = Some(Verdict::RolledBack);
    rec.restored_from = Some(tries[0]);
    rec.rows = Some(10);
    end_run(m, back, ids, RunState::Succeeded, rec);
    m.ok(move |s| {
        s.mark_published(
            &Publication {
                try_id: ids.1,
                dag_id: "d",
                task_id: "t",
                interval: day(1),
                rows: 10,
                fingerprint: Some("back"),
            },
            backfill::clock::now_ms(),
        )
    });
    assert_eq!(
        r.current_publication("d", "t", start(1)).unwrap(),
        Some(Current {
            try_id: ids.1,
            rows: 10,
            content: Some(tries[0]),
            fingerprint: Some("back".into()),
        })
    );
    assert_eq!(
        r.published_history("d", "t", start(3), 10).unwrap(),
        [30, 10, 10]
    );
    assert_eq!(
        r.latest_computing_state("d", start(1)).unwrap(),
        Some(RunState::Succeeded)
    );
    assert_eq!(
        r.last_success("d", start(1)).unwrap(),
        Some(run_started(
            m,
            m.int(&format!(
                "SELECT run_id FROM task_tries WHERE id = {}",
                tries[1]
            ))
        )),
        "a rollback computes nothing"
    );
}
