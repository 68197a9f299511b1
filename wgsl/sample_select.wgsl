// sample_select: pass 3 of the sampler (src/sampling/device.rs): one workgroup per row turns the
// statistics of sample_stats and the bins of sample_histogram into the token id.
//   - Fixed outcomes (greedy, a +inf scaled logit, no candidate) from the partials alone.
//   - Top-k: the bin holding the k-th largest s from the cumulative bin counts, then the exact
//     value inside that bin by a selection over its entries (fetched from every workgroup's
//     bucket); Z = the weight of K1 (bins above + the part of that bin >= t_k).
//   - Top-p: the bin where the cumulative K1 weight reaches ceil(top_p * Z) (exact 64-bit
//     integer arithmetic on the fixed-point weights), then the exact level inside it by the same
//     selection with the weight as the predicate. Skipped when that bin is below the draw window
//     (it cannot change the winner).
//   - Min-p: the bin of ln_min_p; entries of that bin are tested one by one.
//   - Draw: every bin above b* (the first bin not wholly kept) is wholly kept, so the winner
//     there is the best of each workgroup's prefix record for bin b* - 1; the entries of bin b*
//     are tested against the thresholds and compete with it.
// The three bin jobs (top-k, top-p, draw) run as iterations of one loop over the same fetch and
// selection code: short code matters where workgroups run as masked SIMD (CPU drivers).
// Selection inside a bin: with n <= WG entries, every entry counts / weighs the entries at or
// above it (no rounds); otherwise a 4 x 8-bit radix select (MSD first).
// Grid: one workgroup per row, 2-D folded (see gpu/kernel.rs).
// Rust: src/sampling/device.rs pipelines_for, pipelines_logged, bind
#include "sample_common"
#include "sample_reduce"
#include "philox"

@group(0) @binding(0) var<storage, read> params: array<Params>;            // (B)
@group(0) @binding(1) var<storage, read> partials: array<vec4<u32>>;       // (B, G) from sample_stats
@group(0) @binding(2) var<storage, read> hist: array<u32>;                 // (B, NBINS, HW) from sample_histogram
@group(0) @binding(3) var<storage, read> list: array<vec2<u32>>;           // (B, V) (key, index) from sample_histogram
@group(0) @binding(4) var<storage, read> buckets: array<u32>;              // (B, G, META) from sample_histogram
@group(0) @binding(5) var<storage, read_write> fetched: array<vec2<u32>>;  // (B, V) the entries of one large bin
@group(0) @binding(6) var<storage, read_write> out: array<u32>;            // (B) token ids
@group(0) @binding(7) var<storage, read> info: Info;
@group(0) @binding(8) var<storage, read_write> status: array<u32>;         // (B) 1: the row has a NaN or +-inf logit
#ifdef LOG
// LOG: each row's id and status also go to entry (step % N, row) of a log of N steps, so that a
// decode loop running several steps in one submission reads them all back with one copy.
@group(0) @binding(9) var<storage, read_write> step_log: array<vec2<u32>>; // (N, B) (id, status)

fn log_at(step: u32, r: u32) -> u32 {
    return (step % (arrayLength(&step_log) / info.rows)) * info.rows + r;
}
#endif

// Row r's token id (lane 0 of its workgroup).
fn put_id(p: Params, r: u32, t: u32) {
    out[r] = t;
#ifdef LOG
    step_log[log_at(p.step, r)].x = t;
#endif
}

// Row r's status: 1 when its logits held a NaN or an infinity (lane 0).
fn put_status(p: Params, r: u32, non_finite: bool) {
    status[r] = select(0u, 1u, non_finite);
#ifdef LOG
    step_log[log_at(p.step, r)].y = select(0u, 1u, non_finite);
#endif
}

const RANK: u32 = 0u;   // select the rank-th largest key
const LEVEL: u32 = 1u;  // select the top-p level

struct Pick {
    q: u32,              // scan position (radix: 255 - digit) or key
    excl_c: u32,         // count strictly above it
    excl_m: vec2<u32>,   // weight strictly above it
    incl_m: vec2<u32>,   // weight at or above it
}

struct Sel {
    key: u32,
    mass: vec2<u32>,     // weight of the eligible entries with key >= key
}

