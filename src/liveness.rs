//! Who is alive on this host: what the manifest needs to judge an owner by its process and a
//! try by its process group. The manifest is handed a [`Host`] and never looks at processes
//! itself; `process::LOCAL` is the one that does, and tests may pass their own.

/// A process group as recorded in the manifest: the group id and its leader's start time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Group {
    pub pgid: i64,
    /// Clock ticks since boot at which the leader started (`/proc/PID/stat` field 22); `None`
    /// when unknown (a manifest written before it was recorded).
    pub leader_start: Option<i64>,
}

/// This host, as far as liveness goes.
pub trait Host: Send + Sync + std::fmt::Debug {
    /// The name owners record, to tell processes of this host from others'.
    fn name(&self) -> String;
    /// Whether process `pid` of this host is alive (not a zombie).
    fn pid_alive(&self, pid: i64) -> bool;
    /// Whether a member of `group` of this host is alive, its leader being the recorded one.
    fn group_alive(&self, group: Group) -> bool;
}
