//! The library's module graph (issue 31): no import circle between the files of `src/`, and no
//! op that names a model or a file format (`src/ops` never uses `crate::model` or `crate::loader`).
//!
//! The graph is read from the sources, without the compiler: a node per file of `src/` (the
//! library's; `main.rs` is another crate), an edge `a -> b` where a's code names an item of b:
//! through a `use` line, or a path (`crate::x::y`, `super::x`, an imported module's `m::x`).
//! Comments and string literals are not code. Three rules make the graph mean dependencies:
//! - a `mod` declaration is not an edge (a parent declares its children; that is layout);
//! - a re-export (`pub use` / `pub(crate) use`) forwards a name: whoever names it through the
//!   re-exporting module depends on the file that defines it, and the re-export itself is an edge
//!   only where its own file's code uses the name (a folder's `mod.rs` may re-export its files'
//!   items while those files use their parent's);
//! - a path names the deepest file module it reaches (`crate::ops::matmul::Input` names
//!   `ops/matmul/mod.rs`; an inline `mod cpu { .. }` belongs to its file).
//!
//! Test code (`#[cfg(test)]` modules, inline or in files of their own, and other `#[cfg(test)]`
//! items) counts like the rest: the circles and the ops rule hold for it too.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A lexical token of cleaned code: an identifier (or keyword), `::`, or one punctuation char.
#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Id(String),
    Path,
    P(char),
}

/// Tokens of `src` with comments, string and char literals and lifetimes dropped.
fn tokens(src: &str) -> Vec<Tok> {
    let c: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        if ch == '/' && c.get(i + 1) == Some(&'/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && c.get(i + 1) == Some(&'*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if ch == 'r' && matches!(c.get(i + 1), Some('"') | Some('#')) && {
            let mut j = i + 1;
            while c.get(j) == Some(&'#') {
                j += 1;
            }
            c.get(j) == Some(&'"')
        } {
            // Raw string r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while c[j] == '#' {
                hashes += 1;
                j += 1;
            }
            j += 1;
            loop {
                if c[j] == '"' && (0..hashes).all(|h| c.get(j + 1 + h) == Some(&'#')) {
                    i = j + 1 + hashes;
                    break;
                }
                j += 1;
            }
        } else if ch == '"' {
            i += 1;
            while c[i] != '"' {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
        } else if ch == '\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime ('a).
            if c.get(i + 1) == Some(&'\\') {
                i += 2;
                while c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if c.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
                while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                    i += 1;
                }
            }
        } else if ch.is_alphabetic() || ch == '_' {
            let s = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            out.push(Tok::Id(c[s..i].iter().collect()));
        } else if ch.is_ascii_digit() {
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_' || c[i] == '.') {
                i += 1;
            }
        } else if ch == ':' && c.get(i + 1) == Some(&':') {
            out.push(Tok::Path);
            i += 2;
        } else {
            if !ch.is_whitespace() {
                out.push(Tok::P(ch));
            }
            i += 1;
        }
    }
    out
}

/// The module path of a file of src/ (`crate::ops::matmul` for `src/ops/matmul/mod.rs`).
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut segs: Vec<String> = rel.iter().map(|s| s.to_string_lossy().into_owned()).collect();
    if matches!(segs.last().map(String::as_str), Some("mod") | Some("lib")) {
        segs.pop();
    }
    std::iter::once("crate".to_string()).chain(segs).collect::<Vec<_>>().join("::")
}

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rs_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// One `use` path: its segments (absolute or relative, as written), the name it binds, and
/// whether it re-exports.
#[derive(Debug)]
struct Use {
    path: Vec<String>,
    alias: String,
    public: bool,
    /// The inline module the use sits in (relative to its file's module).
    inline: Vec<String>,
}

