//! Starting a child process (a try, a probe, a hook) with its gate between `fork` and `exec`,
//! as cheaply as `posix_spawn`: the child is created with `clone(CLONE_VM | CLONE_VFORK)` on a
//! small stack of its own (no copy of the parent's memory), puts itself in a new process group,
//! writes its pid on a pipe, waits for the gate, sets up its stdio and folder, and `exec`s. Only
//! the calling thread waits meanwhile (that is what `CLONE_VFORK` suspends); other threads read
//! the pid, record the group and open the gate.
//!
//! The child shares the parent's memory until `exec`, so it only makes system calls on data
//! prepared beforehand, with every signal blocked and every handler reset to the default (a
//! handler would run on the parent's memory). Its exit status is waited for through a pidfd.

use std::ffi::{CString, OsStr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::ExitStatus;

use nix::libc;
use tokio::io::unix::AsyncFd;

use super::GATE_CLOSED;

/// Everything the child needs, prepared in the parent (no allocation after `clone`).
pub(super) struct Prepared {
    path: CString,
    argv: Vec<CString>,
    envp: Vec<CString>,
    cwd: CString,
}

fn cstring(bytes: &[u8]) -> std::io::Result<CString> {
    CString::new(bytes).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "a command, argument or environment value contains a NUL byte",
        )
    })
}

impl Prepared {
    /// `argv[0]` is looked up on the `PATH` of `env` (else of this process) unless it contains
    /// a `/`; the environment is this process's plus `env`.
    pub(super) fn new(
        argv: &[&OsStr],
        env: &[(String, String)],
        cwd: &Path,
    ) -> std::io::Result<Self> {
        let name = argv
            .first()
            .ok_or_else(|| std::io::Error::other("empty command"))?;
        // This process's environment does not change while it runs: read it once.
        static BASE: std::sync::OnceLock<
            std::collections::BTreeMap<std::ffi::OsString, std::ffi::OsString>,
        > = std::sync::OnceLock::new();
        let mut vars = BASE.get_or_init(|| std::env::vars_os().collect()).clone();
        for (k, v) in env {
            vars.insert(k.into(), v.into());
        }
        let path = if name.as_bytes().contains(&b'/') {
            let p = cwd.join(name);
            if !p.exists() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "no such program (not a file, and not found on PATH)",
                ));
            }
            name.as_bytes().to_vec()
        } else {
            let search = vars.get(OsStr::new("PATH")).cloned().unwrap_or_default();
            lookup(&search, cwd, name)?.into_os_string().into_vec()
        };
        Ok(Self {
            path: cstring(&path)?,
            argv: argv
                .iter()
                .map(|a| cstring(a.as_bytes()))
                .collect::<Result<_, _>>()?,
            envp: vars
                .iter()
                .map(|(k, v)| {
                    let mut kv = k.as_bytes().to_vec();
                    kv.push(b'=');
                    kv.extend_from_slice(v.as_bytes());
                    cstring(&kv)
                })
                .collect::<Result<_, _>>()?,
            cwd: cstring(cwd.as_os_str().as_bytes())?,
        })
    }
}

use std::os::unix::ffi::OsStringExt;

type Found = std::collections::HashMap<
    (std::ffi::OsString, std::path::PathBuf, std::ffi::OsString),
    std::path::PathBuf,
>;

/// Where a program name is found on a search path, remembered for the process (as a shell
/// hashes the commands it ran).
fn lookup(search: &OsStr, cwd: &Path, name: &OsStr) -> std::io::Result<std::path::PathBuf> {
    static FOUND: std::sync::LazyLock<std::sync::Mutex<Found>> =
        std::sync::LazyLock::new(Default::default);
    let key = (search.to_owned(), cwd.to_path_buf(), name.to_owned());
    if let Some(p) = FOUND.lock().ok().and_then(|f| f.get(&key).cloned()) {
        return Ok(p);
    }
    let found = std::env::split_paths(search)
        .map(|dir| cwd.join(dir).join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no such program (not a file, and not found on PATH)",
            )
        })?;
    if let Ok(mut f) = FOUND.lock() {
        f.insert(key, found.clone());
    }
    Ok(found)
}

/// What the child reads; it lives on the parent's stack while the parent waits in `clone`.
struct ChildArgs {
    path: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    cwd: *const libc::c_char,
    stdin: RawFd,
    out: RawFd,
    err: RawFd,
    gate: RawFd,
    parent: libc::pid_t,
    mask: libc::sigset_t,
    /// The open-files limit to give the command, when this process raised its own (see
    /// `limits::raise`): the one it was started with.
    nofile: Option<libc::rlimit>,
    /// The `errno` of a failed `chdir` or `exec`, written by the child.
    error: libc::c_int,
}

