// sample_histogram: pass 2 of the sampler (src/sampling/device.rs), sampling rows only. Each
// workgroup takes one CHUNK of one row and, with m = the row's max of s (from the partials of
// sample_stats) and d = s - m for every candidate (s > -inf):
//   1. bins d (include/sample_common: 1/8-wide bins down to -40, then a tail), counting the
//      candidates of each bin and summing their fixed-point weights floor(exp(d) * 2^40);
//   2. for draw-window tokens (d > -20) that pass min-p, computes the Gumbel key
//      d + gumbel(bits_to_unit(uniform_bits(seed, step, stream, i))) (one Philox block per thread);
//   3. writes its candidates (order key of s, index) to the row's list bucketed by bin (a local
//      counting sort: the workgroup's region of the list holds bin 0's entries, then bin 1's,
//      ...) and the bucket offsets to its metadata, so sample_select can fetch any one bin of
//      the row (and recompute the Gumbel keys of that one bin);
//   4. writes, for each window bin b, the best (Gumbel key, lowest index) over its bins 0..=b;
//   5. adds its bin counts and weights to the row's histogram (integer atomics on 13-bit
//      parts of its exact 64-bit sums: exact, order-independent, nothing returned to wait for).
// Slots inside a bucket come from atomics, so their order varies between runs; every consumer
// is order-independent (integer sums, lowest-index tie-breaks), so the tokens do not.
// A row's token mask (include/sample_mask) leaves its disallowed tokens out (not candidates).
// Grid: rows * groups workgroups, 2-D folded (see gpu/kernel.rs), as in sample_stats.
// Rust: src/sampling/device.rs pipelines_for, bind
#include "sample_common"
#include "sample_reduce"
#include "philox"
#include "sample_mask"

@group(0) @binding(0) var<storage, read> logits: array<f32>;               // (B, V)
@group(0) @binding(1) var<storage, read> params: array<Params>;            // (B)
@group(0) @binding(2) var<storage, read> partials: array<vec4<u32>>;       // (B, G) from sample_stats
@group(0) @binding(3) var<storage, read_write> hist: array<atomic<u32>>;   // (B, NBINS, HW): count, weight parts
@group(0) @binding(4) var<storage, read_write> list: array<vec2<u32>>;     // (B, V) candidates (key, index) bucketed per workgroup
@group(0) @binding(5) var<storage, read_write> buckets: array<u32>;           // (B, G, META) bucket offsets, best records
@group(0) @binding(6) var<storage, read> info: Info;
@group(0) @binding(7) var<storage, read> token_mask: array<u32>;           // (masked rows, ceil(V / 32))

