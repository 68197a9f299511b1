//! WGSL sources and their preprocessor.
//!
//! Every file under `wgsl/` is embedded at build time (see `build.rs`). A kernel file is named
//! after its op (`wgsl/rms_norm.wgsl`); shared snippets live in `wgsl/include/`.
//!
//! Directives (each on its own line):
//! - `#include "name"`: pastes `wgsl/include/name.wgsl` once (later includes of it are dropped);
//! - `#include "name" as P`: pastes it (once per prefix) with every name it declares at top level
//!   (`fn`, `struct`, `const`, `alias`, `override`, `var`) prefixed by `P` wherever they appear as
//!   names (not after a `.`: member accesses keep theirs): a second copy of a family's functions
//!   beside the first (the mixed-type matvec: `quant_q6_k` as `b_` gives `b_q_raw`, `b_QRaw`, ...).
//!   Names it uses but does not declare stay shared. The files it includes (plainly) are part of
//!   the paste: pasted once per prefix, their names prefixed too (`quant_q4_1`'s `quant_nibble_vals`);
//! - `#ifdef X` / `#ifndef X` / `#else` / `#endif`: keep or drop lines by whether macro X is set;
//! - `#define X value`: the default of X when the caller does not set it;
//! - `{{X}}` anywhere in a line: replaced by X's value (an unset X is an error); `{{X+n}}`: by X's
//!   value plus n, both integers (the consecutive bindings of an include, from its first: `{{B+1}}`).
//!   With `#define`, a kernel passes an include its parameters: set before the `#include` line.
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
    expand(name, source(name)?, &mut defines, macros, &mut included, &mut out, None)?;
    Ok(out)
}

/// The names a WGSL text declares at top level (unindented `fn`, `struct`, `const`, `alias`,
/// `var<...>` lines).
fn top_level_names(src: &str) -> Vec<String> {
    let ident = |s: &str| -> Option<String> {
        let n: String = s.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        (!n.is_empty()).then_some(n)
    };
    src.lines()
        .filter(|l| !l.starts_with(char::is_whitespace))
        .filter_map(|l| {
            for kw in ["fn ", "struct ", "const ", "alias ", "override "] {
                if let Some(rest) = l.strip_prefix(kw) {
                    return ident(rest.trim_start());
                }
            }
            let rest = l.strip_prefix("var")?;
            let rest = match rest.chars().next()? {
                '<' => &rest[rest.find('>')? + 1..],
                c if c.is_whitespace() => rest,
                _ => return None,
            };
            ident(rest.trim_start())
        })
        .collect()
}

/// `src` with every identifier in `names` prefixed by `prefix`, but after a `.` (a member).
fn prefix_names(src: &str, names: &[String], prefix: &str) -> String {
    let mut out = String::with_capacity(src.len() + src.len() / 8);
    let mut word = String::new();
    // (the character before the current word)
    let mut before = ' ';
    let flush = |word: &mut String, out: &mut String, before: char| {
        if before != '.' && names.iter().any(|n| n == word) {
            out.push_str(prefix);
        }
        out.push_str(word);
        word.clear();
    };
    for c in src.chars() {
        // (a name never starts with a digit, and no name is all digits: "2u" stays a literal)
        if c.is_ascii_alphanumeric() || c == '_' {
            word.push(c);
        } else {
            flush(&mut word, &mut out, before);
            out.push(c);
            before = c;
        }
    }
    flush(&mut word, &mut out, before);
    out
}

