//! The parts of a machine that some tests need and `cargo test` cannot bring: PostgreSQL's
//! server binaries, Chromium and chromedriver, promtool, the right to make namespaces, and a few
//! common programs. One lookup, used twice:
//!
//! - `build.rs` includes this file, and for each part this machine lacks it sets
//!   `cfg(missing = "NAME")`. A test that needs the part carries
//!   `#[cfg_attr(missing = "NAME", ignore = "what is missing, and what installs it")]`, so that
//!   `cargo test` counts it as ignored and prints why (libtest has no way to ignore a test once
//!   it runs). Under `CI=true` nothing is set, and a missing part fails its tests.
//! - The tests find their parts here when they run, and fail, naming the part, when it is not
//!   there: under `CI=true`, with `--include-ignored`, or when the machine changed after the
//!   build in a place the build script does not watch.
//!
//! The build script runs again when `PATH`, `PG_BIN` or `CI` change, or one of the folders of
//! [`watched`] (those of `PATH`, `PG_BIN`, `/usr/lib/postgresql`, libfaketime's): installing or
//! removing a program changes its folder. Folders that do not exist are not watched (cargo would run the
//! script, and rebuild the crate, on every build), so a part that appears in a folder created
//! after the build is seen at the next change of the others, or after `touch build.rs`.
//!
//! A test binary includes it as `#[path = "parts/mod.rs"] mod parts;` at its root (or
//! `"../parts/mod.rs"` from `tests/cli/main.rs`), where `tests/pg` finds it as `crate::parts`.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// What `unshare` is asked for to make a host (`tests/cli/hosts.rs`): PID and UTS namespaces.
pub const UNSHARE: &[&str] = &["--pid", "--fork", "--kill-child", "--mount-proc", "--uts"];

/// A part some tests need; [`Part::name`] is its value in `cfg(missing = "...")`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// `initdb`, `pg_ctl` and `postgres` in `PG_BIN`, else in `/usr/lib/postgresql/*/bin`.
    Postgres,
    /// `chromium` on `PATH` (the browser test's headless browser).
    Chromium,
    /// `chromedriver` on `PATH` (the browser test's WebDriver).
    Chromedriver,
    /// `promtool` on `PATH` (checks `/metrics`).
    Promtool,
    /// `unshare` that makes PID and UTS namespaces (the hosts and join tests): root.
    Namespaces,
    /// util-linux's `script` on `PATH` (a pseudo-terminal for the terminal tests).
    Script,
    /// `man` on `PATH` (where the manual page is installed).
    Man,
    /// `python3` on `PATH` (a second process holding a SQLite write lock).
    Python3,
    /// A second user: `setpriv` running a program as `nobody` (root, util-linux's `setpriv`).
    Nobody,
    /// `mount -t tmpfs` and `umount` that work here (root): small file systems to fill (the
    /// tests of full disks).
    Tmpfs,
    /// libfaketime's `libfaketime.so.1` (a process whose wall clock is set ahead or back, or
    /// jumps while it runs).
    Faketime,
}

impl Part {
    pub const ALL: [Part; 11] = [
        Part::Postgres,
        Part::Chromium,
        Part::Chromedriver,
        Part::Promtool,
        Part::Namespaces,
        Part::Script,
        Part::Man,
        Part::Python3,
        Part::Nobody,
        Part::Tmpfs,
        Part::Faketime,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Part::Postgres => "postgres",
            Part::Chromium => "chromium",
            Part::Chromedriver => "chromedriver",
            Part::Promtool => "promtool",
            Part::Namespaces => "namespaces",
            Part::Script => "script",
            Part::Man => "man",
            Part::Python3 => "python3",
            Part::Nobody => "nobody",
            Part::Tmpfs => "tmpfs",
            Part::Faketime => "faketime",
        }
    }

    /// The part on this machine (the folder of PostgreSQL's server binaries, a program's path),
    /// or what is missing and what installs it.
    pub fn find(self) -> Result<PathBuf, String> {
        match self {
            Part::Postgres => postgres(),
            Part::Chromium => program_or(
                "chromium",
                "install it with `sudo apt-get install chromium` (Debian)",
            ),
            Part::Chromedriver => program_or(
                "chromedriver",
                "install it with `sudo apt-get install chromium-driver` (Debian)",
            ),
            Part::Promtool => program_or(
                "promtool",
                "install it with `sudo apt-get install prometheus` (Debian, Ubuntu)",
            ),
            Part::Namespaces => namespaces(),
            Part::Script => program_or(
                "script",
                "install util-linux's with `sudo apt-get install bsdutils` (Debian)",
            ),
            Part::Man => program_or(
                "man",
                "install it with `sudo apt-get install man-db` (Debian)",
            ),
            Part::Python3 => program_or(
                "python3",
                "install it with `sudo apt-get install python3` (Debian)",
            ),
            Part::Nobody => nobody(),
            Part::Tmpfs => tmpfs(),
            Part::Faketime => faketime(),
        }
    }

    /// [`Part::find`], or a panic that names what is missing: for a test that needs the part.
    pub fn require(self) -> PathBuf {
        self.find().unwrap_or_else(|why| panic!("{why}"))
    }
}

