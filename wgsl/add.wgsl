// add: x += y, elementwise over n f32 values (the residual add).
// Grid: 1-D over ceil(n / WG) workgroups, 2-D folded (see gpu/kernel.rs).
// Rust: src/ops/elementwise.rs add
#define WG 256

struct Params {
    n: u32,
    _pad0: u32,  // the host writes 16 bytes (Rust: the struct's twin, checked by a test)
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<storage, read_write> x: array<f32>;  // (T, C) residual stream, updated in place
@group(0) @binding(1) var<storage, read> y: array<f32>;        // (T, C)
@group(0) @binding(2) var<uniform> p: Params;

#include "entry_thread"
    if (i < p.n) {
        x[i] = x[i] + y[i];
    }
}
