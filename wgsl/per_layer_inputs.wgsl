// per_layer_inputs: Gemma 4's per-layer inputs (E2B/E4B), combined into each layer's slot:
//   out[l * slot + t * 2P + P + j] = (proj[t, l * P + j] + tok[t, l * P + j]) * scale
// proj: the token embedding's projection, already RMS-normalized per (token, layer); tok: the
// per-layer embedding rows. Each layer's slot holds T rows of [gate: P | input: P]: the layer's
// gate projection fills the first half, and the next projection reads the row as a gated input
// (act(gate) * input). Layer slots start at multiples of 64 floats (storage view alignment).
// Grid: 1-D over ceil(T * L * P / WG) workgroups, 2-D folded (see gpu/kernel.rs).
// Rust: src/ops/embedding.rs per_layer_inputs
#define WG 256

struct Params {
    n_tokens: u32,
    layers: u32,
    dim: u32,       // P
    slot: u32,      // floats per layer slot (>= T * 2P)
    scale: f32,     // 1 / sqrt(2)
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<storage, read> proj: array<f32>;       // (T, L * P)
@group(0) @binding(1) var<storage, read> tok: array<f32>;        // (T, L * P)
@group(0) @binding(2) var<storage, read_write> out: array<f32>;  // (L, slot): per layer (T, 2P) [gate | input]
@group(0) @binding(3) var<uniform> p: Params;

#include "entry_thread"
    let per_token = p.layers * p.dim;
    if (i >= p.n_tokens * per_token) {
        return;
    }
    let t = i / per_token;
    let r = i - t * per_token;
    let l = r / p.dim;
    let j = r - l * p.dim;
    out[l * p.slot + t * 2u * p.dim + p.dim + j] = (proj[i] + tok[i]) * p.scale;
}
