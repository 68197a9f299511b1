// embedding: out[t, c] = table[ids[t], c] * scale, for the tokens whose id falls in this chunk
// of the table: rows [row_start, row_start + chunk_rows). Other tokens' rows of out are left
// untouched (another chunk's dispatch writes them; an id >= vocab is written by none).
// The table is f16 stored packed two per u32 (element 2i in the low half), any column count.
// Grid: 1-D over ceil(n_tokens * cols / WG) workgroups, 2-D folded (see gpu/kernel.rs).
// Rust: src/ops/embedding.rs embedding
#define WG 256

struct Params {
    n_tokens: u32,
    cols: u32,
    row_start: u32,
    chunk_rows: u32,
    scale: f32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<storage, read> table: array<u32>;      // (chunk_rows, cols) f16 packed pairs
@group(0) @binding(1) var<storage, read> ids: array<u32>;        // (n_tokens)
@group(0) @binding(2) var<storage, read_write> out: array<f32>;  // (n_tokens, cols)
@group(0) @binding(3) var<uniform> p: Params;

#include "entry_thread"
    if (i >= p.n_tokens * p.cols) {
        return;
    }
    let t = i / p.cols;
    let c = i - t * p.cols;
    let id = ids[t];
    let r = id - p.row_start;
    if (id < p.row_start || r >= p.chunk_rows) {
        return;
    }
    let e = r * p.cols + c;
    let pair = unpack2x16float(table[e >> 1u]);
    out[i] = pair[e & 1u] * p.scale;
}
