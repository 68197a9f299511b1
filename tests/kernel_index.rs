//! The kernel index stays complete: every kernel file `wgsl/<name>.wgsl` has a header line
//! `// Rust: <file> <fn>[, <fn>...]` naming its constructor(s), the file exists and holds each
//! `fn`; `wgsl/INDEX.md` has one row per kernel (kernel → constructor → CPU twin → tests) whose
//! constructor cell is the header's, and every file and function it names exists (tests: a
//! `#[test]` function). No GPU needed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The kernel files' names (no extension), from the directory listing.
fn kernels() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(root().join("wgsl"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "wgsl"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(root().join(path)).map_err(|e| format!("{}: {e}", path.display()))
}

/// Whether `src` defines `fn name` (any visibility, any indentation).
fn defines(src: &str, name: &str) -> bool {
    src.lines().any(|l| {
        let l = l.trim_start();
        let l = l
            .strip_prefix("pub ")
            .or_else(|| l.strip_prefix("pub(crate) "))
            .or_else(|| l.strip_prefix("pub(super) "))
            .unwrap_or(l);
        l.strip_prefix("fn ").is_some_and(|r| r.strip_prefix(name).is_some_and(|r| r.starts_with(['(', '<'])))
    })
}

/// Whether `src` has a `#[test]` function `name` (attributes such as `#[ignore]` may sit between).
fn has_test(src: &str, name: &str) -> bool {
    let lines: Vec<&str> = src.lines().map(str::trim).collect();
    lines.iter().enumerate().any(|(i, l)| {
        *l == "#[test]"
            && lines[i + 1..].iter().take_while(|l| l.starts_with("#[") || l.starts_with("//")).count() < 4
            && lines[i + 1..].iter().find(|l| !l.starts_with("#[") && !l.starts_with("//")).is_some_and(|l| {
                l.strip_prefix("fn ").is_some_and(|r| r.strip_prefix(name).is_some_and(|r| r.starts_with('(')))
            })
    })
}

/// A cell `path: fn, fn; path: fn` as (path, fns).
fn cell(text: &str) -> Result<Vec<(PathBuf, Vec<String>)>, String> {
    text.split(';')
        .map(|part| {
            let (path, fns) = part.split_once(':').ok_or_else(|| format!("`{part}` is not `path: fn, fn`"))?;
            let fns: Vec<String> = fns.split(',').map(|f| f.trim().to_string()).filter(|f| !f.is_empty()).collect();
            if fns.is_empty() {
                return Err(format!("`{part}` names no function"));
            }
            Ok((PathBuf::from(path.trim()), fns))
        })
        .collect()
}

/// Checks that each (path, fns) exists; `test`: the fns are `#[test]` functions; CPU twins
/// written `cpu::f` must sit in a file with a `mod cpu` (or in a `cpu.rs`).
fn check_cell(what: &str, cells: &[(PathBuf, Vec<String>)], test: bool, failures: &mut Vec<String>) {
    for (path, fns) in cells {
        let src = match read(path) {
            Ok(s) => s,
            Err(e) => {
                failures.push(format!("{what}: {e}"));
                continue;
            }
        };
        for f in fns {
            let (cpu, name) = match f.strip_prefix("cpu::") {
                Some(n) => (true, n),
                None => (false, f.as_str()),
            };
            let ok = if test { has_test(&src, name) } else { defines(&src, name) };
            if !ok {
                let kind = if test { "#[test] fn" } else { "fn" };
                failures.push(format!("{what}: {} has no `{kind} {name}`", path.display()));
            }
            if cpu && !src.contains("mod cpu") && path.file_name().is_none_or(|n| n != "cpu.rs") {
                failures.push(format!("{what}: {} has no `mod cpu` for `{f}`", path.display()));
            }
        }
    }
}

/// The `// Rust: <file> <fn>, <fn>` line of a kernel, as a cell.
fn header(kernel: &str) -> Result<(PathBuf, Vec<String>), String> {
    let src = read(&Path::new("wgsl").join(format!("{kernel}.wgsl")))?;
    let line = src
        .lines()
        .find_map(|l| l.strip_prefix("// Rust: "))
        .ok_or_else(|| format!("wgsl/{kernel}.wgsl has no `// Rust: <file> <fn>` header line"))?;
    let (path, fns) = line.trim().split_once(' ').ok_or_else(|| format!("wgsl/{kernel}.wgsl: bad header `{line}`"))?;
    Ok((PathBuf::from(path), fns.split(',').map(|f| f.trim().to_string()).collect()))
}

#[test]
fn every_kernel_header_names_existing_constructors() {
    let mut failures = Vec::new();
    for k in kernels() {
        match header(&k) {
            Ok(c) => check_cell(&format!("wgsl/{k}.wgsl header"), &[c], false, &mut failures),
            Err(e) => failures.push(e),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_kernel_index_covers_every_kernel_with_existing_functions() {
    let index = read(Path::new("wgsl/INDEX.md")).unwrap();
    let mut rows: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut failures = Vec::new();
    for line in index.lines().filter(|l| l.starts_with('|')).skip(2) {
        let cells: Vec<String> = line.trim().trim_matches('|').split('|').map(|c| c.trim().to_string()).collect();
        if cells.len() != 4 {
            failures.push(format!("wgsl/INDEX.md: row `{line}` does not have 4 cells"));
            continue;
        }
        if rows.insert(cells[0].clone(), cells).is_some() {
            failures.push(format!("wgsl/INDEX.md: {} has two rows", line));
        }
    }
    let kernels = kernels();
    assert!(kernels.len() > 20, "only {} kernel files found", kernels.len());
    for k in &kernels {
        let Some(cells) = rows.get(k) else {
            failures.push(format!("wgsl/INDEX.md has no row for wgsl/{k}.wgsl"));
            continue;
        };
        for (i, (what, test)) in [("constructor", false), ("CPU twin", false), ("tests", true)].into_iter().enumerate()
        {
            match cell(&cells[i + 1]) {
                Ok(c) => {
                    check_cell(&format!("wgsl/INDEX.md {k} {what}"), &c, test, &mut failures);
                    if i == 0 {
                        if let Ok(h) = header(k) {
                            if c != [h.clone()] {
                                failures.push(format!(
                                    "wgsl/INDEX.md {k}: constructor `{}` is not the header's `{}: {}`",
                                    cells[1],
                                    h.0.display(),
                                    h.1.join(", ")
                                ));
                            }
                        }
                    }
                }
                Err(e) => failures.push(format!("wgsl/INDEX.md {k} {what}: {e}")),
            }
        }
    }
    for k in rows.keys().filter(|k| !kernels.contains(k)) {
        failures.push(format!("wgsl/INDEX.md: row {k} has no file wgsl/{k}.wgsl"));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
