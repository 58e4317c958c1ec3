//! The one clock that decides what "now" is for planning: which intervals are complete, and
//! what `today` and `now-6h` mean. `BACKFILL_NOW` (an RFC 3339 instant) pins it, for tests and
//! for replaying what a past nightly run would have done. Heartbeats and durations always use
//! the real clock.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chrono::{DateTime, Utc};

pub const ENV: &str = "BACKFILL_NOW";

/// How often an owner writes its heartbeat (and reads the cancel flag).
pub const HEARTBEAT: Duration = Duration::from_millis(250);

/// Wall-clock milliseconds since the epoch, for event timestamps and heartbeats.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
        .saturating_add(crate::fault::clock_skew_ms())
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
pub fn now() -> Result<DateTime<Utc>, BadNow> {
    match std::env::var(ENV) {
        Ok(value) => DateTime::parse_from_rfc3339(&value)
            .map(|t| t.with_timezone(&Utc))
            .map_err(|why| BadNow { value, why }),
        Err(_) => Ok(Utc::now()),
    }
}
