// matmul_quant_params: the uniform of both quantized matmuls (matmul_quant, matmul_quant_coop),
// built by src/ops/matmul/gguf.rs `matmul_quant_params`.
struct Params {
    t: u32,       // T, token rows of x and y
    n: u32,       // N, output columns
    k: u32,       // K
    ld_out: u32,  // row stride of y, in elements (>= N)
    o1: u32,      // first word of plane 1
    o2: u32,      // first word of plane 2
    bpr: u32,     // blocks per row: K / QK
    _pad: u32,
}