var<workgroup> c_cnt: array<u32, BPT * WG>;          // inclusive cumulative count per bin
var<workgroup> c_mass: array<vec2<u32>, BPT * WG>;   // inclusive cumulative weight per bin
var<workgroup> r_cnt: array<atomic<u32>, 256>;
var<workgroup> r_lo: array<atomic<u32>, 256>;
var<workgroup> r_hi: array<atomic<u32>, 256>;
var<workgroup> seg_end: array<u32, WG>;
var<workgroup> seg_start: array<u32, WG>;
var<workgroup> f_key: array<u32, WG>;                // a small fetched bin (n <= WG)
var<workgroup> f_idx: array<u32, WG>;
var<workgroup> f_w: array<vec2<u32>, WG>;
var<workgroup> p_max: atomic<u32>;
var<workgroup> p_min: atomic<u32>;
var<workgroup> pick: Pick;
var<workgroup> pick_bin: u32;
var<workgroup> pickb: vec4<u32>;

var<private> row: u32;
var<private> groups: u32;
var<private> fbase: u32;  // start of this row's region of `fetched`
var<private> mx: f32;     // the row's max of s

fn weight(key: u32) -> vec2<u32> {
    return quant(exp(from_key(key) - mx));
}

// Cumulative count / weight of bins 0..=b (0 for b = NO_INDEX, i.e. "bin -1").
fn cum_c(b: u32) -> u32 {
    if (b == NO_INDEX) {
        return 0u;
    }
    return c_cnt[b];
}

fn cum_m(b: u32) -> vec2<u32> {
    if (b == NO_INDEX) {
        return vec2<u32>(0u);
    }
    return c_mass[b];
}

// Gathers the n entries of bin b from every workgroup's bucket: into shared memory when
// n <= WG (a small bin), else into this row's region of `fetched`. n is the bin's count.
fn fetch(b: u32, n: u32, ln: Lanes) {
    var total = 0u;
    for (var g0 = 0u; g0 < groups; g0 += WG) {
        let g = g0 + ln.pos;
        var len = 0u;
        var start = 0u;
        if (g < groups) {
            let mb = (row * groups + g) * META + META_OFFS;
            let o0 = buckets[mb + b];
            len = buckets[mb + b + 1u] - o0;
            start = row * info.vocab + g * CHUNK + o0;
        }
        let sc = wg_scan(len, vec2<u32>(0u), ln);
        seg_end[ln.pos] = sc.c;
        seg_start[ln.pos] = start;
        workgroupBarrier();
        let cnt = sc.total_c;
        for (var j = ln.lid; j < cnt; j += WG) {
            // The segment holding j: the first t with seg_end[t] > j.
            var lo = 0u;
            var hi = WG - 1u;
            while (lo < hi) {
                let mid = (lo + hi) / 2u;
                if (seg_end[mid] > j) {
                    hi = mid;
                } else {
                    lo = mid + 1u;
                }
            }
            var before = 0u;
            if (lo > 0u) {
                before = seg_end[lo - 1u];
            }
            let e = list[seg_start[lo] + (j - before)];
            let at = total + j;
            if (n <= WG) {
                f_key[at] = e.x;
                f_idx[at] = e.y;
            } else {
                fetched[fbase + at] = e;
            }
        }
        total += cnt;
        workgroupBarrier();
    }
    if (n > WG) {
        storageBarrier();
    }
}

// Entry j (key, index) of the n fetched ones.
fn entry(j: u32, n: u32) -> vec2<u32> {
    if (n <= WG) {
        return vec2<u32>(f_key[j], f_idx[j]);
    }
    return fetched[fbase + j];
}

// The number of entries in bin b (uniform).
fn bin_count(b: u32) -> u32 {
    var before = 0u;
    if (b > 0u) {
        before = workgroupUniformLoad(&c_cnt[b - 1u]);
    }
    return workgroupUniformLoad(&c_cnt[b]) - before;
}

// The best (key, index) over the prefix records of bin b - 1 of this thread's workgroups
// (the winner among the bins 0..b-1); (0, NO_INDEX) for b = 0.
fn records(b: u32, lid: u32) -> vec2<u32> {
    var bk = 0u;
    var bi = NO_INDEX;
    if (b > 0u) {
        for (var g = lid; g < groups; g += WG) {
            let rb = (row * groups + g) * META + META_RECS + 2u * (b - 1u);
            let k = buckets[rb];
            let i = buckets[rb + 1u];
            if (better(k, i, bk, bi)) {
                bk = k;
                bi = i;
            }
        }
    }
    return vec2<u32>(bk, bi);
}

