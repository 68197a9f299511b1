// sample_reduce: workgroup reductions and scans for the sampling kernels (WG = SEG * SEG threads,
// all of them calling from uniform control flow). Written for few barriers (each costs a full
// workgroup rendezvous, and a lot more on CPU implementations):
//   - reductions: subgroup operations under SUBGROUP (any subgroup size: one partial per
//     subgroup, combined by thread 0), else a two-level "raking" reduction (SEG threads each
//     combine SEG values, then thread 0 combines their SEG results);
//   - scans: under SUBGROUP, subgroup scans (one native inclusive add of (count, three 21-bit
//     parts of the 64-bit mass), shuffles for the (key, index) scan) and one rendezvous for the
//     subgroup totals; else raking in shared memory (SEG segments of SEG scanned serially, then
//     the segment totals). Scans run in `pos` order: the local index without subgroups,
//     sg_id * sg_size + sg_lane with them (subgroups do not promise to follow the local index;
//     with full subgroups, or one partial subgroup of lanes 0..WG-1, pos is a permutation of
//     the local indices). Callers split their data by `pos`.
//     (Raking is what CPU drivers like, but on a GPU its two serial 16-step chains cost ~1 us
//     a scan: the subgroup scans took the sampler from 38.4 to 34.4 us at 152k top-p on the
//     H100, BENCHMARKS.md.)
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
    sg_size: u32,
    pos: u32,       // this thread's place in scan order (see above)
}

// The entry points' thread builtins (one struct parameter: the kernels share it).
struct LaneIds {
    @builtin(local_invocation_index) lid: u32,
#ifdef SUBGROUP
    @builtin(subgroup_invocation_id) sg_lane: u32,
    @builtin(subgroup_id) sg_id: u32,
    @builtin(num_subgroups) sg_count: u32,
    @builtin(subgroup_size) sg_size: u32,
#endif
}

fn lanes(ids: LaneIds) -> Lanes {
#ifdef SUBGROUP
    return Lanes(ids.lid, ids.sg_lane, ids.sg_id, ids.sg_count, ids.sg_size, ids.sg_id * ids.sg_size + ids.sg_lane);
#else
    return Lanes(ids.lid, 0u, 0u, 1u, 1u, ids.lid);
#endif
}

// What sample_stats computes per chunk and the later passes combine per row.
struct Stats {
    lkey: u32,   // largest order key of the raw logits (NaN as -inf)
    lidx: u32,   // lowest index holding it
    skey: u32,   // largest order key of s = l * inv_temperature (NaN as -inf)
    count: u32,  // candidates: s > -inf
    inf: u32,    // flags: FLAG_POS_INF (some s is +inf) | FLAG_NON_FINITE (some raw logit is NaN or +-inf)
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

// A partial as sample_stats stores it: (lkey, lidx, skey, count | flags << 30); counts stay
// below 2^22 (MAX_VOCAB in src/sampling/device.rs).
fn pack_count_flags(count: u32, flags: u32) -> u32 {
    return count | (flags << 30u);
}

fn unpack_stats(v: vec4<u32>) -> Stats {
    return Stats(v.x, v.y, v.z, v.w & 0x3FFFFFFFu, v.w >> 30u);
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
#ifdef SUBGROUP
var<workgroup> sg_tot: array<vec4<u32>, WG>;  // per-subgroup scan totals

// A 64-bit mass below 2^63 as three 21-bit parts (bits 0-20, 21-41, 42-62): a workgroup's
// sums of them stay below 2^32, so native 32-bit subgroup adds carry nothing.
fn parts3(m: vec2<u32>) -> vec3<u32> {
    return vec3<u32>(m.x & 0x1FFFFFu, (m.x >> 21u) | ((m.y & 0x3FFu) << 11u), m.y >> 10u);
}

fn join3(p: vec3<u32>) -> vec2<u32> {
    let r = add64(vec2<u32>(p.x, 0u), vec2<u32>(p.y << 21u, p.y >> 11u));
    return add64(r, vec2<u32>(0u, p.z << 10u));
}
#endif

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

// Inclusive prefix sums in pos order of (count, 64-bit mass).
fn wg_scan(c: u32, m: vec2<u32>, ln: Lanes) -> Scan {
#ifdef SUBGROUP
    let v = vec4<u32>(c, parts3(m));
    let inc = subgroupInclusiveAdd(v);
    let tot = subgroupAdd(v);
    if (ln.sg_lane == 0u) {
        sg_tot[ln.sg_id] = tot;
    }
    workgroupBarrier();
    var before = vec4<u32>(0u);
    var all = vec4<u32>(0u);
    for (var s = 0u; s < ln.sg_count; s++) {
        let t = sg_tot[s];
        if (s < ln.sg_id) {
            before += t;
        }
        all += t;
    }
    workgroupBarrier();  // sg_tot is free again
    let x = inc + before;
    return Scan(x.x, join3(x.yzw), all.x, join3(all.yzw));
#else
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
#endif
}

// Exclusive prefix "best" in pos order of (key, index) pairs (larger key, then smaller
// index: the `better` order); (0, NO_INDEX) for pos 0.
fn wg_scan_best_excl(k: u32, i: u32, ln: Lanes) -> vec2<u32> {
#ifdef SUBGROUP
    // Inclusive within the subgroup (Kogge-Stone on shuffles), then shifted by one lane.
    var bk = k;
    var bi = i;
    for (var d = 1u; d < ln.sg_size; d <<= 1u) {
        let ok = subgroupShuffleUp(bk, d);
        let oi = subgroupShuffleUp(bi, d);
        if (ln.sg_lane >= d && better(ok, oi, bk, bi)) {
            bk = ok;
            bi = oi;
        }
    }
    var ek = subgroupShuffleUp(bk, 1u);
    var ei = subgroupShuffleUp(bi, 1u);
    if (ln.sg_lane == 0u) {
        ek = 0u;
        ei = NO_INDEX;
    }
    let mk = subgroupMax(k);
    let mi = subgroupMin(select(NO_INDEX, i, k == mk));
    if (ln.sg_lane == 0u) {
        sg_tot[ln.sg_id] = vec4<u32>(mk, mi, 0u, 0u);
    }
    workgroupBarrier();
    for (var s = 0u; s < ln.sg_id; s++) {
        let t = sg_tot[s];
        if (better(t.x, t.y, ek, ei)) {
            ek = t.x;
            ei = t.y;
        }
    }
    workgroupBarrier();
    return vec2<u32>(ek, ei);
#else
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
#endif
}
