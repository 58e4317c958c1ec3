//! Lease liveness: who may run an interval.
//!
//! A lease names its owner backfill; the owner row carries pid, host and heartbeat. A lease is
//! live while its owner is `running`, has sent a heartbeat within the lease timeout, and — when
//! it runs on this host — its process exists. Anything else is stale and may be taken over.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

/// Everything needed to judge liveness and to stamp new leases.
#[derive(Debug, Clone)]
pub struct LeaseCtx {
    pub now_ms: i64,
    pub host: String,
    pub pid: i64,
    pub timeout_ms: i64,
}

impl LeaseCtx {
    pub fn new(timeout: Duration) -> Self {
        Self {
            now_ms: now_ms(),
            host: hostname(),
            pid: i64::from(std::process::id()),
            timeout_ms: i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX),
        }
    }

    /// Whether a backfill with this owner information is alive.
    pub fn owner_alive(
        &self,
        state: &str,
        pid: Option<i64>,
        host: Option<&str>,
        heartbeat_ms: Option<i64>,
    ) -> bool {
        if state != "running" {
            return false;
        }
        let fresh = heartbeat_ms.is_some_and(|hb| self.now_ms - hb < self.timeout_ms);
        let here = host == Some(self.host.as_str());
        fresh && (!here || pid.is_some_and(pid_alive))
    }
}

/// Wall-clock milliseconds since the epoch, for event timestamps and heartbeats.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

pub fn hostname() -> String {
    nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "localhost".to_string())
}

/// Whether a process exists and is not a zombie.
pub fn pid_alive(pid: i64) -> bool {
    let Ok(raw) = i32::try_from(pid) else {
        return false;
    };
    if raw <= 0 {
        return false;
    }
    let exists = match kill(Pid::from_raw(raw), None) {
        Ok(()) => true,
        Err(nix::errno::Errno::EPERM) => true,
        Err(_) => false,
    };
    if !exists {
        return false;
    }
    // A zombie has exited; only its parent has not reaped it yet.
    match std::fs::read_to_string(format!("/proc/{raw}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_none_or(|state| state != "Z"),
        Err(_) => true,
    }
}

/// Sends `signal` to every process of a process group. Returns whether any received it.
pub fn signal_group(pgid: i64, signal: Signal) -> bool {
    match i32::try_from(pgid) {
        Ok(raw) if raw > 1 => killpg(Pid::from_raw(raw), signal).is_ok(),
        _ => false,
    }
}

/// Whether any process of the group is still alive. Zombies do not count: they have exited and
/// only wait for their parent, which may be the very process that is frozen.
pub fn group_alive(pgid: i64) -> bool {
    let exists = match i32::try_from(pgid) {
        Ok(raw) if raw > 1 => killpg(Pid::from_raw(raw), None).is_ok(),
        _ => false,
    };
    if !exists {
        return false;
    }
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return true;
    };
    entries.filter_map(Result::ok).any(|e| {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            return false;
        };
        // After the command name: state, ppid, pgrp, ...
        let mut fields = stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.split_whitespace())
            .into_iter()
            .flatten();
        let state = fields.next();
        let pgrp = fields.nth(1).and_then(|g| g.parse::<i64>().ok());
        pgrp == Some(pgid) && state != Some("Z")
    })
}

/// Kills an orphaned process group left by a dead backfill and waits (up to `wait`) until it
/// is gone, so that a new try never overlaps the old one.
pub fn kill_orphan_group(pgid: i64, wait: Duration) {
    if !signal_group(pgid, Signal::SIGKILL) {
        return;
    }
    let deadline = std::time::Instant::now() + wait;
    while group_alive(pgid) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn liveness_rules() {
        let ctx = LeaseCtx {
            now_ms: 100_000,
            host: "here".into(),
            pid: 1,
            timeout_ms: 30_000,
        };
        let me = i64::from(std::process::id());
        assert!(ctx.owner_alive("running", Some(me), Some("here"), Some(90_000)));
        // Silent for longer than the timeout.
        assert!(!ctx.owner_alive("running", Some(me), Some("here"), Some(60_000)));
        // Finished owners hold nothing.
        assert!(!ctx.owner_alive("cancelled", Some(me), Some("here"), Some(90_000)));
        // A dead pid on this host.
        assert!(!ctx.owner_alive(
            "running",
            Some(i64::from(i32::MAX)),
            Some("here"),
            Some(90_000)
        ));
        // Another host: only the heartbeat can tell.
        assert!(ctx.owner_alive(
            "running",
            Some(i64::from(i32::MAX)),
            Some("there"),
            Some(90_000)
        ));
    }
}
