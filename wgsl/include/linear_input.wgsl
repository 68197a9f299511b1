// linear_input: what a matvec meets its weight rows with, when the op before it is fused in
// (src/ops/matmul/mod.rs, `Input`). Token t's row of the kernel's input `x` starts at vec4 t · xs:
//   plain:  x[t, k]                                  x: (T, K)
//   NORM:   rms_norm(x)[t, k] = x[t, k] · g[k] · r_t, r_t = 1 / sqrt(mean_k x[t, k]² + eps)
//           x: (T, K), g: (K). The kernel meets x ⊙ g (li_load) and scales each token's sums
//           by r_t (li_norm_scales, once per pass of up to 4 tokens, after the weights streamed:
//           nothing waits for the reduction).
//   GATED:  act(x[t, k]) · x[t, K + k]              x: (T, 2K) = [gate | up] per row
//           (act: include/activation.wgsl), the gated activation fused into the down projection.
// K must be a multiple of 4. The including kernel defines WG and the bindings
//   x: array<vec4<f32>>    the input, read through li_x
//   g: array<vec4<f32>>    the norm's weight (NORM), read through li_g
// and passes the up half's offset (K / 4, GATED) to li_load.

// x's vec4 number i.
fn li_x(i: u32) -> vec4<f32> {
    return x[i];
}
#ifdef NORM
// g's vec4 number i.
fn li_g(i: u32) -> vec4<f32> {
    return g[i];
}
#endif
#include "activation"

// Input vec4 number i (< K / 4) of the token row starting at vec4 `row`.
fn li_load(row: u32, i: u32, half: u32) -> vec4<f32> {
#ifdef GATED
    return act4(li_x(row + i)) * li_x(row + half + i);
#else
#ifdef NORM
    return li_x(row + i) * li_g(i);
#else
    return li_x(row + i);
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
        let a = li_x(rows.x + i);
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
#define TREE li_red
#define TREE_V s
#define TREE_H h
#include "tree_sum"
    let total = li_red[0];
#endif
    workgroupBarrier();
    return inverseSqrt(total / f32(4u * k4) + vec4<f32>(eps));
}
#endif
