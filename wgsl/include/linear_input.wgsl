// linear_input: what a matvec meets its weight rows with, when the op before it is fused in
// (src/ops/matmul/mod.rs, `Input`). Token t's row of the kernel's input `x` starts at vec4 t · xs:
//   plain:  x[t, k]                                  x: (T, K)
//   NORM:   rms_norm(x)[t, k] = x[t, k] · g[k] · r_t, r_t = 1 / sqrt(mean_k x[t, k]² + eps)
//           x: (T, K), g: (K). The kernel meets x ⊙ g (li_load) and scales each token's sums
//           by r_t (li_norm_scales, once per pass of up to 4 tokens, after the weights streamed:
//           nothing waits for the reduction).
//   GATED:  act(x[t, k]) · x[t, K + k]              x: (T, 2K) = [gate | up] per row
//           (act: include/activation.wgsl), the gated activation fused into the down projection.
//   SANDWICH (with NORM; one token): a sandwich post-norm and its residual add fused in front of
//           the next pre-norm: x is the block's output y (1, K), h the residual stream (1, K),
//           pw the post-norm's weight, s the layer's output scale:
//             h'[k] = (h[k] + y[k] · r_y · pw[k]) · s,  r_y = 1 / sqrt(mean_k y[k]² + eps)
//           (rms_norm.wgsl's ACCUMULATE order), and the kernel meets rms_norm(h') · g as NORM
//           does: h' ⊙ g (li_load), the sums scaled by r_h' (li_norm_scales over h'). The
//           kernel first sets li_r1 = r_y (li_norm_scales with li_phase 0), then li_phase = 1;
//           one workgroup writes h' out for the rest of the step.
// K must be a multiple of 4. The including kernel defines WG and the accessors
//   fn li_x(i: u32) -> vec4<f32>    x's vec4 number i
//   fn li_g(i: u32) -> vec4<f32>    g's vec4 number i (NORM)
//   fn li_h(i: u32) -> vec4<f32>, fn li_pw(i: u32) -> vec4<f32>, fn li_scale() -> f32 (SANDWICH)
// and passes the up half's offset (K / 4, GATED) to li_load.
#include "activation"

#ifdef SANDWICH
var<private> li_r1: f32;
var<private> li_phase: u32;

// h' vec4 number i (one token).
fn li_resid(i: u32) -> vec4<f32> {
    return (li_h(i) + li_x(i) * li_r1 * li_pw(i)) * li_scale();
}
#endif

// What li_norm_scales sums the squares of: x's vec4 i (from the row's start), or with SANDWICH
// in phase 1 h''s.
fn li_src(at: u32, i: u32) -> vec4<f32> {
#ifdef SANDWICH
    if (li_phase == 1u) {
        return li_resid(i);
    }
#endif
    return li_x(at);
}

// Input vec4 number i (< K / 4) of the token row starting at vec4 `row`.
fn li_load(row: u32, i: u32, half: u32) -> vec4<f32> {
#ifdef GATED
    return act4(li_x(row + i)) * li_x(row + half + i);
#else
#ifdef SANDWICH
    return li_resid(i) * li_g(i);
#else
#ifdef NORM
    return li_x(row + i) * li_g(i);
#else
    return li_x(row + i);
#endif
#endif
#endif
}

#ifdef NORM
var<workgroup> li_red: array<vec4<f32>, {{WG}}>;

// r_t for the token rows starting at vec4 rows.x .. rows.w (4 with TOK4, else rows.x alone; K / 4
// = k4 vec4 each): every thread of the workgroup sums the squares of its strided share, then the
// workgroup adds them: with SUBGROUP per subgroup, then the WG / sg_size subgroup sums (one
// barrier); without, a tree through workgroup memory. Call it from uniform control flow; it ends
// with a barrier, so li_red may be reused at once.
fn li_norm_scales(rows: vec4<u32>, k4: u32, eps: f32, lid: u32, sg_size: u32, sg_lane: u32) -> vec4<f32> {
    var s = vec4<f32>(0.0);
    for (var i = lid; i < k4; i += {{WG}}u) {
        let a = li_src(rows.x + i, i);
#ifdef TOK4
        let b = li_x(rows.y + i);
        let c = li_x(rows.z + i);
        let d = li_x(rows.w + i);
        s += vec4<f32>(dot(a, a), dot(b, b), dot(c, c), dot(d, d));
#else
        s.x += dot(a, a);
#endif
    }
#ifdef SUBGROUP
    s = subgroupAdd(s);
    if (sg_lane == 0u) {
        li_red[lid / sg_size] = s;
    }
    workgroupBarrier();
    var total = vec4<f32>(0.0);
    for (var i = 0u; i < {{WG}}u / sg_size; i++) {
        total += li_red[i];
    }
#else
    li_red[lid] = s;
    workgroupBarrier();
    for (var h = {{WG}}u / 2u; h > 0u; h >>= 1u) {
        if (lid < h) {
            li_red[lid] += li_red[lid + h];
        }
        workgroupBarrier();
    }
    let total = li_red[0];
#endif
    workgroupBarrier();
    return inverseSqrt(total / f32(4u * k4) + vec4<f32>(eps));
}
#endif
