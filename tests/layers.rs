//! The layer rule of `src/lib.rs`, checked: its table lists the modules top to bottom; every
//! `crate::` path in a module's code (tests aside) names a module of its own line or of a line
//! below, and no two modules import each other. A path that must go up carries the comment
//! `layer exception:` with why, on its line or the line above.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The table of `src/lib.rs`: each module (`task::template` on its own) and its line's rank,
/// from 0 at the top.
fn layers(lib: &str) -> BTreeMap<String, usize> {
    let table = lib
        .lines()
        .filter_map(|l| l.strip_prefix("//!"))
        .skip_while(|l| l.trim() != "```text")
        .skip(1)
        .take_while(|l| l.trim() != "```");
    let mut ranks = BTreeMap::new();
    let (mut rank, mut continued) = (0, false);
    for line in table {
        let line = line.strip_prefix(' ').unwrap_or(line);
        if line.starts_with(' ') || line.is_empty() {
            continue;
        }
        // The names, up to the description (two spaces or more).
        let names = line.split("  ").next().unwrap_or_default();
        for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let name = name.trim_end_matches('/').trim_end_matches(".rs");
            ranks.insert(name.to_string(), rank);
        }
        continued = names.trim_end().ends_with(',');
        if !continued {
            rank += 1;
        }
    }
    assert!(!continued, "the table of src/lib.rs ends inside a line");
    ranks
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module of the table that a file of `src/` belongs to.
fn module_of(rel: &Path) -> String {
    let parts: Vec<String> = rel
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.len() >= 2 && parts[0] == "task" && parts[1] == "template" {
        return "task::template".into();
    }
    parts[0].clone()
}

/// The modules of the table that `code` names by `crate::` paths, with the line of each, leaving
/// out comments, tests and the lines marked as exceptions.
fn imports(code: &str) -> Vec<(String, usize)> {
    let mut found = Vec::new();
    let mut excepted = false;
    for (n, line) in code.lines().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("#[cfg(test)]") {
            break;
        }
        let exception = line.contains("layer exception:");
        if trimmed.starts_with("//") {
            excepted = exception;
            continue;
        }
        if exception || std::mem::take(&mut excepted) {
            continue;
        }
        let code = line.split("//").next().unwrap_or_default();
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            let path: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            let mut segments = path.split("::");
            let first = segments.next().unwrap_or_default().to_string();
            let module = if first == "task" && segments.next() == Some("template") {
                "task::template".to_string()
            } else {
                first
            };
            found.push((module, n + 1));
        }
    }
    found
}

#[test]
fn modules_import_only_below_their_layer_and_never_each_other() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let ranks = layers(&std::fs::read_to_string(root.join("lib.rs")).unwrap());
    assert!(
        ranks.len() > 20,
        "the table of src/lib.rs was not read: {ranks:?}"
    );
    let mut files = Vec::new();
    sources(&root, &mut files);
    let mut problems = Vec::new();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let rel = file.strip_prefix(&root).unwrap();
        if rel == Path::new("lib.rs") || rel == Path::new("main.rs") {
            continue;
        }
        let me = module_of(rel);
        let Some(&my_rank) = ranks.get(&me) else {
            problems.push(format!(
                "{}: module `{me}` is not in the table of src/lib.rs",
                rel.display()
            ));
            continue;
        };
        for (module, line) in imports(&std::fs::read_to_string(file).unwrap()) {
            if module == me {
                continue;
            }
            match ranks.get(&module) {
                None => problems.push(format!(
                    "{}:{line}: `crate::{module}` is not in the table of src/lib.rs",
                    rel.display()
                )),
                Some(&rank) if rank < my_rank => problems.push(format!(
                    "{}:{line}: `{me}` imports `{module}`, a layer above it",
                    rel.display()
                )),
                Some(_) => {
                    edges.entry(me.clone()).or_default().insert(module);
                }
            }
        }
    }
    for (a, targets) in &edges {
        for b in targets {
            if a < b && edges.get(b).is_some_and(|t| t.contains(a)) {
                problems.push(format!("`{a}` and `{b}` import each other"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_rule_reads_the_table_and_catches_what_goes_up() {
    let lib = "//! ```text\n//! top/, side   what\n//!              more\n//! a, b,\n//! c            pure\n//! ```\n";
    let ranks = layers(lib);
    assert_eq!(
        ranks.into_iter().collect::<Vec<_>>(),
        [("a", 1), ("b", 1), ("c", 1), ("side", 0), ("top", 0)]
            .map(|(n, r)| (n.to_string(), r))
            .to_vec()
    );
    let code = "use crate::a::X;\n// layer exception: why\nuse crate::top;\nlet y = crate::task::template::render(); // crate::b in a comment\n#[cfg(test)]\nuse crate::c;\n";
    assert_eq!(
        imports(code),
        [("a".to_string(), 1), ("task::template".to_string(), 4)]
    );
}