// Whether a candidate with (count, weight) strictly above it `ec`, `em` and at or above it
// `ic`, `im` is the one selected: RANK: ec < rank <= ic; LEVEL: base + em < goal <= base + im.
fn hits(mode: u32, rank: u32, base: vec2<u32>, goal: vec2<u32>, ec: u32, ic: u32, em: vec2<u32>, im: vec2<u32>) -> bool {
    if (mode == RANK) {
        return ec < rank && rank <= ic;
    }
    return !ge64(add64(base, em), goal) && ge64(add64(base, im), goal);
}

// Selection among the n fetched entries with key >= floor_key (see the file comment).
fn select_in_bin(mode: u32, n: u32, floor_key: u32, rank: u32, base: vec2<u32>, goal: vec2<u32>, ln: Lanes) -> Sel {
    if (n <= WG) {
        // Every eligible entry measures what lies at or above its key.
        if (ln.lid == 0u) {
            atomicStore(&p_max, 0u);
            atomicStore(&p_min, NO_INDEX);
        }
        var k = 0u;
        if (ln.lid < n) {
            k = f_key[ln.lid];
            f_w[ln.lid] = weight(k);
        }
        workgroupBarrier();
        var ic = 0u;
        var ec = 0u;
        var im = vec2<u32>(0u);
        var em = vec2<u32>(0u);
        if (ln.lid < n && k >= floor_key) {
            for (var j = 0u; j < n; j++) {
                let kj = f_key[j];
                if (kj >= k) {
                    ic += 1u;
                    im = add64(im, f_w[j]);
                    if (kj > k) {
                        ec += 1u;
                        em = add64(em, f_w[j]);
                    }
                }
            }
            if (hits(mode, rank, base, goal, ec, ic, em, im)) {
                atomicMax(&p_max, k);
            }
            atomicMin(&p_min, k);
        }
        workgroupBarrier();
        if (ln.lid == 0u) {
            // No hit is unreachable (the weights equal sample_histogram's): the lowest level.
            let hi = atomicLoad(&p_max);
            pick_bin = select(hi, atomicLoad(&p_min), hi == 0u);
        }
        let key = uni(workgroupUniformLoad(&pick_bin));
        if (ln.lid < n && k == key && k >= floor_key) {
            atomicMin(&p_min, ln.lid);
        }
        workgroupBarrier();
        if (ln.lid == atomicLoad(&p_min)) {
            pick.incl_m = im;
        }
        return Sel(key, uni2(workgroupUniformLoad(&pick).incl_m));
    }

    // Radix select, 8 bits a round from the top; digits in scan order q = 255 - digit, DPT
    // consecutive positions a thread.
    var prefix = 0u;
    var r = rank;
    var above = vec2<u32>(0u);  // weight of eligible entries above the current key range
    var at = vec2<u32>(0u);
    for (var round = 0u; round < 4u; round++) {
        let shift = 24u - 8u * round;
        var mask = 0u;
        if (round > 0u) {
            mask = 0xFFFFFFFFu << (32u - 8u * round);
        }
        for (var d = ln.lid; d < 256u; d += WG) {
            atomicStore(&r_cnt[d], 0u);
            atomicStore(&r_lo[d], 0u);
            atomicStore(&r_hi[d], 0u);
        }
        if (ln.lid == 0u) {
            pick.q = NO_INDEX;
        }
        workgroupBarrier();
        for (var j = ln.lid; j < n; j += WG) {
            let k = fetched[fbase + j].x;
            if (k >= floor_key && (k & mask) == prefix) {
                let dg = (k >> shift) & 255u;
                atomicAdd(&r_cnt[dg], 1u);
                let q = weight(k);
                if (q.x != 0u || q.y != 0u) {
                    let old = atomicAdd(&r_lo[dg], q.x);
                    let hi = q.y + select(0u, 1u, old + q.x < old);
                    if (hi != 0u) {
                        atomicAdd(&r_hi[dg], hi);
                    }
                }
            }
        }
        workgroupBarrier();
        var tc = 0u;
        var tm = vec2<u32>(0u);
        for (var t = 0u; t < DPT; t++) {
            let dg = 255u - (ln.pos * DPT + t);
            tc += atomicLoad(&r_cnt[dg]);
            tm = add64(tm, vec2<u32>(atomicLoad(&r_lo[dg]), atomicLoad(&r_hi[dg])));
        }
        let sc = wg_scan(tc, tm, ln);
        var ic = sc.c - tc;
        var im = add64(above, sub64(sc.m, tm));
        var last_nonempty = 0u;
        for (var t = 0u; t < DPT; t++) {
            let qpos = ln.pos * DPT + t;
            let dg = 255u - qpos;
            let c = atomicLoad(&r_cnt[dg]);
            let m = vec2<u32>(atomicLoad(&r_lo[dg]), atomicLoad(&r_hi[dg]));
            let ec = ic;
            let em = im;
            ic += c;
            im = add64(im, m);
            if (c != 0u && hits(mode, r, base, goal, ec, ic, em, im)) {
                pick = Pick(qpos, ec, em, im);
            }
            if (c != 0u) {
                last_nonempty = qpos + 1u;
            }
        }
        var pk = workgroupUniformLoad(&pick);
        pk = Pick(uni(pk.q), uni(pk.excl_c), uni2(pk.excl_m), uni2(pk.incl_m));
        if (pk.q == NO_INDEX) {
            // Unreachable (see above): the lowest non-empty digit.
            let qlast = wg_max(last_nonempty, ln) - 1u;
            var ec = sc.c - tc;
            var em = add64(above, sub64(sc.m, tm));
            for (var t = 0u; t < DPT; t++) {
                let qpos = ln.pos * DPT + t;
                let dg = 255u - qpos;
                let c = atomicLoad(&r_cnt[dg]);
                let m = vec2<u32>(atomicLoad(&r_lo[dg]), atomicLoad(&r_hi[dg]));
                if (qpos == qlast) {
                    pick = Pick(qpos, ec, em, add64(em, m));
                }
                ec += c;
                em = add64(em, m);
            }
            pk = workgroupUniformLoad(&pick);
            pk = Pick(uni(pk.q), uni(pk.excl_c), uni2(pk.excl_m), uni2(pk.incl_m));
        }
        prefix |= (255u - pk.q) << shift;
        r -= pk.excl_c;
        above = pk.excl_m;
        at = pk.incl_m;
    }
    return Sel(prefix, at);
}

