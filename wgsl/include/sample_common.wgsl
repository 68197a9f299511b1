// sample_common: what the sampling kernels (sample_stats, sample_histogram, sample_select) share:
// the per-row parameters, the dispatch info, the order-preserving keys, the value bins and the
// fixed-point weights. The algorithm is described in src/sampling/device.rs.

// Workgroup size (a power of two, 64..256) and its raking split WG = SEG * SEG: the host picks
// 64 / 8 for small vocabularies and 256 / 16 otherwise (src/sampling/device.rs).
#define WG 256
#define SEG 16
const WG: u32 = {{WG}}u;
const SEG: u32 = {{SEG}}u;
// Logits per workgroup in the multi-workgroup passes: 4 consecutive entries per thread, so one
// Philox block serves a thread (entries 4j..4j+3 share the counter (j, stream, step, 0)).
const CHUNK: u32 = 4u * WG;

// Bins of d = s - max (<= 0): bin b holds d in (-(b+1)/8, -b/8] for b < NB (d > -40); the tail
// bin TAIL holds d <= -40 (weight < 2^-57: 0 in the fixed point below) and d = -inf.
// Bins below WIN (d > -20) form the draw window: a token with d <= -20 can never win the
// Gumbel-max (its key d + g <= -20 + 16.64 < -2.82 <= the key of the maximum, d = 0).
const BINS_PER_UNIT: f32 = 8.0;
const NB: u32 = 320u;
const TAIL: u32 = 320u;
const NBINS: u32 = 321u;
// Words per bin of the row histogram: the count, then the bin's weight as four 13-bit-aligned
// parts (each workgroup adds its exact 64-bit sum split so, with plain atomic adds: no returned
// values to wait for, no carries; see join_parts).
const HW: u32 = 5u;
const WIN: u32 = 160u;
// Per-workgroup metadata written by sample_histogram: NBINS + 1 bucket offsets, then WIN
// records (key, index) of the best Gumbel key over bins 0..=b.
const META_OFFS: u32 = 0u;
const META_RECS: u32 = 322u;   // NBINS + 1
const META: u32 = 642u;        // META_RECS + 2 * WIN

// Per-thread shares of the bin scans (NBINS + 1 offsets), of the window bins and of the 256
// radix digits.
const BPT: u32 = (NBINS + WG) / WG;
const WPT: u32 = (WIN + WG - 1u) / WG;
const DPT: u32 = 256u / WG;

const MODE_GREEDY: u32 = 0u;

const KEY_NEG_INF: u32 = 0x007FFFFFu;
const KEY_POS_INF: u32 = 0xFF800000u;
const NO_INDEX: u32 = 0xFFFFFFFFu;

// Stats.inf flags. FLAG_POS_INF: some scaled logit s is +inf (the row's outcome is fixed).
// FLAG_NON_FINITE: some raw logit is NaN or +-inf (sample_select reports it in `status`: a
// model that produced such logits has failed, whatever token the spec gives the row).
const FLAG_POS_INF: u32 = 1u;
const FLAG_NON_FINITE: u32 = 2u;

// PreparedParams (src/sampling/params.rs), 40 bytes.
struct Params {
    mode: u32,
    inv_temperature: f32,
    top_k: u32,
    top_p: f32,
    ln_min_p: f32,
    seed_lo: u32,
    seed_hi: u32,
    step: u32,
    stream: u32,
    mask: u32,  // 0: no token mask; 1 + j: the j-th mask of token_mask (include/sample_mask)
}

struct Info {
    rows: u32,
    vocab: u32,
    groups: u32,  // workgroups per row in the multi-workgroup passes: ceil(vocab / CHUNK)
    zero: u32,    // always 0 (rounding barrier source, include/philox.wgsl)
}

// host::order_key on f32 bits (not NaN): -0 and +0 share a key.
fn okey(bits: u32) -> u32 {
    let b = select(bits, 0u, bits == 0x80000000u);
    if ((b & 0x80000000u) != 0u) {
        return ~b;
    }
    return b | 0x80000000u;
}

// okey with NaN mapped to -inf.
fn okey_nan(bits: u32) -> u32 {
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {
        return KEY_NEG_INF;
    }
    return okey(bits);
}

// host::from_order_key.
fn from_key(k: u32) -> f32 {
    if ((k & 0x80000000u) != 0u) {
        return bitcast<f32>(k & 0x7FFFFFFFu);
    }
    return bitcast<f32>(~k);
}

// The bin of d <= 0 (see above); monotone: d1 >= d2 => bin(d1) <= bin(d2). Integer compare of
// the bits of |d| * 8 (exact), so +-0, -inf and fast-math compilers are all handled.
fn bin_of(d: f32) -> u32 {
    let x = abs(d) * BINS_PER_UNIT;
    if (bitcast<u32>(x) < 0x43A00000u) {  // x < 320.0
        return u32(x);
    }
    return TAIL;
}

// floor(w * 2^40) as (lo, hi) words, for w = exp(d) in [0, ~1]: the weights top-p sums,
// exactly and in any order, in 64-bit fixed point (a row of V < 2^22 entries sums below 2^63).
fn quant(w: f32) -> vec2<u32> {
    let x = w * 256.0;
    let h = floor(x);
    let f = x - h;
    return vec2<u32>(u32(f * 4294967296.0), u32(h));
}

// A workgroup's bin weight x < 2^51 as parts x = p0 + p1 2^13 + p2 2^26 + p3 2^39 (each < 2^13,
// so a row's sums of at most 2^12 workgroups stay below 2^25).
fn split_parts(x: vec2<u32>) -> vec4<u32> {
    return vec4<u32>(x.x & 0x1FFFu, (x.x >> 13u) & 0x1FFFu, ((x.x >> 26u) | (x.y << 6u)) & 0x1FFFu, x.y >> 7u);
}

// The 64-bit sum of parts (a row's total weight stays below 2^63: V < 2^22).
fn join_parts(p: vec4<u32>) -> vec2<u32> {
    var r = vec2<u32>(p.x, 0u);
    r = add64(r, vec2<u32>(p.y << 13u, p.y >> 19u));
    r = add64(r, vec2<u32>(p.z << 26u, p.z >> 6u));
    return add64(r, vec2<u32>(0u, p.w << 7u));
}

fn add64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let lo = a.x + b.x;
    return vec2<u32>(lo, a.y + b.y + select(0u, 1u, lo < a.x));
}

fn sub64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    return vec2<u32>(a.x - b.x, a.y - b.y - select(0u, 1u, a.x < b.x));
}

fn ge64(a: vec2<u32>, b: vec2<u32>) -> bool {
    return a.y > b.y || (a.y == b.y && a.x >= b.x);
}

// (key, index) order of the argmax reductions: larger key, then smaller index.
fn better(ak: u32, ai: u32, bk: u32, bi: u32) -> bool {
    return ak > bk || (ak == bk && ai < bi);
}
