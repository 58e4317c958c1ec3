//! A warehouse in the manifest's own database: how it is recognised, and the manifest's record
//! of a publish written by the publish's own transaction.

use super::*;
use crate::warehouse::backend::Sharing;

/// The types of an [`InManifest`] statement's parameters.
pub(super) const IN_PUBLISH_TYPES: [Type; 17] = [
    Type::INT8,
    Type::INT8,
    Type::TEXT,
    Type::INT8,
    Type::INT8,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::INT8,
    Type::INT8,
    Type::INT8,
    Type::INT8,
    Type::INT8,
    Type::INT8,
    Type::INT8,
];

/// The values of an [`InManifest`] statement's parameters.
pub(super) struct InPublishValues<'a> {
    pub(super) try_id: i64,
    pub(super) rows: i64,
    pub(super) m: &'a InManifest,
    pub(super) start: i64,
    pub(super) end: i64,
    /// A merge's rows inserted, updated, deleted and unchanged: the runner's, or what a
    /// promote's merge did.
    pub(super) merged: [Option<i64>; 4],
}

impl<'a> InPublishValues<'a> {
    pub(super) fn of(m: &'a InManifest, try_id: i64, rows: i64, interval: DataInterval) -> Self {
        Self {
            try_id,
            rows,
            m,
            start: interval.start.timestamp(),
            end: interval.end.timestamp(),
            merged: m.merged,
        }
    }

    /// With the counts of the merge that this transaction did.
    pub(super) fn merged(mut self, done: Option<&crate::gate::Merge>) -> Self {
        if let Some(d) = done {
            self.merged = [d.inserted, d.updated, d.deleted, d.unchanged].map(Some);
        }
        self
    }

    pub(super) fn params(&self) -> [&(dyn ToSql + Sync); 17] {
        let m = self.m;
        [
            &self.try_id,
            &self.rows,
            &m.fingerprint,
            &m.source_rows,
            &m.previous_rows,
            &m.verdict,
            &m.reasons,
            &m.source_fingerprint,
            &m.dag_id,
            &m.task_id,
            &self.start,
            &self.end,
            &m.promoted_from,
            &self.merged[0],
            &self.merged[1],
            &self.merged[2],
            &self.merged[3],
        ]
    }

    /// Runs the statement inside the publish's transaction (not pipelined with its commit);
    /// a try that may no longer publish is [`Error::Refused`].
    pub(super) fn run(&self, c: &mut Conn) -> std::result::Result<(), Failure> {
        let stmt = prepared(c, self.m.statement, &IN_PUBLISH_TYPES)?;
        match c.wait(c.client.execute(&stmt, &self.params())) {
            Ok(_) => Ok(()),
            Err(e) if refused_by_manifest(&e, self.m.refused, self.try_id) => {
                Err(Error::Refused.into())
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// Whether the manifest's record of a publish failed because the try may no longer publish:
/// `publish_refused`, or a serialization failure (recovery ended the try after the publish's
/// snapshot was taken). Says so in the diagnostics.
pub(super) fn refused_by_manifest(e: &tokio_postgres::Error, code: &str, try_id: i64) -> bool {
    let refused = e
        .code()
        .is_some_and(|c| c.code() == code || *c == SqlState::T_R_SERIALIZATION_FAILURE);
    if refused {
        tracing::info!(try_id, "publish refused by the manifest: {}", describe(e));
    }
    refused
}

/// Whether warehouse `w` is in the manifest's own database (`manifest_key`, see
/// [`crate::manifest::database_key`]) and its user may write the manifest's record of a
/// publish: then a publish and that record commit in one transaction. Asked once per run
/// (see `runner::sql_try::one_database`), which says it when it may not.
pub(crate) fn shares_database(w: &Warehouse, manifest_key: &str) -> Sharing {
    // Looked up by oid in the catalogs, which anyone may read: a user without access to the
    // manifest's schema gets "no", not an error. (A privilege function given several
    // privileges says whether any is held: each is asked alone.)
    let sql = format!(
        "WITH s AS (SELECT oid FROM pg_catalog.pg_namespace WHERE nspname = 'backfill_manifest'), \
              t AS (SELECT c.oid, c.relname FROM pg_catalog.pg_class c JOIN s ON c.relnamespace = s.oid \
                    WHERE c.relname IN ('task_tries', 'published') AND c.relkind = 'r'), \
              f AS (SELECT p.oid FROM pg_catalog.pg_proc p JOIN s ON p.pronamespace = s.oid \
                    WHERE p.proname = 'publish_refused') \
         SELECT ({DATABASE_KEY}) = $1, \
                coalesce((SELECT has_schema_privilege(oid, 'USAGE') FROM s), false) \
                AND (SELECT count(*) = 2 AND bool_and(has_table_privilege(oid, 'SELECT') \
                       AND has_table_privilege(oid, 'UPDATE') \
                       AND (relname <> 'published' OR has_table_privilege(oid, 'INSERT'))) FROM t) \
                AND (SELECT count(*) = 1 AND bool_and(has_function_privilege(oid, 'EXECUTE')) FROM f)"
    );
    let found = conn::take(w).map_err(String::from).and_then(|c| {
        let row = c.wait(c.client.query_one(&sql, &[&manifest_key]));
        match row {
            Ok(row) => {
                conn::give(c);
                Ok((row.get::<_, bool>(0), row.get::<_, Option<bool>>(1)))
            }
            Err(e) => Err(describe(&e)),
        }
    });
    match found {
        Ok((false, _)) => Sharing::Apart,
        Ok((true, Some(true))) => Sharing::Shared,
        Ok((true, _)) => Sharing::SharedReadOnly,
        Err(e) => {
            // The try meets the problem itself; recording after the commit is always safe.
            tracing::warn!(warehouse = %w.name, "cannot tell whether the warehouse is in the manifest's database: {e}");
            Sharing::Apart
        }
    }
}
