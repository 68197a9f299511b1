// gated_delta_rule_chunked: the gated delta rule of gated_delta_rule.wgsl (same definition, same
// bindings, state ring and grid) in the chunked form, for prefill (transformers'
// torch_chunk_gated_delta_rule, flash-linear-attention's chunk_gated_delta_rule). The pass's tokens
// go in chunks of C; per chunk of a value head h, with S the state entering it (Dk, Dv) and
//   q^, k^  = l2norm(q), l2norm(k), q^ also / sqrt(Dk);  beta_t = sigmoid(b_t)
//   G_t     = g_0 + .. + g_t  (g = -exp(A_log) softplus(a + dt_bias): the log-decays, in-chunk cumsum)
//   A[t,m]  = -beta_t (k^_t . k^_m) exp(G_t - G_m)   for m < t (strictly lower)
//   y_t     = beta_t (v_t - exp(G_t) S^T k^_t)         (C, Dv)
//   v_new   = (I - A)^-1 y                            transformers' U - W S, W = T (beta e^G k^), U = T (beta v):
//             v_new_t = y_t + sum_{m<t} A[t,m] v_new_m   forward substitution, one column at a time
//   o_t     = exp(G_t) S^T q^_t + sum_{m<=t} (q^_t . k^_m) exp(G_t - G_m) v_new_m
//   S       = exp(G_last) S + sum_t exp(G_last - G_t) k^_t v_new_t^T
// which is the recurrence token by token, regrouped (v_new_t is the recurrent form's delta). Every
// exp() has an argument <= 0 (no overflow; exp(G_t) may underflow to 0, as the decay it stands for).
// The norms come from the Gram matrices' diagonals: |k_t|^2 = (k k^T)[t,t], and q's own squares.
//
// Grid and work split as gated_delta_rule.wgsl: workgroup (h, block) owns CB columns of head h's S,
// thread (c, r) keeps rows r*ROWS .. (r+1)*ROWS of column j = block*CB + c in registers through the
// whole pass. Per chunk, 6 barriers:
//   1. stage the chunk's raw q, k rows (zeros past the pass) and (g, beta) in workgroup memory;
//   2. the Gram entries k_t . k_m, q_t . k_m (m <= t) and q_t . q_t, one per thread, 1/|k|, 1/|q|
//      and G (the C x C work is small and done again by each of the head's Dv / CB workgroups);
//   3. A and the masked decayed q^ k^T in place; each thread's partial sums of S^T k_t and S^T q_t
//      over its rows, for every token of the chunk;
//   4. thread (c, r) adds the RG row groups' partials of tokens t = r, r + RG, ..: y_t and the
//      inter-chunk output exp(G_t) q^_t S;
//   5. the forward substitution, a thread per column (r == 0), y -> v_new in place;
//   6. o (tokens t = r, r + RG, ..) to out; the state update in registers.
// The recurrent kernel needs about 12 barriers per token; this one 6 per chunk.
//
// Workgroup memory (f32 words): q, k 2 C (DK + 1), (g, beta) 2 C, G and the norms 3 C, the C x C
// matrices 2 C^2, the partials 2 C CB RG, y / v_new and the inter-chunk o 2 C CB. Qwen3.5's
// Dk = Dv = 128 (CB 32, RG 8) with C = 8: 6840 words, 26.7 KiB; src/ops/deltanet.rs picks the
// largest C in {16, 8, 4} within min(32 KiB, the device's limit) and falls back to the recurrent
// kernel where none fits. The staged rows have an odd stride (DK + 1) so that the Gram's reads of
// C different rows hit different banks.
//
// Macros: DK, DV, CB (columns per workgroup, divides DV), RG (row groups), ROWS (= ceil(DK / RG)),
// C (tokens per chunk); flag KV_TILED (k head h % Hk, llama.cpp's order; else h / (Hv / Hk)).
// Rust: src/ops/deltanet.rs gated_delta_rule, record_delta
#define DK 16
#define DV 16
#define CB 16
#define RG 16
#define ROWS 1
#define C 8

