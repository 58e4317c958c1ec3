//! How long this process's manifest sessions wait: for the server to answer (the patience),
//! and the server for a session idle inside a transaction.

use std::time::Duration;

/// The longest the server lets a manifest session sit idle inside a transaction before it ends
/// the session (and rolls its transaction back): a frozen host holds the writers' lock no
/// longer than this, nor than a fifth of the lease timeout (see [`idle_in_transaction`]).
pub(crate) const IDLE_IN_TRANSACTION: Duration = Duration::from_secs(5);

/// The idle-in-transaction timeout of this process's manifest sessions, in milliseconds (see
/// [`set_lease_timeout`]).
static IDLE_MS: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(IDLE_IN_TRANSACTION.as_millis() as u64);

/// How long the server lets a session of this process sit idle inside a transaction: a peer
/// waits for the writers' lock behind a frozen process at most about that long.
pub(crate) fn idle_in_transaction() -> Duration {
    Duration::from_millis(IDLE_MS.load(std::sync::atomic::Ordering::Relaxed))
}

/// Fits this process's manifest sessions to the project's lease timeout, before the first
/// connection: a session idle inside a transaction is ended after a fifth of the lease (at
/// most [`IDLE_IN_TRANSACTION`]), so that a peer that waits behind a frozen writer for the
/// writers' lock hears back within half its lease, the time after which its heartbeat gives
/// up; and the patience is the lease (see [`set_patience`]).
pub(crate) fn set_lease_timeout(lease: Duration) {
    let idle = (lease / 5).min(IDLE_IN_TRANSACTION);
    let ms = u64::try_from(idle.as_millis()).unwrap_or(u64::MAX).max(100);
    IDLE_MS.store(ms, std::sync::atomic::Ordering::Relaxed);
    set_patience(lease);
}

/// How long the manifest may go without answering before this process gives up on it, when
/// nothing set it (see [`set_patience`]).
pub(crate) const PATIENCE: Duration = Duration::from_secs(30);

/// The patience of this process, in milliseconds (see [`set_patience`]).
static PATIENCE_MS: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(PATIENCE.as_millis() as u64);

/// How long the manifest may go without answering before this process gives up on it: each
/// round trip waits for its answer that long at most (a server or a network that hangs, not
/// only one that refuses), and a lost connection is made again for that long after the last
/// answer. A backfill's owner sets its lease timeout: a manifest silent for longer has let its
/// leases expire, so the owner stops and exits rather than hang (the backfill stays resumable).
/// Never less than twice [`IDLE_IN_TRANSACTION`]: waiting for the writers' lock behind a host
/// frozen inside a transaction (which the server ends after at most that long) is not silence,
/// and a server that restarts is waited for that long at least.
pub(crate) fn set_patience(d: Duration) {
    let d = d.max(IDLE_IN_TRANSACTION * 2);
    let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1);
    PATIENCE_MS.store(ms, std::sync::atomic::Ordering::Relaxed);
}

pub(crate) fn patience() -> Duration {
    Duration::from_millis(PATIENCE_MS.load(std::sync::atomic::Ordering::Relaxed))
}