/// Reads exactly `buf.len()` bytes; false on end of file or error. Async-signal-safe.
pub(super) fn read_exact(fd: RawFd, buf: &mut [u8]) -> bool {
    let mut at = 0;
    while at < buf.len() {
        // SAFETY: read(2) into a live buffer of the given length.
        let n = unsafe { libc::read(fd, buf[at..].as_mut_ptr().cast(), buf.len() - at) };
        if n > 0 {
            at += n as usize;
        } else if n == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return false;
        }
    }
    true
}

/// Closes every descriptor from `first` on but `keep`. Async-signal-safe.
fn close_from(first: RawFd, keep: RawFd) {
    let close_range = |from: RawFd, to: libc::c_uint| {
        // SAFETY: close_range(2) only closes this process's descriptors.
        from as libc::c_uint > to
            || unsafe { libc::syscall(libc::SYS_close_range, from as libc::c_uint, to, 0) } == 0
    };
    let below = u32::try_from(keep - 1).unwrap_or(0);
    if close_range(first, below) && close_range(keep + 1, libc::c_uint::MAX) {
        return;
    }
    // A kernel before 5.9: each descriptor up to the limit on open ones.
    // SAFETY: getrlimit(2) and close(2) are async-signal-safe system calls on plain data.
    unsafe {
        let mut limit: libc::rlimit = std::mem::zeroed();
        let most = if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur.min(1 << 16) as RawFd
        } else {
            1024
        };
        for fd in first..most {
            if fd != keep {
                libc::close(fd);
            }
        }
    }
}

