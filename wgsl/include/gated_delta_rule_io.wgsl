// gated_delta_rule_io: what the two gated delta rule kernels (gated_delta_rule.wgsl, recurrent;
// gated_delta_rule_chunked.wgsl, chunked) share: the uniform (one Rust helper fills both:
// src/ops/deltanet.rs), the bindings, the state ring and how a workgroup's threads hold their
// share of a head's state. The including kernel defines DK, DV, CB, RG, ROWS.
//
// Grid: (Hv * Dv / CB) workgroups, 2-D folded: workgroup (h, block) owns CB columns of head h's S;
// thread (c, r) keeps rows r*ROWS .. (r+1)*ROWS of column block*CB + c in registers through the
// pass (S read and written once per pass). Each sequence slot of the caches has its own ring of R
// states (the state buffer is (slots * R, Hv, Dk, Dv), sequence slot s's ring at s * R): a pass
// at pos with n tokens reads ring state pos % R of its slot (zeros when pos == 0) and writes
// (pos + n) % R. A pass of one sequence is in slot step.slot.
// BATCH (gated_delta_rule.wgsl only: a decode step of many sequences): grid z is the step's row,
// each row a sequence of its own at (tok_pos(row), tok_slot(row)): one token, its own state, the
// same arithmetic as a one-token pass (so a row's numbers are that pass's).

// BATCH (include/step.wgsl): the binding of the pass's (position, slot) per token.
#define SEQS 8
#include "step"

struct Params {
    k_heads: u32,   // Hk
    v_heads: u32,   // Hv
    ld_qkv: u32,    // row stride of qkv: 2 Hk Dk + Hv Dv
    ld_mix: u32,    // row stride of mix (the in_proj output)
    b_col: u32,     // first column of b in mix (Hv columns)
    a_col: u32,     // first column of a in mix (Hv columns)
    n_rows: u32,    // T the kernel was recorded for
    ring: u32,      // R
}

@group(0) @binding(0) var<storage, read> qkv: array<f32>;          // (T, ld_qkv): [q (Hk, Dk) | k (Hk, Dk) | v (Hv, Dv)], after the conv
@group(0) @binding(1) var<storage, read> mix: array<f32>;          // (T, ld_mix): b, a at their columns
@group(0) @binding(2) var<storage, read> a_log: array<f32>;        // (Hv)
@group(0) @binding(3) var<storage, read> dt_bias: array<f32>;      // (Hv)
@group(0) @binding(4) var<storage, read_write> state: array<f32>;  // (slots * R, Hv, Dk, Dv)
@group(0) @binding(5) var<storage, read_write> out: array<f32>;    // (T, Hv Dv): o, before the gated norm
@group(0) @binding(6) var<uniform> step: Step;
@group(0) @binding(7) var<uniform> p: Params;

const WG: u32 = {{CB}}u * {{RG}}u;

// torch's softplus (beta 1, threshold 20).
fn softplus(x: f32) -> f32 {
    return select(log(1.0 + exp(x)), x, x > 20.0);
}

// A thread's share of the pass: value head h (h >= Hv: a workgroup past the heads), its key head
// kh, its column j and first row i0 of S, the pass's first row (row0: 0, or a batch step's row)
// and tokens n from it, the position of row0, the ring states read (src) and written (dst).
struct Share {
    h: u32,
    kh: u32,
    j: u32,
    i0: u32,
    row0: u32,
    n: u32,
    pos: u32,
    src: u32,
    dst: u32,
}

fn share_of(wid: vec3<u32>, nwg: vec3<u32>, lid3: vec3<u32>) -> Share {
    let blocks = {{DV}}u / {{CB}}u;
    let wg = wid.x + wid.y * nwg.x;  // 2-D folded grid (gpu/kernel.rs)
    var sh: Share;
    sh.h = wg / blocks;
#ifdef KV_TILED
    sh.kh = sh.h % p.k_heads;
#else
    sh.kh = sh.h / (p.v_heads / p.k_heads);
#endif
    sh.j = (wg % blocks) * {{CB}}u + lid3.x;
    sh.i0 = lid3.y * {{ROWS}}u;
    sh.n = min(step.n_tokens, p.n_rows);
    sh.row0 = 0u;
    sh.pos = step.pos;
    var slot = step.slot;
#ifdef BATCH
    // This workgroup's row of the step (none past its rows: n = 0, and the entry returns).
    sh.row0 = wid.z;
    sh.n = select(0u, 1u, wid.z < sh.n);
    let row = min(wid.z, p.n_rows - 1u);
    sh.pos = tok_pos(row);
    slot = tok_slot(row);
#endif
    let head_size = {{DK}}u * {{DV}}u;
    let ring0 = slot * p.ring;
    sh.src = ((ring0 + sh.pos % p.ring) * p.v_heads + sh.h) * head_size;
    sh.dst = ((ring0 + (sh.pos + sh.n) % p.ring) * p.v_heads + sh.h) * head_size;
    return sh;
}

// The thread's rows of S from the ring (zeros at pos 0, and for rows past Dk).
fn load_state(sh: Share) -> array<f32, {{ROWS}}> {
    var s: array<f32, {{ROWS}}>;
    for (var x = 0u; x < {{ROWS}}u; x++) {
        s[x] = 0.0;
        if (sh.i0 + x < {{DK}}u && sh.pos != 0u) {
            s[x] = state[sh.src + (sh.i0 + x) * {{DV}}u + sh.j];
        }
    }
    return s;
}

// The thread's rows of S into the ring.
fn store_state(sh: Share, s: array<f32, {{ROWS}}>) {
    for (var x = 0u; x < {{ROWS}}u; x++) {
        if (sh.i0 + x < {{DK}}u) {
            state[sh.dst + (sh.i0 + x) * {{DV}}u + sh.j] = s[x];
        }
    }
}
