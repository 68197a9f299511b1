// matvec_quant: y = x · Wᵀ (+ bias) (+ y) for one token, or a few (T small), with W in a GGUF
// quantized type (include/quant.wgsl: the type flag, the planes layout, the dequantization): the
// decode hot path, bound by streaming W's blocks once, dequantized in registers, summed in f32.
//
// Work split (as matvec.wgsl, with a "unit" of QU elements in place of a 16-byte load): a
// workgroup of WG threads is cut into WG / TPR row groups of TPR threads; a row group computes 4
// consecutive output rows. Lane l of a row group takes units l, l + TPR, ... of each of its 4 rows
// (consecutive lanes read consecutive 16-byte words of a plane: coalesced), loading the 4 rows'
// units first (4 loads in flight, plus their scales), then meeting them with the unit's x (loaded
// once per token, shared by the 4 rows) of each of TOK tokens (TOK = 1, or 4 with the flag TOK4).
// The TPR partial sums of an output are reduced: with SUBGROUP by subgroupAdd, then the
// per-subgroup sums through workgroup memory (TPR is a multiple of every possible subgroup size,
// and subgroups are contiguous runs of local_invocation_index); without, in two levels of 8 and
// TPR / 8 through workgroup memory (TPR >= 8). Lane r + 4·j of the row group stores row r of
// token j.
// More than TOK tokens: the workgroup repeats this over the same rows for each TOK tokens, so
// only the first pass streams W from memory.
// Grid: ceil(N / (4 · WG / TPR)) workgroups, 2-D folded (see gpu/kernel.rs). Rows past N and
// tokens past T read a clamped row or token and store nothing, so every thread reaches the
// barriers.
#define WG 256
#define TPR 32
#define TOK 1
#define GB 5

#include "quant"

struct Params {
    n: u32,       // N, output rows
    units: u32,   // units per row: K / QU
    t: u32,       // T, tokens
    ld_out: u32,  // row stride of y, in elements
    xk: u32,      // K / 4: x row stride, in vec4
    o1: u32,      // first word of plane 1
    o2: u32,      // first word of plane 2
    _pad: u32,
    xs: u32,      // row stride of x, in vec4: K / 4 (GATED: K / 2)
    half: u32,    // GATED: the up half's offset in x's row, in vec4 (K / 4)
    eps: f32,     // NORM: the RMSNorm epsilon
    _pad2: u32,
}

@group(0) @binding(0) var<storage, read> wv: array<vec4<u32>>;   // the planes (16-byte view)
@group(0) @binding(1) var<storage, read> ww: array<u32>;         // the same buffer (word view)
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;    // (T, K)
@group(0) @binding(3) var<storage, read_write> y: array<f32>;    // (T, ld_out), columns [0, N) written
@group(0) @binding(4) var<uniform> p: Params;
#ifdef BIAS
@group(0) @binding(5) var<storage, read> bias: array<f32>;       // (N)
#endif
#ifdef NORM
@group(0) @binding({{GB}}) var<storage, read> g: array<vec4<f32>>; // (K) the RMSNorm weight
#endif

// The fused input (include/linear_input.wgsl): x as the kernel meets it. q_row is the current
// token's row start (vec4), set before each token's dot products.
var<private> q_row: u32;
fn li_x(i: u32) -> vec4<f32> {
    return x[i];
}
#ifdef NORM
fn li_g(i: u32) -> vec4<f32> {
    return g[i];
}
#endif
#include "linear_input"

fn qw4(i: u32) -> vec4<u32> {
    return wv[i];
}
fn qw1(i: u32) -> u32 {
    return ww[i];
}
fn qx4(i: u32) -> vec4<f32> {
    return li_load(q_row, i - q_row, p.half);
}
fn q_planes() -> vec2<u32> {
    return vec2<u32>(p.o1, p.o2);
}

const NGROUPS: u32 = {{WG}}u / {{TPR}}u;

#include "matvec_reduce"

#ifdef PROBE_NOMATH
// Measurement probes (tests only): the loads without the dequantization and x.
#ifdef Q4_K
fn q_probe(r: QRaw) -> f32 {
    return bitcast<f32>((r.qs.x ^ r.qs.y ^ r.qs.z ^ r.qs.w) & 0x3FFFFFFFu) + r.dl + r.dh + r.ml + r.mh;
}
#endif
#ifdef Q6_K
fn q_probe(r: QRaw) -> f32 {
    let w = r.a ^ r.c ^ r.h;
    return bitcast<f32>((w.x ^ w.y ^ w.z ^ w.w) & 0x3FFFFFFFu) + dot(r.s, r.s);
}
#endif
#ifdef Q8_0
fn q_probe(r: QRaw) -> f32 {
    let w = r.a ^ r.b;
    return bitcast<f32>((w.x ^ w.y ^ w.z ^ w.w) & 0x3FFFFFFFu) + r.d;
}
#endif
#ifdef Q4_1
#else
#ifdef Q5_0
#else
#ifdef Q5_1
#else
#ifdef Q8_0
#else
#ifdef Q4_K
#else
#ifdef Q5_K
#else
#ifdef Q6_K
#else
fn q_probe(r: QRaw) -> f32 {
    return bitcast<f32>((r.qs.x ^ r.qs.y ^ r.qs.z ^ r.qs.w) & 0x3FFFFFFFu) + r.d;
}
#endif
#endif
#endif
#endif
#endif
#endif
#endif
#endif

