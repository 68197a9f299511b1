//! WGSL sources and their preprocessor.
//!
//! Every file under `wgsl/` is embedded at build time (see `build.rs`). A kernel file is named
//! after its op (`wgsl/rms_norm.wgsl`); shared snippets live in `wgsl/include/`.
//!
//! Directives (each on its own line):
//! - `#include "name"`: pastes `wgsl/include/name.wgsl` once (later includes of it are dropped);
//! - `#ifdef X` / `#ifndef X` / `#else` / `#endif`: keep or drop lines by whether macro X is set;
//! - `#define X value`: the default of X when the caller does not set it;
//! - `{{X}}` anywhere in a line: replaced by X's value (an unset X is an error).
//!
//! Standard macros set by [`crate::gpu::Gpu::macros`]: `F16` (shader-f16 is enabled: the kernel
//! may use `f16` arithmetic) and `SUBGROUP` (subgroup operations are enabled). Kernels must work
//! with neither: f16 data is stored packed in `u32` pairs and unpacked with `unpack2x16float`.

use crate::error::{Error, Result};
use std::collections::BTreeMap;

include!(concat!(env!("OUT_DIR"), "/shaders.rs"));

/// Preprocessor macros: name -> value (a set flag has value "1"). Ordered, so usable as a cache key.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Macros(pub BTreeMap<String, String>);

impl Macros {
    pub fn new() -> Self {
        Self::default()
    }
    /// Sets a flag (`#ifdef name` holds).
    pub fn flag(mut self, name: &str) -> Self {
        self.0.insert(name.to_string(), "1".to_string());
        self
    }
    /// Sets a flag when `on`.
    pub fn flag_if(self, name: &str, on: bool) -> Self {
        if on {
            self.flag(name)
        } else {
            self
        }
    }
    /// Sets a value for `{{name}}`.
    pub fn set(mut self, name: &str, value: impl ToString) -> Self {
        self.0.insert(name.to_string(), value.to_string());
        self
    }
    pub fn is_set(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }
}

/// The raw text of `wgsl/<name>.wgsl`.
pub fn source(name: &str) -> Result<&'static str> {
    SOURCES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, s)| *s)
        .ok_or_else(|| Error::Gpu(format!("no shader wgsl/{name}.wgsl")))
}

/// Names of the kernel files (everything but `include/`).
pub fn kernel_names() -> impl Iterator<Item = &'static str> {
    SOURCES.iter().map(|(n, _)| *n).filter(|n| !n.starts_with("include/"))
}

/// Returns the final WGSL of kernel `name` under `macros`.
pub fn preprocess(name: &str, macros: &Macros) -> Result<String> {
    let mut defines = macros.0.clone();
    let mut included = Vec::new();
    let mut out = String::new();
    expand(name, source(name)?, &mut defines, macros, &mut included, &mut out)?;
    Ok(out)
}

fn expand(
    file: &str,
    src: &str,
    defines: &mut BTreeMap<String, String>,
    caller: &Macros,
    included: &mut Vec<String>,
    out: &mut String,
) -> Result<()> {
    let err = |line: usize, msg: String| Error::Gpu(format!("wgsl/{file}.wgsl:{}: {msg}", line + 1));
    // Stack of (this branch active, some branch of this #if taken, parent active).
    let mut stack: Vec<(bool, bool)> = Vec::new();
    let active = |stack: &Vec<(bool, bool)>| stack.iter().all(|(a, _)| *a);
    for (ln, line) in src.lines().enumerate() {
        let t = line.trim_start();
        if let Some(rest) = t.strip_prefix("#ifdef ") {
            let on = defines.contains_key(rest.trim());
            stack.push((on, on));
        } else if let Some(rest) = t.strip_prefix("#ifndef ") {
            let on = !defines.contains_key(rest.trim());
            stack.push((on, on));
        } else if t.starts_with("#else") {
            let top = stack.last_mut().ok_or_else(|| err(ln, "#else without #ifdef".into()))?;
            top.0 = !top.1;
            top.1 = true;
        } else if t.starts_with("#endif") {
            stack.pop().ok_or_else(|| err(ln, "#endif without #ifdef".into()))?;
        } else if !active(&stack) {
            continue;
        } else if let Some(rest) = t.strip_prefix("#define ") {
            let mut it = rest.trim().splitn(2, char::is_whitespace);
            let k = it.next().unwrap_or_default().to_string();
            let v = it.next().unwrap_or("1").trim().to_string();
            if !caller.0.contains_key(&k) {
                defines.insert(k, v);
            }
        } else if let Some(rest) = t.strip_prefix("#include ") {
            let inc = rest.trim().trim_matches('"');
            let key = format!("include/{inc}");
            if !included.contains(&key) {
                included.push(key.clone());
                let src = source(&key).map_err(|e| err(ln, e.to_string()))?;
                expand(&key, src, defines, caller, included, out)?;
            }
        } else if t.starts_with('#') {
            return Err(err(ln, format!("unknown directive {t}")));
        } else {
            substitute(line, defines, out).map_err(|m| err(ln, m))?;
            out.push('\n');
        }
    }
    if !stack.is_empty() {
        return Err(Error::Gpu(format!("wgsl/{file}.wgsl: unterminated #ifdef")));
    }
    Ok(())
}

fn substitute(line: &str, defines: &BTreeMap<String, String>, out: &mut String) -> Result<(), String> {
    let mut rest = line;
    while let Some(i) = rest.find("{{") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 2..];
        let j = after.find("}}").ok_or("unclosed {{")?;
        let key = after[..j].trim();
        let v = defines.get(key).ok_or_else(|| format!("macro {key} is not set"))?;
        out.push_str(v);
        rest = &after[j + 2..];
    }
    out.push_str(rest);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directives() {
        let mut d = BTreeMap::new();
        let caller = Macros::new().flag("A").set("N", 4);
        d.extend(caller.0.clone());
        let src =
            "#define N 9\n#define M 2\n#ifdef A\na{{N}}\n#ifndef B\nnb\n#else\nb\n#endif\n#else\nnot_a\n#endif\nm{{M}}";
        let mut out = String::new();
        expand("t", src, &mut d, &caller, &mut vec![], &mut out).unwrap();
        assert_eq!(out, "a4\nnb\nm2\n");
        let mut out = String::new();
        assert!(expand("t", "{{Q}}", &mut d, &caller, &mut vec![], &mut out).is_err());
        assert!(expand("t", "#ifdef A\n", &mut d, &caller, &mut vec![], &mut out).is_err());
    }
}
