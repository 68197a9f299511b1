// attention: causal (optionally sliding-window) multi-head attention with grouped-query heads over
// the f16 KV cache; one kernel for prefill and decode (src/ops/attention.rs picks the tiling).
//
// Token t of the pass (t < step.n_tokens) is at position p = step.pos + t and query head h
// (KV head g = h / G, G = H / Hkv) attends keys j in [lo(p), p], lo(p) = max(0, p + 1 - window)
// (window 0: lo = 0): out = softmax_j((q . k_j) * scale) v_j, softmax in f32 with max subtraction.
//
// Rows: a row is one (token t, query head h) pair. The G query heads sharing KV head g are rows
// t * G + (h - g * G) of that KV head, so the BQ rows of a workgroup share their K/V tiles.
// Workgroup (x, y, z) = (row block, KV head g, key split). The block walks its key range in tiles
// of BK keys staged in workgroup memory as packed f16 (K, then V in the same buffer), with a
// flash-attention online softmax (running max m and sum l per row, accumulator rescaled when m
// grows). Threads: WG = BQ * LPR, thread (r, j) = (tid / LPR, tid % LPR):
//   scores:  lane j of row r computes keys j + LPR * i (KPL = BK / LPR of them), full dot over D;
//   softmax: per-row max and sum through workgroup memory (no subgroup size is assumed);
//   P V:     lane j owns dim pairs j + LPR * i (NW = ceil(D / 2 / LPR) of them) in registers.
// Masked scores are a finite NEG sentinel and masked probabilities exactly 0 (no infinities:
// fast-math compilers may assume there are none); K/V words past the range are loaded as 0.
//
// SPLIT (NSPLIT > 1, flash decoding): the block's key range is cut into NSPLIT parts of whole
// tiles, one per workgroup z; each writes its unnormalized accumulator and (m, l), and the MERGE
// entry (this file compiled with MERGE) combines them. Without SPLIT the output is written here.
//
// Macros: D (even), G, BQ, LPR, WG (= BQ * LPR), BK (multiple of LPR), KPL, NW, NSPLIT, and the
// workgroup array sizes Q_WORDS (BQ * (D/2 + 1)), KV_WORDS (BK * (D/2 + 1)), P_WORDS (BQ * (BK + 1)).

struct Step {
    pos: u32,
    n_tokens: u32,
    _pad0: u32,
    _pad1: u32,
}

struct Params {
    heads: u32,       // H
    kv_heads: u32,    // Hkv
    max_ctx: u32,
    window: u32,      // 0: full causal
    scale: f32,
    n_rows: u32,      // T the kernel was recorded for
    _pad0: u32,
    _pad1: u32,
}

const NEG: f32 = -1.0e30;
const HD: u32 = {{D}}u / 2u; // words (f16 pairs) per head

#ifdef MERGE
// ---- merge of the NSPLIT partials: one workgroup per (token, head) row, R = T * H rows ----
@group(0) @binding(0) var<storage, read> part_o: array<vec2<f32>>;   // (NSPLIT, T * H, D) unnormalized outputs, as pairs
@group(0) @binding(1) var<storage, read> part_ml: array<vec2<f32>>;  // (NSPLIT, T * H) (running max m, sum l)
@group(0) @binding(2) var<storage, read_write> out: array<vec2<f32>>; // (T, H * D) as pairs
@group(0) @binding(3) var<uniform> step: Step;
@group(0) @binding(4) var<uniform> p: Params;

var<workgroup> weight: array<f32, {{NSPLIT}}>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * nwg.x;
    let n_rows = p.n_rows * p.heads;
    if (row >= n_rows || row / p.heads >= min(step.n_tokens, p.n_rows)) {
        return;
    }
    var mx = NEG;
    for (var s = 0u; s < {{NSPLIT}}u; s++) {
        mx = max(mx, part_ml[s * n_rows + row].x);
    }
    var l = 0.0;
    for (var s = 0u; s < {{NSPLIT}}u; s++) {
        let ml = part_ml[s * n_rows + row];
        l += ml.y * exp(ml.x - mx);
    }
    for (var s = lid; s < {{NSPLIT}}u; s += 64u) {
        weight[s] = exp(part_ml[s * n_rows + row].x - mx);
    }
    workgroupBarrier();
    let inv = select(0.0, 1.0 / l, l > 0.0);
    for (var w = lid; w < HD; w += 64u) {
        var o = vec2<f32>(0.0);
        for (var s = 0u; s < {{NSPLIT}}u; s++) {
            o += part_o[(s * n_rows + row) * HD + w] * weight[s];
        }
        out[row * HD + w] = o * inv;
    }
}