// ceil(z * p) exactly, for 0 < p < 1 and z < 2^64 (z * mantissa needs 88 bits).
fn ceil_mul(z: vec2<u32>, p: f32) -> vec2<u32> {
    let pb = bitcast<u32>(p);
    let e = (pb >> 23u) & 0xFFu;
    var mant = pb & 0x007FFFFFu;
    var sh = 149u;  // p = mant * 2^-sh
    if (e != 0u) {
        mant |= 0x00800000u;
        sh = 150u - e;
    }
    let a = mulhilo(z.x, mant);
    let b = mulhilo(z.y, mant);
    let x1 = a.x + b.y;
    var wd = array<u32, 4>(a.y, x1, b.x + select(0u, 1u, x1 < a.x), 0u);
    if (sh >= 96u) {
        return vec2<u32>(select(0u, 1u, (wd[0] | wd[1] | wd[2]) != 0u), 0u);
    }
    let ws = sh / 32u;
    let bs = sh % 32u;
    var rem = false;
    for (var i = 0u; i < ws; i++) {
        rem = rem || wd[i] != 0u;
    }
    var q: vec2<u32>;
    if (bs == 0u) {
        q = vec2<u32>(wd[ws], wd[ws + 1u]);
    } else {
        rem = rem || (wd[ws] & ((1u << bs) - 1u)) != 0u;
        let w2 = select(0u, wd[min(ws + 2u, 3u)], ws + 2u < 4u);
        q = vec2<u32>((wd[ws] >> bs) | (wd[ws + 1u] << (32u - bs)),
                      (wd[ws + 1u] >> bs) | (w2 << (32u - bs)));
    }
    if (rem) {
        q = add64(q, vec2<u32>(1u, 0u));
    }
    return q;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, ids: LaneIds) {
    let ln = lanes(ids);
    let lid = ln.lid;
    let r = wid.x + wid.y * nwg.x;
    if (r >= info.rows) {
        return;
    }
    fr_zero = info.zero;
    row = r;
    groups = info.groups;
    fbase = r * info.vocab;
    let p = params[r];
    let ngroups = info.groups;
    let sampling = p.mode != MODE_GREEDY;

    // The row's histogram, loaded with the partials (one round trip), BPT bins a thread.
    let hb = r * NBINS * HW;
    var hc: array<u32, BPT>;
    var hm: array<vec2<u32>, BPT>;
    for (var q = 0u; q < BPT; q++) {
        let b = ln.pos * BPT + q;
        hc[q] = 0u;
        hm[q] = vec2<u32>(0u);
        if (sampling && b < NBINS) {
            let h = hb + HW * b;
            hc[q] = hist[h];
            hm[q] = join_parts(vec4<u32>(hist[h + 1u], hist[h + 2u], hist[h + 3u], hist[h + 4u]));
        }
    }

    // Row statistics from the partials.
    var st = stats_empty();
    for (var g = lid; g < ngroups; g += WG) {
        st = stats_combine(st, unpack_stats(partials[r * ngroups + g]));
    }
    let rs = wg_stats(st, ln);
    if (lid == 0u) {
        put_status(p, r, (rs.inf & FLAG_NON_FINITE) != 0u);
    }
    let pos_inf = (rs.inf & FLAG_POS_INF) != 0u;
    if (!sampling || pos_inf || rs.count == 0u) {
        if (lid == 0u) {
            // Greedy and +inf: the argmax of the raw logits; no candidate: 0. With a token
            // mask: all three the masked argmax (sample_stats skipped the disallowed tokens).
            var t = select(rs.lidx, 0u, rs.lidx == NO_INDEX);
            if (sampling && !pos_inf && p.mask == 0u) {
                t = 0u;
            }
            put_id(p, r, t);
        }
    } else {
        sample(p, rs, hc, hm, ln);
    }
}

