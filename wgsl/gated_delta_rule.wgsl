// gated_delta_rule: Gated DeltaNet's recurrence (transformers' torch_recurrent_gated_delta_rule
// with use_qk_l2norm_in_kernel), per value head h and token t of the pass (k head
// kh = h / (Hv / Hk): repeat_interleave; with KV_TILED kh = h % Hk, llama.cpp's GGUF order):
//   q, k   = l2norm(q_kh), l2norm(k_kh)        x * inverseSqrt(sum(x^2) + 1e-6), then q /= sqrt(Dk)
//   beta   = sigmoid(b[t, h]);  g = -exp(A_log[h]) * softplus(a[t, h] + dt_bias[h])
//   S      = S * exp(g)                          S: (Dk, Dv), the head's recurrent state
//   delta  = (v - S^T k) * beta;  S = S + k delta^T;  o = S^T q
// o goes to out; the gated RMSNorm after it is rms_norm_gated (a head's columns span workgroups).
// The state is a ring of R states per sequence slot (as in causal_conv1d): a pass at pos with n
// tokens reads ring state pos % R of its slot (zeros when pos == 0) and writes (pos + n) % R.
// BATCH: a decode step of many sequences, grid z its rows, each row its own sequence's one token
// (include/gated_delta_rule_io.wgsl).
// Decode steps run this kernel; prefill passes (recorded for more than one token) run
// gated_delta_rule_chunked.wgsl, the same rule in the chunked form, where its chunk fits the
// device's workgroup memory (src/ops/deltanet.rs: delta_form).
//
// Grid: (Hv * Dv / CB) workgroups, 2-D folded: workgroup (h, block) owns CB columns of head h's S; its
// CB * RG threads split them by rows: thread (r, c) keeps rows r*ROWS .. (r+1)*ROWS of column
// block*CB + c in registers through all the pass's tokens (S read and written once per pass), so
// a decode step spreads the state over many workgroups. The column sums S^T k and S^T q add the RG
// row groups' partial sums in workgroup memory. Macros: DK, DV, CB (columns per workgroup, divides
// DV), RG (row groups), ROWS (= ceil(DK / RG)); flags KV_TILED, BATCH.
// Rust: src/ops/deltanet.rs gated_delta_rule, record_delta
#define DK 16
#define DV 16
#define CB 16
#define RG 16
#define ROWS 1

#include "gated_delta_rule_io"


var<workgroup> qs: array<f32, {{DK}}>;
var<workgroup> ks: array<f32, {{DK}}>;
var<workgroup> red: array<vec2<f32>, WG>;

// Entry point (opened by the include: this thread's share, its state rows in s), continued here.
#include "gated_delta_rule_entry"
    let q_scale = inverseSqrt(f32({{DK}}u));
    let k_off = p.k_heads * {{DK}}u;
    let v_off = 2u * k_off;
    for (var t = sh.row0; t < sh.row0 + n; t++) {
        let row = t * p.ld_qkv;
        // q and k of this token's k head, and their squared norms.
        var sq = vec2<f32>(0.0);
        for (var i = lid; i < {{DK}}u; i += WG) {
            let qv = qkv[row + kh * {{DK}}u + i];
            let kv = qkv[row + k_off + kh * {{DK}}u + i];
            qs[i] = qv;
            ks[i] = kv;
            sq += vec2<f32>(qv * qv, kv * kv);
        }
        red[lid] = sq;
        workgroupBarrier();
        for (var w = WG / 2u; w > 0u; w >>= 1u) {
            if (lid < w) {
                red[lid] += red[lid + w];
            }
            workgroupBarrier();
        }
        let norms = red[0];
        workgroupBarrier();
        let qn = inverseSqrt(norms.x + 1e-6) * q_scale;
        let kn = inverseSqrt(norms.y + 1e-6);
        let mrow = t * p.ld_mix;
        let beta = 1.0 / (1.0 + exp(-mix[mrow + p.b_col + h]));
        let decay = exp(decay_rate * softplus(mix[mrow + p.a_col + h] + dt_bias[h]));
        // S^T k for column j: this thread's rows, then the row groups' sum.
        var part = 0.0;
        for (var x = 0u; x < {{ROWS}}u; x++) {
            let i = min(i0 + x, {{DK}}u - 1u);
            s[x] *= decay;
            part += select(0.0, s[x] * ks[i] * kn, i0 + x < {{DK}}u);
        }
        red[lid].x = part;
        workgroupBarrier();
        var kv_mem = 0.0;
        for (var g = 0u; g < {{RG}}u; g++) {
            kv_mem += red[g * {{CB}}u + c].x;
        }
        workgroupBarrier();
        let delta = (qkv[row + v_off + h * {{DV}}u + j] - kv_mem) * beta;
        part = 0.0;
        for (var x = 0u; x < {{ROWS}}u; x++) {
            let i = min(i0 + x, {{DK}}u - 1u);
            let live = i0 + x < {{DK}}u;
            s[x] += select(0.0, ks[i] * kn * delta, live);
            part += select(0.0, s[x] * qs[i] * qn, live);
        }
        red[lid].x = part;
        workgroupBarrier();
        if (r == 0u) {
            var o = 0.0;
            for (var g = 0u; g < {{RG}}u; g++) {
                o += red[g * {{CB}}u + c].x;
            }
            out[t * p.v_heads * {{DV}}u + h * {{DV}}u + j] = o;
        }
        workgroupBarrier();
    }
    store_state(sh, s);
}
