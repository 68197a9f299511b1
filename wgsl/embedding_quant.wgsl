// embedding_quant: out[t, c] = table[ids[t], c] * scale from a table kept in a GGUF quantized type
// (include/quant.wgsl: the planes layout and q_run, the dequantization bit-identical to
// src/loader/dtype.rs to_f32), for the tokens whose id falls in this chunk of the table: rows
// [row_start, row_start + chunk_rows). Other tokens' rows of out are left untouched (another
// chunk's dispatch writes them; an id >= vocab is written by none). A thread writes 4 columns.
// Grid: 1-D over ceil(n_tokens * cols / 4 / WG) workgroups, 2-D folded (see gpu/kernel.rs).
// Rust: src/ops/embedding.rs embedding
#define WG 256

#include "quant"

struct Params {
    n_tokens: u32,
    cols: u32,        // C, a multiple of QK
    row_start: u32,
    chunk_rows: u32,
    scale: f32,
    o1: u32,          // first word of plane 1
    o2: u32,          // first word of plane 2
    _pad: u32,
}

#include "quant_views"

@group(0) @binding(2) var<storage, read> ids: array<u32>;               // (n_tokens)
@group(0) @binding(3) var<storage, read_write> out: array<vec4<f32>>;   // (n_tokens, cols / 4)
@group(0) @binding(4) var<uniform> p: Params;

// The gather meets no x (quant.wgsl's x helpers are unused here).
fn qx4(i: u32) -> vec4<f32> {
    return vec4<f32>(0.0);
}

#include "entry"
    // Some types read only one of the two views: a (never taken) use keeps both bound.
    if (p.n_tokens == 0u) {
        out[0] = vec4<f32>(bitcast<f32>(ww[0])) + bitcast<vec4<f32>>(wv[0]);
    }
    let c4 = p.cols / 4u;
    let i = (wid.x + wid.y * nwg.x) * {{WG}}u + lid;
    if (i >= p.n_tokens * c4) {
        return;
    }
    let t = i / c4;
    let c = 4u * (i - t * c4);
    let id = ids[t];
    let r = id - p.row_start;
    if (id < p.row_start || r >= p.chunk_rows) {
        return;
    }
    let blocks = p.cols / QK;
    out[i] = q_run(r * blocks + c / QK, c % QK) * p.scale;
}
