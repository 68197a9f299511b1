// linear_store: the epilogue every linear kernel (matvec, matmul and their quantized forms) ends
// with: y[t, col] = softcap(v + bias[col]) (+ y[t, col]), each step under its flag (BIAS, SOFTCAP,
// ACCUMULATE). The including kernel binds y (f32) and, with BIAS, bias (f32, one per column), and
// has p.ld_out, y's row stride in elements.
#include "softcap"

// Writes output `col` of token row `t`.
fn store(t: u32, col: u32, v: f32) {
    var o = v;
#ifdef BIAS
    o += bias[col];
#endif
#ifdef SOFTCAP
    o = softcap(o);
#endif
    let at = t * p.ld_out + col;
#ifdef ACCUMULATE
    o += y[at];
#endif
    y[at] = o;
}