var<workgroup> h_cnt: array<atomic<u32>, NBINS>;
var<workgroup> h_lo: array<atomic<u32>, NBINS>;
var<workgroup> h_hi: array<atomic<u32>, NBINS>;
var<workgroup> b_key: array<atomic<u32>, WIN>;
var<workgroup> b_idx: array<atomic<u32>, WIN>;
var<workgroup> h_off: array<u32, BPT * WG>;  // exclusive bucket offsets; [NBINS..] = candidates

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, ids: LaneIds) {
    let ln = lanes(ids);
    let lid = ln.lid;
    fr_zero = info.zero;
#include "sample_row_group"

    // Issue this thread's loads (and its Philox block, pure arithmetic) before the row
    // reduction, so their latency overlaps it.
    let vocab = info.vocab;
    let i0 = g * CHUNK + lid * 4u;
    var lv: array<f32, 4>;
    for (var j = 0u; j < 4u; j++) {
        lv[j] = 0.0;
        if (sampling && i0 + j < vocab) {
            lv[j] = logits[row * vocab + i0 + j];
        }
    }
    var block = vec4<u32>(0u);
    if (sampling) {
        block = philox_block(p.seed_lo, p.seed_hi, p.step, p.stream, i0);
    }

    // The row's maximum, candidate count and +inf flag.
    var st = stats_empty();
    for (var q = lid; q < groups; q += WG) {
        st = stats_combine(st, unpack_stats(partials[row * groups + q]));
    }
    let rs = wg_stats(st, ln);
    if (!sampling || (rs.inf & FLAG_POS_INF) != 0u || rs.count == 0u) {
        return;  // a fixed outcome: sample_select decides it from the partials
    }
    let m = from_key(rs.skey);

    for (var b = lid; b < NBINS; b += WG) {
        atomicStore(&h_cnt[b], 0u);
        atomicStore(&h_lo[b], 0u);
        atomicStore(&h_hi[b], 0u);
    }
    for (var b = lid; b < WIN; b += WG) {
        atomicStore(&b_key[b], 0u);
        atomicStore(&b_idx[b], NO_INDEX);
    }
    workgroupBarrier();

    // Three passes over the thread's 4 entries: values, then Gumbel keys (independent
    // arithmetic chains the compiler can interleave), then the shared-memory atomics.
    var e_key: array<u32, 4>;
    var e_bin: array<u32, 4>;
    var e_d: array<f32, 4>;
    var e_slot: array<u32, 4>;
    var e_gkey: array<u32, 4>;
    var e_drawn: array<bool, 4>;
    let allowed = mask_bits4(p, i0, vocab);
    for (var j = 0u; j < 4u; j++) {
        e_bin[j] = NO_INDEX;
        e_key[j] = KEY_NEG_INF;
        e_d[j] = 0.0;
        let k = okey_nan(bitcast<u32>(lv[j] * p.inv_temperature));
        if (i0 + j < vocab && k > KEY_NEG_INF && ((allowed >> j) & 1u) != 0u) {
            // s from its key: an integer round trip, so l * inv_t is rounded before `- m`.
            let d = fr(fr(from_key(k)) - m);
            e_key[j] = k;
            e_d[j] = d;
            e_bin[j] = bin_of(d);
        }
    }
    for (var j = 0u; j < 4u; j++) {
        e_drawn[j] = e_bin[j] < WIN && e_d[j] >= p.ln_min_p;
        e_gkey[j] = 0u;
        if (e_drawn[j]) {
            e_gkey[j] = bitcast<u32>(fr(e_d[j] + gumbel(bits_to_unit(block[j]))));
        }
    }
    for (var j = 0u; j < 4u; j++) {
        let b = e_bin[j];
        if (b != NO_INDEX) {
            e_slot[j] = atomicAdd(&h_cnt[b], 1u);
            if (b < NB) {
                let q = quant(exp(e_d[j]));
                if (q.x != 0u || q.y != 0u) {
                    let old = atomicAdd(&h_lo[b], q.x);
                    let hi = q.y + select(0u, 1u, old + q.x < old);
                    if (hi != 0u) {
                        atomicAdd(&h_hi[b], hi);
                    }
                }
            }
            if (e_drawn[j]) {
                atomicMax(&b_key[b], okey(e_gkey[j]));
            }
        }
    }
    workgroupBarrier();

    // Bucket offsets: exclusive scan of the bin counts, BPT consecutive bins per thread.
    var run = 0u;
    for (var q = 0u; q < BPT; q++) {
        let b = ln.pos * BPT + q;
        h_off[b] = run;
        if (b < NBINS) {
            run += atomicLoad(&h_cnt[b]);
        }
    }
    let sc = wg_scan(run, vec2<u32>(0u), ln);
    for (var q = 0u; q < BPT; q++) {
        h_off[ln.pos * BPT + q] += sc.c - run;
    }
    workgroupBarrier();

    let mbase = w * META;
    for (var b = lid; b <= NBINS; b += WG) {
        buckets[mbase + META_OFFS + b] = h_off[b];
    }
    let lbase = row * vocab + g * CHUNK;
    for (var j = 0u; j < 4u; j++) {
        let b = e_bin[j];
        if (b != NO_INDEX) {
            list[lbase + h_off[b] + e_slot[j]] = vec2<u32>(e_key[j], i0 + j);
            if (e_drawn[j] && okey(e_gkey[j]) == atomicLoad(&b_key[b])) {
                atomicMin(&b_idx[b], i0 + j);
            }
        }
    }
    workgroupBarrier();

    // Best (key, index) over bins 0..=b for each window bin b (WPT consecutive bins a thread).
    var rk = 0u;
    var ri = NO_INDEX;
    for (var q = 0u; q < WPT; q++) {
        let b = ln.pos * WPT + q;
        if (b < WIN) {
            let k = atomicLoad(&b_key[b]);
            let i = atomicLoad(&b_idx[b]);
            if (better(k, i, rk, ri)) {
                rk = k;
                ri = i;
            }
        }
    }
    let before = wg_scan_best_excl(rk, ri, ln);
    rk = before.x;
    ri = before.y;
    for (var q = 0u; q < WPT; q++) {
        let b = ln.pos * WPT + q;
        if (b < WIN) {
            let k = atomicLoad(&b_key[b]);
            let i = atomicLoad(&b_idx[b]);
            if (better(k, i, rk, ri)) {
                rk = k;
                ri = i;
            }
            buckets[mbase + META_RECS + 2u * b] = rk;
            buckets[mbase + META_RECS + 2u * b + 1u] = ri;
        }
    }

    // Merge into the row's histogram.
    let hb = row * NBINS * HW;
    for (var b = lid; b < NBINS; b += WG) {
        let c = atomicLoad(&h_cnt[b]);
        if (c != 0u) {
            atomicAdd(&hist[hb + HW * b], c);
            let parts = split_parts(vec2<u32>(atomicLoad(&h_lo[b]), atomicLoad(&h_hi[b])));
            for (var t = 0u; t < 4u; t++) {
                if (parts[t] != 0u) {
                    atomicAdd(&hist[hb + HW * b + 1u + t], parts[t]);
                }
            }
        }
    }
}
