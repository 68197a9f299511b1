// linear_bindings: the bindings that follow the weight's in every linear kernel (matmul,
// matmul_quant, matmul_quant_coop, matvec, and the quantized matvecs through
// include/matvec_quant_params): the input x, the output y, the kernel's uniform Params and, with
// BIAS, the bias, at the consecutive bindings LIN_B .. LIN_B + 3. Before the #include the kernel
// defines LIN_B (x's binding) and LIN_X (the element type of x's array).
@group(0) @binding({{LIN_B}}) var<storage, read> x: array<{{LIN_X}}>;      // (T, K) (GATED: (T, 2K))
@group(0) @binding({{LIN_B+1}}) var<storage, read_write> y: array<f32>;    // (T, ld_out), columns [0, N) written
@group(0) @binding({{LIN_B+2}}) var<uniform> p: Params;
#ifdef BIAS
@group(0) @binding({{LIN_B+3}}) var<storage, read> bias: array<f32>;       // (N)
#endif
