//! The layer rule of `src/lib.rs`, checked. Its table lists the modules top to bottom, one layer
//! a line; this test reads every file of `src/` as Rust (with `syn`) and resolves every path of
//! its code that names something of the crate to the file it names. Then:
//!
//! - a module imports only from its own line of the table or from a line below;
//! - modules of one line separated by `|` are siblings that never import each other;
//! - no modules import each other, two of them or more in a circle;
//! - no files import each other in a circle. A file's imports of the modules it sits in (its
//!   ancestors' `mod.rs`, and `lib.rs`) are not counted: a child may use what its parent
//!   declares and re-exports.
//!
//! A path that must break one of the first three rules carries the comment `layer exception:`
//! with why, on its line or the line above; nothing excuses a circle of files.
//!
//! Test code is left out by its extent: an item (a `mod`, `fn`, `impl`, `use`, ...), a member of
//! an `impl` or a trait, a field, a variant, a match arm or a `let` carrying `#[cfg(test)]` (or a
//! `cfg` that requires `test`, such as `all(test, ...)`) or a test attribute (`#[test]`,
//! `#[tokio::test]`), and the files of a module declared that way. What follows such an item
//! in its file is read. An expression carrying `#[cfg(test)]` is still read: that is rare, and
//! reading it can only report more.
//!
//! The paths read are those of `use` trees (groups, renames, globs and `self` spelled out), those
//! of the code (expressions, types, patterns, trait bounds, macros' names) and the path-like
//! runs of tokens (`a::b::c`) inside macros' bodies, which `syn` leaves unparsed. A path names
//! the crate when it starts with `crate` (`$crate` in a macro), `self` or `super` (any number of
//! them; inline `mod x { }` blocks are modules too), or with a name that stands for a path of
//! the crate where it is written: a module the module declares, a name one of its `use` items
//! binds (`use crate::task;` then `task::template::render`), or one a `use` glob brings in (`use
//! super::*;` then `conn::take`), what the module defines itself first. That is the path spelled
//! out. `main.rs` is the binary, another crate, whose paths into the library start with the
//! library's name.
//!
//! A path names the deepest file along it: `crate::manifest::store::Store` names
//! `src/manifest/store.rs` (or `src/manifest/store/mod.rs`), `crate::manifest::Store` names
//! `src/manifest/mod.rs` even if that re-exports `Store` from elsewhere.
//!
//! What the check cannot follow fails it too: a file that does not parse, a `mod` with
//! `#[path]`, a file of no module of the table, a module of the table without a file, and a path
//! that names the crate's root but no module.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::path::{Path, PathBuf};

use proc_macro2::{Spacing, TokenStream, TokenTree};
use syn::punctuated::Punctuated;
use syn::visit::{self, Visit};
use syn::{Attribute, ImplItem, Item, Meta, Token, TraitItem, UseTree};

/// The comment that excuses a path from the layer rules, followed by why.
const EXCEPTION: &str = "layer exception:";

// The table.

/// Where a module stands in the table: its line (0 at the top) and its group of siblings (the
/// names between two `|` of one line; numbered across the whole table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Place {
    line: usize,
    group: usize,
}

/// The fenced `text` block of the doc comment of `lib`: its lines without the `//!` prefix.
fn table_block(lib: &str) -> Option<String> {
    let lines = lib
        .lines()
        .map_while(|l| l.strip_prefix("//!"))
        .map(|l| l.strip_prefix(' ').unwrap_or(l))
        .skip_while(|l| l.trim() != "```text")
        .skip(1);
    let mut block = String::new();
    for line in lines {
        if line.trim() == "```" {
            return Some(block);
        }
        block.push_str(line);
        block.push('\n');
    }
    None
}

/// The modules of the table of `lib` (`task::template` is one on its own), each with its place.
///
/// A line of the table starts with names, up to its description (after two spaces or more); a
/// line that starts with a space carries on the description above. Names are separated by `,`
/// (may import one another, one way) or by `|` (siblings: never import each other); a line whose
/// names end with either goes on to the names of the next line. `commands/` and `main.rs` are
/// the modules `commands` and `main`.
fn layers(lib: &str) -> Result<BTreeMap<String, Place>, String> {
    let block = table_block(lib).ok_or("src/lib.rs has no ```text table in its doc comment")?;
    let mut places = BTreeMap::new();
    let (mut line, mut group) = (0, 0);
    // What ended the names of the line before: nothing (a new line), `,` or `|`.
    let mut pending: Option<char> = None;
    for text in block.lines() {
        if text.starts_with(' ') || text.trim().is_empty() {
            continue;
        }
        let names = text.split("  ").next().unwrap_or_default().trim();
        // A new line of the table (after `|`, the line before opened the group already).
        if pending.is_none() && !places.is_empty() {
            (line, group) = (line + 1, group + 1);
        }
        for (i, piece) in names.split('|').enumerate() {
            if i > 0 {
                group += 1;
            }
            for name in piece.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                let name = name.trim_end_matches('/').trim_end_matches(".rs");
                let place = Place { line, group };
                if places.insert(name.to_string(), place).is_some() {
                    return Err(format!("the table of src/lib.rs names `{name}` twice"));
                }
            }
        }
        pending = names.chars().last().filter(|c| matches!(c, ',' | '|'));
    }
    if pending.is_some() {
        return Err("the table of src/lib.rs ends inside a line".into());
    }
    Ok(places)
}

/// The module of the table that module path `path` belongs to: its longest prefix the table
/// names (`task::template::x` is `task::template`), or else its first name.
fn table_module(path: &[String], places: &BTreeMap<String, Place>) -> String {
    (1..=path.len())
        .rev()
        .map(|n| path[..n].join("::"))
        .find(|m| places.contains_key(m))
        .unwrap_or_else(|| path.first().cloned().unwrap_or_default())
}

