// sample_stats: pass 1 of the sampler (src/sampling/device.rs). For each row and each CHUNK of
// it (one workgroup each), the statistics every later step needs:
//   - the greedy argmax of the raw logits (NaN as -inf, lowest index on ties),
//   - for sampling rows: the largest order key of s = l * inv_temperature (NaN as -inf), the
//     number of candidates (s > -inf) and whether some s is +inf;
//   - for every row: whether some raw logit is NaN or +-inf.
// A row's token mask (include/sample_mask) leaves its disallowed tokens out of the argmax and
// the candidates (the NaN / inf flag still sees the whole row).
// Also zeroes the row's global bin histogram for sample_histogram (sampling rows).
// Grid: rows * groups workgroups, 2-D folded (see gpu/kernel.rs); workgroup w is chunk
// w % groups of row w / groups; each thread reads 4 consecutive logits.
// Rust: src/sampling/device.rs pipelines_for, bind
#include "sample_common"
#include "sample_reduce"
#include "sample_mask"

@group(0) @binding(0) var<storage, read> logits: array<f32>;              // (B, V)
@group(0) @binding(1) var<storage, read> params: array<Params>;           // (B)
@group(0) @binding(2) var<storage, read_write> partials: array<vec4<u32>>; // (B, G): argmax key of l, its index, max key of s, candidates | flags << 30
@group(0) @binding(3) var<storage, read_write> hist: array<u32>;          // (B, NBINS, HW) zeroed
@group(0) @binding(4) var<uniform> info: Info;
@group(0) @binding(5) var<storage, read> token_mask: array<u32>;          // (masked rows, ceil(V / 32))

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, ids: LaneIds) {
    let ln = lanes(ids);
    let lid = ln.lid;
#include "sample_row_group"
    let vocab = info.vocab;
    let base = row * vocab;
    let i0 = g * CHUNK + lid * 4u;

    var st = stats_empty();  // lkey 0 is below every key: the first entry always takes it
    let allowed = mask_bits4(p, i0, vocab);
    for (var j = 0u; j < 4u; j++) {
        let i = i0 + j;
        if (i < vocab) {
            let l = logits[base + i];
            let k = okey_nan(bitcast<u32>(l));
            st.inf |= select(0u, FLAG_NON_FINITE, (bitcast<u32>(l) & 0x7F800000u) == 0x7F800000u);
            if (((allowed >> j) & 1u) == 0u) {
                continue;
            }
            if (k > st.lkey) {
                st.lkey = k;
                st.lidx = i;
            }
            if (sampling) {
                let ks = okey_nan(bitcast<u32>(l * p.inv_temperature));
                st.skey = max(st.skey, ks);
                st.count += select(0u, 1u, ks > KEY_NEG_INF);
                st.inf |= select(0u, FLAG_POS_INF, ks == KEY_POS_INF);
            }
        }
    }
    let r = wg_stats(st, ln);
    if (lid == 0u) {
        partials[w] = vec4<u32>(r.lkey, r.lidx, r.skey, pack_count_flags(r.count, r.inf));
    }

    // Zero this row's share of the histogram (NBINS * HW words spread over the row's groups).
    if (sampling) {
        let hbase = row * NBINS * HW;
        for (var k = g * WG + lid; k < NBINS * HW; k += groups * WG) {
            hist[hbase + k] = 0u;
        }
    }
}