#include "gated_delta_rule_io"

const KS: u32 = {{DK}}u + 1u;       // row stride of the staged q, k
const CC: u32 = {{C}}u * {{C}}u;

var<workgroup> qs: array<f32, {{C}} * KS>;          // (C, KS) the chunk's raw q rows
var<workgroup> ks: array<f32, {{C}} * KS>;          // (C, KS) the chunk's raw k rows
var<workgroup> gb: array<vec2<f32>, {{C}}>;         // (C) (g, beta)
var<workgroup> gc: array<f32, {{C}}>;               // (C) G, the cumsum of g
var<workgroup> kn: array<f32, {{C}}>;               // (C) 1 / |k|
var<workgroup> qn: array<f32, {{C}}>;               // (C) 1 / (|q| sqrt(Dk))
var<workgroup> am: array<f32, CC>;                  // (C, C) [t, m]: k_t . k_m, then A (m < t)
var<workgroup> pm: array<f32, CC>;                  // (C, C) [t, m]: q_t . k_m, then q^_t . k^_m exp(G_t - G_m) (m <= t)
var<workgroup> part: array<vec2<f32>, {{C}} * WG>;  // (C, RG, CB) row groups' partial (S^T k_t, S^T q_t)
var<workgroup> ys: array<f32, {{C}} * {{CB}}>;      // (C, CB) y, then v_new
var<workgroup> qo: array<f32, {{C}} * {{CB}}>;      // (C, CB) exp(G_t) S^T q^_t

