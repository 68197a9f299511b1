// matvec_quant_params: the uniform of both quantized matvecs (matvec_quant, matvec_quant_batch),
// built by src/ops/matmul/gguf.rs `matvec_quant_params` (the batch kernel reads no routing), and
// the bindings they share: x, y, p, BIAS's bias and NORM's g (at binding GB, which the kernel
// defines); the weight's views (bindings 0, 1) come from include/quant_views.wgsl.
struct Params {
    n: u32,       // N, output rows
    units: u32,   // units per row: K / QU
    t: u32,       // T, tokens
    ld_out: u32,  // row stride of y, in elements
    xk: u32,      // K / 4: x row stride, in vec4
    o1: u32,      // first word of plane 1
    o2: u32,      // first word of plane 2
    experts: u32, // EXPERTS: E, the experts in W's stack
    xs: u32,      // row stride of x, in vec4: K / 4 (GATED: K / 2)
    half: u32,    // GATED: the up half's offset in x's row, in vec4 (K / 4)
    eps: f32,     // NORM: the RMSNorm epsilon
    spr: u32,     // EXPERTS: slots per x row
}

#define LIN_B 2
#define LIN_X vec4<f32>
#include "linear_bindings"
#ifdef NORM
@group(0) @binding({{GB}}) var<storage, read> g: array<vec4<f32>>; // (K) the RMSNorm weight
#endif
