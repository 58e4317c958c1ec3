//! Staged outputs as the session needs them: what a promote backfill publishes (also when it
//! is resumed), and settling a staged backfill once nothing of it awaits promotion.

use std::collections::HashMap;
use std::path::Path;

use crate::exit::Error;
use crate::manifest::writer::Writer;
use crate::manifest::{self, Backfill};
use crate::project::Project;
use crate::runner::{Mode, StagedTry};
use crate::state::BackfillKind;

/// What the runner does for a backfill of this kind (`resume` asks).
pub(crate) fn mode_of(b: &Backfill, manifest_path: &Path) -> Result<Mode, Error> {
    Ok(match b.kind {
        BackfillKind::Run => Mode::Run,
        BackfillKind::Stage => Mode::Stage,
        BackfillKind::Promote => {
            let source = b.source_backfill.ok_or_else(|| {
                Error::Internal(format!(
                    "promote backfill {} names no staged backfill",
                    b.id
                ))
            })?;
            let staged = staged_outputs(manifest_path, source)?;
            if b.atomic {
                Mode::PromoteAtomic(staged)
            } else {
                Mode::Promote(staged)
            }
        }
        BackfillKind::Rollback => Mode::Rollback(b.tasks.clone()),
    })
}

/// The outputs of a staged backfill still awaiting promotion, by interval start and task.
pub(crate) fn staged_outputs(
    manifest_path: &Path,
    backfill_id: i64,
) -> Result<HashMap<(i64, String), StagedTry>, Error> {
    let conn = manifest::open_read_only(manifest_path)?;
    let staged = conn
        .staged_outputs(backfill_id)
        .map_err(|e| e.at(manifest_path))?;
    Ok(staged
        .into_iter()
        .filter(|s| s.state == crate::state::StagedState::Staged)
        .filter_map(|s| {
            let path = s.path?;
            Some((
                (s.interval.start.timestamp(), s.task_id),
                StagedTry {
                    try_id: s.try_id,
                    run_id: s.run_id,
                    try_number: s.try_number,
                    record: s.record,
                    path,
                },
            ))
        })
        .collect())
}

/// Once no output of a staged backfill awaits promotion, it is complete. Written through the
/// manifest's writer, as every write is.
pub(crate) fn settle_staged(path: &Path, project: &Project, id: i64) -> Result<(), Error> {
    let writer = Writer::open(path, project.durability)?;
    let settled = writer.call_blocking(move |c| c.settle_staged(id));
    writer.close();
    Ok(settled?)
}
