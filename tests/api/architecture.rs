//! The house's shape, read from `src/` as Rust syntax: no file imports another that imports it
//! back (directly or around a circle), and no top-level module imports one from a layer above.
//!
//! An edge goes from the file that names an item to the file that defines it. A `pub use`
//! re-export is a facade, not an edge: a path through it is followed to the item's own file.
//! Importing a module by name is not an edge either; naming something inside it is. A module's
//! parent and its parts are one room: a part uses what its parent defines (`super::Store`) and
//! the parent wires its parts, so an edge between a file and one of its ancestors is not
//! counted. Test-only code (`#[cfg(test)]`) is left out: tests may reach anywhere.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

/// Top-level modules from the top of the house down. A module may import its own layer's
/// modules only if they share the line below, and any module of a lower line.
const LAYERS: &[&[&str]] = &[
    &["cli"],
    &["app"],
    &["http"],
    &["context", "import"],
    &["jobs", "webhooks"],
    &["summarize"],
    &["store"],
    &["tree"],
    &["history"],
    &[
        "auth",
        "metrics",
        "telemetry",
        "shutdown",
        "turns",
        "json_weight",
    ],
];

type ModPath = Vec<String>;

#[derive(Clone, Copy, PartialEq)]
enum RefKind {
    Use,
    Reexport,
    Code,
}

struct Ref {
    scope: ModPath,
    segments: Vec<String>,
    kind: RefKind,
}

#[derive(Default)]
struct FileFacts {
    refs: Vec<Ref>,
    /// Inline modules declared in the file (not test-only), as full paths.
    inline_modules: Vec<ModPath>,
}

struct Collector {
    scope: ModPath,
    facts: FileFacts,
}

fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| match &attr.meta {
        syn::Meta::List(list) if list.path.is_ident("cfg") => {
            let words = list.tokens.to_string();
            let mut words = words.split(|c: char| !c.is_alphanumeric() && c != '_');
            words.clone().any(|word| word == "test") && !words.any(|word| word == "not")
        }
        _ => false,
    })
}

