//! Every kernel under `wgsl/` (found through `gpu::shader::kernel_names()`, so new kernels are
//! picked up automatically) must, in every variant:
//! - preprocess (every `{{X}}` has a `#define X default` in the file or its includes),
//! - parse and validate with naga (capabilities as wgpu grants them: `f16` only under `F16`,
//!   subgroup operations only under `SUBGROUP`; uniformity analysis on),
//! - translate to MSL (the Metal check; MSL 2.4) and to SPIR-V (1.3, as wgpu on Vulkan 1.1+);
//!   tensor-core kernels (`*_coop`, Vulkan only) with shader-f16 and subgroups, to SPIR-V only.
//!
//! Variants: every combination of the standard flags `F16` and `SUBGROUP`, each alone and combined
//! with each of the kernel's own `#ifdef` / `#ifndef` flags alone (so a kernel must be valid with
//! none of its own flags and with any one of them), and with the sets in `TOGETHER` (flags nested
//! in another's `#ifdef`). No GPU needed.

use naga::back::{msl, spv};
use naga::valid::{Capabilities, ValidationFlags, Validator};
use std::collections::BTreeSet;
use wgpu_llm::gpu::{shader, Macros};

const STANDARD: [&str; 2] = ["F16", "SUBGROUP"];

/// Flags that only act together (one nested in another's `#ifdef`), checked as sets besides
/// each flag alone: kernel, flags.
const TOGETHER: &[(&str, &[&str])] = &[
    ("matvec_quant", &["DP4", "DP4X"]),
    ("matvec_quant", &["DP4", "DP4X", "STAGE8", "TOK4", "NORM"]),
    ("matvec_quant", &["DP4", "STAGE8", "Q6_K", "NORM"]),
    ("matvec_quant", &["DP4", "XG", "Q6_K", "PREFETCH"]),
    ("matvec_quant", &["DP4", "XG", "Q4_K"]),
    ("matvec_quant", &["DP4", "DP4X", "TOK4", "Q4_K", "GATED"]),
    ("matvec_quant", &["MIX", "Q4_K", "MIX_Q6_K", "NORM"]),
    ("matvec_quant", &["MIX", "Q8_0", "MIX_Q5_1", "ACCUMULATE"]),
    ("matvec_quant", &["MIX", "DP4", "MIX_FLOAT_A", "STAGE8", "Q5_0", "MIX_Q6_K", "NORM"]),
    ("matvec_quant", &["MIX", "DP4", "Q4_K", "MIX_Q4_0"]),
    ("matvec_quant_batch", &["GROUPED", "NORM", "GLU"]),
    ("matvec_quant_batch", &["GROUPED", "GATED", "ACCUMULATE", "Q6_K"]),
    ("rms_norm", &["REG", "ACCUMULATE", "NEXT"]),
    ("rms_norm", &["REG", "ACCUMULATE", "NEXT", "STAGE"]),
    ("rms_norm", &["REG", "ACCUMULATE", "NEXT", "STAGE", "STAGE8"]),
    ("attention_decode", &["STAGE8", "SPLIT", "SG32"]),
    ("rms_norm", &["ACCUMULATE", "NEXT", "STAGE"]),
];

/// The file and everything it includes (recursively), as (name, source).
fn sources(name: &str) -> Result<Vec<(String, &'static str)>, String> {
    let mut out = Vec::new();
    let mut todo = vec![name.to_string()];
    while let Some(n) = todo.pop() {
        if out.iter().any(|(m, _)| *m == n) {
            continue;
        }
        let src = shader::source(&n).map_err(|e| e.to_string())?;
        for line in src.lines() {
            if let Some(rest) = line.trim_start().strip_prefix("#include ") {
                // `"name"` or `"name" as P`
                let name = rest.trim().trim_start_matches('"').split('"').next().unwrap_or_default();
                todo.push(format!("include/{name}"));
            }
        }
        out.push((n, src));
    }
    Ok(out)
}

