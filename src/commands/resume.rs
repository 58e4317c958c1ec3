//! `backfill resume ID`: continue a backfill, then the rest of its cascade, if any.

use crate::exit::{self, Error};
use crate::manifest;
use crate::session::resume::resume_found;
use crate::session::{Global, find_backfill};

/// Resumes backfill `id`; for a backfill of a cascade, then continues the cascade.
/// With `wait`, a lease its owner still holds is waited out first.
pub(crate) fn run(g: &Global, id: i64, wait: bool) -> Result<u8, Error> {
    let (project, path, conn, backfill) = find_backfill(g, id)?;
    let code = resume_found(g, &project, &path, conn, backfill.clone(), wait)?;
    if let (crate::state::BackfillKind::Promote, Some(source)) =
        (backfill.kind, backfill.source_backfill)
    {
        crate::session::staged::settle_staged(&path, &project, source)?;
    }
    let root = match (&backfill.cascade, backfill.cascade_of) {
        (Some(_), _) => Some(backfill),
        (None, Some(root)) => manifest::open_read_only(&path)?
            .backfill(root)
            .map_err(|e| e.at(&path))?,
        _ => None,
    };
    let Some(root) = root else {
        return Ok(code);
    };
    let Some(mode) = root
        .cascade
        .as_deref()
        .and_then(crate::cascade::Mode::parse)
    else {
        return Ok(code);
    };
    if code == exit::INTERRUPTED {
        return Ok(code);
    }
    let rest = crate::session::cascade::continue_cascade(g, &project, root.id, &root.dag_id, mode)?;
    Ok(crate::session::chain::worst(code, rest))
}
