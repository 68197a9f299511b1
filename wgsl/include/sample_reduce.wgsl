// sample_reduce: workgroup reductions and scans for the sampling kernels (WG = SEG * SEG threads,
// all of them calling from uniform control flow). Written for few barriers (each costs a full
// workgroup rendezvous, and a lot more on CPU implementations):
//   - reductions: subgroup operations under SUBGROUP (any subgroup size: one partial per
//     subgroup, combined by thread 0), else a two-level "raking" reduction (SEG threads each
//     combine SEG values, then thread 0 combines their SEG results);
//   - scans: raking in shared memory (SEG segments of SEG scanned serially, then the segment
//     totals), in local-index order (which subgroups do not promise to follow).
// Every uniform result comes back through workgroupUniformLoad, so callers may branch on it
// around barriers. Needs include "sample_common" first.

// Marks a workgroup-uniform value as uniform to the compiler: a subgroup broadcast under
// SUBGROUP (free on GPUs, and it lets drivers that run workgroups as masked SIMD branch instead
// of executing both sides), the value itself otherwise.
fn uni(x: u32) -> u32 {
#ifdef SUBGROUP
    return subgroupBroadcastFirst(x);
#else
    return x;
#endif
}

fn uni2(x: vec2<u32>) -> vec2<u32> {
#ifdef SUBGROUP
    return subgroupBroadcastFirst(x);
#else
    return x;
#endif
}

struct Lanes {
    lid: u32,
    sg_lane: u32,
    sg_id: u32,
    sg_count: u32,
}

// What sample_stats computes per chunk and the later passes combine per row.
struct Stats {
    lkey: u32,   // largest order key of the raw logits (NaN as -inf)
    lidx: u32,   // lowest index holding it
    skey: u32,   // largest order key of s = l * inv_temperature (NaN as -inf)
    count: u32,  // candidates: s > -inf
    inf: u32,    // 1 when some s is +inf
}

fn stats_combine(a: Stats, b: Stats) -> Stats {
    var r = a;
    if (better(b.lkey, b.lidx, a.lkey, a.lidx)) {
        r.lkey = b.lkey;
        r.lidx = b.lidx;
    }
    r.skey = max(a.skey, b.skey);
    r.count = a.count + b.count;
    r.inf = a.inf | b.inf;
    return r;
}

fn stats_empty() -> Stats {
    return Stats(0u, NO_INDEX, KEY_NEG_INF, 0u, 0u);
}

// A partial as sample_stats stores it: (lkey, lidx, skey, count | inf << 31).
fn unpack_stats(v: vec4<u32>) -> Stats {
    return Stats(v.x, v.y, v.z, v.w & 0x7FFFFFFFu, v.w >> 31u);
}

var<workgroup> red_k: array<u32, WG>;
var<workgroup> red_i: array<u32, WG>;
var<workgroup> red_m: array<vec2<u32>, WG>;
var<workgroup> red_st: array<Stats, WG>;
var<workgroup> seg_k: array<u32, SEG>;
var<workgroup> seg_i: array<u32, SEG>;
var<workgroup> seg_m: array<vec2<u32>, SEG>;
var<workgroup> red_out: vec2<u32>;
var<workgroup> red_out_m: vec4<u32>;
var<workgroup> red_out_st: Stats;

fn wg_stats(v: Stats, ln: Lanes) -> Stats {
#ifdef SUBGROUP
    let lk = subgroupMax(v.lkey);
    let li = subgroupMin(select(NO_INDEX, v.lidx, v.lkey == lk));
    let sk = subgroupMax(v.skey);
    let c = subgroupAdd(v.count);
    let f = subgroupOr(v.inf);
    if (ln.sg_lane == 0u) {
        red_st[ln.sg_id] = Stats(lk, li, sk, c, f);
    }
    workgroupBarrier();
    if (ln.lid == 0u) {
        var r = red_st[0];
        for (var s = 1u; s < ln.sg_count; s++) {
            r = stats_combine(r, red_st[s]);
        }
        red_out_st = r;
    }
#else
    red_st[ln.lid] = v;
    workgroupBarrier();
    if (ln.lid < SEG) {
        var r = red_st[ln.lid * SEG];
        for (var s = 1u; s < SEG; s++) {
            r = stats_combine(r, red_st[ln.lid * SEG + s]);
        }
        red_st[ln.lid * SEG] = r;
    }
    workgroupBarrier();
    if (ln.lid == 0u) {
        var r = red_st[0];
        for (var s = 1u; s < SEG; s++) {
            r = stats_combine(r, red_st[s * SEG]);
        }
        red_out_st = r;
    }
#endif
    let r = workgroupUniformLoad(&red_out_st);
    return Stats(uni(r.lkey), uni(r.lidx), uni(r.skey), uni(r.count), uni(r.inf));
}

