//! Staged outputs: kept unpublished until a promote publishes them or they are discarded; one
//! per task and interval awaits promotion, the newest.

use backfill::manifest::NewBackfill;
use backfill::plan::RunState;
use backfill::state::{BackfillKind, BackfillState, StagedState, TryState, Verdict};

use crate::support::*;

fn staged(rows: i64, path: &str) -> backfill::manifest::TryRecord {
    let mut rec = record(TryState::Succeeded);
    rec.staged = Some(StagedState::Staged);
    rec.staged_path = Some(path.to_string());
    rec.verdict = Some(Verdict::Staged);
    rec.reasons = Some("warning: small".into());
    rec.rows = Some(rows);
    rec.fingerprint = Some(format!("f{rows}"));
    rec.source_rows = Some(rows + 1);
    rec.source_fingerprint = Some("src".into());
    rec
}

/// A staged backfill's outputs await promotion with what their gate judged; staging an
/// interval again discards the older output; a promote's running try keeps its staged output
/// from being discarded; an output is promoted or discarded once; the staged backfill is
/// complete once none awaits; readers say what became of each.
pub fn staged_outputs_are_promoted_or_discarded_once(m: &Engine) {
    let stage = NewBackfill {
        kind: BackfillKind::Stage,
        ..request("d")
    };
    let s = planned(m, stage, 2, &alive());
    let (r0, s0) = start_run(m, s, "d", 0, "t");
    end_run(m, s, (r0, s0), RunState::Succeeded, staged(7, "/staged/0"));
    let (r1, s1) = start_run(m, s, "d", 1, "t");
    end_run(m, s, (r1, s1), RunState::Succeeded, staged(8, "/staged/1"));
    let r = m.read();
    let outputs = |id| {
        r.staged_outputs(id)
            .unwrap()
            .into_iter()
            .map(|o| {
                (
                    o.interval,
                    o.task_id,
                    o.try_id,
                    o.run_id,
                    o.try_number,
                    o.path,
                    o.state,
                )
            })
            .collect::<Vec<_>>()
    };
    let out = |d, t, run, path: &str, state| {
        (
            day(d),
            "t".to_string(),
            t,
            run,
            1,
            Some(path.to_string()),
            state,
        )
    };
    assert_eq!(
        outputs(1),
        [
            out(0, s0, r0, "/staged/0", StagedState::Staged),
            out(1, s1, r1, "/staged/1", StagedState::Staged),
        ]
    );
    let first = &r.staged_outputs(1).unwrap()[0].record;
    assert_eq!(
        (
            first.rows,
            first.fingerprint.as_deref(),
            first.source_rows,
            first.source_fingerprint.as_deref()
        ),
        (Some(7), Some("f7"), Some(8), Some("src"))
    );
    assert_eq!(
        (first.verdict, first.reasons.as_deref(), first.state),
        (
            Some(Verdict::Staged),
            Some("warning: small"),
            TryState::Succeeded
        )
    );
    assert!(r.is_staged(s0).unwrap() && r.is_staged(s1).unwrap());
    let kept = r.keeping_staged_tables().unwrap();
    assert!(kept.contains(&s0) && kept.contains(&s1));
    let audits = r.needing_audit_files().unwrap();
    assert!(audits.contains(&s0) && audits.contains(&s1));
    assert!(
        r.succeeded_tries("d", start(0)).unwrap().is_empty(),
        "staged outputs are not computed"
    );

    // Day 0 staged again: the older output is discarded.
    let c = alive();
    m.ok(move |st| st.take_leases(1, "d", &mut std::iter::once(day(0)), &c));
    let (r0b, s0b) = start_run(m, s, "d", 0, "t");
    end_run(
        m,
        s,
        (r0b, s0b),
        RunState::Succeeded,
        staged(9, "/staged/0b"),
    );
    assert_eq!(
        outputs(1),
        [
            out(0, s0, r0, "/staged/0", StagedState::Discarded),
            out(0, s0b, r0b, "/staged/0b", StagedState::Staged),
            out(1, s1, r1, "/staged/1", StagedState::Staged),
        ]
    );
    assert!(!r.is_staged(s0).unwrap());
    assert!(!r.keeping_staged_tables().unwrap().contains(&s0));

    // Settled only once it is staged and nothing awaits.
    m.ok(|st| st.settle_staged(1));
    assert_eq!(
        r.backfill(1).unwrap().unwrap().state,
        BackfillState::Running
    );
    m.ok(move |st| st.finish_backfill(s, BackfillState::Staged, after(30_000)));
    m.ok(|st| st.settle_staged(1));
    assert_eq!(r.backfill(1).unwrap().unwrap().state, BackfillState::Staged);

    // A promote of it, running: its try names the staged output it publishes.
    let promote = NewBackfill {
        kind: BackfillKind::Promote,
        source_backfill: Some(1),
        ..request("d")
    };
    let p = planned_days(m, promote, [0], &alive());
    assert_eq!(r.promoting(1).unwrap(), Some(2));
    let (pr, pt) = start_run(m, p, "d", 0, "t");
    m.ok(move |st| st.set_promoted_from(pt, s0b));
    assert_eq!(
        m.int(&format!(
            "SELECT promoted_from FROM task_tries WHERE id = {pt}"
        )),
        s0b
    );
    assert!(
        !m.ok(move |st| st.discard_staged(s0b)),
        "a promote of it runs"
    );
    assert!(r.is_staged(s0b).unwrap());
    assert!(m.ok(move |st| st.set_staged(s0b, StagedState::Promoted)));
    assert!(
        !m.ok(move |st| st.set_staged(s0b, StagedState::Discarded)),
        "once"
    );
    assert!(!r.is_staged(s0b).unwrap());
    end_run(
        m,
        p,
        (pr, pt),
        RunState::Succeeded,
        record(TryState::Succeeded),
    );
    m.ok(move |st| st.finish_backfill(p, BackfillState::Completed, after(30_000)));
    assert_eq!(r.promoting(1).unwrap(), None);
    m.ok(|st| st.settle_staged(1));
    assert_eq!(
        r.backfill(1).unwrap().unwrap().state,
        BackfillState::Staged,
        "day 1 awaits"
    );
    assert!(m.ok(move |st| st.discard_staged(s1)));
    assert!(!m.ok(move |st| st.discard_staged(s1)), "once");
    m.ok(|st| st.settle_staged(1));
    assert_eq!(
        r.backfill(1).unwrap().unwrap().state,
        BackfillState::Completed
    );
    assert!(r.keeping_staged_tables().unwrap().is_empty());
    assert!(r.needing_audit_files().unwrap().is_empty());

    // What became of each, as `show` and `runs` say it.
    let show = r.show_backfill(1).unwrap().unwrap();
    let verdicts: Vec<_> = show
        .interval_details
        .iter()
        .map(|i| i.verdict.map(|v| v.to_string()))
        .collect();
    assert_eq!(
        verdicts,
        [
            Some("staged, promoted".to_string()),
            Some("staged, discarded".to_string())
        ]
    );
    let history: Vec<_> = r
        .run_history("d", start(0), start(1))
        .unwrap()
        .into_iter()
        .map(|h| (h.run_id, h.verdict.map(|v| v.to_string())))
        .collect();
    assert_eq!(
        history,
        [
            (r0, Some("staged, discarded".to_string())),
            (r0b, Some("staged, promoted".to_string())),
            (pr, None),
            (r1, Some("staged, discarded".to_string())),
        ]
    );
    let tries = r.interval_tries(1, start(0)).unwrap();
    assert_eq!(
        tries
            .iter()
            .map(|t| t.verdict.map(|v| v.to_string()))
            .collect::<Vec<_>>(),
        [
            Some("staged, discarded".to_string()),
            Some("staged, promoted".to_string())
        ]
    );
}
