// softcap: a linear layer's soft-capping epilogue (Gemma's final_logit_softcapping) under the flag
// SOFTCAP, with SOFTCAP_BITS the cap's f32 bits: cap * tanh(v / cap). tanh from one exp of a non-positive argument, so no
// |v| overflows (a driver's tanh may compute inf / inf); near 0 the error is a few ulp of cap.
// Default (30.0) for validation; src/ops/matmul sets it.
#define SOFTCAP_BITS 1106247680

#ifdef SOFTCAP
fn softcap(v: f32) -> f32 {
    let cap = bitcast<f32>({{SOFTCAP_BITS}}u);
    let e = exp(-2.0 * abs(v) / cap);
    return sign(v) * cap * ((1.0 - e) / (1.0 + e));
}
#endif