/// Expands the use tree at `t[i..]` (up to `;`) into `out`; returns the index after `;`.
fn use_tree(t: &[Tok], mut i: usize, prefix: &[String], out: &mut Vec<(Vec<String>, String)>) -> usize {
    let mut path = prefix.to_vec();
    loop {
        match &t[i] {
            Tok::Id(s) if s == "as" => {
                if let Tok::Id(a) = &t[i + 1] {
                    let a = if a == "_" { String::new() } else { a.clone() };
                    out.push((path.clone(), a));
                }
                return i + 2;
            }
            Tok::Id(s) => {
                path.push(s.clone());
                i += 1;
            }
            Tok::Path => i += 1,
            Tok::P('*') => {
                out.push((path.clone(), "*".into()));
                return i + 1;
            }
            Tok::P('{') => {
                i += 1;
                loop {
                    if t[i] == Tok::P('}') {
                        return i + 1;
                    }
                    i = use_tree(t, i, &path, out);
                    if t[i] == Tok::P(',') {
                        i += 1;
                    }
                }
            }
            _ => {
                // `,`, `}` or `;` ends this path.
                let mut p = path.clone();
                let alias = match p.last().map(String::as_str) {
                    Some("self") => {
                        p.pop();
                        p.last().cloned().unwrap_or_default()
                    }
                    _ => p.last().cloned().unwrap_or_default(),
                };
                out.push((p, alias));
                return i;
            }
        }
    }
}

struct File {
    module: String,
    uses: Vec<Use>,
    /// Paths named in code outside `use` lines: (inline module, segments).
    paths: Vec<(Vec<String>, Vec<String>)>,
    /// Identifiers used outside `use` lines.
    idents: BTreeSet<String>,
}

fn parse(module: &str, src: &str) -> File {
    let t = tokens(src);
    let mut f = File { module: module.into(), uses: vec![], paths: vec![], idents: BTreeSet::new() };
    // Inline modules: (name, brace depth at which they close).
    let mut inline: Vec<(String, usize)> = vec![];
    let mut depth = 0usize;
    let mut i = 0;
    while i < t.len() {
        match &t[i] {
            Tok::P('{') => depth += 1,
            Tok::P('}') => {
                depth -= 1;
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
            }
            Tok::Id(s) if s == "mod" => {
                if let (Some(Tok::Id(name)), Some(Tok::P('{'))) = (t.get(i + 1), t.get(i + 2)) {
                    inline.push((name.clone(), depth));
                    depth += 1;
                    i += 3;
                    continue;
                }
            }
            Tok::Id(s) if s == "use" => {
                // `pub use`, `pub(crate) use`, `pub(super) use`.
                let public = matches!(t.get(i.wrapping_sub(1)), Some(Tok::Id(p)) if p == "pub")
                    || (t.get(i.wrapping_sub(1)) == Some(&Tok::P(')'))
                        && matches!(t.get(i.wrapping_sub(4)), Some(Tok::Id(p)) if p == "pub"));
                let mut paths = vec![];
                i = use_tree(&t, i + 1, &[], &mut paths);
                let here: Vec<String> = inline.iter().map(|(n, _)| n.clone()).collect();
                for (path, alias) in paths {
                    f.uses.push(Use { path, alias, public, inline: here.clone() });
                }
                continue;
            }
            Tok::Id(s) => {
                f.idents.insert(s.clone());
                if t.get(i + 1) == Some(&Tok::Path) && i.checked_sub(1).is_none_or(|p| t[p] != Tok::Path) {
                    let mut segs = vec![s.clone()];
                    let mut j = i + 1;
                    while t.get(j) == Some(&Tok::Path) {
                        match t.get(j + 1) {
                            Some(Tok::Id(n)) => segs.push(n.clone()),
                            _ => break,
                        }
                        j += 2;
                    }
                    f.paths.push((inline.iter().map(|(n, _)| n.clone()).collect(), segs));
                }
            }
            _ => {}
        }
        i += 1;
    }
    f
}

struct Graph {
    modules: BTreeSet<String>,
    /// Module -> re-exported name -> absolute target path.
    reexports: BTreeMap<String, BTreeMap<String, Vec<String>>>,
}

