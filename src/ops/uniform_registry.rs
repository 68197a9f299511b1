//! The registry of every kernel's uniform structs and the test that keeps WGSL and Rust in step:
//! for each entry, the kernels are preprocessed with the entry's flags and parsed with naga, and
//! the WGSL struct's member names, offsets and size must equal the Rust twin's
//! ([`UniformLayout`]). Every `var<uniform>` of every kernel (in its default variant and with
//! each `#ifdef` / `#ifndef` flag alone) must be covered by an entry, so a new kernel or a new
//! uniform fails the test until it is registered here.

use super::uniform::UniformLayout;
use crate::gpu::{shader, Macros};
use std::collections::BTreeSet;

/// One Rust uniform type and the kernels that declare its WGSL twin.
struct Entry {
    /// Kernel files (`wgsl/<name>.wgsl`) whose uniform this type fills.
    kernels: &'static [&'static str],
    /// Flags under which the kernels declare the uniform (most need none).
    flags: &'static [&'static str],
    rust: &'static str,
    wgsl: &'static str,
    members: fn() -> Vec<(&'static str, u32)>,
    size: usize,
}

fn entry<T: UniformLayout>(kernels: &'static [&'static str], flags: &'static [&'static str]) -> Entry {
    Entry {
        kernels,
        flags,
        rust: std::any::type_name::<T>(),
        wgsl: T::WGSL,
        members: T::members,
        size: std::mem::size_of::<T>(),
    }
}

/// Every kernel's uniform: (kernels, flags, Rust type).
fn registry() -> Vec<Entry> {
    use super::{attention, deltanet, elementwise, embedding, matmul, moe, norm, rope};
    vec![
        entry::<super::StepParams>(
            &[
                "attention",
                "attention_decode",
                "causal_conv1d",
                "gated_delta_rule",
                "gated_delta_rule_chunked",
                "kv_cache_write",
                "rms_norm_gated",
                "rope",
            ],
            &[],
        ),
        entry::<elementwise::InPlaceUniform>(&["add", "mul_sigmoid"], &[]),
        entry::<elementwise::GatedActUniform>(&["gated_act"], &[]),
        entry::<attention::AttentionUniform>(&["attention", "attention_decode"], &[]),
        entry::<attention::KvCacheWriteUniform>(&["kv_cache_write"], &[]),
        entry::<deltanet::CausalConv1dUniform>(&["causal_conv1d"], &[]),
        entry::<deltanet::GatedDeltaRuleUniform>(&["gated_delta_rule", "gated_delta_rule_chunked"], &[]),
        entry::<deltanet::RmsNormGatedUniform>(&["rms_norm_gated"], &[]),
        entry::<embedding::EmbeddingUniform>(&["embedding"], &[]),
        entry::<embedding::EmbeddingQuantUniform>(&["embedding_quant"], &[]),
        entry::<embedding::PerLayerInputsUniform>(&["per_layer_inputs"], &[]),
        entry::<norm::RmsNormUniform>(&["rms_norm"], &[]),
        entry::<norm::RmsNormUniform>(&["rms_norm"], &["IN_PLACE"]),
        entry::<rope::RopeUniform>(&["rope"], &[]),
        entry::<matmul::MatmulUniform>(&["matmul"], &[]),
        entry::<matmul::MatvecUniform>(&["matvec"], &[]),
        entry::<matmul::gguf::MatmulQuantUniform>(&["matmul_quant", "matmul_quant_coop"], &[]),
        entry::<matmul::gguf::MatvecQuantUniform>(&["matvec_quant", "matvec_quant_batch"], &[]),
        entry::<matmul::gguf::MatvecQuantMixUniform>(&["matvec_quant"], &["MIX"]),
        entry::<matmul::gguf::QuantizeX16Uniform>(&["quantize_x16"], &[]),
        entry::<moe::MoeGroupUniform>(&["moe_group"], &[]),
        entry::<moe::MoeRouterUniform>(&["moe_router"], &[]),
        entry::<moe::MoeCombineUniform>(&["moe_combine"], &[]),
        entry::<crate::sampling::device::SampleInfo>(&["sample_stats"], &[]),
        entry::<crate::sampling::logprobs::LogprobInfo>(&["sample_logprobs"], &[]),
        entry::<crate::sampling::penalty::ControlInfo>(&["sample_penalty", "token_counts"], &[]),
    ]
}