// The files.

/// Every `.rs` file under `dir`, sorted.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module path of a file of `src/` (`manifest/mod.rs` is `manifest`, `lib.rs` the root).
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|l| l == "mod") || rel == Path::new("lib.rs") {
        parts.pop();
    }
    parts
}

/// The file of `src/` that a path of the crate names: the deepest file along it, `lib.rs` if
/// none.
fn file_of(path: &[String], files: &BTreeSet<PathBuf>) -> PathBuf {
    (1..=path.len())
        .rev()
        .find_map(|n| {
            let stem: PathBuf = path[..n].iter().collect();
            [stem.with_extension("rs"), stem.join("mod.rs")]
                .into_iter()
                .find(|f| files.contains(f))
        })
        .unwrap_or_else(|| PathBuf::from("lib.rs"))
}

/// The lines of `text` (1-based) that are excused: those that carry the comment
/// `layer exception:` with a reason, and those under such a comment alone on its line.
fn excused_lines(text: &str) -> BTreeSet<usize> {
    let mut excused = BTreeSet::new();
    for (n, line) in text.lines().enumerate() {
        let reasoned = line
            .find("//")
            .and_then(|c| line[c..].split_once(EXCEPTION))
            .is_some_and(|(_, why)| !why.trim().is_empty());
        if reasoned {
            excused.insert(n + 1);
            if line.trim_start().starts_with("//") {
                excused.insert(n + 2);
            }
        }
    }
    excused
}

// Test code.

/// Whether an attribute makes what carries it test code: `#[test]` (or `#[tokio::test]`, ...),
/// or a `cfg` that holds only under `test`.
fn is_test(attr: &Attribute) -> bool {
    let path = attr.path();
    if path.segments.last().is_some_and(|s| s.ident == "test") {
        return true;
    }
    path.is_ident("cfg")
        && attr
            .parse_args_with(Punctuated::<Meta, Token![,]>::parse_terminated)
            .is_ok_and(|m| m.len() == 1 && requires_test(&m[0]))
}

/// Whether a `cfg` predicate holds only under `test`: `test`, an `all` with one that does, an
/// `any` whose every one does.
fn requires_test(meta: &Meta) -> bool {
    match meta {
        Meta::Path(p) => p.is_ident("test"),
        Meta::List(list) => {
            let Ok(inner) = list.parse_args_with(Punctuated::<Meta, Token![,]>::parse_terminated)
            else {
                return false;
            };
            if list.path.is_ident("all") {
                inner.iter().any(requires_test)
            } else if list.path.is_ident("any") {
                !inner.is_empty() && inner.iter().all(requires_test)
            } else {
                false
            }
        }
        Meta::NameValue(_) => false,
    }
}

