// gated_delta_rule: Gated DeltaNet's recurrence (transformers' torch_recurrent_gated_delta_rule
// with use_qk_l2norm_in_kernel) and the gated RMSNorm after it (Qwen3_5MoeRMSNormGated), per
// value head h and token t of the pass (k head kh = h / (Hv / Hk): repeat_interleave):
//   q, k   = l2norm(q_kh), l2norm(k_kh)        x * inverseSqrt(sum(x^2) + 1e-6), then q /= sqrt(Dk)
//   beta   = sigmoid(b[t, h]);  g = -exp(A_log[h]) * softplus(a[t, h] + dt_bias[h])
//   S      = S * exp(g)                          S: (Dk, Dv), the head's recurrent state
//   delta  = (v - S^T k) * beta;  S = S + k delta^T;  o = S^T q
//   out    = o * inverseSqrt(mean(o^2) + eps) * norm_w * silu(z[t, h])
// The state is a ring of R slots (as in causal_conv1d): a pass at pos with n tokens reads slot
// pos % R (zeros when pos == 0) and writes slot (pos + n) % R.
//
// Grid: one workgroup per value head (Hv workgroups); thread j < Dv owns column j of S (Dk floats
// in registers) through all the pass's tokens, so S is read and written once per pass. q and k of
// the current token and the reductions live in workgroup memory. Macros: DK, DV, WG (power of two
// >= DV).
#define DK 16
#define DV 16
#define WG 16

struct Step {
    pos: u32,
    n_tokens: u32,
    _pad0: u32,
    _pad1: u32,
}

struct Params {
    k_heads: u32,   // Hk
    v_heads: u32,   // Hv
    ld_qkv: u32,    // row stride of qkv: 2 Hk Dk + Hv Dv
    ld_mix: u32,    // row stride of mix (the in_proj output)
    z_col: u32,     // first column of z in mix (Hv Dv columns)
    b_col: u32,     // first column of b in mix (Hv columns)
    a_col: u32,     // first column of a in mix (Hv columns)
    n_rows: u32,    // T the kernel was recorded for
    ring: u32,      // R
    eps: f32,       // the gated norm's epsilon
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<storage, read> qkv: array<f32>;          // (T, ld_qkv): [q (Hk, Dk) | k (Hk, Dk) | v (Hv, Dv)], after the conv
@group(0) @binding(1) var<storage, read> mix: array<f32>;          // (T, ld_mix): z, b, a at their columns
@group(0) @binding(2) var<storage, read> a_log: array<f32>;        // (Hv)
@group(0) @binding(3) var<storage, read> dt_bias: array<f32>;      // (Hv)
@group(0) @binding(4) var<storage, read> norm_w: array<f32>;       // (Dv)
@group(0) @binding(5) var<storage, read_write> state: array<f32>;  // (R, Hv, Dk, Dv)
@group(0) @binding(6) var<storage, read_write> out: array<f32>;    // (T, Hv Dv)
@group(0) @binding(7) var<uniform> step: Step;
@group(0) @binding(8) var<uniform> p: Params;

var<workgroup> qs: array<f32, {{DK}}>;
var<workgroup> ks: array<f32, {{DK}}>;
var<workgroup> red: array<vec2<f32>, {{WG}}>;

// Sum over the workgroup of each thread's pair; every thread gets the total.
fn reduce2(v: vec2<f32>, lid: u32) -> vec2<f32> {
    red[lid] = v;
    workgroupBarrier();
    for (var s = {{WG}}u / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            red[lid] += red[lid + s];
        }
        workgroupBarrier();
    }
    let total = red[0];
    workgroupBarrier();
    return total;
}

// torch's softplus (beta 1, threshold 20).
fn softplus(x: f32) -> f32 {
    return select(log(1.0 + exp(x)), x, x > 20.0);
}

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wid.x;
    if (h >= p.v_heads) {
        return;  // uniform across the workgroup
    }
    let kh = h / (p.v_heads / p.k_heads);
    let n = min(step.n_tokens, p.n_rows);
    let head_size = {{DK}}u * {{DV}}u;
    let src = ((step.pos % p.ring) * p.v_heads + h) * head_size;
    let dst = (((step.pos + n) % p.ring) * p.v_heads + h) * head_size;
    let j = lid;
    let live = j < {{DV}}u;
    var s: array<f32, {{DK}}>;
    for (var i = 0u; i < {{DK}}u; i++) {
        s[i] = 0.0;
        if (live && step.pos != 0u) {
            s[i] = state[src + i * {{DV}}u + j];
        }
    }
    let decay_rate = -exp(a_log[h]);
    let q_scale = inverseSqrt(f32({{DK}}u));
    let k_off = p.k_heads * {{DK}}u;
    let v_off = 2u * k_off;
    for (var t = 0u; t < n; t++) {
        let row = t * p.ld_qkv;
        // q and k of this token's k head, and their squared norms.
        var sq = vec2<f32>(0.0);
        for (var i = lid; i < {{DK}}u; i += {{WG}}u) {
            let qv = qkv[row + kh * {{DK}}u + i];
            let kv = qkv[row + k_off + kh * {{DK}}u + i];
            qs[i] = qv;
            ks[i] = kv;
            sq += vec2<f32>(qv * qv, kv * kv);
        }
        let norms = reduce2(sq, lid);  // also the barrier after the q/k stores
        let qn = inverseSqrt(norms.x + 1e-6) * q_scale;
        let kn = inverseSqrt(norms.y + 1e-6);
        let mrow = t * p.ld_mix;
        let beta = 1.0 / (1.0 + exp(-mix[mrow + p.b_col + h]));
        let decay = exp(decay_rate * softplus(mix[mrow + p.a_col + h] + dt_bias[h]));
        var o = 0.0;
        if (live) {
            var kv_mem = 0.0;
            for (var i = 0u; i < {{DK}}u; i++) {
                s[i] *= decay;
                kv_mem += s[i] * (ks[i] * kn);
            }
            let delta = (qkv[row + v_off + h * {{DV}}u + j] - kv_mem) * beta;
            for (var i = 0u; i < {{DK}}u; i++) {
                s[i] += (ks[i] * kn) * delta;
                o += s[i] * (qs[i] * qn);
            }
        }
        // Gated RMSNorm over the head's Dv outputs.
        let ss = reduce2(vec2<f32>(o * o, 0.0), lid);
        if (live) {
            let zv = mix[mrow + p.z_col + h * {{DV}}u + j];
            let normed = o * inverseSqrt(ss.x / f32({{DV}}u) + p.eps) * norm_w[j];
            out[t * p.v_heads * {{DV}}u + h * {{DV}}u + j] = normed * (zv / (1.0 + exp(-zv)));
        }
    }
    if (live) {
        for (var i = 0u; i < {{DK}}u; i++) {
            state[dst + i * {{DV}}u + j] = s[i];
        }
    }
}
