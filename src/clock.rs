//! The one clock that decides what "now" is for planning: which intervals are complete, and
//! what `today` and `now-6h` mean. `BACKFILL_NOW` (an RFC 3339 instant) pins it, for tests and
//! for replaying what a past nightly run would have done. Heartbeats and durations always use
//! the real clock: heartbeats and starts the wall clock, which other processes and hosts read;
//! durations the monotonic one ([`Mark`], [`End`]), which a wall clock set back or ahead does
//! not move, so that nothing this process ran ends before it started.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chrono::{DateTime, Utc};

pub(crate) const ENV: &str = "BACKFILL_NOW";

/// How often an owner writes its heartbeat (and reads the cancel flag).
pub(crate) const HEARTBEAT: Duration = Duration::from_millis(250);

/// Wall-clock milliseconds since the epoch, for event timestamps and heartbeats.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
        .saturating_add(crate::fault::clock_skew_ms())
}

/// A moment of this process on the monotonic clock (`CLOCK_BOOTTIME`: it counts a suspended
/// machine's sleep, as the wall clock does, and no step of the wall clock), taken when it
/// recorded a start: what the end is measured from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Mark(std::time::Duration);

impl Mark {
    pub(crate) fn now() -> Self {
        let mut ts = nix::libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime only writes the timespec it is given.
        let read = unsafe { nix::libc::clock_gettime(nix::libc::CLOCK_BOOTTIME, &mut ts) };
        if read != 0 {
            return Self(std::time::Duration::ZERO);
        }
        Self(std::time::Duration::new(
            u64::try_from(ts.tv_sec).unwrap_or(0),
            u32::try_from(ts.tv_nsec).unwrap_or(0),
        ))
    }

    /// Milliseconds from this mark to now.
    pub(crate) fn elapsed_ms(self) -> i64 {
        let ms = Self::now().0.saturating_sub(self.0).as_millis();
        i64::try_from(ms).unwrap_or(i64::MAX)
    }
}

/// When something ended, for the manifest: now on the wall clock (the database's on PostgreSQL)
/// and, when this process recorded its start, the milliseconds since on the monotonic clock.
/// The manifest records the end as now, never before the start; and as the start plus those
/// milliseconds when they and now disagree by more than a second: the clock jumped meanwhile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct End {
    pub now_ms: i64,
    pub elapsed_ms: Option<i64>,
}

impl End {
    /// Now, the start not measured by this process.
    pub fn now() -> Self {
        Self::since(None)
    }

    /// Now, and the time since `began` when this process marked the start.
    pub(crate) fn since(began: Option<Mark>) -> Self {
        Self {
            now_ms: now_ms(),
            elapsed_ms: began.map(Mark::elapsed_ms),
        }
    }
}

/// `BACKFILL_NOW` that does not say an instant: bad input (exit 2).
#[derive(Debug, thiserror::Error)]
#[error(
    "{ENV}={value} is not an RFC 3339 instant ({why}); write it like 2026-09-01T00:00:00Z or unset it"
)]
pub struct BadNow {
    value: String,
    why: chrono::ParseError,
}

/// Now, as planning sees it: `BACKFILL_NOW` when set, else the real clock.
pub(crate) fn now() -> Result<DateTime<Utc>, BadNow> {
    match std::env::var(ENV) {
        Ok(value) => DateTime::parse_from_rfc3339(&value)
            .map(|t| t.with_timezone(&Utc))
            .map_err(|why| BadNow { value, why }),
        Err(_) => Ok(Utc::now()),
    }
}