/// Names after `#<directive> ` in any of the sources.
fn directive_names(srcs: &[(String, &str)], directive: &str) -> BTreeSet<String> {
    let prefix = format!("#{directive} ");
    srcs.iter()
        .flat_map(|(_, s)| s.lines())
        .filter_map(|l| l.trim_start().strip_prefix(prefix.as_str()))
        .filter_map(|rest| rest.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// Names used as `{{X}}`.
fn placeholders(srcs: &[(String, &str)]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (_, s) in srcs {
        for line in s.lines().filter(|l| !l.trim_start().starts_with('#')) {
            let mut rest = line;
            while let Some(i) = rest.find("{{") {
                let after = &rest[i + 2..];
                match after.find("}}") {
                    Some(j) => {
                        // ({{X+n}}: X plus n, see src/gpu/shader.rs)
                        out.insert(after[..j].split('+').next().unwrap_or_default().trim().to_string());
                        rest = &after[j + 2..];
                    }
                    None => break,
                }
            }
        }
    }
    out
}

/// Capabilities as wgpu grants them for a device with exactly these optional features.
fn capabilities(f16: bool, subgroup: bool) -> Capabilities {
    let mut caps = Capabilities::all();
    if !f16 {
        // SHADER_FLOAT16_IN_FLOAT32 (pack/unpack2x16float, quantizeToF16) stays: wgpu grants it
        // without shader-f16 (a downlevel flag every Vulkan / Metal / GLES 3 device has).
        caps -= Capabilities::SHADER_FLOAT16;
    }
    if !subgroup {
        caps -= Capabilities::SUBGROUP | Capabilities::SUBGROUP_BARRIER | Capabilities::SUBGROUP_VERTEX_STAGE;
    }
    caps
}

fn restrict() -> naga::proc::BoundsCheckPolicies {
    use naga::proc::BoundsCheckPolicy::Restrict;
    naga::proc::BoundsCheckPolicies {
        index: Restrict,
        buffer: Restrict,
        image_load: Restrict,
        binding_array: naga::proc::BoundsCheckPolicy::Unchecked,
    }
}

/// Runs `f`, turning a panic inside naga into an error message.
fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            Err(format!("{what} panicked: {msg}"))
        }
    }
}

/// Preprocess, parse, validate, translate one variant.
fn check_variant(name: &str, macros: &Macros, f16: bool, subgroup: bool) -> Result<(), String> {
    let code = shader::preprocess(name, macros).map_err(|e| format!("preprocess: {e}"))?;
    let module = guarded("wgsl parse", || {
        naga::front::wgsl::parse_str(&code).map_err(|e| format!("parse: {}", e.emit_to_string(&code)))
    })?;
    if !module.entry_points.iter().any(|ep| ep.stage == naga::ShaderStage::Compute) {
        return Err("no @compute entry point".into());
    }
    let info = guarded("validation", || {
        Validator::new(ValidationFlags::all(), capabilities(f16, subgroup))
            .validate(&module)
            .map_err(|e| format!("validate: {}", e.emit_to_string(&code)))
    })?;
    let coop = name.ends_with("_coop");
    guarded("MSL translation", || {
        if coop {
            return Ok(());
        }
        let options = msl::Options { lang_version: (2, 4), bounds_check_policies: restrict(), ..Default::default() };
        msl::write_string(&module, &info, &options, &msl::PipelineOptions::default())
            .map(|_| ())
            .map_err(|e| format!("MSL: {e}"))
    })?;
    guarded("SPIR-V translation", || {
        let options = spv::Options { lang_version: (1, 3), bounds_check_policies: restrict(), ..Default::default() };
        spv::write_vec(&module, &info, &options, None).map(|_| ()).map_err(|e| format!("SPIR-V: {e}"))
    })?;
    Ok(())
}

fn describe(m: &Macros) -> String {
    if m.0.is_empty() {
        "(no flags)".to_string()
    } else {
        m.0.keys().cloned().collect::<Vec<_>>().join("+")
    }
}

