// matvec_quant_params: the uniform of both quantized matvecs (matvec_quant, matvec_quant_batch),
// built by src/ops/matmul/gguf.rs `matvec_quant_params`. The batch kernel reads no routing.
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
