//! The states the manifest records, as enums: a backfill's, a run's and a task try's. Each maps
//! to the text the manifest stores (and its `CHECK` constraints allow) through `ToSql`/`FromSql`,
//! so no state is ever spelled as a string outside this module.

use std::fmt;
use std::str::FromStr;

use rusqlite::types::{FromSql, FromSqlError, FromSqlResult, ToSql, ToSqlOutput, ValueRef};

/// Declares a state enum with its stored names, `Display`, `FromStr` and the SQL mapping.
macro_rules! stored_enum {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $($(#[$vdoc])* $variant),+
        }

        impl $name {
            pub(crate) const ALL: &'static [$name] = &[$($name::$variant),+];

            pub(crate) const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $name {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                Self::ALL
                    .iter()
                    .copied()
                    .find(|v| v.as_str() == s)
                    .ok_or_else(|| format!("unknown {} `{s}`", stringify!($name)))
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = String::deserialize(d)?;
                text.parse().map_err(serde::de::Error::custom)
            }
        }

        impl ToSql for $name {
            fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
                Ok(ToSqlOutput::from(self.as_str()))
            }
        }

        impl FromSql for $name {
            fn column_result(value: ValueRef<'_>) -> FromSqlResult<Self> {
                let text = value.as_str()?;
                text.parse()
                    .map_err(|e: String| FromSqlError::Other(e.into()))
            }
        }
    };
}

stored_enum! {
    /// Where a backfill stands.
    BackfillState {
        Running => "running",
        Completed => "completed",
        Failed => "failed",
        Cancelled => "cancelled",
        /// A staged backfill whose every planned interval succeeded: its outputs await
        /// `promote` (or `discard`).
        Staged => "staged",
    }
}

stored_enum! {
    /// What a backfill does with its intervals.
    BackfillKind {
        /// Computes each interval and publishes what passes the gate.
        Run => "run",
        /// Computes and audits each interval and keeps the output, unpublished.
        Stage => "stage",
        /// Publishes the staged outputs of another backfill.
        Promote => "promote",
        /// Puts back the partitions that the latest publishes replaced.
        Rollback => "rollback",
    }
}

stored_enum! {
    /// What became of a staged output.
    StagedState {
        Staged => "staged",
        Promoted => "promoted",
        Discarded => "discarded",
    }
}

stored_enum! {
    /// The state of one run (one attempt at one interval).
    RunState {
        Queued => "queued",
        Running => "running",
        Succeeded => "succeeded",
        Failed => "failed",
        Rejected => "rejected",
        Cancelled => "cancelled",
    }
}

stored_enum! {
    /// The state of one task try.
    TryState {
        Running => "running",
        Succeeded => "succeeded",
        Failed => "failed",
        Rejected => "rejected",
        Cancelled => "cancelled",
    }
}

stored_enum! {
    /// Where the readiness of an interval's sources stands (`[tasks.ready]`), for one task.
    ReadyState {
        /// Not ready yet: asked again until its wait runs out.
        Waiting => "waiting",
        /// Ready: the interval's run could start.
        Ready => "ready",
        /// Still not ready when its wait ran out: the interval was not run.
        NotReady => "not ready",
    }
}

impl RunState {
    pub(crate) fn is_finished(self) -> bool {
        !matches!(self, Self::Queued | Self::Running)
    }
}

stored_enum! {
    /// What a backfill's plan does with an interval (its reason, when skipped, is recorded
    /// beside it).
    PlanAction {
        Run => "run",
        Skip => "skip",
    }
}

stored_enum! {
    /// The gate's verdict on a try's output, as the manifest records it.
    Verdict {
        Published => "published",
        /// An explicit empty partition: zero rows from an empty source.
        PublishedEmpty => "published empty",
        Rejected => "rejected",
        /// Kept unpublished for `promote`.
        Staged => "staged",
        /// A rollback's try: the partition put back as an earlier publish left it.
        RolledBack => "rolled back",
    }
}

/// A verdict as the reads show it: a staged output's says what became of it (`staged,
/// promoted`, `staged, discarded`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShownVerdict {
    pub verdict: Verdict,
    /// What became of a staged output (`None` for the other verdicts, or an old record).
    pub staged: Option<StagedState>,
}

impl fmt::Display for ShownVerdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.verdict, self.staged) {
            (Verdict::Staged, Some(s)) if s != StagedState::Staged => write!(f, "staged, {s}"),
            (v, _) => f.write_str(v.as_str()),
        }
    }
}

impl serde::Serialize for ShownVerdict {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Where an interval's latest run stands, as the reads show it: its state, or, while its try
/// waits for a slot of a pool, that pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IntervalState {
    Run(RunState),
    WaitingForPool(String),
    /// No run yet: its sources are not ready (`[tasks.ready]`), and it may wait this much
    /// longer (milliseconds).
    WaitingForSources(i64),
}

impl IntervalState {
    /// The run's state (a run waiting for a pool is running).
    pub(crate) fn run_state(&self) -> RunState {
        match self {
            Self::Run(s) => *s,
            Self::WaitingForPool(_) => RunState::Running,
            Self::WaitingForSources(_) => RunState::Queued,
        }
    }
}

impl fmt::Display for IntervalState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Run(s) => f.write_str(s.as_str()),
            Self::WaitingForPool(pool) => write!(f, "waiting for pool {pool}"),
            Self::WaitingForSources(left_ms) => write!(
                f,
                "waiting for sources ({} left)",
                crate::words::duration_left(std::time::Duration::from_millis(
                    u64::try_from(*left_ms).unwrap_or(0)
                ))
            ),
        }
    }
}

impl serde::Serialize for IntervalState {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_sql() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        for s in RunState::ALL {
            let back: RunState = conn.query_row("SELECT ?1", [s], |r| r.get(0)).unwrap();
            assert_eq!(back, *s);
            assert_eq!(s.as_str().parse::<RunState>(), Ok(*s));
        }
        for s in TryState::ALL {
            let back: TryState = conn.query_row("SELECT ?1", [s], |r| r.get(0)).unwrap();
            assert_eq!(back, *s);
        }
        for s in BackfillState::ALL {
            let back: BackfillState = conn.query_row("SELECT ?1", [s], |r| r.get(0)).unwrap();
            assert_eq!(back, *s);
        }
        let bad: rusqlite::Result<RunState> = conn.query_row("SELECT 'exploded'", [], |r| r.get(0));
        assert!(bad.is_err());
    }
}
