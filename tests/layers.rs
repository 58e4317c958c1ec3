//! The layer rule of `src/lib.rs`, checked: its table lists the modules top to bottom; every
//! `crate::` path in a module's code (tests aside) names a module of its own line or of a line
//! below, and no two modules import each other. A path that must go up carries the comment
//! `layer exception:` with why, on its line or the line above.
//!
//! Within the modules, files do not go round in circles either: every `crate::` and `super::`
//! path (in `use` trees and in code) is resolved to the file that defines it, and the files'
//! imports must have no cycle. A file's imports of the modules it sits in (its ancestors'
//! `mod.rs`) are not counted: a child may use what its parent declares and re-exports.

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

/// The module path of a file of `src/` (`manifest/mod.rs` is `manifest`).
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|l| l == "mod") {
        parts.pop();
    }
    parts
}

/// The paths of a `use` tree (`a::{b, c::{d, self}}` is `a::b`, `a::c::d`, `a::c::self`).
fn expand(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        return vec![
            tree.split(" as ")
                .next()
                .unwrap_or_default()
                .trim()
                .to_string(),
        ];
    };
    let close = tree.rfind('}').filter(|c| *c > open).unwrap_or(tree.len());
    let (prefix, inner) = (&tree[..open], &tree[open + 1..close]);
    let (mut parts, mut current, mut depth) = (Vec::new(), String::new(), 0);
    for c in inner.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    parts.push(current);
    parts
        .iter()
        .filter(|p| !p.trim().is_empty())
        .flat_map(|p| expand(p))
        .map(|p| format!("{prefix}{p}"))
        .collect()
}