extern "C" fn child(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` points to the parent's `ChildArgs`, alive and unchanged while the parent is
    // suspended in `clone`; only async-signal-safe system calls follow.
    unsafe {
        let a = &mut *arg.cast::<ChildArgs>();
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        for sig in 1..65 {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::sigaction(sig, &dfl, std::ptr::null_mut());
            }
        }
        libc::setpgid(0, 0);
        // Should the owner die while this waits at the gate, the kernel kills it: the gate's
        // end of file alone cannot be relied on, as a child cloned at the same moment holds a
        // copy of its write end until it has closed what it does not need (below).
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        if libc::getppid() != a.parent {
            libc::_exit(GATE_CLOSED);
        }
        // While it waits at its gate, the child holds only what its command will have: its
        // stdin, stdout and stderr, and the gate (kept above them, closed by the exec). Its
        // copies of every other descriptor open when it was cloned would keep those open for as
        // long as it waits: other tries' output pipes (their readers would wait for it), other
        // children's gates, and the manifest's connections (one this program dropped would stay
        // open at the server, its transaction and the writers' lock with it).
        let gate = libc::fcntl(a.gate, libc::F_DUPFD_CLOEXEC, 3);
        if gate < 0
            || libc::dup2(a.stdin, 0) < 0
            || libc::dup2(a.out, 1) < 0
            || libc::dup2(a.err, 2) < 0
        {
            a.error = *libc::__errno_location();
            libc::_exit(127);
        }
        close_from(3, gate);
        let pid = libc::getpid().to_le_bytes();
        let written = libc::write(gate, pid.as_ptr().cast(), pid.len());
        let mut go = [0u8; 1];
        if written != pid.len() as isize || !read_exact(gate, &mut go) {
            // The owner let go (or went away) before recording this try: never run it.
            libc::_exit(GATE_CLOSED);
        }
        if libc::chdir(a.cwd) != 0 {
            a.error = *libc::__errno_location();
            libc::_exit(127);
        }
        libc::prctl(libc::PR_SET_PDEATHSIG, 0);
        if let Some(limit) = &a.nofile {
            // Lowering a soft limit cannot fail; the command keeps this process's otherwise.
            libc::setrlimit(libc::RLIMIT_NOFILE, limit);
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, &a.mask, std::ptr::null_mut());
        libc::execve(a.path, a.argv, a.envp);
        a.error = *libc::__errno_location();
        libc::_exit(127)
    }
}

/// What a child is started with: its stdin, its stdout, its stderr (the same pipe as stdout,
/// or another), and its end of the gate (it writes its pid there, then waits for a byte).
pub(super) struct Wiring {
    pub stdin: OwnedFd,
    pub out: OwnedFd,
    pub err: OwnedFd,
    pub gate: OwnedFd,
}

/// `/dev/null`, opened once for the process and duplicated for each child.
pub(super) fn dev_null() -> std::io::Result<OwnedFd> {
    static NULL: std::sync::OnceLock<std::io::Result<OwnedFd>> = std::sync::OnceLock::new();
    match NULL.get_or_init(|| std::fs::File::open("/dev/null").map(OwnedFd::from)) {
        Ok(fd) => fd.try_clone(),
        Err(e) => Err(std::io::Error::new(e.kind(), e.to_string())),
    }
}

/// Clones the child and returns once it has `exec`ed (or ended before). Blocks the calling
/// thread while the child waits at its gate.
pub(super) fn clone_gated(p: &Prepared, wiring: Wiring) -> std::io::Result<Child> {
    let ptrs = |v: &[CString]| -> Vec<*const libc::c_char> {
        v.iter()
            .map(|c| c.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect()
    };
    let argv = ptrs(&p.argv);
    let envp = ptrs(&p.envp);
    let mut args = ChildArgs {
        path: p.path.as_ptr(),
        argv: argv.as_ptr(),
        envp: envp.as_ptr(),
        cwd: p.cwd.as_ptr(),
        stdin: wiring.stdin.as_raw_fd(),
        out: wiring.out.as_raw_fd(),
        err: wiring.err.as_raw_fd(),
        gate: wiring.gate.as_raw_fd(),
        parent: std::process::id() as libc::pid_t,
        // SAFETY: a sigset_t is plain data; filled below.
        mask: unsafe { std::mem::zeroed() },
        nofile: crate::limits::inherited().map(|(soft, hard)| libc::rlimit {
            rlim_cur: soft,
            rlim_max: hard,
        }),
        error: 0,
    };
    let mut stack = vec![0u8; 64 * 1024];
    // SAFETY: the stack outlives the child's use of it (the parent is suspended until exec);
    // the top is aligned down to 16 bytes as the ABI wants.
    let top = unsafe { stack.as_mut_ptr().add(stack.len()) } as usize & !15;
    // SAFETY: every signal is blocked around clone, so that no handler runs in the child on
    // the parent's memory; the previous mask is restored in the parent and, before exec, in
    // the child.
    let pid = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut args.mask);
        let pid = libc::clone(
            child,
            top as *mut libc::c_void,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            std::ptr::addr_of_mut!(args).cast(),
        );
        libc::pthread_sigmask(libc::SIG_SETMASK, &args.mask, std::ptr::null_mut());
        pid
    };
    drop(stack);
    if pid < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut child = Child::new(pid);
    if args.error != 0 {
        child.reap_now();
        return Err(std::io::Error::from_raw_os_error(args.error));
    }
    Ok(child)
}

/// A child process of ours, waited for through a pidfd.
pub(crate) struct Child {
    pid: libc::pid_t,
    pidfd: Option<AsyncFd<OwnedFd>>,
    status: Option<ExitStatus>,
}

impl Child {
    fn new(pid: libc::pid_t) -> Self {
        // SAFETY: pidfd_open(2) on our own child; the returned descriptor is owned here.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        let pidfd = (fd >= 0)
            .then(|| {
                // SAFETY: a new descriptor that nothing else owns; an OwnedFd keeps it open
                // and unchanged for as long as the AsyncFd holds it.
                unsafe {
                    let owned = OwnedFd::from_raw_fd(fd as RawFd);
                    AsyncFd::register_with_interest(owned, tokio::io::Interest::READABLE).ok()
                }
            })
            .flatten();
        Self {
            pid,
            pidfd,
            status: None,
        }
    }

    /// Reaps the child if it has ended.
    fn try_reap(&mut self) -> std::io::Result<Option<ExitStatus>> {
        use std::os::unix::process::ExitStatusExt;
        if let Some(s) = self.status {
            return Ok(Some(s));
        }
        let mut raw = 0;
        // SAFETY: waitpid(2) on our own child.
        let r = unsafe { libc::waitpid(self.pid, &mut raw, libc::WNOHANG) };
        match r {
            0 => Ok(None),
            r if r == self.pid => {
                let s = ExitStatus::from_raw(raw);
                self.status = Some(s);
                Ok(Some(s))
            }
            _ => Err(std::io::Error::last_os_error()),
        }
    }

    /// Waits for a child that must be gone already or soon (an exec that failed).
    fn reap_now(&mut self) {
        let mut raw = 0;
        // SAFETY: waitpid(2) on our own child.
        unsafe { libc::waitpid(self.pid, &mut raw, 0) };
    }

    /// Waits until the child ends. Cancel-safe.
    pub(crate) async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        loop {
            if let Some(s) = self.try_reap()? {
                return Ok(s);
            }
            match &self.pidfd {
                Some(fd) => {
                    let mut ready = fd.readable().await?;
                    ready.clear_ready();
                }
                None => tokio::time::sleep(std::time::Duration::from_millis(10)).await,
            }
        }
    }
}
