// sample_logprobs: log-probabilities of the model's distribution (the raw logits: no temperature,
// filter, mask or penalty) for the rows of a step that ask (src/sampling/logprobs.rs has the spec).
// One workgroup per asking row, which reads its row twice (v = l with NaN as -inf):
//   1. the top max(info.top, 1) entries by (v desc, index asc): each thread keeps its own best
//      entries in a sorted list (its entries come in index order, so a tie goes after the
//      entries before it), then rounds pick the best head of the threads' lists (a tree argmax;
//      the winner's thread is its index mod WG) and advance that list. The first is the
//      maximum m;
//   2. S = sum of exp(d(i)), d(i) = v - m (0 where v == m: the infinite maxima), in f32: each
//      thread adds its entries in index order, then a tree over the workgroup; ln_s = log(S).
// logprob(i) = d(i) - ln_s. Output row (stride 1 + 2 * top, u32 words): the sampled token's
// logprob (f32 bits; the sampled id comes from `ids`, the sampler's output), then per rank
// (id, logprob bits); ranks past the row's length get id NO_INDEX.
// No subgroups, no f16: one variant.
// Rust: src/sampling/logprobs.rs encode_pass
#define WG 256
const WG: u32 = {{WG}}u;
// OpenAI's limit on top_logprobs.
const MAX_TOP: u32 = 20u;
const NO_INDEX: u32 = 0xFFFFFFFFu;

struct LogprobInfo {
    vocab: u32,
    asks: u32,    // rows that ask (workgroups)
    top: u32,     // ranks computed for every asking row (the largest n asked), <= MAX_TOP
    stride: u32,  // 1 + 2 * top
}

@group(0) @binding(0) var<storage, read> logits: array<f32>;       // (B, V)
@group(0) @binding(1) var<storage, read> ids: array<u32>;          // (B): the sampled ids
@group(0) @binding(2) var<storage, read> asked: array<u32>;        // (asks): row in the batch
@group(0) @binding(3) var<storage, read_write> out: array<u32>;    // (asks, stride)
@group(0) @binding(4) var<uniform> info: LogprobInfo;

var<workgroup> red_v: array<f32, WG>;
var<workgroup> red_i: array<u32, WG>;
// The rounds' winners (value, index), best first.
var<workgroup> best_v: array<f32, MAX_TOP>;
var<workgroup> best_i: array<u32, MAX_TOP>;

fn neg_inf() -> f32 {
    return bitcast<f32>(0xFF800000u);
}

// The logit with NaN as -inf (a bit test: compilers may fold x != x away).
fn value(l: f32) -> f32 {
    let b = bitcast<u32>(l);
    return select(l, neg_inf(), (b & 0x7FFFFFFFu) > 0x7F800000u);
}

// v - m, 0 where v == m (so an infinite maximum gives 0, not NaN).
fn shifted(v: f32, m: f32) -> f32 {
    return select(v - m, 0.0, v == m);
}

// (v, i) ranks before (w, j).
fn better(v: f32, i: u32, w: f32, j: u32) -> bool {
    return v > w || (v == w && i < j);
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let a = wid.x + wid.y * nwg.x;
    // Uniform over the workgroup (the grid is exact in x when it is folded: see Rust).
    let live = a < info.asks;
    let vocab = info.vocab;
    let row = select(0u, asked[min(a, info.asks - 1u)], live);
    let base = row * vocab;

    // 1. The best entries: this thread's own, best first, then the rounds over the threads.
    let keep = max(info.top, 1u);
    var tv: array<f32, MAX_TOP>;
    var ti: array<u32, MAX_TOP>;
    var cnt = 0u;
    // The last entry of a full list, in a register: most entries are compared with it alone.
    var worst = neg_inf();
    for (var i = lid; i < vocab; i += WG) {
        let v = value(logits[base + i]);
        if (cnt < keep || v > worst) {
            var j = min(cnt, keep - 1u);
            while (j > 0u && tv[j - 1u] < v) {
                tv[j] = tv[j - 1u];
                ti[j] = ti[j - 1u];
                j -= 1u;
            }
            tv[j] = v;
            ti[j] = i;
            cnt = min(cnt + 1u, keep);
            worst = tv[cnt - 1u];
        }
    }
    var head = 0u;
    for (var r = 0u; r < keep; r++) {
        let has = head < cnt;
        red_v[lid] = select(neg_inf(), tv[min(head, MAX_TOP - 1u)], has);
        red_i[lid] = select(NO_INDEX, ti[min(head, MAX_TOP - 1u)], has);
        workgroupBarrier();
        for (var h = WG / 2u; h > 0u; h >>= 1u) {
            if (lid < h && better(red_v[lid + h], red_i[lid + h], red_v[lid], red_i[lid])) {
                red_v[lid] = red_v[lid + h];
                red_i[lid] = red_i[lid + h];
            }
            workgroupBarrier();
        }
        if (lid == 0u) {
            best_v[r] = red_v[0];
            best_i[r] = red_i[0];
        }
        if (red_i[0] != NO_INDEX && red_i[0] % WG == lid) {
            head += 1u;
        }
        workgroupBarrier();
    }
    let m = best_v[0];

    // 2. The sum of exp(d), and its log.
    var s = 0.0;
    for (var i = lid; i < vocab; i += WG) {
        s += exp(shifted(value(logits[base + i]), m));
    }
#define TREE red_v
#define TREE_V s
#define TREE_H h
#include "tree_sum"
    let ln_s = log(red_v[0]);

    if (live && lid == 0u) {
        let o = a * info.stride;
        let id = ids[row];
        var lp = neg_inf();
        if (id < vocab) {
            lp = shifted(value(logits[base + id]), m) - ln_s;
        }
        out[o] = bitcast<u32>(lp);
        for (var r = 0u; r < info.top; r++) {
            out[o + 1u + 2u * r] = best_i[r];
            out[o + 2u + 2u * r] = bitcast<u32>(shifted(best_v[r], m) - ln_s);
        }
    }
}