#[test]
fn every_kernel_variant_validates_and_translates() {
    let names: Vec<&str> = shader::kernel_names().collect();
    assert!(!names.is_empty(), "no kernels found under wgsl/");
    let mut failures = Vec::new();
    let mut checked = 0usize;
    for name in &names {
        let srcs = match sources(name) {
            Ok(s) => s,
            Err(e) => {
                failures.push(format!("wgsl/{name}.wgsl: {e}"));
                continue;
            }
        };
        // Convention: every {{X}} has a default.
        let defined = directive_names(&srcs, "define");
        for x in placeholders(&srcs).difference(&defined) {
            failures.push(format!(
                "wgsl/{name}.wgsl: {{{{{x}}}}} has no default (add `#define {x} <default>` to the file)"
            ));
        }
        // The kernel's own flags: #ifdef / #ifndef names that are not standard and not valued macros.
        let mut own: BTreeSet<String> = directive_names(&srcs, "ifdef");
        own.extend(directive_names(&srcs, "ifndef"));
        let own: Vec<String> =
            own.into_iter().filter(|f| !STANDARD.contains(&f.as_str()) && !defined.contains(f)).collect();
        // Tensor-core kernels (`*_coop`: wgpu's cooperative matrices, 16 × 16 f16 tiles) exist only
        // for devices with shader-f16 and subgroups, and only on Vulkan (Metal's simdgroup
        // matrices are 8 × 8): checked with both and translated to SPIR-V only.
        let coop = name.ends_with("_coop");
        for f16 in [false, true] {
            for subgroup in [false, true] {
                if coop && !(f16 && subgroup) {
                    continue;
                }
                let base = Macros::new().flag_if("F16", f16).flag_if("SUBGROUP", subgroup);
                let together = TOGETHER
                    .iter()
                    // (STAGE8 uses subgroup shuffles: the host sets it only with SUBGROUP.)
                    .filter(|(k, fs)| k == name && (subgroup || !fs.contains(&"STAGE8")))
                    .map(|(_, fs)| fs.iter().fold(base.clone(), |m, f| m.flag(f)));
                let variants =
                    std::iter::once(base.clone()).chain(own.iter().map(|f| base.clone().flag(f))).chain(together);
                for m in variants {
                    checked += 1;
                    if let Err(e) = check_variant(name, &m, f16, subgroup) {
                        failures.push(format!("wgsl/{name}.wgsl [{}]: {e}", describe(&m)));
                    }
                }
            }
        }
    }
    eprintln!("checked {checked} variants of {} kernels: {}", names.len(), names.join(", "));
    assert!(failures.is_empty(), "{} shader variant(s) failed:\n\n{}", failures.len(), failures.join("\n\n"));
}

/// The checker itself catches what it is for (so a green run means something).
#[test]
fn checker_rejects_bad_kernels() {
    let bad_f16 = "@group(0) @binding(0) var<storage, read_write> x: array<f32>;\n\
                   @compute @workgroup_size(64) fn main() { let h = f16(x[0]); x[0] = f32(h * h); }";
    assert!(naga::front::wgsl::parse_str(bad_f16).is_err(), "f16 without `enable f16;`");
    let f16 = format!("enable f16;\n{bad_f16}");
    let module = naga::front::wgsl::parse_str(&f16).unwrap();
    assert!(Validator::new(ValidationFlags::all(), capabilities(false, false)).validate(&module).is_err());
    assert!(Validator::new(ValidationFlags::all(), capabilities(true, false)).validate(&module).is_ok());
    let sg = "@group(0) @binding(0) var<storage, read_write> x: array<f32>;\n\
              @compute @workgroup_size(64) fn main(@builtin(local_invocation_index) i: u32) { x[i] = subgroupAdd(x[i]); }";
    let module = naga::front::wgsl::parse_str(sg).unwrap();
    assert!(Validator::new(ValidationFlags::all(), capabilities(false, false)).validate(&module).is_err());
    assert!(Validator::new(ValidationFlags::all(), capabilities(false, true)).validate(&module).is_ok());
    let srcs = vec![("t".to_string(), "#define A 1\nx {{A}} {{B}}\n#ifdef C\n#endif")];
    let missing: Vec<_> = placeholders(&srcs).difference(&directive_names(&srcs, "define")).cloned().collect();
    assert_eq!(missing, vec!["B".to_string()]);
    assert_eq!(directive_names(&srcs, "ifdef"), BTreeSet::from(["C".to_string()]));
}
