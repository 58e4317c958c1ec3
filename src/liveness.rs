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
    /// The name owners record, to tell processes of this host from others': where a recorded
    /// process id means this process (see [`identity`]).
    fn name(&self) -> String;
    /// Whether process `pid` of this host is alive (not a zombie).
    fn pid_alive(&self, pid: i64) -> bool;
    /// Whether a member of `group` of this host is alive, its leader being the recorded one.
    fn group_alive(&self, group: Group) -> bool;
    /// When process `pid` of this host started (clock ticks since boot), if it exists.
    fn start_of(&self, pid: i64) -> Option<i64>;
    /// Whether process `pid` of this host is stopped (SIGSTOP, a debugger).
    fn stopped(&self, pid: i64) -> bool;
}

/// What owners and tries record as their host: the host name and, after `#`, the PID
/// namespace whose numbering their process ids follow (when known).
pub(crate) fn identity(host: &str, pid_namespace: Option<&str>) -> String {
    match pid_namespace {
        Some(ns) => format!("{host}#{ns}"),
        None => host.to_string(),
    }
}

/// The name and PID namespace of a recorded host, when it has one: the number after its last
/// `#`, as Linux numbers namespaces (from 0xF0000000: ten digits or more), so that a `#` in a
/// host name recorded by an earlier version is not taken for one.
fn namespace(recorded: &str) -> Option<(&str, &str)> {
    recorded
        .rsplit_once('#')
        .filter(|(_, ns)| ns.len() >= 10 && ns.bytes().all(|b| b.is_ascii_digit()))
}

/// The host name of a recorded host, for people.
pub(crate) fn host_name(recorded: &str) -> &str {
    namespace(recorded).map_or(recorded, |(name, _)| name)
}

/// Whether a recorded host is `here` (an [`identity`]). A host recorded without its PID
/// namespace (by an earlier version) is taken by its name.
pub(crate) fn same_host(recorded: &str, here: &str) -> bool {
    recorded == here || namespace(recorded).is_none() && recorded == host_name(here)
}

/// The name of a recorded host when it is not `here`, for saying where something runs.
pub(crate) fn elsewhere<'a>(recorded: Option<&'a str>, here: &str) -> Option<&'a str> {
    recorded.filter(|h| !same_host(h, here)).map(host_name)
}

/// The fields of `/proc/PID/stat` after the command name: state is the first.
pub(crate) fn stat_fields(pid: i64) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    Some(rest.split_whitespace().map(str::to_string).collect())
}

/// Whether a process of this host is stopped (SIGSTOP, a debugger).
pub(crate) fn is_stopped(pid: i64) -> bool {
    stat_fields(pid).is_some_and(|f| f.first().is_some_and(|s| s == "T" || s == "t"))
}

/// The CPU time a process of this host has used so far, in clock ticks (user and system,
/// `/proc/PID/stat` fields 14 and 15): what tells a process that works from one that waits.
pub(crate) fn cpu_ticks(pid: i64) -> Option<u64> {
    let f = stat_fields(pid)?;
    let field = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
    Some(field(11)? + field(12)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_is_its_name_and_its_pid_namespace() {
        let here = identity("etl-2", Some("4026531836"));
        assert_eq!(here, "etl-2#4026531836");
        assert_eq!(host_name(&here), "etl-2");
        assert!(same_host(&here, &here));
        // The same name, another PID namespace (a container sharing the host name).
        assert!(!same_host("etl-2#4026532001", &here));
        assert!(!same_host("etl-3#4026531836", &here));
        // Recorded by an earlier version: by name.
        assert!(same_host("etl-2", &here));
        assert!(!same_host("etl-3", &here));
        assert_eq!(identity("etl-2", None), "etl-2");
        assert_eq!(host_name("etl-2"), "etl-2");
        // A `#` in the name itself.
        let hashed = identity("etl#2", Some("4026531836"));
        assert_eq!(host_name(&hashed), "etl#2");
        assert!(same_host("etl#2", &hashed));
        assert!(!same_host("etl#2#4026532001", &hashed));
    }
}