/// The attributes of an item.
fn item_attrs(item: &Item) -> &[Attribute] {
    match item {
        Item::Const(i) => &i.attrs,
        Item::Enum(i) => &i.attrs,
        Item::ExternCrate(i) => &i.attrs,
        Item::Fn(i) => &i.attrs,
        Item::ForeignMod(i) => &i.attrs,
        Item::Impl(i) => &i.attrs,
        Item::Macro(i) => &i.attrs,
        Item::Mod(i) => &i.attrs,
        Item::Static(i) => &i.attrs,
        Item::Struct(i) => &i.attrs,
        Item::Trait(i) => &i.attrs,
        Item::TraitAlias(i) => &i.attrs,
        Item::Type(i) => &i.attrs,
        Item::Union(i) => &i.attrs,
        Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

/// The name an item defines in its module's namespace, but for modules (`mod`) and `use`.
fn item_name(item: &Item) -> Option<&syn::Ident> {
    match item {
        Item::Const(i) => Some(&i.ident),
        Item::Enum(i) => Some(&i.ident),
        Item::ExternCrate(i) => Some(i.rename.as_ref().map_or(&i.ident, |(_, r)| r)),
        Item::Fn(i) => Some(&i.sig.ident),
        Item::Macro(i) => i.ident.as_ref(),
        Item::Static(i) => Some(&i.ident),
        Item::Struct(i) => Some(&i.ident),
        Item::Trait(i) => Some(&i.ident),
        Item::TraitAlias(i) => Some(&i.ident),
        Item::Type(i) => Some(&i.ident),
        Item::Union(i) => Some(&i.ident),
        _ => None,
    }
}

/// The attributes of a member of an `impl`.
fn impl_item_attrs(item: &ImplItem) -> &[Attribute] {
    match item {
        ImplItem::Const(i) => &i.attrs,
        ImplItem::Fn(i) => &i.attrs,
        ImplItem::Type(i) => &i.attrs,
        ImplItem::Macro(i) => &i.attrs,
        _ => &[],
    }
}

/// The attributes of a member of a trait.
fn trait_item_attrs(item: &TraitItem) -> &[Attribute] {
    match item {
        TraitItem::Const(i) => &i.attrs,
        TraitItem::Fn(i) => &i.attrs,
        TraitItem::Type(i) => &i.attrs,
        TraitItem::Macro(i) => &i.attrs,
        _ => &[],
    }
}

// Reading a file.

/// A path of a file's code, as written, and where.
#[derive(Debug, Clone)]
struct Written {
    /// The module it is written in (a file's, or an inline `mod`'s in it).
    scope: Vec<String>,
    segments: Vec<String>,
    /// A glob (`use a::b::*`): it names the module `a::b`.
    glob: bool,
    line: usize,
    /// Its line is excused by a `layer exception:` comment.
    excused: bool,
}

impl Written {
    /// The path as written (a glob with its `*`).
    fn text(&self) -> String {
        let path = self.segments.join("::");
        if self.glob {
            format!("{path}::*")
        } else {
            path
        }
    }
}

/// What names mean in a module: its modules, its other items, the names its `use` items bind,
/// and the modules whose names its `use` globs bring in. Items and `use` items in a block count
/// as the whole module's: a name bound in one function is taken as bound in all.
#[derive(Debug, Default)]
struct Scope {
    mods: BTreeSet<String>,
    items: BTreeSet<String>,
    uses: Vec<(String, Written)>,
    globs: Vec<Written>,
}

/// A `mod x;` of a file, whose code is in another file.
#[derive(Debug)]
struct Declared {
    module: Vec<String>,
    test: bool,
    /// It has a `#[path]`, which this test does not follow.
    moved: bool,
    line: usize,
}

/// What a file says, read by walking its syntax tree.
#[derive(Debug, Default)]
struct Reading {
    /// The lines excused by a `layer exception:` comment.
    excused: BTreeSet<usize>,
    /// The walk is in a `use` item whose first line is excused (its tree may go on below).
    excused_use: bool,
    /// The module being read.
    scope: Vec<String>,
    /// Whether the walk is inside test code: then only the `mod x;` items are noted.
    testing: bool,
    scopes: BTreeMap<Vec<String>, Scope>,
    paths: Vec<Written>,
    declared: Vec<Declared>,
}

impl Reading {
    /// Walks what `attrs` belong to with `walk`, as test code if one of them says so.
    fn within(&mut self, attrs: &[Attribute], walk: impl FnOnce(&mut Self)) {
        let was = self.testing;
        self.testing |= attrs.iter().any(is_test);
        walk(self);
        self.testing = was;
    }

    /// Notes a path written in the module being read.
    fn note(&mut self, segments: Vec<String>, glob: bool, line: usize) -> Written {
        let written = Written {
            scope: self.scope.clone(),
            segments,
            glob,
            line,
            excused: self.excused_use || self.excused.contains(&line),
        };
        self.paths.push(written.clone());
        written
    }

    /// The paths of a `use` tree under `prefix`, and the names they bind.
    fn use_tree(&mut self, tree: &UseTree, prefix: &mut Vec<String>) {
        let leaf = |me: &mut Self, segments: Vec<String>, name: Option<String>, line| {
            let written = me.note(segments, name.is_none(), line);
            let scope = me.scopes.entry(me.scope.clone()).or_default();
            match name {
                None => scope.globs.push(written),
                Some(name) if name != "_" => scope.uses.push((name, written)),
                Some(_) => {}
            }
        };
        match tree {
            UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(&p.tree, prefix);
                prefix.pop();
            }
            UseTree::Name(n) if n.ident == "self" => {
                let line = n.ident.span().start().line;
                leaf(self, prefix.clone(), prefix.last().cloned(), line);
            }
            UseTree::Name(n) => {
                let mut segments = prefix.clone();
                segments.push(n.ident.to_string());
                leaf(
                    self,
                    segments,
                    Some(n.ident.to_string()),
                    n.ident.span().start().line,
                );
            }
            UseTree::Rename(r) => {
                let mut segments = prefix.clone();
                if r.ident != "self" {
                    segments.push(r.ident.to_string());
                }
                leaf(
                    self,
                    segments,
                    Some(r.rename.to_string()),
                    r.ident.span().start().line,
                );
            }
            UseTree::Glob(g) => leaf(
                self,
                prefix.clone(),
                None,
                g.star_token.spans[0].start().line,
            ),
            UseTree::Group(g) => {
                for tree in &g.items {
                    self.use_tree(tree, prefix);
                }
            }
        }
    }

    /// The path-like runs of tokens (`a::b`, not after `::` or `.`) in a macro's body.
    fn tokens(&mut self, tokens: TokenStream) {
        let tokens: Vec<TokenTree> = tokens.into_iter().collect();
        let punct = |at: usize, c: char, joint: bool| match tokens.get(at) {
            Some(TokenTree::Punct(p)) => {
                p.as_char() == c && (!joint || p.spacing() == Spacing::Joint)
            }
            _ => false,
        };
        // `::` at `at`: a `:` joined to the next one.
        let colons = |at: usize| punct(at, ':', true) && punct(at + 1, ':', false);
        // The token at `at` goes on from the one before: a path, or a field or method.
        let goes_on =
            |at: usize| (at >= 2 && colons(at - 2)) || (at >= 1 && punct(at - 1, '.', false));
        let mut i = 0;
        while i < tokens.len() {
            match &tokens[i] {
                TokenTree::Group(g) => self.tokens(g.stream()),
                TokenTree::Ident(first) if !goes_on(i) => {
                    let mut segments = vec![first.to_string()];
                    while colons(i + 1)
                        && let Some(TokenTree::Ident(next)) = tokens.get(i + 3)
                    {
                        segments.push(next.to_string());
                        i += 3;
                    }
                    if segments.len() >= 2 {
                        self.note(segments, false, first.span().start().line);
                    }
                }
                _ => {}
            }
            i += 1;
        }
    }
}

impl<'ast> Visit<'ast> for Reading {
    fn visit_item(&mut self, item: &'ast Item) {
        self.within(item_attrs(item), |me| {
            if let Some(name) = item_name(item).filter(|_| !me.testing) {
                let scope = me.scopes.entry(me.scope.clone()).or_default();
                scope.items.insert(name.to_string());
            }
            visit::visit_item(me, item);
        });
    }

    fn visit_impl_item(&mut self, item: &'ast ImplItem) {
        self.within(impl_item_attrs(item), |me| visit::visit_impl_item(me, item));
    }

    fn visit_trait_item(&mut self, item: &'ast TraitItem) {
        self.within(trait_item_attrs(item), |me| {
            visit::visit_trait_item(me, item)
        });
    }

    fn visit_field(&mut self, field: &'ast syn::Field) {
        self.within(&field.attrs, |me| visit::visit_field(me, field));
    }

    fn visit_variant(&mut self, variant: &'ast syn::Variant) {
        self.within(&variant.attrs, |me| visit::visit_variant(me, variant));
    }

    fn visit_arm(&mut self, arm: &'ast syn::Arm) {
        self.within(&arm.attrs, |me| visit::visit_arm(me, arm));
    }

    fn visit_local(&mut self, local: &'ast syn::Local) {
        self.within(&local.attrs, |me| visit::visit_local(me, local));
    }

    fn visit_stmt_macro(&mut self, stmt: &'ast syn::StmtMacro) {
        self.within(&stmt.attrs, |me| visit::visit_stmt_macro(me, stmt));
    }

    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        let name = item.ident.to_string();
        let mut module = self.scope.clone();
        module.push(name.clone());
        if item.content.is_none() {
            self.declared.push(Declared {
                module: module.clone(),
                test: self.testing,
                moved: item.attrs.iter().any(|a| a.path().is_ident("path")),
                line: item.ident.span().start().line,
            });
        }
        if !self.testing {
            let scope = self.scopes.entry(self.scope.clone()).or_default();
            scope.mods.insert(name);
        }
        let outer = std::mem::replace(&mut self.scope, module);
        visit::visit_item_mod(self, item);
        self.scope = outer;
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        // A path after `::` is another crate's.
        if !self.testing && item.leading_colon.is_none() {
            self.excused_use = self.excused.contains(&item.use_token.span.start().line);
            self.use_tree(&item.tree, &mut Vec::new());
            self.excused_use = false;
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if !self.testing && path.leading_colon.is_none() && path.segments.len() >= 2 {
            let segments = path.segments.iter().map(|s| s.ident.to_string()).collect();
            self.note(segments, false, path.segments[0].ident.span().start().line);
        }
        visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        if !self.testing {
            self.tokens(mac.tokens.clone());
        }
        visit::visit_macro(self, mac);
    }

    /// `pub(in crate::a)` names where an item is seen, not what it uses.
    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}
}