impl Graph {
    /// Absolute segments of `segs` written in `module` (inside its inline modules `inline`):
    /// `crate::..`, `super::..`, `self::..`, or a child module's name. None: not a crate path.
    fn absolute(&self, module: &str, inline: &[String], segs: &[String]) -> Option<Vec<String>> {
        let mut base: Vec<String> = module.split("::").map(String::from).collect();
        base.extend(inline.iter().cloned());
        let mut rest = segs;
        match segs.first().map(String::as_str)? {
            "crate" => return Some(segs.to_vec()),
            "self" => rest = &segs[1..],
            "super" => {
                while rest.first().is_some_and(|s| s == "super") {
                    base.pop();
                    rest = &rest[1..];
                }
            }
            first => {
                let child = format!("{}::{first}", base.join("::"));
                if !self.modules.contains(&child) {
                    return None;
                }
            }
        }
        base.extend(rest.iter().cloned());
        Some(base)
    }

    /// The file module an absolute path names, through re-exports.
    fn resolve(&self, path: &[String]) -> String {
        let mut path = path.to_vec();
        for _ in 0..16 {
            let mut cur = path[0].clone();
            let mut i = 1;
            while i < path.len() && self.modules.contains(&format!("{cur}::{}", path[i])) {
                cur = format!("{cur}::{}", path[i]);
                i += 1;
            }
            match path.get(i).and_then(|n| self.reexports.get(&cur)?.get(n)) {
                Some(target) if target.as_slice() != &path[..=i] => {
                    path = target.iter().chain(&path[i + 1..]).cloned().collect();
                }
                _ => return cur,
            }
        }
        panic!("re-exports loop at {path:?}")
    }
}

/// The edges of the library's files: module -> modules it names.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = vec![];
    rs_files(&src, &mut files);
    files.retain(|f| f != &src.join("main.rs") && !f.starts_with(src.join("bin")));
    let parsed: Vec<File> =
        files.iter().map(|f| parse(&module_of(&src, f), &std::fs::read_to_string(f).unwrap())).collect();
    let mut g = Graph { modules: parsed.iter().map(|f| f.module.clone()).collect(), reexports: BTreeMap::new() };
    for f in &parsed {
        for u in f.uses.iter().filter(|u| u.public && u.inline.is_empty() && u.alias != "*") {
            if let Some(abs) = g.absolute(&f.module, &u.inline, &u.path) {
                g.reexports.entry(f.module.clone()).or_default().insert(u.alias.clone(), abs);
            }
        }
    }
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &parsed {
        let mut to = BTreeSet::new();
        // Local names bound by `use` (for `alias::item` paths in the code).
        let mut aliases: BTreeMap<(Vec<String>, String), Vec<String>> = BTreeMap::new();
        for u in &f.uses {
            let Some(abs) = g.absolute(&f.module, &u.inline, &u.path) else { continue };
            aliases.insert((u.inline.clone(), u.alias.clone()), abs.clone());
            // A re-export is an edge where its own file's code uses the name.
            if !u.public || u.alias == "*" || f.idents.contains(&u.alias) {
                to.insert(g.resolve(&abs));
            }
        }
        for (inline, segs) in &f.paths {
            let abs = match aliases.get(&(inline.clone(), segs[0].clone())) {
                Some(a) => Some(a.iter().chain(&segs[1..]).cloned().collect()),
                None => g.absolute(&f.module, inline, segs),
            };
            if let Some(abs) = abs {
                to.insert(g.resolve(&abs));
            }
        }
        to.remove(&f.module);
        edges.insert(f.module.clone(), to);
    }
    edges
}