// The 4 rows' units against one token's x.
fn dot4(r0: QRaw, r1: QRaw, r2: QRaw, r3: QRaw, u: u32, xr: u32) -> vec4<f32> {
#ifdef PROBE_NOMATH
    return vec4<f32>(q_probe(r0), q_probe(r1), q_probe(r2), q_probe(r3));
#else
#ifdef PROBE_NOX
    let v = q_x(0u, 0u);
#else
    let v = q_x(u, xr);
#endif
    return vec4<f32>(q_dot(r0, v), q_dot(r1, v), q_dot(r2, v), q_dot(r3, v));
#endif
}

// Writes output `row` of token `t`.
fn store(t: u32, row: u32, v: f32) {
    var o = v;
#ifdef BIAS
    o += bias[row];
#endif
    let at = t * p.ld_out + row;
#ifdef ACCUMULATE
    o += y[at];
#endif
    y[at] = o;
}

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
#ifdef SUBGROUP
        @builtin(subgroup_size) sg_size: u32, @builtin(subgroup_invocation_id) sg_lane: u32,
#endif
        @builtin(local_invocation_index) lid: u32) {
    // Q4_K and Q5_K read only the 16-byte view: a (never taken) use keeps the word view in the
    // bind group layout for every type (p.n > 0).
    if (p.n == 0u) {
        y[0] = bitcast<f32>(ww[0]);
#ifdef PROBE_NOMATH
        y[0] = x[0].x;
#endif
    }
    let wg = wid.x + wid.y * nwg.x;
    let grp = lid / {{TPR}}u;
    let lane = lid % {{TPR}}u;
    let row0 = (wg * NGROUPS + grp) * 4u;
    let units = p.units;
    // First unit of each of the row group's rows (clamped: rows past N compute garbage, unstored).
    let base = min(vec4<u32>(row0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(p.n - 1u)) * units;
    // The output this lane stores after the reduction: row r of token j of the pass.
    let out_r = lane % 4u;
    let out_j = lane / 4u;

    for (var t0 = 0u; t0 < p.t; t0 += {{TOK}}u) {
        // Each token's x row start (clamped: tokens past T compute garbage, unstored).
        let xr = min(vec4<u32>(t0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(p.t - 1u)) * p.xs;
        // (acc1..3 stay 0 without TOK4.)
        var acc0 = vec4<f32>(0.0);
        var acc1 = vec4<f32>(0.0);
        var acc2 = vec4<f32>(0.0);
        var acc3 = vec4<f32>(0.0);
        for (var u = lane; u < units; u += {{TPR}}u) {
            let r0 = q_raw(base.x + u);
            let r1 = q_raw(base.y + u);
            let r2 = q_raw(base.z + u);
            let r3 = q_raw(base.w + u);
            q_row = xr.x;
            acc0 += dot4(r0, r1, r2, r3, u, xr.x);
#ifdef TOK4
            q_row = xr.y;
            acc1 += dot4(r0, r1, r2, r3, u, xr.y);
            q_row = xr.z;
            acc2 += dot4(r0, r1, r2, r3, u, xr.z);
            q_row = xr.w;
            acc3 += dot4(r0, r1, r2, r3, u, xr.w);
#endif
        }

#ifdef SUBGROUP
        var sum = mv_reduce(acc0, acc1, acc2, acc3, lid, sg_size, sg_lane);
#else
        var sum = mv_reduce(acc0, acc1, acc2, acc3, lid, 1u, 0u);
#endif
#ifdef NORM
        // The norm's scale last: the weights did not wait for its reduction.
#ifdef SUBGROUP
        let rn = li_norm_scales(xr, p.xk, p.eps, lid, sg_size, sg_lane);
#else
        let rn = li_norm_scales(xr, p.xk, p.eps, lid, 1u, 0u);
#endif
        sum *= rn[min(out_j, 3u)];
#endif
        if (out_j < {{TOK}}u && row0 + out_r < p.n && t0 + out_j < p.t) {
            store(t0 + out_j, row0 + out_r, sum);
        }
        // `red` is rewritten by the next pass.
        workgroupBarrier();
    }
}