/// A path of the library spelled out from its root, and whether it is excused (its line, or
/// that of a `use` it was spelled out through).
type Spelled = (Vec<String>, bool);

/// The module that `main.rs`, the binary, stands for among the library's: no name of Rust.
const BINARY: &str = "<main.rs>";

/// How paths are spelled out from the root of the library, with what the modules of all its
/// files (and of the binary's) bind.
struct Resolver<'a> {
    /// The library's name, with which the binary's paths into it start.
    lib_name: &'a str,
    scopes: &'a BTreeMap<Vec<String>, Scope>,
    /// What the name each module binds by `use` stands for (`None`: another crate's).
    bound: BTreeMap<(Vec<String>, String), Option<Spelled>>,
}

/// The names already being looked up, each in its module: a glob may lead back to them.
type Seen = BTreeSet<(Vec<String>, String)>;

impl Resolver<'_> {
    /// The path of the library that `path` names, if it names one.
    fn resolve(&self, path: &Written) -> Option<Spelled> {
        self.resolve_seen(path, &mut Seen::new())
    }

    /// `resolve`, with the names being looked up already.
    fn resolve_seen(&self, path: &Written, seen: &mut Seen) -> Option<Spelled> {
        let (first, rest) = path.segments.split_first()?;
        let binary = path.scope.first().is_some_and(|s| s == BINARY);
        let mut base = path.scope.clone();
        let mut excused = path.excused;
        let mut rest = rest.iter().peekable();
        match first.as_str() {
            // The binary's own modules: no file of the library.
            "crate" | "self" | "super" if binary => return None,
            name if binary && name == self.lib_name => base.clear(),
            "crate" => base.clear(),
            "self" => {}
            "super" => {
                base.pop()?;
                while rest.next_if(|s| *s == "super").is_some() {
                    base.pop()?;
                }
            }
            name => {
                let (target, through) = self.lookup(&base, name, seen)??;
                (base, excused) = (target, excused || through);
            }
        }
        base.extend(rest.cloned());
        Some((base, excused))
    }

    /// What `name` stands for in module `scope`: one of its modules or other items, a name it
    /// binds by `use`, or one its globs bring in (what the module defines or binds itself comes
    /// first). `None` if nothing; `Some(None)` if another crate's.
    fn lookup(&self, scope: &[String], name: &str, seen: &mut Seen) -> Option<Option<Spelled>> {
        let key = (scope.to_vec(), name.to_string());
        if !seen.insert(key.clone()) {
            return None;
        }
        let found = self.lookup_unseen(scope, name, seen);
        seen.remove(&key);
        found
    }

    /// `lookup`, once `name` is marked as being looked up in `scope`.
    fn lookup_unseen(
        &self,
        scope: &[String],
        name: &str,
        seen: &mut Seen,
    ) -> Option<Option<Spelled>> {
        let s = self.scopes.get(scope)?;
        if s.mods.contains(name) || s.items.contains(name) {
            let mut module = scope.to_vec();
            module.push(name.to_string());
            return Some(Some((module, false)));
        }
        if let Some(bound) = self.bound.get(&(scope.to_vec(), name.to_string())) {
            return Some(bound.clone());
        }
        for glob in &s.globs {
            let Some((module, excused)) = self.resolve_seen(glob, seen) else {
                continue;
            };
            if let Some(found) = self.lookup(&module, name, seen) {
                return Some(found.map(|(path, through)| (path, through || excused)));
            }
        }
        None
    }
}

// The check.

/// Which rule a problem breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Rule {
    /// The table or a file could not be read, or they do not match.
    Unread,
    /// A module imports from a line above its own.
    Upward,
    /// Siblings (`|`) import each other.
    Siblings,
    /// Modules import each other, in pairs or in a circle.
    Modules,
    /// Files import each other in a circle.
    Files,
}