fn expand(
    file: &str,
    src: &str,
    defines: &mut BTreeMap<String, String>,
    caller: &Macros,
    included: &mut Vec<String>,
    out: &mut String,
    paste: Option<&str>,
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
            let (inc, prefix) = parse_include(rest).map_err(|m| err(ln, m))?;
            if let (Some(p), Some(outer)) = (prefix, paste) {
                return Err(err(ln, format!("#include as {p} inside a file pasted as {outer}")));
            }
            let key = format!("include/{inc}");
            // Inside a file pasted as P, a plain include is a part of that paste: pasted once per
            // prefix, its names prefixed with the rest of the paste's.
            let once = match prefix.or(paste) {
                Some(p) => format!("{key} as {p}"),
                None => key.clone(),
            };
            if !included.contains(&once) {
                included.push(once);
                let src = source(&key).map_err(|e| err(ln, e.to_string()))?;
                match prefix {
                    None => expand(&key, src, defines, caller, included, out, paste)?,
                    Some(p) => {
                        let mut text = String::new();
                        expand(&key, src, defines, caller, included, &mut text, Some(p))?;
                        out.push_str(&prefix_names(&text, &top_level_names(&text), p));
                    }
                }
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

/// `"name"` or `"name" as P` (P an identifier prefix).
fn parse_include(rest: &str) -> Result<(&str, Option<&str>), String> {
    let rest = rest.trim();
    let body = rest.strip_prefix('"').ok_or("#include wants a quoted name")?;
    let end = body.find('"').ok_or("#include: unclosed quote")?;
    let (name, tail) = (&body[..end], body[end + 1..].trim());
    if tail.is_empty() {
        return Ok((name, None));
    }
    let p = tail.strip_prefix("as ").map(str::trim).ok_or_else(|| format!("#include: unexpected {tail:?}"))?;
    if p.is_empty() || !p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(format!("#include: bad prefix {p:?}"));
    }
    Ok((name, Some(p)))
}

fn substitute(line: &str, defines: &BTreeMap<String, String>, out: &mut String) -> Result<(), String> {
    let mut rest = line;
    while let Some(i) = rest.find("{{") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 2..];
        let j = after.find("}}").ok_or("unclosed {{")?;
        // `{{X}}`, or `{{X+n}}`: X's value (an integer) plus n.
        let (key, add) = match after[..j].split_once('+') {
            Some((k, n)) => (k.trim(), Some(n.trim())),
            None => (after[..j].trim(), None),
        };
        let v = defines.get(key).ok_or_else(|| format!("macro {key} is not set"))?;
        match add {
            None => out.push_str(v),
            Some(n) => {
                let sum = v.parse::<u64>().ok().zip(n.parse::<u64>().ok()).map(|(v, n)| v + n);
                let sum = sum.ok_or_else(|| format!("{{{{{key}+{n}}}}}: {key} = {v:?} and {n:?} must be integers"))?;
                out.push_str(&sum.to_string());
            }
        }
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
        expand("t", src, &mut d, &caller, &mut vec![], &mut out, None).unwrap();
        assert_eq!(out, "a4\nnb\nm2\n");
        let mut out = String::new();
        expand(
            "t",
            "#define B 3\n@binding({{B}}) @binding({{B+1}}) @binding({{ B + 2 }})",
            &mut d,
            &caller,
            &mut vec![],
            &mut out,
            None,
        )
        .unwrap();
        assert_eq!(out, "@binding(3) @binding(4) @binding(5)\n");
        // (not an integer; unset)
        assert!(expand("t", "{{B+x}}", &mut d, &caller, &mut vec![], &mut String::new(), None).is_err());
        assert!(expand("t", "{{Q+1}}", &mut d, &caller, &mut vec![], &mut String::new(), None).is_err());
        let mut out = String::new();
        assert!(expand("t", "{{Q}}", &mut d, &caller, &mut vec![], &mut out, None).is_err());
        assert!(expand("t", "#ifdef A\n", &mut d, &caller, &mut vec![], &mut out, None).is_err());
    }

    #[test]
    fn prefixed_names() {
        let src = "const QU: u32 = 32u;\nstruct QRaw {\n    qs: u32,\n}\nvar<private> q_t: u32;\n\
                   fn q_raw(i: u32) -> QRaw {\n    return QRaw(qw1(i) + QU + q_t);\n}\nvariant_of_nothing\n\
                   const qs = 1u;\nfn f(r: QRaw) -> u32 {\n    return r.qs + qs;\n}\n";
        let names = top_level_names(src);
        assert_eq!(names, ["QU", "QRaw", "q_t", "q_raw", "qs", "f"]);
        let out = prefix_names(src, &names, "b_");
        // Declared names renamed where declared and used; the undeclared accessor and fields stay.
        assert!(out.contains("fn b_q_raw(i: u32) -> b_QRaw {"), "{out}");
        assert!(out.contains("return b_QRaw(qw1(i) + b_QU + b_q_t);"), "{out}");
        assert!(out.contains("var<private> b_q_t: u32;"), "{out}");
        // A member access keeps its name where a declared name matches it (the field
        // declaration itself is renamed, as any name: so no declared name may be a field's).
        assert!(out.contains("return r.qs + b_qs;"), "{out}");
        let mut d = BTreeMap::new();
        let caller = Macros::new();
        let mut out = String::new();
        let r = expand("t", "#include \"quant_views\" as b_\n", &mut d, &caller, &mut vec![], &mut out, None);
        assert!(r.is_ok(), "{r:?}");
        // The files a prefixed paste includes are part of it, prefixed too (once per prefix), and
        // may not paste with another prefix themselves.
        let mut inc = vec![];
        let mut out = String::new();
        let src = "#include \"quant_q4_1\"\n#include \"quant_q4_1\" as b_\n";
        expand("t", src, &mut d, &caller, &mut inc, &mut out, None).unwrap();
        assert_eq!(out.matches("fn q_vals(r: QRaw) -> QV {").count(), 1, "{out}");
        assert_eq!(out.matches("fn b_q_vals(r: b_QRaw) -> b_QV {").count(), 1, "{out}");
        assert!(out.contains("alias b_QV = QV32;") && out.contains("return b_q_dot_v(r, b_q_vals(r), v);"), "{out}");
        assert!(inc.contains(&"include/quant_nibble_vals as b_".to_string()), "{inc:?}");
        let r = expand("t", "#include \"quant\" as c_\n", &mut d, &caller, &mut vec![], &mut String::new(), Some("b_"));
        assert!(r.as_ref().is_err_and(|e| e.to_string().contains("inside a file pasted as b_")), "{r:?}");
        assert_eq!(parse_include(" \"quant_q6_k\" as b_").unwrap(), ("quant_q6_k", Some("b_")));
        assert_eq!(parse_include("\"quant\"").unwrap(), ("quant", None));
        assert!(parse_include("\"quant\" b_").is_err() && parse_include("quant").is_err());
    }
}