/// A circle of the graph, if there is one.
fn find_cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit<'a>(
        n: &'a str,
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<&'a str, u8>,
        stack: &mut Vec<&'a str>,
    ) -> Option<Vec<String>> {
        state.insert(n, 1);
        stack.push(n);
        for m in edges.get(n).into_iter().flatten() {
            match state.get(m.as_str()) {
                Some(1) => {
                    let at = stack.iter().position(|s| s == m).unwrap();
                    return Some(stack[at..].iter().map(|s| s.to_string()).chain([m.clone()]).collect());
                }
                Some(_) => {}
                None => {
                    if let Some(c) = visit(m, edges, state, stack) {
                        return Some(c);
                    }
                }
            }
        }
        stack.pop();
        state.insert(n, 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in edges.keys() {
        if !state.contains_key(n.as_str()) {
            if let Some(c) = visit(n, edges, &mut state, &mut vec![]) {
                return Some(c);
            }
        }
    }
    None
}

#[test]
fn no_import_circle_between_files() {
    let edges = graph();
    assert!(edges.len() > 50, "read {} files of src/", edges.len());
    // Every circle found, each reported once (its closing edge removed to look for the next).
    let mut rest = edges.clone();
    let mut circles = vec![];
    while let Some(c) = find_cycle(&rest) {
        rest.get_mut(&c[c.len() - 2]).unwrap().remove(&c[c.len() - 1]);
        circles.push(c.join(" -> "));
    }
    // Circles not yet broken (parent modules whose files use the parent's types while the parent
    // calls into them), each to be removed from this list with its fix: the list can only shrink,
    // and a circle found that is not on it fails.
    let known = ["crate::gpu -> crate::gpu::kernel -> crate::gpu"];
    let new: Vec<&String> = circles.iter().filter(|c| !known.contains(&c.as_str())).collect();
    assert!(new.is_empty(), "import circles:\n{}", circles.join("\n"));
    let gone: Vec<&&str> = known.iter().filter(|k| !circles.iter().any(|c| c == *k)).collect();
    assert!(gone.is_empty(), "circles broken (remove them from `known`): {gone:?}");
}

#[test]
fn ops_name_no_model_and_no_file_format() {
    let edges = graph();
    let bad: Vec<String> = edges
        .iter()
        .filter(|(m, _)| m.starts_with("crate::ops"))
        .flat_map(|(m, to)| {
            to.iter()
                .filter(|t| {
                    ["crate::model", "crate::loader"].iter().any(|p| t == p || t.starts_with(&format!("{p}::")))
                })
                .map(move |t| format!("{m} -> {t}"))
        })
        .collect();
    assert!(bad.is_empty(), "ops importing model or loader: {bad:#?}");
}

#[test]
fn the_graph_sees_a_circle_and_an_op_naming_a_model() {
    // The reader itself: a circle through `super`, a re-export and an alias is found.
    let mut edges = BTreeMap::new();
    for (m, src) in [
        ("crate::a", "pub use b::X; use crate::a::b as bb; fn f() { bb::g(); }"),
        ("crate::a::b", "use super::Y; // crate::c\n fn g() { let _ = \"crate::c\"; }"),
    ] {
        edges.insert(m.to_string(), parse(m, src));
    }
    let g = Graph {
        modules: edges.keys().cloned().collect(),
        reexports: [(
            "crate::a".to_string(),
            [("X".to_string(), vec!["crate".into(), "a".into(), "b".into(), "X".into()])].into(),
        )]
        .into(),
    };
    let f = &edges["crate::a::b"];
    let to: BTreeSet<String> =
        f.uses.iter().map(|u| g.resolve(&g.absolute(&f.module, &u.inline, &u.path).unwrap())).collect();
    assert_eq!(to, ["crate::a".to_string()].into());
    assert!(f.paths.is_empty(), "comments and strings are not code: {:?}", f.paths);
    let a = &edges["crate::a"];
    assert_eq!(g.resolve(&["crate".into(), "a".into(), "X".into()]), "crate::a::b");
    assert!(a.paths.iter().any(|(_, p)| p == &["bb".to_string(), "g".to_string()]));
    let real = graph();
    assert!(real["crate::ops::matmul::gguf::linear"].contains("crate::ops::matmul::gguf"));
    assert!(real["crate::ops::moe"].contains("crate::weights::quant"), "{:?}", real["crate::ops::moe"]);
}