// (largest key, smallest index holding it) over the workgroup.
fn wg_argmax(key: u32, idx: u32, ln: Lanes) -> vec2<u32> {
#ifdef SUBGROUP
    let mk = subgroupMax(key);
    let mi = subgroupMin(select(NO_INDEX, idx, key == mk));
    if (ln.sg_lane == 0u) {
        red_k[ln.sg_id] = mk;
        red_i[ln.sg_id] = mi;
    }
    workgroupBarrier();
    if (ln.lid == 0u) {
        var bk = red_k[0];
        var bi = red_i[0];
        for (var s = 1u; s < ln.sg_count; s++) {
            if (better(red_k[s], red_i[s], bk, bi)) {
                bk = red_k[s];
                bi = red_i[s];
            }
        }
        red_out = vec2<u32>(bk, bi);
    }
#else
    red_k[ln.lid] = key;
    red_i[ln.lid] = idx;
    workgroupBarrier();
    if (ln.lid < SEG) {
        var bk = red_k[ln.lid * SEG];
        var bi = red_i[ln.lid * SEG];
        for (var s = 1u; s < SEG; s++) {
            let k = red_k[ln.lid * SEG + s];
            let i = red_i[ln.lid * SEG + s];
            if (better(k, i, bk, bi)) {
                bk = k;
                bi = i;
            }
        }
        seg_k[ln.lid] = bk;
        seg_i[ln.lid] = bi;
    }
    workgroupBarrier();
    if (ln.lid == 0u) {
        var bk = seg_k[0];
        var bi = seg_i[0];
        for (var s = 1u; s < SEG; s++) {
            if (better(seg_k[s], seg_i[s], bk, bi)) {
                bk = seg_k[s];
                bi = seg_i[s];
            }
        }
        red_out = vec2<u32>(bk, bi);
    }
#endif
    return uni2(workgroupUniformLoad(&red_out));
}

fn wg_max(v: u32, ln: Lanes) -> u32 {
    return wg_argmax(v, 0u, ln).x;
}

// 64-bit (lo, hi) sum (raking in both variants: subgroup adds do not carry).
fn wg_sum64(v: vec2<u32>, ln: Lanes) -> vec2<u32> {
    red_m[ln.lid] = v;
    workgroupBarrier();
    if (ln.lid < SEG) {
        var a = vec2<u32>(0u);
        for (var s = 0u; s < SEG; s++) {
            a = add64(a, red_m[ln.lid * SEG + s]);
        }
        seg_m[ln.lid] = a;
    }
    workgroupBarrier();
    if (ln.lid == 0u) {
        var a = vec2<u32>(0u);
        for (var s = 0u; s < SEG; s++) {
            a = add64(a, seg_m[s]);
        }
        red_out_m = vec4<u32>(a, 0u, 0u);
    }
    return uni2(workgroupUniformLoad(&red_out_m).xy);
}

struct Scan {
    c: u32,          // this thread's inclusive count
    m: vec2<u32>,    // this thread's inclusive mass
    total_c: u32,    // the totals (equal in every thread, but not known uniform: do not
    total_m: vec2<u32>, // branch on them around barriers)
}

// Inclusive prefix sums in local-index order of (count, 64-bit mass).
fn wg_scan(c: u32, m: vec2<u32>, ln: Lanes) -> Scan {
    red_k[ln.lid] = c;
    red_m[ln.lid] = m;
    workgroupBarrier();
    if (ln.lid < SEG) {
        var ac = 0u;
        var am = vec2<u32>(0u);
        for (var s = 0u; s < SEG; s++) {
            let j = ln.lid * SEG + s;
            ac += red_k[j];
            am = add64(am, red_m[j]);
            red_k[j] = ac;
            red_m[j] = am;
        }
        seg_k[ln.lid] = ac;
        seg_m[ln.lid] = am;
    }
    workgroupBarrier();
    if (ln.lid == 0u) {
        // Exclusive scan of the segment totals, in place; the grand total to red_out_m.
        var ac = 0u;
        var am = vec2<u32>(0u);
        for (var s = 0u; s < SEG; s++) {
            let tc = seg_k[s];
            let tm = seg_m[s];
            seg_k[s] = ac;
            seg_m[s] = am;
            ac += tc;
            am = add64(am, tm);
        }
        red_out_m = vec4<u32>(am, ac, 0u);
    }
    workgroupBarrier();
    let s = ln.lid / SEG;
    let mc = red_k[ln.lid] + seg_k[s];
    let mm = add64(red_m[ln.lid], seg_m[s]);
    let t = red_out_m;
    return Scan(mc, mm, t.z, t.xy);
}

// Exclusive prefix "best" in local-index order of (key, index) pairs (larger key, then smaller
// index: the `better` order); (0, NO_INDEX) for thread 0.
fn wg_scan_best_excl(k: u32, i: u32, ln: Lanes) -> vec2<u32> {
    red_k[ln.lid] = k;
    red_i[ln.lid] = i;
    workgroupBarrier();
    if (ln.lid < SEG) {
        // Exclusive within the segment, in place.
        var bk = 0u;
        var bi = NO_INDEX;
        for (var s = 0u; s < SEG; s++) {
            let j = ln.lid * SEG + s;
            let tk = red_k[j];
            let ti = red_i[j];
            red_k[j] = bk;
            red_i[j] = bi;
            if (better(tk, ti, bk, bi)) {
                bk = tk;
                bi = ti;
            }
        }
        seg_k[ln.lid] = bk;
        seg_i[ln.lid] = bi;
    }
    workgroupBarrier();
    if (ln.lid == 0u) {
        // Exclusive prefix best of the segment results, in place.
        var bk = 0u;
        var bi = NO_INDEX;
        for (var s = 0u; s < SEG; s++) {
            let tk = seg_k[s];
            let ti = seg_i[s];
            seg_k[s] = bk;
            seg_i[s] = bi;
            if (better(tk, ti, bk, bi)) {
                bk = tk;
                bi = ti;
            }
        }
    }
    workgroupBarrier();
    let s = ln.lid / SEG;
    var rk = red_k[ln.lid];
    var ri = red_i[ln.lid];
    if (better(seg_k[s], seg_i[s], rk, ri)) {
        rk = seg_k[s];
        ri = seg_i[s];
    }
    workgroupBarrier();
    return vec2<u32>(rk, ri);
}