#else
// ---- attention ----
@group(0) @binding(0) var<storage, read> qkv: array<f32>;      // (T, (H + 2 Hkv) * D): [q | k | v], q roped
@group(0) @binding(1) var<storage, read> k_cache: array<u32>;  // (Hkv, max_ctx, D) f16, packed pairs
@group(0) @binding(2) var<storage, read> v_cache: array<u32>;  // (Hkv, max_ctx, D) f16, packed pairs
@group(0) @binding(3) var<uniform> step: Step;
@group(0) @binding(4) var<uniform> p: Params;
#ifdef SPLIT
@group(0) @binding(5) var<storage, read_write> part_o: array<vec2<f32>>;  // (NSPLIT, T * H, D) unnormalized, as pairs
@group(0) @binding(6) var<storage, read_write> part_ml: array<vec2<f32>>; // (NSPLIT, T * H) (m, l)
#else
@group(0) @binding(5) var<storage, read_write> out: array<vec2<f32>>;     // (T, H * D) as pairs
#endif

const QS: u32 = {{D}}u / 2u + 1u; // padded row stride of q_s (vec2) and kv_s (u32): no bank conflicts
const PS: u32 = {{BK}}u + 1u;     // padded row stride of p_s

var<workgroup> q_s: array<vec2<f32>, {{Q_WORDS}}>; // (BQ, D/2 + 1) the block's queries
var<workgroup> kv_s: array<u32, {{KV_WORDS}}>;     // (BK, D/2 + 1) K tile, then V tile, f16 pairs
var<workgroup> p_s: array<f32, {{P_WORDS}}>;       // (BQ, BK + 1) probabilities of the tile
var<workgroup> red_m: array<f32, {{WG}}>;          // (BQ, LPR) per-lane max
var<workgroup> red_l: array<f32, {{WG}}>;          // (BQ, LPR) per-lane sum

