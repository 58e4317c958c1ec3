//! The project's folders, made only while the project folder is still there.
//!
//! A project folder removed (or moved, or replaced) while a command runs is not made again by
//! the logs or audit files of the tries that follow: the folders below it are made one at a
//! time from the project folder down, so that none is made once it is gone, and a command that
//! notices it ([`project_gone`]) stops starting intervals and says so at its end.

use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The project folder of this process as it was found: its path, device and inode.
static PROJECT: Mutex<Option<(PathBuf, u64, u64)>> = Mutex::new(None);

/// Records the project folder this process works in (once found, before anything is made in
/// it).
pub(crate) fn set_project_root(root: &Path) {
    let Ok(meta) = std::fs::metadata(root) else {
        return;
    };
    if let Ok(mut p) = PROJECT.lock() {
        *p = Some((root.to_path_buf(), meta.dev(), meta.ino()));
    }
}

/// The project folder this process works in, when one was recorded.
pub(crate) fn project_root() -> Option<PathBuf> {
    PROJECT
        .lock()
        .ok()?
        .as_ref()
        .map(|(root, _, _)| root.clone())
}

/// Why the project folder is no longer the one this process started in: removed, moved or
/// replaced since; `None` while it is there (or none was recorded).
pub(crate) fn project_gone() -> Option<String> {
    let (root, dev, ino) = PROJECT.lock().ok()?.clone()?;
    match std::fs::metadata(&root) {
        Ok(m) if m.dev() == dev && m.ino() == ino => None,
        Ok(_) => Some(format!(
            "the project folder {} was replaced by another while this command ran",
            root.display()
        )),
        Err(_) => Some(format!(
            "the project folder {} was removed (or moved) while this command ran",
            root.display()
        )),
    }
}

/// Makes `dir` and its parents with `mode`. Below the project folder, they are made one at a
/// time from it down, and none once it is gone (the error then says so): a command never makes
/// a removed project's folders again.
pub(crate) fn make_dir(dir: &Path, mode: u32) -> std::io::Result<()> {
    let project = PROJECT.lock().ok().and_then(|p| p.clone());
    let below = project.and_then(|(root, _, _)| {
        let rest = dir.strip_prefix(&root).ok()?.to_path_buf();
        Some((root, rest))
    });
    let Some((root, rest)) = below else {
        return std::fs::DirBuilder::new()
            .recursive(true)
            .mode(mode)
            .create(dir);
    };
    let gone = |why: String| std::io::Error::new(std::io::ErrorKind::NotFound, why);
    if let Some(why) = project_gone() {
        return Err(gone(why));
    }
    let mut at = root.clone();
    for part in rest.components() {
        at.push(part);
        match std::fs::DirBuilder::new().mode(mode).create(&at) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && at.is_dir() => {}
            // Its parent vanished since it was looked at: the project folder went meanwhile.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(gone(project_gone().unwrap_or_else(|| e.to_string())));
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folders_below_a_removed_project_are_not_made_again() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("project");
        std::fs::create_dir(&root).unwrap();
        set_project_root(&root);
        // Made while the project is there: its inode cannot be the project's.
        let other = dir.path().join("other");
        std::fs::create_dir(&other).unwrap();
        let logs = root.join(".backfill/logs/dag/task");
        make_dir(&logs, 0o700).unwrap();
        assert!(logs.is_dir());
        assert_eq!(project_gone(), None);
        // Outside the project, folders are made as asked.
        make_dir(&dir.path().join("elsewhere/a"), 0o700).unwrap();
        std::fs::remove_dir_all(&root).unwrap();
        let err = make_dir(&logs, 0o700).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "the project folder {} was removed (or moved) while this command ran",
                root.display()
            )
        );
        assert!(!root.exists(), "not made again");
        // Another folder at its path is not the project this process started in.
        std::fs::rename(&other, &root).unwrap();
        assert!(project_gone().is_some_and(|w| w.contains("was replaced")));
        assert!(make_dir(&logs, 0o700).is_err());
        assert!(!root.join(".backfill").exists());
        *PROJECT.lock().unwrap() = None;
    }
}