// Entry point (opened by the include: this thread's share, its state rows in s), continued here.
#include "gated_delta_rule_entry"
    let bias = dt_bias[h];
    let q_scale = inverseSqrt(f32({{DK}}u));
    let q_col = kh * {{DK}}u;
    let k_col = p.k_heads * {{DK}}u + q_col;
    let v_col = 2u * p.k_heads * {{DK}}u + h * {{DV}}u + j;
    for (var t0 = 0u; t0 < n; t0 += {{C}}u) {
        let nc = min({{C}}u, n - t0);  // tokens of this chunk (the last one may be partial)
        // 1. The raw q, k rows and (g, beta) of the chunk; zeros past the pass.
        for (var e = lid; e < {{C}}u * {{DK}}u; e += WG) {
            let t = e / {{DK}}u;
            let i = e % {{DK}}u;
            var qk = vec2<f32>(0.0);
            if (t < nc) {
                let row = (t0 + t) * p.ld_qkv;
                qk = vec2<f32>(qkv[row + q_col + i], qkv[row + k_col + i]);
            }
            qs[t * KS + i] = qk.x;
            ks[t * KS + i] = qk.y;
        }
        for (var t = lid; t < {{C}}u; t += WG) {
            var g_beta = vec2<f32>(0.0);
            if (t < nc) {
                let m = (t0 + t) * p.ld_mix;
                let g = decay_rate * softplus(mix[m + p.a_col + h] + bias);
                g_beta = vec2<f32>(g, 1.0 / (1.0 + exp(-mix[m + p.b_col + h])));
            }
            gb[t] = g_beta;
        }
        workgroupBarrier();
        // 2. Gram entries [t, m] (m <= t) and the norms; items CC .. CC + C: |q_t| and G_t.
        for (var e = lid; e < CC + {{C}}u; e += WG) {
            if (e < CC) {
                let t = e / {{C}}u;
                let m = e % {{C}}u;
                if (m <= t) {
                    var kk = 0.0;
                    var qk = 0.0;
                    for (var x = 0u; x < {{DK}}u; x++) {
                        let km = ks[m * KS + x];
                        kk += ks[t * KS + x] * km;
                        qk += qs[t * KS + x] * km;
                    }
                    am[e] = kk;
                    pm[e] = qk;
                    if (m == t) {
                        kn[t] = inverseSqrt(kk + 1e-6);
                    }
                }
            } else {
                let t = e - CC;
                var qq = 0.0;
                for (var x = 0u; x < {{DK}}u; x++) {
                    let qx = qs[t * KS + x];
                    qq += qx * qx;
                }
                qn[t] = inverseSqrt(qq + 1e-6) * q_scale;
                var g = 0.0;
                for (var m = 0u; m <= t; m++) {
                    g += gb[m].x;
                }
                gc[t] = g;
            }
        }
        workgroupBarrier();
        // 3. A and the decayed q^ k^T, in place (m <= t; A's diagonal stays unused) ...
        for (var e = lid; e < CC; e += WG) {
            let t = e / {{C}}u;
            let m = e % {{C}}u;
            if (m <= t) {
                let d = exp(gc[t] - gc[m]) * kn[m];
                pm[e] *= qn[t] * d;
                if (m < t) {
                    am[e] *= -gb[t].y * kn[t] * d;
                }
            }
        }
        // ... and this thread's rows' share of S^T k_t, S^T q_t (raw k, q: scaled in 4). Rows
        // past DK hold 0 in s (never loaded or updated), the clamped index just stays in bounds.
        for (var t = 0u; t < nc; t++) {
            var pkq = vec2<f32>(0.0);
            for (var x = 0u; x < {{ROWS}}u; x++) {
                let i = t * KS + min(i0 + x, {{DK}}u - 1u);
                pkq += vec2<f32>(ks[i], qs[i]) * s[x];
            }
            part[t * WG + lid] = pkq;
        }
        workgroupBarrier();
        // 4. The row groups' sums: y_t and the inter-chunk output of column j.
        for (var t = r; t < nc; t += {{RG}}u) {
            var sum = vec2<f32>(0.0);
            for (var g = 0u; g < {{RG}}u; g++) {
                sum += part[t * WG + g * {{CB}}u + c];
            }
            let eg = exp(gc[t]);
            let v = qkv[(t0 + t) * p.ld_qkv + v_col];
            ys[t * {{CB}}u + c] = gb[t].y * (v - eg * kn[t] * sum.x);
            qo[t * {{CB}}u + c] = qn[t] * eg * sum.y;
        }
        workgroupBarrier();
        // 5. v_new = (I - A)^-1 y, column j (row 0 of y is v_new's already).
        if (r == 0u) {
            for (var t = 1u; t < nc; t++) {
                var acc = ys[t * {{CB}}u + c];
                for (var m = 0u; m < t; m++) {
                    acc += am[t * {{C}}u + m] * ys[m * {{CB}}u + c];
                }
                ys[t * {{CB}}u + c] = acc;
            }
        }
        workgroupBarrier();
        // 6. o, and the state after the chunk.
        for (var t = r; t < nc; t += {{RG}}u) {
            var o = qo[t * {{CB}}u + c];
            for (var m = 0u; m <= t; m++) {
                o += pm[t * {{C}}u + m] * ys[m * {{CB}}u + c];
            }
            out[(t0 + t) * p.v_heads * {{DV}}u + h * {{DV}}u + j] = o;
        }
        let g_last = gc[nc - 1u];
        let decay = exp(g_last);
        for (var x = 0u; x < {{ROWS}}u; x++) {
            s[x] *= decay;
        }
        for (var t = 0u; t < nc; t++) {
            let w = kn[t] * exp(g_last - gc[t]) * ys[t * {{CB}}u + c];
            for (var x = 0u; x < {{ROWS}}u; x++) {
                let i = min(i0 + x, {{DK}}u - 1u);
                s[x] += select(0.0, ks[t * KS + i] * w, i0 + x < {{DK}}u);
            }
        }
        workgroupBarrier();  // the next chunk overwrites what this one read
    }
    store_state(sh, s);
}
