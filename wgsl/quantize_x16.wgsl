// quantize_x16: x as the integer-dot-product matvec meets it (include/stage_x16.wgsl: per 32-element
// block a power-of-two scale d and 16-bit values split into low and high bytes), written once to a
// buffer, so that every workgroup of matvec_quant's XG variant reads it instead of staging the
// row itself (rows too long for workgroup memory; any workgroup size).
// Layout (include/quant.wgsl, XG): per token row, per block b, five vec4<u32>:
//   xs[5b], xs[5b + 1]       the low bytes of elements 0..15 and 16..31 (byte i of word w:
//                            element 4w + i of the 16)
//   xs[5b + 2], xs[5b + 3]   their high bytes (two's complement)
//   xs[5b + 4]               bits of (d · Σ q over elements 0..15, d · Σ q over 16..31, d, 0)
// One thread a block (its 8 vec4 loaded at once). Grid: ceil(T · K / 32 / WG) workgroups, 2-D
// folded (see gpu/kernel.rs). CPU twin: src/ops/matmul/gguf.rs `cpu::quantize_x16`.
#define WG 64

#include "stage_x16"

struct Params {
    blocks: u32,  // T · K / 32
    bpr: u32,     // K / 32, blocks a row
    xs: u32,      // x's row stride, in vec4
    pad: u32,
}

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;         // (T, K)
@group(0) @binding(1) var<storage, read_write> xs: array<vec4<u32>>;  // (T, K / 32, 5)
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let blk = (wid.x + wid.y * nwg.x) * {{WG}}u + lid;
    if (blk >= p.blocks) {
        return;
    }
    let t = blk / p.bpr;
    let i = t * p.xs + 8u * (blk % p.bpr);
    var v: array<vec4<f32>, 8>;
    for (var j = 0u; j < 8u; j++) {
        v[j] = x[i + j];
    }
    let b = stage_block(v);
    for (var j = 0u; j < 5u; j++) {
        xs[5u * blk + j] = b[j];
    }
}
