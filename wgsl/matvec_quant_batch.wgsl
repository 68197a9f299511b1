// matvec_quant_batch: y = x · Wᵀ (+ bias) (+ y) for a batch decode step (T <= 32 tokens, one per
// sequence), with W in a GGUF / MLX quantized type (include/quant.wgsl). The one-token matvec
// (matvec_quant.wgsl) dequantizes a unit of W for every token it meets; at 8-32 tokens that
// arithmetic, not W's bytes, bounds it. Here a thread dequantizes its unit once (q_vals) and meets
// it with the x of TB tokens (q_dot_v), x coming from workgroup memory as one broadcast load for
// the 32 rows of a subgroup.
//
// Work split: a workgroup takes RW consecutive rows and TB consecutive tokens (grid z: token
// groups of TB). Its WG threads are S = WG / RW k-slices of RW rows: thread (slice s, row r) =
// local index s · RW + r, so a subgroup holds consecutive rows of one slice (or of 2 where RW =
// 16), which all read the same x. The row is walked in chunks of S units (S · QU elements: whole super-blocks of the
// k-quants); per chunk the workgroup stages each token's x for the chunk (the fused input applied:
// include/linear_input.wgsl), then slice s meets unit s of the chunk of its row with every token.
// At the end the S partial sums of an output are added in slice order through workgroup memory
// and thread (token j = lid / RW, row r = lid % RW) stores it (RW · TB = WG).
// Batch invariance: a token's sums are the same operations in the same order whatever T, its
// place in the batch or the other tokens (tokens past T are skipped by uniform branches).
// NORM: each token's r_t from its own square sum, 32 threads a token, added as a fixed tree.
// RW (32 or 16: the host takes fewer rows a workgroup where the grid would be small) changes
// no sum: the k-slices are TB = WG / RW whatever RW, and the norm's lanes are fixed.
// Grid: (ceil(N / RW) row blocks, 2-D folded (gpu/kernel.rs), ceil(T / TB) token groups as z).
// GROUPED (a mixture-of-experts prefill, src/ops/moe.rs): W is a stack of p.experts weights of N
// rows each (expert e's units follow expert e - 1's), the "tokens" are slots grouped by expert
// (moe_group.wgsl's table), and z is a tile of at most TB slots of one expert: its expert's rows,
// x row slot / p.spr per slot, y row slot; the tiles past the pass's count return at once. A
// slot's sums are the batch kernel's for its x row, whatever its tile (batch invariance).
// Rust: src/ops/matmul/gguf/batch.rs matvec_quant_batch
#define WG 256
#define RW 32
#define TB 8
#define GB 5
#define EB 6

#include "quant"

#include "matvec_quant_params"

#include "quant_views"

#ifdef GROUPED
@group(0) @binding({{EB}}) var<storage, read> groups: array<u32>;  // (S + 3 tiles): the slots by expert, then the tiles (expert, first, count)
var<workgroup> tile: vec3<u32>;                 // this workgroup's (expert, first, count)
var<workgroup> tile_slots: array<u32, {{TB}}>;  // (TB) its slots
#endif

// The group's first token (0 with GROUPED: its tokens are tile_slots) and count.
var<private> g_t0: u32;
var<private> g_nt: u32;

// x row of the group's token j (past the count: the last token's).
fn x_row(j: u32) -> u32 {
    let i = min(j, g_nt - 1u);
#ifdef GROUPED
    return tile_slots[i] / p.spr;
#else
    return g_t0 + i;
#endif
}

// y row of the group's token j (< the count).
fn y_row(j: u32) -> u32 {
#ifdef GROUPED
    return tile_slots[j];
#else
    return g_t0 + j;
#endif
}

const S: u32 = {{WG}}u / {{RW}}u;   // k-slices
const C4: u32 = S * QU / 4u;         // a token's chunk of x, in vec4

// (TB, C4) the chunk of x as the weights meet it; reused for the slices' partial sums.
var<workgroup> xs: array<vec4<f32>, {{TB}} * C4>;

#include "linear_input"

// x of the staged chunk: q_x(u, j · C4) reads token j's values of chunk unit u.
fn qx4(i: u32) -> vec4<f32> {
    return xs[i];
}

#include "linear_store"

#ifdef NORM
const NL: u32 = 32u;   // threads per token for the square sums, whatever RW
var<workgroup> nred: array<f32, {{WG}}>;
var<workgroup> nsc: array<f32, {{TB}}>;   // (TB) each token's r_t