fn item_attrs(item: &syn::Item) -> &[syn::Attribute] {
    match item {
        syn::Item::Const(i) => &i.attrs,
        syn::Item::Enum(i) => &i.attrs,
        syn::Item::ExternCrate(i) => &i.attrs,
        syn::Item::Fn(i) => &i.attrs,
        syn::Item::ForeignMod(i) => &i.attrs,
        syn::Item::Impl(i) => &i.attrs,
        syn::Item::Macro(i) => &i.attrs,
        syn::Item::Mod(i) => &i.attrs,
        syn::Item::Static(i) => &i.attrs,
        syn::Item::Struct(i) => &i.attrs,
        syn::Item::Trait(i) => &i.attrs,
        syn::Item::TraitAlias(i) => &i.attrs,
        syn::Item::Type(i) => &i.attrs,
        syn::Item::Union(i) => &i.attrs,
        syn::Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

fn flatten_use(tree: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match tree {
        syn::UseTree::Path(path) => {
            prefix.push(path.ident.to_string());
            flatten_use(&path.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(name) => {
            let ident = name.ident.to_string();
            let mut path = prefix.clone();
            if ident != "self" {
                path.push(ident);
            }
            out.push(path);
        }
        syn::UseTree::Rename(rename) => {
            let mut path = prefix.clone();
            let ident = rename.ident.to_string();
            if ident != "self" {
                path.push(ident);
            }
            out.push(path);
        }
        syn::UseTree::Glob(_) => out.push(prefix.clone()),
        syn::UseTree::Group(group) => {
            for tree in &group.items {
                flatten_use(tree, prefix, out);
            }
        }
    }
}

/// Paths written inside macro calls and attributes (`#[utoipa::path(body = crate::…)]`), which
/// syn keeps as tokens: every `a::b::c` run.
fn token_paths(tokens: TokenStream, out: &mut Vec<Vec<String>>) {
    let mut current: Vec<String> = Vec::new();
    let mut colons = 0;
    let flush = |current: &mut Vec<String>, out: &mut Vec<Vec<String>>| {
        if current.len() > 1 {
            out.push(std::mem::take(current));
        }
        current.clear();
    };
    for tree in tokens {
        match tree {
            TokenTree::Ident(ident) => {
                if colons == 2 || current.is_empty() {
                    if colons != 2 {
                        flush(&mut current, out);
                    }
                    current.push(ident.to_string());
                } else {
                    flush(&mut current, out);
                    current.push(ident.to_string());
                }
                colons = 0;
            }
            TokenTree::Punct(punct) if punct.as_char() == ':' => colons += 1,
            TokenTree::Group(group) => {
                flush(&mut current, out);
                colons = 0;
                token_paths(group.stream(), out);
            }
            _ => {
                flush(&mut current, out);
                colons = 0;
            }
        }
    }
    flush(&mut current, out);
}

impl Collector {
    fn push(&mut self, segments: Vec<String>, kind: RefKind) {
        if !segments.is_empty() {
            self.facts.refs.push(Ref {
                scope: self.scope.clone(),
                segments,
                kind,
            });
        }
    }

    fn push_tokens(&mut self, tokens: TokenStream) {
        let mut paths = Vec::new();
        token_paths(tokens, &mut paths);
        for path in paths {
            self.push(path, RefKind::Code);
        }
    }
}

impl<'ast> Visit<'ast> for Collector {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if is_test_only(item_attrs(item)) {
            return;
        }
        syn::visit::visit_item(self, item);
    }

    fn visit_impl_item(&mut self, item: &'ast syn::ImplItem) {
        let attrs = match item {
            syn::ImplItem::Fn(f) => &f.attrs,
            syn::ImplItem::Const(c) => &c.attrs,
            syn::ImplItem::Type(t) => &t.attrs,
            _ => return syn::visit::visit_impl_item(self, item),
        };
        if !is_test_only(attrs) {
            syn::visit::visit_impl_item(self, item);
        }
    }

    fn visit_stmt(&mut self, stmt: &'ast syn::Stmt) {
        if let syn::Stmt::Local(local) = stmt {
            if is_test_only(&local.attrs) {
                return;
            }
        }
        syn::visit::visit_stmt(self, stmt);
    }

    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        if let Some((_, items)) = &item.content {
            self.scope.push(item.ident.to_string());
            self.facts.inline_modules.push(self.scope.clone());
            for item in items {
                self.visit_item(item);
            }
            self.scope.pop();
        }
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        let mut paths = Vec::new();
        flatten_use(&item.tree, &mut Vec::new(), &mut paths);
        let kind = match item.vis {
            syn::Visibility::Inherited => RefKind::Use,
            _ => RefKind::Reexport,
        };
        for path in paths {
            self.push(path, kind);
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        if segments.len() > 1 {
            self.push(segments, RefKind::Code);
        }
        syn::visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.visit_path(&mac.path);
        self.push_tokens(mac.tokens.clone());
    }

    fn visit_attribute(&mut self, attr: &'ast syn::Attribute) {
        if let syn::Meta::List(list) = &attr.meta {
            self.push_tokens(list.tokens.clone());
        }
    }
}

struct House {
    /// Every module (file or inline) and the file it lives in.
    module_file: BTreeMap<ModPath, PathBuf>,
    /// The module each file is.
    file_module: BTreeMap<PathBuf, ModPath>,
    facts: BTreeMap<PathBuf, FileFacts>,
}

fn module_path_of(src: &Path, file: &Path) -> ModPath {
    let relative = file.strip_prefix(src).unwrap().with_extension("");
    let mut path: ModPath = relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(path.last().map(String::as_str), Some("mod" | "lib")) {
        path.pop();
    }
    path
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

impl House {
    fn read() -> House {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        files.retain(|f| f != &src.join("main.rs"));
        let mut module_file = BTreeMap::new();
        let mut facts = BTreeMap::new();
        let mut file_module = BTreeMap::new();
        for file in files {
            let module = module_path_of(&src, &file);
            let text = std::fs::read_to_string(&file).unwrap();
            let syntax = syn::parse_file(&text)
                .unwrap_or_else(|e| panic!("{} does not parse: {e}", file.display()));
            let mut collector = Collector {
                scope: module.clone(),
                facts: FileFacts::default(),
            };
            for item in &syntax.items {
                collector.visit_item(item);
            }
            let relative = file.strip_prefix(&src).unwrap().to_path_buf();
            for inline in &collector.facts.inline_modules {
                module_file.insert(inline.clone(), relative.clone());
            }
            module_file.insert(module.clone(), relative.clone());
            file_module.insert(relative.clone(), module);
            facts.insert(relative, collector.facts);
        }
        House {
            module_file,
            file_module,
            facts,
        }
    }

    /// The full path a reference names, when it names something in this crate.
    fn absolute(&self, reference: &Ref, aliases: &BTreeMap<String, ModPath>) -> Option<ModPath> {
        let segments = &reference.segments;
        let mut base = reference.scope.clone();
        let rest: &[String] = match segments[0].as_str() {
            "crate" => {
                base.clear();
                &segments[1..]
            }
            "super" => {
                let supers = segments.iter().take_while(|s| *s == "super").count();
                for _ in 0..supers {
                    base.pop()?;
                }
                &segments[supers..]
            }
            "self" => &segments[1..],
            first => {
                let mut child = base.clone();
                child.push(first.to_owned());
                if self.module_file.contains_key(&child) {
                    segments
                } else if reference.kind == RefKind::Code {
                    let mut full = aliases.get(first)?.clone();
                    full.extend_from_slice(&segments[1..]);
                    return Some(full);
                } else {
                    return None;
                }
            }
        };
        base.extend_from_slice(rest);
        Some(base)
    }

    /// Re-exports of each module: name → the full path it stands for.
    fn reexports(&self) -> BTreeMap<ModPath, BTreeMap<String, ModPath>> {
        let mut out: BTreeMap<ModPath, BTreeMap<String, ModPath>> = BTreeMap::new();
        for facts in self.facts.values() {
            for reference in facts.refs.iter().filter(|r| r.kind == RefKind::Reexport) {
                if let Some(full) = self.absolute(reference, &BTreeMap::new()) {
                    let name = full.last().cloned().unwrap_or_default();
                    out.entry(reference.scope.clone())
                        .or_default()
                        .insert(name, full);
                }
            }
        }
        out
    }

    /// The file that defines what `full` names: the longest module prefix, through re-exports.
    /// `None` when it names a module itself (importing a module's name is not an edge).
    fn defining_file(
        &self,
        full: &[String],
        reexports: &BTreeMap<ModPath, BTreeMap<String, ModPath>>,
    ) -> Option<PathBuf> {
        let mut full = full.to_vec();
        for _ in 0..8 {
            let module_len = (0..=full.len())
                .rev()
                .find(|&n| self.module_file.contains_key(&full[..n]))?;
            if module_len == full.len() {
                return None;
            }
            let module = &full[..module_len];
            let name = &full[module_len];
            match reexports.get(module).and_then(|names| names.get(name)) {
                Some(target) if target.as_slice() != &full[..=module_len] => {
                    let mut next = target.clone();
                    next.extend_from_slice(&full[module_len + 1..]);
                    full = next;
                }
                _ => return self.module_file.get(module).cloned(),
            }
        }
        None
    }

    /// Whether one file holds a module that contains the other's.
    fn is_ancestor_pair(&self, a: &Path, b: &Path) -> bool {
        let (a, b) = (&self.file_module[a], &self.file_module[b]);
        a.starts_with(b) || b.starts_with(a)
    }

    fn edges(&self) -> BTreeMap<PathBuf, BTreeMap<PathBuf, String>> {
        let reexports = self.reexports();
        let mut edges: BTreeMap<PathBuf, BTreeMap<PathBuf, String>> = BTreeMap::new();
        for (file, facts) in &self.facts {
            let mut aliases_by_scope: BTreeMap<ModPath, BTreeMap<String, ModPath>> =
                BTreeMap::new();
            for reference in facts.refs.iter().filter(|r| r.kind != RefKind::Code) {
                if let Some(full) = self.absolute(reference, &BTreeMap::new()) {
                    let name = reference.segments.last().unwrap().clone();
                    let name = if name == "self" {
                        full.last().cloned().unwrap()
                    } else {
                        name
                    };
                    aliases_by_scope
                        .entry(reference.scope.clone())
                        .or_default()
                        .insert(name, full);
                }
            }
            let no_aliases = BTreeMap::new();
            for reference in facts.refs.iter().filter(|r| r.kind != RefKind::Reexport) {
                let aliases = aliases_by_scope
                    .get(&reference.scope)
                    .unwrap_or(&no_aliases);
                let Some(full) = self.absolute(reference, aliases) else {
                    continue;
                };
                let Some(target) = self.defining_file(&full, &reexports) else {
                    continue;
                };
                if &target != file && !self.is_ancestor_pair(file, &target) {
                    edges
                        .entry(file.clone())
                        .or_default()
                        .entry(target)
                        .or_insert_with(|| full.join("::"));
                }
            }
        }
        edges
    }
}

/// Strongly connected groups of more than one file (Tarjan).
fn circles(edges: &BTreeMap<PathBuf, BTreeMap<PathBuf, String>>) -> Vec<Vec<PathBuf>> {
    struct Search<'a> {
        edges: &'a BTreeMap<PathBuf, BTreeMap<PathBuf, String>>,
        index: BTreeMap<&'a PathBuf, usize>,
        low: BTreeMap<&'a PathBuf, usize>,
        stack: Vec<&'a PathBuf>,
        on_stack: BTreeSet<&'a PathBuf>,
        found: Vec<Vec<PathBuf>>,
    }
    impl<'a> Search<'a> {
        fn visit(&mut self, node: &'a PathBuf) {
            let n = self.index.len();
            self.index.insert(node, n);
            self.low.insert(node, n);
            self.stack.push(node);
            self.on_stack.insert(node);
            for next in self.edges.get(node).into_iter().flat_map(|e| e.keys()) {
                if !self.index.contains_key(next) {
                    self.visit(next);
                    let low = self.low[next].min(self.low[node]);
                    self.low.insert(node, low);
                } else if self.on_stack.contains(next) {
                    let low = self.index[next].min(self.low[node]);
                    self.low.insert(node, low);
                }
            }
            if self.low[node] == self.index[node] {
                let mut group = Vec::new();
                loop {
                    let member = self.stack.pop().unwrap();
                    self.on_stack.remove(member);
                    group.push(member.clone());
                    if member == node {
                        break;
                    }
                }
                if group.len() > 1 {
                    group.sort();
                    self.found.push(group);
                }
            }
        }
    }
    let mut search = Search {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for node in edges.keys() {
        if !search.index.contains_key(node) {
            search.visit(node);
        }
    }
    search.found
}

fn describe_circle(
    group: &[PathBuf],
    edges: &BTreeMap<PathBuf, BTreeMap<PathBuf, String>>,
) -> String {
    let members: BTreeSet<&PathBuf> = group.iter().collect();
    let mut lines = vec![format!("circle of {} files:", group.len())];
    for file in group {
        for (target, example) in edges.get(file).into_iter().flatten() {
            if members.contains(target) {
                lines.push(format!(
                    "  {} -> {} ({example})",
                    file.display(),
                    target.display()
                ));
            }
        }
    }
    lines.join("\n")
}

fn top_module(file: &Path) -> String {
    let first = file
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    first.trim_end_matches(".rs").to_owned()
}

fn layer_of(layers: &[&[&str]], module: &str) -> usize {
    layers
        .iter()
        .position(|line| line.contains(&module))
        .unwrap_or_else(|| panic!("`{module}` is in no layer of LAYERS"))
}

/// Edges from a top-level module to one of its own layer or above.
fn upward_imports(
    edges: &BTreeMap<PathBuf, BTreeMap<PathBuf, String>>,
    layers: &[&[&str]],
) -> Vec<String> {
    let mut upward = Vec::new();
    for (file, targets) in edges {
        let from = top_module(file);
        if from == "lib" {
            continue;
        }
        for (target, example) in targets {
            let to = top_module(target);
            if to != from && layer_of(layers, &to) <= layer_of(layers, &from) {
                upward.push(format!(
                    "  {} -> {} ({example})",
                    file.display(),
                    target.display()
                ));
            }
        }
    }
    upward
}

#[test]
fn no_file_imports_a_file_that_imports_it_back() {
    let house = House::read();
    let edges = house.edges();
    let found = circles(&edges);
    let report: Vec<String> = found.iter().map(|g| describe_circle(g, &edges)).collect();
    assert!(
        found.is_empty(),
        "import circles under src/:\n{}",
        report.join("\n")
    );
}

#[test]
fn no_module_imports_a_layer_above_its_own() {
    let upward = upward_imports(&House::read().edges(), LAYERS);
    assert!(
        upward.is_empty(),
        "imports of a layer above or beside:\n{}",
        upward.join("\n")
    );
}

/// The reader must see what it is meant to: a circle planted among the edges is found, and the
/// house read upside down imports upward everywhere.
#[test]
fn the_reader_finds_a_planted_circle_and_follows_reexports() {
    let house = House::read();
    let edges = house.edges();
    let into_store = edges.values().flat_map(|targets| targets.keys());
    assert!(
        into_store.filter(|f| f.starts_with("store")).count() > 10,
        "the reader saw almost no edge into the store"
    );
    let mut planted = edges.clone();
    let (from, to) = planted
        .iter()
        .find_map(|(from, targets)| targets.keys().next().map(|to| (from.clone(), to.clone())))
        .expect("some edge");
    planted
        .entry(to.clone())
        .or_default()
        .insert(from.clone(), "planted".into());
    let found = circles(&planted);
    assert!(
        found.iter().any(|g| g.contains(&from) && g.contains(&to)),
        "{found:?}"
    );
}