/// A broken rule: where (`file:line`, a file, or nothing), and what.
#[derive(Debug, Clone)]
struct Problem {
    rule: Rule,
    at: String,
    what: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.at.is_empty() {
            write!(f, "{}", self.what)
        } else {
            write!(f, "{}: {}", self.at, self.what)
        }
    }
}

/// What the check found: the problems, and how much it read (for the real test to tell that it
/// read something).
#[derive(Debug, Default)]
struct Checked {
    problems: Vec<Problem>,
    modules: usize,
    file_imports: usize,
}

/// A path of a non-test file that names a file of the library.
struct Import {
    from: PathBuf,
    line: usize,
    written: String,
    to: PathBuf,
    excused: bool,
}

/// Checks the sources under `root` (a `src/` folder) against the table of `lib` (the text of a
/// `lib.rs`), for library `lib_name`.
fn check(lib: &str, root: &Path, lib_name: &str) -> Checked {
    let mut problems = Vec::new();
    let mut problem = |rule, at: String, what: String| {
        problems.push(Problem { rule, at, what });
    };
    let places = match layers(lib) {
        Ok(places) => places,
        Err(what) => {
            let problems = vec![Problem {
                rule: Rule::Unread,
                at: String::new(),
                what,
            }];
            return Checked {
                problems,
                ..Checked::default()
            };
        }
    };
    let mut found = Vec::new();
    sources(root, &mut found);
    let files: BTreeSet<PathBuf> = found
        .iter()
        .map(|f| f.strip_prefix(root).unwrap().to_path_buf())
        .collect();

    // Every file, read.
    let mut read = BTreeMap::new();
    for rel in &files {
        let text = std::fs::read_to_string(root.join(rel)).unwrap();
        let syntax = match syn::parse_file(&text) {
            Ok(syntax) => syntax,
            Err(e) => {
                let at = format!("{}:{}", rel.display(), e.span().start().line);
                problem(Rule::Unread, at, format!("does not parse: {e}"));
                continue;
            }
        };
        let mut reading = Reading {
            excused: excused_lines(&text),
            scope: if rel == Path::new("main.rs") {
                vec![BINARY.to_string()]
            } else {
                module_path(rel)
            },
            ..Reading::default()
        };
        reading.visit_file(&syntax);
        read.insert(rel.clone(), reading);
    }

    // The files of modules declared as test code, and the modules moved by `#[path]`.
    let mut tests = Vec::new();
    for (rel, reading) in &read {
        for declared in &reading.declared {
            if declared.moved {
                let at = format!("{}:{}", rel.display(), declared.line);
                let what = "a `mod` with `#[path]`, which this test does not follow".into();
                problem(Rule::Unread, at, what);
            }
            if declared.test {
                tests.push(declared.module.clone());
            }
        }
    }
    let in_tests = |rel: &Path| {
        let me = module_path(rel);
        tests.iter().any(|t| me.starts_with(t))
    };

    // The modules of the table that have no file, and the files of no module of the table.
    let mut modules = BTreeSet::new();
    for rel in files.iter().filter(|f| !in_tests(f)) {
        if rel == Path::new("lib.rs") {
            continue;
        }
        let me = if rel == Path::new("main.rs") {
            "main".to_string()
        } else {
            table_module(&module_path(rel), &places)
        };
        if !places.contains_key(&me) {
            let what = format!("module `{me}` is not in the table of src/lib.rs");
            problem(Rule::Unread, rel.display().to_string(), what);
        }
        modules.insert(me);
    }
    for name in places.keys().filter(|n| !modules.contains(*n)) {
        let what = format!("the table of src/lib.rs names `{name}`, which src/ does not have");
        problem(Rule::Unread, String::new(), what);
    }

    // What the names of each module stand for. A `use` may start with a name another `use`
    // binds, or one a glob brings in: spelled out until nothing changes.
    let mut read: Vec<(PathBuf, Reading)> =
        read.into_iter().filter(|(f, _)| !in_tests(f)).collect();
    let mut scopes = BTreeMap::new();
    for (_, reading) in &mut read {
        scopes.append(&mut reading.scopes);
    }
    let mut resolver = Resolver {
        lib_name,
        scopes: &scopes,
        bound: BTreeMap::new(),
    };
    for _ in 0..16 {
        let mut bound = BTreeMap::new();
        for (scope, s) in &scopes {
            for (name, written) in &s.uses {
                bound.insert((scope.clone(), name.clone()), resolver.resolve(written));
            }
        }
        if bound == resolver.bound {
            break;
        }
        resolver.bound = bound;
    }

    // Every path of every non-test file that names the library, with the file it names.
    let mut imports = Vec::new();
    for (rel, reading) in read.iter().filter(|(f, _)| f != Path::new("lib.rs")) {
        for written in &reading.paths {
            let Some((path, excused)) = resolver.resolve(written) else {
                continue;
            };
            imports.push(Import {
                from: rel.clone(),
                line: written.line,
                written: written.text(),
                to: file_of(&path, &files),
                excused,
            });
        }
    }

    // The layers.
    let module_of = |rel: &Path| match rel.to_str() {
        Some("main.rs") => Some("main".to_string()),
        Some("lib.rs") => None,
        _ => Some(table_module(&module_path(rel), &places)),
    };
    let mut edges: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for import in imports.iter().filter(|i| !i.excused) {
        let at = format!("{}:{}", import.from.display(), import.line);
        let Some(me) = module_of(&import.from) else {
            continue;
        };
        let Some(them) = module_of(&import.to) else {
            let what = format!("`{}` names no module of the table", import.written);
            problem(Rule::Unread, at, what);
            continue;
        };
        let (Some(mine), Some(theirs)) = (places.get(&me), places.get(&them)) else {
            continue;
        };
        if me == them {
            continue;
        }
        if theirs.line < mine.line {
            let what = format!(
                "`{}`: `{me}` imports `{them}`, a layer above its own",
                import.written
            );
            problem(Rule::Upward, at, what);
        } else if theirs.line == mine.line && theirs.group != mine.group {
            let what = format!(
                "`{}`: `{me}` imports `{them}`, and siblings (`|`) never import each other",
                import.written
            );
            problem(Rule::Siblings, at, what);
        } else {
            let by = format!("{at} `{}`", import.written);
            edges.entry(me).or_default().entry(them).or_insert(by);
        }
    }
    let module_graph = edges
        .iter()
        .map(|(a, to)| (a.clone(), to.keys().cloned().collect()))
        .collect();
    for knot in cycles(&module_graph) {
        let what = format!(
            "modules import each other: {}",
            circle(&knot, &edges, "modules")
        );
        problem(Rule::Modules, String::new(), what);
    }

    // The files.
    let mut file_edges: BTreeMap<PathBuf, BTreeMap<PathBuf, String>> = BTreeMap::new();
    for import in &imports {
        let me = if import.from == Path::new("main.rs") {
            Vec::new()
        } else {
            module_path(&import.from)
        };
        // Its own ancestors: what the modules it sits in declare.
        let ancestor = (import.to.ends_with("mod.rs") || import.to == Path::new("lib.rs"))
            && me.starts_with(&module_path(&import.to));
        if import.to != import.from && !ancestor {
            let by = format!(
                "{}:{} `{}`",
                import.from.display(),
                import.line,
                import.written
            );
            let to = file_edges.entry(import.from.clone()).or_default();
            to.entry(import.to.clone()).or_insert(by);
        }
    }
    let file_imports = file_edges.values().map(BTreeMap::len).sum();
    let file_graph = file_edges
        .iter()
        .map(|(a, to)| (a.clone(), to.keys().cloned().collect()))
        .collect();
    for knot in cycles(&file_graph) {
        let what = format!(
            "files import each other in a circle: {}",
            circle(&knot, &file_edges, "files")
        );
        problem(Rule::Files, String::new(), what);
    }
    Checked {
        problems,
        modules: places.len(),
        file_imports,
    }
}