// r_t of the group's tokens (x_row; past the count they repeat the last) into nsc: WG / NL
// tokens a round, NL lanes a token in a fixed tree, so r_t is the same whatever RW. Every thread
// calls it.
fn norm_scales(lid: u32) {
    let lane = lid % NL;
    for (var j0 = 0u; j0 < {{TB}}u; j0 += {{WG}}u / NL) {
        let j = j0 + lid / NL;
        let row = x_row(j) * p.xs;
        var s = 0.0;
        for (var i = lane; i < p.xk; i += NL) {
            let v = li_x(row + i);
            s += dot(v, v);
        }
        nred[lid] = s;
        workgroupBarrier();
        for (var h = NL / 2u; h > 0u; h >>= 1u) {
            if (lane < h) {
                nred[lid] += nred[lid + h];
            }
            workgroupBarrier();
        }
        if (lane == 0u) {
            nsc[j] = inverseSqrt(nred[lid] / f32(4u * p.xk) + p.eps);
        }
        workgroupBarrier();
    }
}
#endif

#ifdef GLU
var<workgroup> pair: array<f32, {{WG}}>;
#endif

#include "entry"
    // Q4_K and Q5_K read only the 16-byte view: a (never taken) use keeps the word view in the
    // bind group layout for every type (p.n > 0).
    if (p.n == 0u) {
        y[0] = bitcast<f32>(ww[0]);
    }
    let r = lid % {{RW}}u;
    let ks = lid / {{RW}}u;
    let row0 = (wid.x + wid.y * nwg.x) * {{RW}}u;
#ifdef GROUPED
    // The tile (p.t = S slots: the table follows the order).
    if (lid == 0u) {
        let at = p.t + 3u * wid.z;
        tile = vec3<u32>(groups[at], groups[at + 1u], groups[at + 2u]);
    }
    let tl = workgroupUniformLoad(&tile);
    let nt = tl.z;
    if (nt == 0u) {
        return;  // a tile past the pass's count (uniform)
    }
    if (lid < nt) {
        tile_slots[lid] = groups[tl.y + lid];
    }
    workgroupBarrier();
    let w0 = min(tl.x, p.experts - 1u) * p.n;
    g_t0 = 0u;
#else
    let w0 = 0u;
    g_t0 = wid.z * {{TB}}u;
    let nt = min(p.t - g_t0, {{TB}}u);
#endif
    g_nt = nt;
    let base = (w0 + min(row0 + r, p.n - 1u)) * p.units;
    let chunks = (p.units + S - 1u) / S;

    var acc0 = vec4<f32>(0.0);   // tokens 0..3 of the group
    var acc1 = vec4<f32>(0.0);   // tokens 4..7
    for (var c = 0u; c < chunks; c++) {
        if (c > 0u) {
            // Every slice is done with the previous chunk.
            workgroupBarrier();
        }
        // Stage the chunk: vec4 e = token j · C4 + i (tokens past T take the last token's row).
        for (var e = lid; e < {{TB}}u * C4; e += {{WG}}u) {
            let j = e / C4;
            let k4 = c * C4 + e % C4;
            if (k4 < p.xk) {
                xs[e] = li_load(x_row(j) * p.xs, k4, p.half);
            }
        }
        workgroupBarrier();
        let u = c * S + ks;
        if (u < p.units) {
            let q = q_raw(base + u);
            let w = q_vals(q);
            acc0.x += q_dot_v(q, w, q_x(ks, 0u));
            if (nt > 1u) {
                acc0.y += q_dot_v(q, w, q_x(ks, C4));
            }
            if (nt > 2u) {
                acc0.z += q_dot_v(q, w, q_x(ks, 2u * C4));
            }
            if (nt > 3u) {
                acc0.w += q_dot_v(q, w, q_x(ks, 3u * C4));
            }
            if (nt > 4u) {
                acc1.x += q_dot_v(q, w, q_x(ks, 4u * C4));
            }
            if (nt > 5u) {
                acc1.y += q_dot_v(q, w, q_x(ks, 5u * C4));
            }
            if (nt > 6u) {
                acc1.z += q_dot_v(q, w, q_x(ks, 6u * C4));
            }
            if (nt > 7u) {
                acc1.w += q_dot_v(q, w, q_x(ks, 7u * C4));
            }
        }
    }
    workgroupBarrier();
    xs[2u * lid] = acc0;
    xs[2u * lid + 1u] = acc1;
    workgroupBarrier();
    // Output (token j, row r): the slices' sums in slice order.
    let j = lid / {{RW}}u;
    var sum = 0.0;
    for (var s = 0u; s < S; s++) {
        sum += xs[2u * (s * {{RW}}u + r) + j / 4u][j % 4u];
    }
#ifdef NORM
    // The norm's scale last: the weights did not wait for its reduction.
    norm_scales(lid);
    sum *= nsc[j];
#endif
    let row = row0 + r;
#ifdef GLU
    // Rows are (gate, up) pairs: the even row's thread stores act(gate) · up to column row / 2.
    pair[lid] = sum;
    workgroupBarrier();
    if (j < nt && r % 2u == 0u && row < p.n) {
        store(y_row(j), row / 2u, act(sum) * pair[lid + 1u]);
    }
#else
    if (j < nt && row < p.n) {
        store(y_row(j), row, sum);
    }
#endif
}