// The sampling path of main (a function, not code after an early return: some drivers run
// the code after a return masked instead of skipping it).
fn sample(p: Params, rs: Stats, hc: array<u32, BPT>, hm: array<vec2<u32>, BPT>, ln: Lanes) {
    let lid = ln.lid;
    let r = row;
    mx = from_key(rs.skey);

    // Cumulative bin counts and weights.
    var ac = 0u;
    var am = vec2<u32>(0u);
    for (var q = 0u; q < BPT; q++) {
        let b = ln.pos * BPT + q;
        ac += hc[q];
        am = add64(am, hm[q]);
        c_cnt[b] = ac;
        c_mass[b] = am;
    }
    let sc = wg_scan(ac, am, ln);
    let ex_c = sc.c - ac;
    let ex_m = sub64(sc.m, am);
    for (var q = 0u; q < BPT; q++) {
        let b = ln.pos * BPT + q;
        c_cnt[b] += ex_c;
        c_mass[b] = add64(c_mass[b], ex_m);
    }
    workgroupBarrier();

    var theta = 0u;            // key threshold of top-k / top-p (0: none)
    var b_theta = NO_INDEX;    // its bin
    var kbin = TAIL;           // bins below kbin are wholly in K1
    var z = sc.total_m;        // weight of K1
    var fetched_bin = NO_INDEX;
    var n = 0u;
    let use_k = p.top_k > 0u && p.top_k < rs.count;
    let use_p = p.top_p < 1.0;
    // b*: the first bin not wholly kept (capped at the window). It is known before the last
    // selection runs, and so are the prefix records the draw needs: they load meanwhile.
    var b_star = min(bin_of(p.ln_min_p), WIN);
    var rec = vec2<u32>(0u, NO_INDEX);
    if (!use_k && !use_p) {
        rec = records(b_star, lid);
    }

    // Jobs 0 (top-k), 1 (top-p), 2 (fetch bin b*): only the needed range runs.
    var first_job = 2u;
    if (use_p) {
        first_job = 1u;
    }
    if (use_k) {
        first_job = 0u;
    }
    var end_job = 2u;
    if (use_k || use_p || bin_of(p.ln_min_p) < WIN) {
        end_job = 3u;
    }
    for (var job = first_job; job < end_job; job++) {
        var bin = NO_INDEX;
        var bn = 0u;  // entries in `bin`
        var mode = RANK;
        var rank = 0u;
        var floor_key = 0u;
        var base = vec2<u32>(0u);
        var goal = vec2<u32>(0u);
        if (job == 0u && use_k) {
            // Top-k: the bin where the cumulative count reaches k (bin, count before it, count).
            for (var q = 0u; q < BPT; q++) {
                let b = ln.pos * BPT + q;
                let prev = cum_c(b - 1u);
                if (b < NBINS && prev < p.top_k && p.top_k <= c_cnt[b]) {
                    pickb = vec4<u32>(b, prev, c_cnt[b] - prev, 0u);
                }
            }
            let pk = workgroupUniformLoad(&pickb);
            kbin = uni(pk.x);
            if (!use_p) {
                b_star = min(b_star, kbin);
                rec = records(b_star, lid);
            }
            if (kbin < TAIL && (use_p || kbin < WIN)) {
                bin = kbin;
                bn = uni(pk.z);
                rank = p.top_k - uni(pk.y);
            } else {
                // t_k is in the tail (weight 0) or below the window with top-p off: the winner
                // does not depend on its exact value.
                z = uni2(workgroupUniformLoad(&c_mass[kbin]));
            }
        }
        if (job == 1u && use_p) {
            // Top-p: the bin where K1's cumulative weight (c_mass below kbin, z from kbin on)
            // reaches the goal (bin, count, weight before it).
            goal = ceil_mul(z, p.top_p);
            for (var q = 0u; q < BPT; q++) {
                let b = ln.pos * BPT + q;
                var prev = z;
                if (b == 0u) {
                    prev = vec2<u32>(0u);
                } else if (b - 1u < kbin) {
                    prev = c_mass[b - 1u];
                }
                var cur = z;
                if (b < kbin) {
                    cur = c_mass[b];
                }
                if (b < NBINS && !ge64(prev, goal) && ge64(cur, goal)) {
                    pickb = vec4<u32>(b, c_cnt[b] - cum_c(b - 1u), prev.x, prev.y);
                }
            }
            let pk = workgroupUniformLoad(&pickb);
            let pbin = uni(pk.x);
            b_star = min(b_star, pbin);
            rec = records(b_star, lid);
            if (pbin < WIN) {
                bin = pbin;
                bn = uni(pk.y);
                mode = LEVEL;
                if (pbin == b_theta) {
                    floor_key = theta;
                }
                base = uni2(pk.zw);
            }
        }
        if (job == 2u && b_star < WIN) {
            bin = b_star;
            bn = n;
            if (bin != fetched_bin) {
                bn = bin_count(bin);
            }
        }
        if (bin != NO_INDEX) {
            if (bin != fetched_bin) {
                fetch(bin, bn, ln);
                fetched_bin = bin;
                n = bn;
            }
            if (job < 2u) {
                let s = select_in_bin(mode, n, floor_key, rank, base, goal, ln);
                theta = s.key;
                b_theta = bin;
                if (job == 0u) {
                    z = add64(cum_m(kbin - 1u), s.mass);
                }
            }
        }
    }

    // The draw: the prefix records for the bins above b*, then the entries of bin b* that pass
    // the thresholds, with their Gumbel keys computed as sample_histogram does.
    var bk = rec.x;
    var bi = rec.y;
    if (b_star < WIN) {
        for (var j = lid; j < n; j += WG) {
            let e = entry(j, n);
            let d = fr(fr(from_key(e.x)) - mx);
            if (e.x >= theta && d >= p.ln_min_p) {
                let block = philox_block(p.seed_lo, p.seed_hi, p.step, p.stream, e.y);
                let k = okey(bitcast<u32>(fr(d + gumbel(bits_to_unit(block[e.y & 3u])))));
                if (better(k, e.y, bk, bi)) {
                    bk = k;
                    bi = e.y;
                }
            }
        }
    }
    let best = wg_argmax(bk, bi, ln);
    if (lid == 0u) {
        put_id(p, r, best.y);
    }
}
