// quantize_x16: x as the integer-dot-product matvec meets it (include/stage_x16.wgsl: per 32-element
// block a power-of-two scale d and 16-bit values split into low and high bytes), written once to a
// buffer, so that every workgroup of matvec_quant's XG variant reads it instead of staging the
// row itself (rows too long for workgroup memory; any workgroup size).
// Layout (include/quant.wgsl, XG, reads it as five vec4<u32> a block): per token row, per block b,
// 20 words:
//   xs[20b ..], xs[20b + 4 ..]    the low bytes of elements 0..15 and 16..31 (byte i of word w:
//                                 element 4w + i of the 16)
//   xs[20b + 8 ..], xs[20b + 12 ..]  their high bytes (two's complement)
//   xs[20b + 16 ..]               bits of d · Σ q over elements 0..15, d · Σ q over 16..31, d, 0
// One thread a block (its 8 vec4 loaded at once), or with STAGE8 (subgroups of 8 or more) eight
// threads a block, a vec4 each, the block's maximum and sums by shuffles (include/stage_x16.wgsl
// stage_lanes8): the same words. Grid: ceil(T · K / 32 / WG) workgroups (STAGE8: 8 times as many
// threads), 2-D folded (see gpu/kernel.rs). CPU twin: src/ops/matmul/gguf.rs `cpu::quantize_x16`.
// Rust: src/ops/matmul/gguf/matvec.rs quantize_x16
#define WG 64

#define XS_STORE
#include "stage_x16"

struct Params {
    blocks: u32,  // T · K / 32
    bpr: u32,     // K / 32, blocks a row
    xs: u32,      // x's row stride, in vec4
    pad: u32,
}

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;         // (T, K)
@group(0) @binding(1) var<storage, read_write> xs: array<u32>;        // (T, K / 32, 20)
@group(0) @binding(2) var<uniform> p: Params;

#include "entry"
    // (STAGE8 only acts with SUBGROUP, which the host sets with it.)
#ifdef SUBGROUP
#ifdef STAGE8
    {
        // Eight threads a block, a vec4 each (the loads coalesced); every thread runs the shuffles.
        let g = (wid.x + wid.y * nwg.x) * {{WG}}u + lid;
        let blk = g / 8u;
        let lane = g % 8u;
        let b = min(blk, p.blocks - 1u);
        stage_store8(20u * blk, lane, x[(b / p.bpr) * p.xs + 8u * (b % p.bpr) + lane], blk < p.blocks);
        return;
    }
#endif
#endif
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
    for (var j = 0u; j < 20u; j++) {
        xs[20u * blk + j] = b[j / 4u][j % 4u];
    }
}
