// attention_kv: the inputs both attention kernels (attention.wgsl, attention_decode.wgsl) read
// (bindings 0-4: qkv, the f16 KV caches, the Step and the uniform of include/attention_params;
// with ROPE the caches are written too and binding RB holds the rotation's inverse frequencies)
// and the helpers over them. The including kernel defines D and RB.
#include "attention_params"

@group(0) @binding(0) var<storage, read> qkv: array<vec4<f32>>;     // (T, (H + 2 Hkv) * D): [q | k | v], q and k roped unless ROPE
#ifdef ROPE
@group(0) @binding(1) var<storage, read_write> k_cache: array<vec4<u32>>; // (S, Hkv, max_ctx, D) f16, 8 per vec4
@group(0) @binding(2) var<storage, read_write> v_cache: array<vec4<u32>>; // (S, Hkv, max_ctx, D) f16, 8 per vec4
@group(0) @binding({{RB}}) var<storage, read> inv_freq: array<f32>;        // (D / 2)
#else
@group(0) @binding(1) var<storage, read> k_cache: array<vec4<u32>>; // (S, Hkv, max_ctx, D) f16, 8 per vec4
@group(0) @binding(2) var<storage, read> v_cache: array<vec4<u32>>; // (S, Hkv, max_ctx, D) f16, 8 per vec4
#endif
@group(0) @binding(3) var<uniform> step: Step;
@group(0) @binding(4) var<uniform> p: Params;

const DV: u32 = {{D}}u / 8u; // 16-byte words (vec4<u32>) per cache row

// First key position visible from position pos.
fn key_lo(pos: u32) -> u32 {
    return select(0u, pos + 1u - p.window, p.window > 0u && pos + 1u > p.window);
}

fn unpack4(w: vec2<u32>) -> vec4<f32> {
    return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
}

// exp(d - m) of a score, 0 for a masked one.
fn prob(d: f32, m: f32) -> f32 {
    return select(0.0, exp(d - m), d > 0.5 * NEG);
}