fn parse(kernel: &str, macros: &Macros) -> Result<naga::Module, String> {
    let src = shader::preprocess(kernel, macros).map_err(|e| format!("{e}"))?;
    naga::front::wgsl::parse_str(&src).map_err(|e| e.emit_to_string(&src))
}

/// A uniform global of a parsed kernel: (struct name, members (name, offset), span).
type Uniform = (String, Vec<(String, u32)>, u32);

/// The uniform globals of a parsed kernel.
fn uniforms(module: &naga::Module) -> Vec<Uniform> {
    module
        .global_variables
        .iter()
        .filter(|(_, g)| g.space == naga::AddressSpace::Uniform)
        .map(|(_, g)| {
            let ty = &module.types[g.ty];
            let name = ty.name.clone().unwrap_or_default();
            match &ty.inner {
                naga::TypeInner::Struct { members, span } => {
                    (name, members.iter().map(|m| (m.name.clone().unwrap_or_default(), m.offset)).collect(), *span)
                }
                other => panic!("a uniform of type {name} that is not a struct: {other:?}"),
            }
        })
        .collect()
}

/// The `#ifdef` / `#ifndef` flags of a kernel file and everything it includes.
fn flags(name: &str, seen: &mut BTreeSet<String>, out: &mut BTreeSet<String>) {
    if !seen.insert(name.to_string()) {
        return;
    }
    let src = shader::source(name).unwrap_or_else(|e| panic!("wgsl/{name}.wgsl: {e}"));
    for line in src.lines() {
        let line = line.trim();
        if let Some(f) = line.strip_prefix("#ifdef ").or_else(|| line.strip_prefix("#ifndef ")) {
            out.insert(f.trim().to_string());
        } else if let Some(rest) = line.strip_prefix("#include ") {
            let inc = rest.trim().trim_start_matches('"').split('"').next().unwrap_or_default();
            flags(&format!("include/{inc}"), seen, out);
        }
    }
}

/// Each registered Rust struct has its WGSL twin's member names, offsets and size, in every
/// kernel it is registered for.
#[test]
fn uniform_structs_match_their_wgsl_twins() {
    let mut failures = Vec::new();
    for e in registry() {
        let macros = e.flags.iter().fold(Macros::new(), |m, f| m.flag(f));
        let want: Vec<(String, u32)> = (e.members)().into_iter().map(|(n, o)| (n.to_string(), o)).collect();
        for kernel in e.kernels {
            let module = match parse(kernel, &macros) {
                Ok(m) => m,
                Err(err) => {
                    failures.push(format!("wgsl/{kernel}.wgsl {:?}: does not parse: {err}", e.flags));
                    continue;
                }
            };
            let found = uniforms(&module).into_iter().find(|(n, _, _)| n == e.wgsl);
            let Some((_, got, span)) = found else {
                failures.push(format!("wgsl/{kernel}.wgsl {:?}: no `var<uniform>` of struct {}", e.flags, e.wgsl));
                continue;
            };
            if got != want || span as usize != e.size {
                failures.push(format!(
                    "wgsl/{kernel}.wgsl {:?}: struct {} is {got:?} ({span} bytes), its Rust twin {} is {want:?} ({} bytes)",
                    e.flags, e.wgsl, e.rust, e.size
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Every uniform of every kernel (default variant, and each of its flags alone) is in the registry.
#[test]
fn every_kernel_uniform_is_registered() {
    let registered: BTreeSet<(&str, &str)> =
        registry().iter().flat_map(|e| e.kernels.iter().map(move |k| (*k, e.wgsl))).collect();
    let mut missing = BTreeSet::new();
    let mut kernels = 0;
    for kernel in shader::kernel_names() {
        kernels += 1;
        let mut own = BTreeSet::new();
        flags(kernel, &mut BTreeSet::new(), &mut own);
        let variants = std::iter::once(Macros::new()).chain(own.iter().map(|f| Macros::new().flag(f)));
        for macros in variants {
            // A variant that does not parse is tests/shaders.rs's to report.
            let Ok(module) = parse(kernel, &macros) else { continue };
            for (name, _, _) in uniforms(&module) {
                if !registered.contains(&(kernel, name.as_str())) {
                    missing.insert(format!("wgsl/{kernel}.wgsl: var<uniform> of struct {name}"));
                }
            }
        }
    }
    assert!(kernels > 20, "only {kernels} kernels found");
    assert!(
        missing.is_empty(),
        "uniforms missing from src/ops/uniform_registry.rs:\n{}",
        missing.into_iter().collect::<Vec<_>>().join("\n")
    );
}