/// A shortest circle of imports among `knot` (a component of the graph `edges`, whose values
/// say where each import is), and how many `things` go round with it.
fn circle<T: Ord>(knot: &[T], edges: &BTreeMap<T, BTreeMap<T, String>>, things: &str) -> String {
    let inside: BTreeSet<&T> = knot.iter().collect();
    let next = |v: &T| -> Vec<&T> {
        let to = edges.get(v).into_iter().flat_map(BTreeMap::keys);
        to.filter(|w| inside.contains(w)).collect()
    };
    let mut best: Option<Vec<&String>> = None;
    for start in knot {
        // Breadth first from `start`, until an import leads back to it.
        let mut came: BTreeMap<&T, &T> = BTreeMap::new();
        let mut queue = VecDeque::from([start]);
        let mut back = None;
        while let Some(v) = queue.pop_front() {
            if next(v).contains(&start) {
                back = Some(v);
                break;
            }
            for w in next(v) {
                if w != start && !came.contains_key(w) {
                    came.insert(w, v);
                    queue.push_back(w);
                }
            }
        }
        let Some(mut at) = back else { continue };
        let mut path = vec![&edges[at][start]];
        while at != start {
            path.push(&edges[came[at]][at]);
            at = came[at];
        }
        path.reverse();
        if best.as_ref().is_none_or(|b| path.len() < b.len()) {
            best = Some(path);
        }
    }
    let path = best.unwrap_or_default();
    let imports: Vec<&str> = path.iter().map(|s| s.as_str()).collect();
    let mut said = imports.join(", then ");
    if knot.len() > path.len() {
        said.push_str(&format!(
            " (one of the circles among {} {things})",
            knot.len()
        ));
    }
    said
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
            let mut component = s.stack.split_off(at);
            if component.len() > 1 {
                component.sort();
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

// The real sources.

/// The crate's folder.
fn here() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The rules, on `src/`: every problem is listed, none is allowed.
#[test]
fn the_sources_keep_to_their_layers() {
    let lib = std::fs::read_to_string(here().join("src/lib.rs")).unwrap();
    let checked = check(&lib, &here().join("src"), env!("CARGO_PKG_NAME"));
    assert!(checked.modules > 20, "the table of src/lib.rs was not read");
    assert!(
        checked.file_imports > 100,
        "the imports of src/ were not read: {} found",
        checked.file_imports
    );
    let problems: Vec<String> = checked.problems.iter().map(Problem::to_string).collect();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn contributing_quotes_the_table_of_lib_rs() {
    let lib = std::fs::read_to_string(here().join("src/lib.rs")).unwrap();
    let table = table_block(&lib).expect("src/lib.rs has a ```text table");
    let contributing = std::fs::read_to_string(here().join("CONTRIBUTING.md")).unwrap();
    assert!(
        contributing.contains(&format!("```text\n{table}```\n")),
        "CONTRIBUTING.md does not quote the table of src/lib.rs as it is:\n{table}"
    );
}

// The check, on sources made up to break each rule.

/// The table the made-up sources follow.
const TABLE: &str = "\
//! The layers.
//!
//! ```text
//! main.rs, top/     the top
//!                   of it all
//! mid, side         one line, one way
//! manifest/ |       siblings, with
//! warehouse/        a description each
//! leaf, task::template
//!                   the bottom
//! ```
";

/// Sources that keep to `TABLE` (and whose test code does not), with `changes` written over
/// them; a file whose text is empty is left out.
fn made_up(changes: &[(&str, &str)]) -> Vec<Problem> {
    let mut files: BTreeMap<&str, &str> = [
        ("lib.rs", TABLE),
        (
            "main.rs",
            "use made_up::top::run;\n\
             fn main() { made_up::leaf::go(); run(); }\n",
        ),
        (
            "top/mod.rs",
            "mod inner;\n\
             use crate::{mid::{self, M}, side as s};\n\
             pub fn run() { inner::go(); s::go(); }\n",
        ),
        (
            "top/inner.rs",
            "use super::super::warehouse;\n\
             pub fn go() { warehouse::go(); super::run(); }\n",
        ),
        (
            "mid.rs",
            "pub struct M;\n\
             pub fn go() { println!(\"{}\", crate::leaf::NAME); }\n",
        ),
        (
            "side.rs",
            "use crate::mid::M;\n\
             pub fn go() { let _: M; }\n",
        ),
        (
            "manifest/mod.rs",
            "pub mod store;\n\
             pub fn go() -> store::Store { crate::leaf::go() }\n",
        ),
        (
            "manifest/store.rs",
            "pub struct Store;\n\
             fn go() { super::super::leaf::go(); }\n",
        ),
        (
            "warehouse/mod.rs",
            "pub fn go() { crate::leaf::go(); }\n\
             // layer exception: why it must look up\n\
             use crate::side::go as up;\n",
        ),
        (
            "leaf/mod.rs",
            "pub const NAME: &str = \"leaf\";\n\
             pub mod low;\n\
             #[cfg(test)]\n\
             mod tests;\n\
             #[cfg(test)]\n\
             mod inline { use crate::top::run; }\n\
             #[cfg(all(test, unix))]\n\
             fn only_in_tests() { crate::top::run(); }\n\
             #[test]\n\
             fn a_test() { crate::top::run(); }\n\
             struct S {\n\
                 #[cfg(test)]\n\
                 field: crate::top::T,\n\
             }\n\
             pub fn go() { crate::task::template::go(); }\n",
        ),
        ("leaf/tests.rs", "use crate::top::run;\n"),
        // What no other file imports: what it imports up makes no circle.
        ("leaf/low.rs", "pub fn go() {}\n"),
        ("task/template.rs", "pub fn go() { let _ = self::go; }\n"),
    ]
    .into();
    files.extend(changes.iter().copied());
    let dir = tempfile::tempdir().unwrap();
    for (file, text) in files.iter().filter(|(_, t)| !t.is_empty()) {
        let path = dir.path().join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    check(files["lib.rs"], dir.path(), "made_up").problems
}

/// The problems of `made_up(changes)`, as the rule each breaks and where.
fn found(changes: &[(&str, &str)]) -> Vec<(Rule, String)> {
    let mut found: Vec<(Rule, String)> = made_up(changes)
        .into_iter()
        .map(|p| (p.rule, p.at))
        .collect();
    found.sort();
    found
}

/// `(rule, at)`, owned.
fn at(rule: Rule, at: &str) -> (Rule, String) {
    (rule, at.to_string())
}

#[test]
fn the_table_reads_lines_siblings_and_names_that_go_on() {
    let places = layers(TABLE).unwrap();
    let place = |name: &str| {
        let p = places[name];
        (p.line, p.group)
    };
    assert_eq!(places.len(), 8);
    assert_eq!(place("main"), (0, 0));
    assert_eq!(place("top"), (0, 0));
    assert_eq!(place("mid"), (1, 1));
    assert_eq!(place("side"), (1, 1));
    assert_eq!(place("manifest"), (2, 2));
    assert_eq!(place("warehouse"), (2, 3));
    assert_eq!(place("leaf"), (3, 4));
    assert_eq!(place("task::template"), (3, 4));
    let open = "//! ```text\n//! a,\n//! ```\n";
    assert!(layers(open).is_err());
    let twice = "//! ```text\n//! a\n//! b, a\n//! ```\n";
    assert!(layers(twice).is_err());
}

#[test]
fn made_up_sources_that_keep_to_the_table_pass() {
    // With upward imports in test code only, and one excused.
    assert_eq!(found(&[]), [], "{:?}", made_up(&[]));
}

#[test]
fn the_check_finds_an_upward_use() {
    let code = "use crate::top::run;\n";
    assert_eq!(
        found(&[("leaf/low.rs", code)]),
        [at(Rule::Upward, "leaf/low.rs:1")]
    );
    // In a group, renamed, as `self`, as a glob.
    let trees = "use crate::{leaf::go, top::{self as t}};\n\
                 use crate::mid::*;\n";
    let expected = [
        at(Rule::Upward, "leaf/low.rs:1"),
        at(Rule::Upward, "leaf/low.rs:2"),
    ];
    assert_eq!(found(&[("leaf/low.rs", trees)]), expected);
}

#[test]
fn the_check_finds_an_upward_path_in_code() {
    let code = "pub fn go() {\n\
                    let _ = crate::mid::go();\n\
                }\n";
    assert_eq!(
        found(&[("leaf/low.rs", code)]),
        [at(Rule::Upward, "leaf/low.rs:2")]
    );
    let types = "pub fn go(_: &crate::top::T) {}\n";
    assert_eq!(
        found(&[("leaf/low.rs", types)]),
        [at(Rule::Upward, "leaf/low.rs:1")]
    );
    // Through a name a `use` binds: at the `use`, and where the name is spelled out.
    let alias = "use crate::top;\n\
                 pub fn go() {\n\
                     top::inner::go();\n\
                 }\n";
    let expected = [
        at(Rule::Upward, "leaf/low.rs:1"),
        at(Rule::Upward, "leaf/low.rs:3"),
    ];
    assert_eq!(found(&[("leaf/low.rs", alias)]), expected);
}

#[test]
fn the_check_reads_on_after_test_code() {
    // What the test module imports is not reported; what follows it is.
    let code = "#[cfg(test)]\n\
                mod tests {\n\
                    use crate::top::run;\n\
                }\n\
                pub fn go() { crate::top::run(); }\n";
    assert_eq!(
        found(&[("leaf/low.rs", code)]),
        [at(Rule::Upward, "leaf/low.rs:5")]
    );
}

#[test]
fn the_check_follows_super_up_to_the_root() {
    // From `manifest::store`, up to `manifest`, up to the root.
    let store = "fn go() { super::super::top::run(); }\n";
    let expected = [at(Rule::Upward, "manifest/store.rs:1")];
    assert_eq!(found(&[("manifest/store.rs", store)]), expected);
    // Inline modules count.
    let inline = "mod a {\n\
                      mod b {\n\
                          use super::super::super::mid::M;\n\
                      }\n\
                  }\n";
    let expected = [at(Rule::Upward, "warehouse/mod.rs:3")];
    assert_eq!(found(&[("warehouse/mod.rs", inline)]), expected);
}

#[test]
fn the_check_reads_macros() {
    let code = "pub fn go() {\n\
                    println!(\"{}\", crate::mid::NAME);\n\
                }\n";
    assert_eq!(
        found(&[("leaf/low.rs", code)]),
        [at(Rule::Upward, "leaf/low.rs:2")]
    );
    let defined = "macro_rules! up {\n\
                       () => { $crate::top::run() };\n\
                   }\n";
    assert_eq!(
        found(&[("leaf/low.rs", defined)]),
        [at(Rule::Upward, "leaf/low.rs:2")]
    );
}

#[test]
fn the_check_keeps_siblings_apart() {
    let manifest = "pub mod store;\n\
                    use crate::warehouse::go;\n";
    let expected = [at(Rule::Siblings, "manifest/mod.rs:2")];
    assert_eq!(found(&[("manifest/mod.rs", manifest)]), expected);
    let warehouse = "pub fn go() { super::manifest::go(); }\n";
    let expected = [at(Rule::Siblings, "warehouse/mod.rs:1")];
    assert_eq!(found(&[("warehouse/mod.rs", warehouse)]), expected);
}

#[test]
fn the_check_finds_modules_of_one_line_that_import_each_other() {
    // `side` imports `mid`, which is fine one way.
    let mid = "pub struct M;\n\
               pub fn go() { crate::side::go(); }\n";
    let problems = made_up(&[("mid.rs", mid)]);
    let rules: Vec<Rule> = problems.iter().map(|p| p.rule).collect();
    assert_eq!(rules, [Rule::Modules, Rule::Files], "{problems:?}");
    let what = &problems[0].what;
    assert!(what.contains("mid.rs:2 `crate::side::go`"), "{what}");
    assert!(what.contains("side.rs:1 `crate::mid::M`"), "{what}");
}

#[test]
fn the_check_finds_files_in_a_circle() {
    let leaf = "pub mod one;\n\
                pub mod two;\n\
                pub const NAME: &str = \"\";\n\
                pub fn go() {}\n";
    let one = "pub fn go() { super::two::go(); }\n";
    let two = "pub fn go() { crate::leaf::one::go(); }\n";
    let problems = made_up(&[
        ("leaf/mod.rs", leaf),
        ("leaf/one.rs", one),
        ("leaf/two.rs", two),
        ("leaf/tests.rs", ""),
    ]);
    let rules: Vec<Rule> = problems.iter().map(|p| p.rule).collect();
    assert_eq!(rules, [Rule::Files], "{problems:?}");
    let what = &problems[0].what;
    assert!(what.contains("leaf/one.rs:1 `super::two::go`"), "{what}");
    assert!(
        what.contains("leaf/two.rs:1 `crate::leaf::one::go`"),
        "{what}"
    );
}

#[test]
fn the_check_follows_names_that_globs_bring_in() {
    let leaf = "pub mod one;\n\
                pub mod two;\n\
                pub const NAME: &str = \"\";\n\
                pub fn go() {}\n";
    let one = "use super::*;\n\
               pub fn go() { two::go(); }\n";
    let two = "use super::*;\n\
               pub fn go() { one::go(); }\n";
    let tree = [
        ("leaf/mod.rs", leaf),
        ("leaf/one.rs", one),
        ("leaf/two.rs", two),
        ("leaf/tests.rs", ""),
    ];
    let problems = made_up(&tree);
    let rules: Vec<Rule> = problems.iter().map(|p| p.rule).collect();
    assert_eq!(rules, [Rule::Files], "{problems:?}");
    let what = &problems[0].what;
    assert!(what.contains("leaf/one.rs:2 `two::go`"), "{what}");
    assert!(what.contains("leaf/two.rs:2 `one::go`"), "{what}");
    // What a file defines comes before what a glob brings in.
    let own = "use super::*;\n\
               enum one { A }\n\
               pub fn go() { let _ = one::A; }\n";
    assert_eq!(
        found(&[tree[0], tree[1], ("leaf/two.rs", own), tree[3]]),
        []
    );
}

#[test]
fn an_exception_needs_a_reason() {
    let code = "// layer exception:\n\
                use crate::top::run;\n\
                use crate::mid::M; // layer exception: the reason\n\
                // layer exception: a `use` on lines of its own\n\
                use crate::{\n\
                    top::T,\n\
                };\n";
    assert_eq!(
        found(&[("leaf/low.rs", code)]),
        [at(Rule::Upward, "leaf/low.rs:2")]
    );
}

#[test]
fn the_check_finds_what_the_table_lacks() {
    let table = TABLE.replace("task::template\n", "task::template, gone\n");
    let problems = found(&[("lib.rs", &table), ("other.rs", "pub fn go() {}\n")]);
    assert_eq!(
        problems,
        [at(Rule::Unread, ""), at(Rule::Unread, "other.rs")]
    );
}