/// Whether this is CI (`CI=true`), where a missing part fails the tests that need it.
pub fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// The folders whose changes may change what [`Part::find`] says: those of `PATH`, `PG_BIN`,
/// `/usr/lib/postgresql` and libfaketime's, each once and only when it exists.
pub fn watched() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect())
        .unwrap_or_default();
    dirs.extend(std::env::var_os("PG_BIN").map(PathBuf::from));
    dirs.push(PathBuf::from(DEBIAN_POSTGRESQL));
    dirs.extend(FAKETIME_DIRS.iter().map(PathBuf::from));
    let mut seen = Vec::new();
    dirs.retain(|dir| {
        let Ok(real) = dir.canonicalize() else {
            return false;
        };
        let new = dir.is_absolute() && real.is_dir() && !seen.contains(&real);
        seen.push(real);
        new
    });
    dirs
}

/// A program on `PATH` as `command -v` finds it: the first executable file of that name in an
/// absolute folder of `PATH`.
pub fn program(name: &str) -> Option<PathBuf> {
    program_in(name, &std::env::var_os("PATH")?)
}

/// [`program`] on the given `PATH`.
pub fn program_in(name: &str, path: &OsStr) -> Option<PathBuf> {
    std::env::split_paths(path)
        .filter(|dir| dir.is_absolute())
        .map(|dir| dir.join(name))
        .find(|file| {
            file.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

fn program_or(name: &str, how: &str) -> Result<PathBuf, String> {
    program(name).ok_or_else(|| format!("no {name} on PATH: {how}"))
}

/// The programs of a PostgreSQL server that the tests run.
pub const SERVER: [&str; 3] = ["initdb", "pg_ctl", "postgres"];

/// Where Debian's `postgresql` package puts each version's server binaries (`15/bin`).
const DEBIAN_POSTGRESQL: &str = "/usr/lib/postgresql";

/// The folder of PostgreSQL's server binaries: `PG_BIN` if set, else the newest
/// `/usr/lib/postgresql/*/bin` that has them all.
pub fn postgres() -> Result<PathBuf, String> {
    postgres_in(
        std::env::var_os("PG_BIN").as_deref(),
        Path::new(DEBIAN_POSTGRESQL),
    )
}

/// [`postgres`] with `PG_BIN` and Debian's folder given.
pub fn postgres_in(pg_bin: Option<&OsStr>, debian: &Path) -> Result<PathBuf, String> {
    if let Some(dir) = pg_bin {
        let dir = PathBuf::from(dir);
        let lacks: Vec<&str> = SERVER
            .into_iter()
            .filter(|program| !dir.join(program).is_file())
            .collect();
        if lacks.is_empty() {
            return Ok(dir);
        }
        return Err(format!(
            "no {} in PG_BIN={}: set PG_BIN to the folder of PostgreSQL's initdb, pg_ctl and postgres, or unset it to use Debian's (`sudo apt-get install postgresql`)",
            words(&lacks),
            dir.display()
        ));
    }
    let mut found: Vec<(Vec<u32>, PathBuf)> = std::fs::read_dir(debian)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry
                .file_name()
                .to_str()?
                .split('.')
                .map(|part| part.parse().ok())
                .collect::<Option<Vec<u32>>>()?;
            let bin = entry.path().join("bin");
            SERVER
                .iter()
                .all(|program| bin.join(program).is_file())
                .then_some((version, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin).ok_or_else(|| {
        format!(
            "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in {}/*/bin and no PG_BIN: install them with `sudo apt-get install postgresql` (Debian, Ubuntu), or set PG_BIN to their folder",
            debian.display()
        )
    })
}

/// Where libfaketime's library is installed: Debian's and Ubuntu's multiarch folders, then
/// the usual others.
const FAKETIME_DIRS: [&str; 4] = [
    "/usr/lib/x86_64-linux-gnu/faketime",
    "/usr/lib/aarch64-linux-gnu/faketime",
    "/usr/lib/faketime",
    "/usr/local/lib/faketime",
];

/// libfaketime's library, to preload (`LD_PRELOAD`) into a process whose clock a test sets.
fn faketime() -> Result<PathBuf, String> {
    FAKETIME_DIRS
        .iter()
        .map(|dir| Path::new(dir).join("libfaketime.so.1"))
        .find(|lib| lib.is_file())
        .ok_or_else(|| {
            format!(
                "no libfaketime.so.1 in {}: install it with `sudo apt-get install libfaketime` (Debian, Ubuntu)",
                FAKETIME_DIRS.join(", ")
            )
        })
}

/// `unshare`, when it makes the namespaces of a host here (it needs root).
fn namespaces() -> Result<PathBuf, String> {
    let unshare = program_or(
        "unshare",
        "install util-linux's with `sudo apt-get install util-linux` (Debian)",
    )?;
    let made = Command::new(&unshare)
        .args(UNSHARE)
        .arg("true")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if made {
        Ok(unshare)
    } else {
        Err(format!(
            "`unshare {}` fails here: it needs root",
            UNSHARE.join(" ")
        ))
    }
}

/// What runs a program as the user `nobody` (see [`Part::Nobody`]): `setpriv` with these
/// arguments before the program.
pub const AS_NOBODY: &[&str] = &["--reuid=nobody", "--regid=nogroup", "--clear-groups"];

/// `setpriv`, when it runs a program as `nobody` here (it needs root, and the user).
fn nobody() -> Result<PathBuf, String> {
    let setpriv = program_or(
        "setpriv",
        "install util-linux's with `sudo apt-get install util-linux` (Debian)",
    )?;
    let ran = Command::new(&setpriv)
        .args(AS_NOBODY)
        .arg("true")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if ran {
        Ok(setpriv)
    } else {
        Err(format!(
            "`setpriv {} true` fails here: it needs root and the user nobody (group nogroup)",
            AS_NOBODY.join(" ")
        ))
    }
}

/// `mount`, when it mounts a small tmpfs here (it needs root) and `umount` unmounts it.
fn tmpfs() -> Result<PathBuf, String> {
    let how = "install util-linux's with `sudo apt-get install mount` (Debian)";
    let mount = program_or("mount", how)?;
    let umount = program_or("umount", how)?;
    // A folder of this call's own: tests that run at once probe at once, and one's unmount or
    // removal of a shared folder failed another's mount.
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir =
        std::env::temp_dir().join(format!("backfill-tmpfs-part-{}-{call}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let quiet = |program: &Path, args: &[&OsStr]| {
        Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let mounted = quiet(
        &mount,
        &[
            OsStr::new("-t"),
            OsStr::new("tmpfs"),
            OsStr::new("-o"),
            OsStr::new("size=64k"),
            OsStr::new("tmpfs"),
            dir.as_os_str(),
        ],
    );
    let unmounted = mounted && quiet(&umount, &[dir.as_os_str()]);
    let _ = std::fs::remove_dir(&dir);
    if unmounted {
        Ok(mount)
    } else {
        Err("`mount -t tmpfs` fails here: it needs root".into())
    }
}

/// `a`, `a nor b`, `a, b nor c`.
fn words(items: &[&str]) -> String {
    match items {
        [] => String::new(),
        [one] => (*one).to_string(),
        [rest @ .., last] => format!("{} nor {last}", rest.join(", ")),
    }
}