// First key position visible from position pos.
fn key_lo(pos: u32) -> u32 {
    return select(0u, pos + 1u - p.window, p.window > 0u && pos + 1u > p.window);
}

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) tid: u32) {
    // The last row blocks have the most keys (causal): start them first.
    let blk = nwg.x - 1u - wid.x;
    let g = wid.y;
    let split = wid.z;
    let n_tok = min(step.n_tokens, p.n_rows);
    let row0 = blk * {{BQ}}u;
    let t_first = row0 / {{G}}u;
    if (t_first >= n_tok) {
        return;
    }
    let t_last = min((row0 + {{BQ}}u - 1u) / {{G}}u, n_tok - 1u);
    // Key range of the block, [blk_lo, blk_hi], and this split's share in whole tiles.
    let blk_lo = key_lo(step.pos + t_first);
    let blk_hi = step.pos + t_last;
    let n_tiles = (blk_hi - blk_lo) / {{BK}}u + 1u;
    let per = (n_tiles + {{NSPLIT}}u - 1u) / {{NSPLIT}}u;
    let k_begin = blk_lo + min(split * per, n_tiles) * {{BK}}u;
    let k_end = min(blk_lo + min((split + 1u) * per, n_tiles) * {{BK}}u, blk_hi + 1u);

    // This thread's row and lane.
    let r = tid / {{LPR}}u;
    let j = tid % {{LPR}}u;
    let row = row0 + r;
    let t = row / {{G}}u;
    let h = g * {{G}}u + row % {{G}}u;
    let live = t < n_tok;
    let q_pos = step.pos + t;
    let lo = key_lo(q_pos);
    let stride = (p.heads + 2u * p.kv_heads) * {{D}}u;

    // The block's queries.
    for (var i = tid; i < {{BQ}}u * HD; i += {{WG}}u) {
        let rr = i / HD;
        let w = i % HD;
        let rw = row0 + rr;
        let tt = rw / {{G}}u;
        var q = vec2<f32>(0.0);
        if (tt < n_tok) {
            let b = tt * stride + (g * {{G}}u + rw % {{G}}u) * {{D}}u + 2u * w;
            q = vec2<f32>(qkv[b], qkv[b + 1u]);
        }
        q_s[rr * QS + w] = q;
    }

    let kv_base = g * p.max_ctx;
    var m_run = NEG;
    var l_run = 0.0;
    var acc: array<vec2<f32>, {{NW}}>;
    for (var kb = k_begin; kb < k_end; kb += {{BK}}u) {
        let nk = min({{BK}}u, k_end - kb);
        // K tile.
        for (var i = tid; i < {{BK}}u * HD; i += {{WG}}u) {
            let k = i / HD;
            let w = i % HD;
            var v = 0u;
            if (k < nk) {
                v = k_cache[(kv_base + kb + k) * HD + w];
            }
            kv_s[k * QS + w] = v;
        }
        workgroupBarrier();

        // Scores of this lane's keys.
        var dots: array<f32, {{KPL}}>;
        for (var w = 0u; w < HD; w++) {
            let q = q_s[r * QS + w];
            for (var i = 0u; i < {{KPL}}u; i++) {
                let kv = unpack2x16float(kv_s[(j + {{LPR}}u * i) * QS + w]);
                dots[i] += q.x * kv.x + q.y * kv.y;
            }
        }
        var valid = 0u;
        var lmax = NEG;
        for (var i = 0u; i < {{KPL}}u; i++) {
            let k = j + {{LPR}}u * i;
            let key = kb + k;
            if (live && k < nk && key >= lo && key <= q_pos) {
                valid |= 1u << i;
                dots[i] *= p.scale;
                lmax = max(lmax, dots[i]);
            }
        }
        red_m[tid] = lmax;
        workgroupBarrier();

        // Online softmax update of the row; probabilities to p_s; V tile over the K tile.
        var m_new = m_run;
        for (var i = 0u; i < {{LPR}}u; i++) {
            m_new = max(m_new, red_m[r * {{LPR}}u + i]);
        }
        let alpha = exp(m_run - m_new);
        var lsum = 0.0;
        for (var i = 0u; i < {{KPL}}u; i++) {
            var e = 0.0;
            if ((valid & (1u << i)) != 0u) {
                e = exp(dots[i] - m_new);
            }
            p_s[r * PS + j + {{LPR}}u * i] = e;
            lsum += e;
        }
        red_l[tid] = lsum;
        for (var i = tid; i < {{BK}}u * HD; i += {{WG}}u) {
            let k = i / HD;
            let w = i % HD;
            var v = 0u;
            if (k < nk) {
                v = v_cache[(kv_base + kb + k) * HD + w];
            }
            kv_s[k * QS + w] = v;
        }
        workgroupBarrier();

        var bsum = 0.0;
        for (var i = 0u; i < {{LPR}}u; i++) {
            bsum += red_l[r * {{LPR}}u + i];
        }
        l_run = l_run * alpha + bsum;
        m_run = m_new;
        for (var i = 0u; i < {{NW}}u; i++) {
            acc[i] *= alpha;
        }
        for (var k = 0u; k < nk; k++) {
            let pk = p_s[r * PS + k];
            for (var i = 0u; i < {{NW}}u; i++) {
                let w = j + {{LPR}}u * i;
                if (w < HD) {
                    acc[i] += pk * unpack2x16float(kv_s[k * QS + w]);
                }
            }
        }
        workgroupBarrier();
    }

    if (!live) {
        return;
    }
    let out_row = t * p.heads + h;
#ifdef SPLIT
    let prow = split * p.n_rows * p.heads + out_row;
    for (var i = 0u; i < {{NW}}u; i++) {
        let w = j + {{LPR}}u * i;
        if (w < HD) {
            part_o[prow * HD + w] = acc[i];
        }
    }
    if (j == 0u) {
        part_ml[prow] = vec2<f32>(m_run, l_run);
    }
#else
    let inv = select(0.0, 1.0 / l_run, l_run > 0.0);
    for (var i = 0u; i < {{NW}}u; i++) {
        let w = j + {{LPR}}u * i;
        if (w < HD) {
            out[out_row * HD + w] = acc[i] * inv;
        }
    }
#endif
}
#endif