/// The code of a file without its comments and tests.
fn code_of(code: &str) -> String {
    code.lines()
        .take_while(|l| !l.trim_start().starts_with("#[cfg(test)]"))
        .map(|l| l.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The `crate::` and `super::` paths of `code`, as module paths from the crate's root, for the
/// file at module path `me`.
fn crate_paths(code: &str, me: &[String]) -> Vec<Vec<String>> {
    let mut raw = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("use ") {
        let word_start =
            at == 0 || !rest[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_');
        rest = &rest[at + 4..];
        if word_start && let Some(end) = rest.find(';') {
            raw.extend(expand(&rest[..end]));
        }
    }
    for start in ["crate::", "super::"] {
        let mut rest = code;
        while let Some(at) = rest.find(start) {
            let before = &rest[..at];
            rest = &rest[at..];
            let path: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            rest = &rest[start.len()..];
            if !before.ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == ':') {
                raw.push(path);
            }
        }
    }
    raw.iter()
        .filter_map(|p| {
            let mut segments = p.split("::").map(str::trim).filter(|s| !s.is_empty());
            let mut base = match segments.next()? {
                "crate" => Vec::new(),
                "super" => me[..me.len().saturating_sub(1)].to_vec(),
                _ => return None,
            };
            for s in segments {
                match s {
                    "super" => {
                        base.pop();
                    }
                    "self" | "*" => {}
                    s => base.push(s.to_string()),
                }
            }
            Some(base)
        })
        .collect()
}

/// The file of `src/` that defines module path `path`: the longest prefix that is a file.
fn file_of(path: &[String], files: &BTreeSet<PathBuf>) -> Option<PathBuf> {
    (1..=path.len()).rev().find_map(|n| {
        let stem: PathBuf = path[..n].iter().collect();
        [stem.with_extension("rs"), stem.join("mod.rs")]
            .into_iter()
            .find(|f| files.contains(f))
    })
}

/// The cycles of a graph: each strongly connected component of more than one node.
fn cycles<T: Ord + Clone>(edges: &BTreeMap<T, BTreeSet<T>>) -> Vec<Vec<T>> {
    // Tarjan's algorithm.
    struct State<T> {
        index: BTreeMap<T, usize>,
        low: BTreeMap<T, usize>,
        stack: Vec<T>,
        found: Vec<Vec<T>>,
    }
    fn visit<T: Ord + Clone>(v: &T, edges: &BTreeMap<T, BTreeSet<T>>, s: &mut State<T>) {
        let i = s.index.len();
        s.index.insert(v.clone(), i);
        s.low.insert(v.clone(), i);
        s.stack.push(v.clone());
        for w in edges.get(v).into_iter().flatten() {
            if !s.index.contains_key(w) {
                visit(w, edges, s);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v.clone(), low);
            } else if s.stack.contains(w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v.clone(), low);
            }
        }
        if s.low[v] == s.index[v] {
            let at = s.stack.iter().rposition(|x| x == v).unwrap();
            let component = s.stack.split_off(at);
            if component.len() > 1 {
                s.found.push(component);
            }
        }
    }
    let mut s = State {
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for v in edges.keys() {
        if !s.index.contains_key(v) {
            visit(v, edges, &mut s);
        }
    }
    s.found
}

#[test]
fn files_import_each_other_in_no_circle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = Vec::new();
    sources(&root, &mut found);
    let files: BTreeSet<PathBuf> = found
        .iter()
        .map(|f| f.strip_prefix(&root).unwrap().to_path_buf())
        .collect();
    let mut edges: BTreeMap<PathBuf, BTreeSet<PathBuf>> = BTreeMap::new();
    for rel in &files {
        if rel == Path::new("lib.rs") || rel == Path::new("main.rs") {
            continue;
        }
        let me = module_path(rel);
        let code = code_of(&std::fs::read_to_string(root.join(rel)).unwrap());
        for path in crate_paths(&code, &me) {
            let Some(target) = file_of(&path, &files) else {
                continue;
            };
            // Its own ancestors: what the modules it sits in declare.
            let ancestor = target.ends_with("mod.rs") && me.starts_with(&module_path(&target));
            if target != *rel && !ancestor {
                edges.entry(rel.clone()).or_default().insert(target);
            }
        }
    }
    assert!(
        edges.len() > 50,
        "the imports of src/ were not read: {edges:?}"
    );
    let circles: Vec<String> = cycles(&edges)
        .into_iter()
        .map(|c| {
            let mut c: Vec<String> = c.iter().map(|f| f.display().to_string()).collect();
            c.sort();
            format!(
                "these files import each other in a circle: {}",
                c.join(", ")
            )
        })
        .collect();
    assert!(circles.is_empty(), "{}", circles.join("\n"));
}

#[test]
fn the_file_rule_resolves_paths_and_finds_circles() {
    let files: BTreeSet<PathBuf> = ["a/mod.rs", "a/b.rs", "a/c.rs", "d.rs"]
        .map(PathBuf::from)
        .into();
    let me = module_path(Path::new("a/b.rs"));
    let code = code_of(
        "use super::{c::{X, Y}, self as parent};\npub use crate::d::Z; // crate::e\nlet v = crate::a::c::f();\nabuse crate::x;",
    );
    let targets: Vec<Option<PathBuf>> = crate_paths(&code, &me)
        .iter()
        .map(|p| file_of(p, &files))
        .collect();
    let some = |f: &str| Some(PathBuf::from(f));
    assert_eq!(
        targets,
        [
            some("a/c.rs"),
            some("a/c.rs"),
            some("a/mod.rs"),
            some("d.rs"),
            some("d.rs"),
            some("a/c.rs"),
            None,
            some("a/mod.rs"),
        ]
    );
    let graph = |pairs: &[(u8, u8)]| {
        let mut g: BTreeMap<u8, BTreeSet<u8>> = BTreeMap::new();
        for (a, b) in pairs {
            g.entry(*a).or_default().insert(*b);
        }
        g
    };
    assert!(cycles(&graph(&[(1, 2), (2, 3), (1, 3)])).is_empty());
    let mut found = cycles(&graph(&[(1, 2), (2, 3), (3, 1), (3, 4)]));
    found[0].sort();
    assert_eq!(found, [vec![1, 2, 3]]);
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
