// matvec: y = x · Wᵀ (+ bias) (+ y) for one token, or a few (T small): the decode hot path,
// bound by the bandwidth of streaming W once.
//
// W is f16, packed two per u32, row-major (N, K). Each load takes VEC u32 words (2·VEC halves) of
// one row; the host picks the widest VEC with K % (2·VEC) == 0, so rows start on a whole load and
// no K tail exists (K is even): VEC4 (K % 8 == 0), VEC2 (K % 4 == 0) or neither (one u32).
//
// Work split: a workgroup of WG threads is cut into WG / TPR row groups of TPR threads; a row
// group computes ROWS consecutive output rows. Lane l of a row group reads loads l, l + TPR, ...
// of each of its rows (consecutive lanes read consecutive 16-byte words: coalesced), takes the
// matching x chunk once into registers and uses it for all ROWS rows. The TPR partial sums of a
// row are then reduced: with SUBGROUP by subgroupAdd, then the per-subgroup sums through
// workgroup memory (the host guarantees TPR is a multiple of every possible subgroup size, and
// subgroups are assumed to be contiguous runs of local_invocation_index); without, by a
// workgroup-memory tree.
// Several tokens: the workgroup repeats this for each token over the same rows, so only the first
// token's pass streams W from memory (a workgroup's rows, ROWS · K · 2 bytes per row group, stay
// in cache for the others).
// Grid: ceil(N / (ROWS · WG / TPR)) workgroups, 2-D folded (see gpu/kernel.rs). Rows past N
// (last workgroup, folded grid padding) read a clamped row and store nothing, so every thread
// reaches the barriers.
#define WG 256
#define TPR 64
// ROWS (rows per row group) is 1, 2 or 4, with the flag ROWS2 or ROWS4 set to match.
#define ROWS 1

struct Params {
    n: u32,       // N, output rows
    kv: u32,      // loads per row: K / (2 · VEC)
    t: u32,       // T, tokens
    ld_out: u32,  // row stride of y, in elements
}

#ifdef VEC4
alias WVec = vec4<u32>;  // 8 halves
alias XVec = vec4<f32>;  // 2 of these per load
const XPL: u32 = 2u;     // XVec per load
#else
#ifdef VEC2
alias WVec = vec2<u32>;  // 4 halves
alias XVec = vec4<f32>;
const XPL: u32 = 1u;
#else
alias WVec = u32;        // 2 halves
alias XVec = vec2<f32>;
const XPL: u32 = 1u;
#endif
#endif

@group(0) @binding(0) var<storage, read> w: array<WVec>;         // (N, K) f16 packed, K / (2·VEC) loads per row
@group(0) @binding(1) var<storage, read> x: array<XVec>;         // (T, K)
@group(0) @binding(2) var<storage, read_write> y: array<f32>;    // (T, ld_out), columns [0, N) written
@group(0) @binding(3) var<uniform> p: Params;
#ifdef BIAS
@group(0) @binding(4) var<storage, read> bias: array<f32>;       // (N)
#endif

const NGROUPS: u32 = {{WG}}u / {{TPR}}u;

// Partial sums of a workgroup, component r for row r of a row group.
var<workgroup> red: array<vec4<f32>, {{WG}}>;

// The slice of x that load i of a W row meets (xi = i · XPL + the token's first XVec), and its
// dot product with that load.
#ifdef VEC4
fn x_chunk(xi: u32) -> array<vec4<f32>, 2> {
    return array<vec4<f32>, 2>(x[xi], x[xi + 1u]);
}
fn dot_chunk(wv: vec4<u32>, xc: array<vec4<f32>, 2>) -> f32 {
    let w0 = vec4<f32>(unpack2x16float(wv.x), unpack2x16float(wv.y));
    let w1 = vec4<f32>(unpack2x16float(wv.z), unpack2x16float(wv.w));
    return dot(w0, xc[0]) + dot(w1, xc[1]);
}
#else
#ifdef VEC2
fn x_chunk(xi: u32) -> vec4<f32> {
    return x[xi];
}
fn dot_chunk(wv: vec2<u32>, xc: vec4<f32>) -> f32 {
    return dot(vec4<f32>(unpack2x16float(wv.x), unpack2x16float(wv.y)), xc);
}
#else
fn x_chunk(xi: u32) -> vec2<f32> {
    return x[xi];
}
fn dot_chunk(wv: u32, xc: vec2<f32>) -> f32 {
    return dot(unpack2x16float(wv), xc);
}
#endif
#endif

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
    let wg = wid.x + wid.y * nwg.x;
    let grp = lid / {{TPR}}u;
    let lane = lid % {{TPR}}u;
    let row0 = (wg * NGROUPS + grp) * {{ROWS}}u;
    let kv = p.kv;
    // First load of each of the row group's rows (clamped: rows past N compute garbage, unstored).
    let base = min(vec4<u32>(row0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(p.n - 1u)) * kv;

    for (var t = 0u; t < p.t; t++) {
        let xrow = t * kv * XPL;
        // Component r accumulates row row0 + r (ROWS of the 4 are used; explicit, not an
        // indexed array, so that it stays in registers on every compiler).
        var acc = vec4<f32>(0.0);
        for (var i = lane; i < kv; i += {{TPR}}u) {
            let xc = x_chunk(xrow + i * XPL);
            acc.x += dot_chunk(w[base.x + i], xc);
#ifdef ROWS2
            acc.y += dot_chunk(w[base.y + i], xc);
#endif
#ifdef ROWS4
            acc.y += dot_chunk(w[base.y + i], xc);
            acc.z += dot_chunk(w[base.z + i], xc);
            acc.w += dot_chunk(w[base.w + i], xc);
#endif
        }

#ifdef SUBGROUP
        // One sum per subgroup, then lane r of the row group adds its row's TPR / sg_size sums.
        let s = subgroupAdd(acc);
        if (sg_lane == 0u) {
            red[lid / sg_size] = s;
        }
        workgroupBarrier();
        let per_group = {{TPR}}u / sg_size;
        if (lane < {{ROWS}}u && row0 + lane < p.n) {
            let first = grp * per_group;
            var sum = 0.0;
            for (var j = 0u; j < per_group; j++) {
                sum += red[first + j][lane];
            }
            store(t, row0 + lane, sum);
        }
#else
        red[lid] = acc;
        workgroupBarrier();
        for (var s = {{TPR}}u / 2u; s > 0u; s >>= 1u) {
            if (lane < s) {
                red[lid] += red[lid + s];
            }
            workgroupBarrier();
        }
        if (lane < {{ROWS}}u && row0 + lane < p.n) {
            store(t, row0 + lane, red[grp * {{TPR}}u][lane]);
        }
#endif
        // `red` is rewritten by the next token.
        workgroupBarrier();
    }
}
