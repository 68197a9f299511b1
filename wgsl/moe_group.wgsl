// moe_group: the slots of a mixture-of-experts pass grouped by expert (src/ops/moe.rs), for the
// grouped expert projections of prefill (matvec_quant_batch.wgsl with GROUPED): the slots of
// each expert in a run of their own, cut into tiles of at most TB slots, so that a workgroup
// dequantizes a unit of its expert's rows once for a tile of slots instead of once per slot.
//   order: groups[0 .. S): the slots s (ids[s] clamped to the stack, as the per-slot kernels
//          read it) by expert, expert 0's first;
//   tiles: groups[S + 3 i ..][..3] = (expert, first place in the order, count <= TB) for the
//          tiles i < the pass's tile count, expert by expert; the other tiles up to max_tiles
//          get count 0 (the grouped kernel's workgroups of those tiles return at once).
// Within an expert the slots come in the order their threads' atomics land, which may differ
// from run to run: the grouped kernel's sums of a slot do not depend on the other slots of its
// tile (matvec_quant_batch's batch invariance), so the outputs do not either.
// One workgroup of 256 threads: the counts in workgroup atomics, exclusive scans of the counts
// and of the tiles per expert (each thread a run of ceil(E / 256) experts, then a scan over the
// 256 runs), the tile table, then the scatter. Workgroup memory: 3 · ME + 2 · 256 words
// (14 KiB).
// Rust: src/ops/moe.rs moe_group
#define TB 8
#define ME 1024

struct Params {
    slots: u32,      // S
    stack: u32,      // E: experts in the stack (ids past it read the last)
    max_tiles: u32,  // tiles the table holds: ceil(S / TB) + min(E, S)
    _pad: u32,
}

@group(0) @binding(0) var<storage, read> ids: array<u32>;            // (S) each slot's expert
@group(0) @binding(1) var<storage, read_write> groups: array<u32>;   // (S + 3 max_tiles): order, then tiles
@group(0) @binding(2) var<uniform> p: Params;

var<workgroup> count: array<atomic<u32>, {{ME}}>;  // (E) slots of each expert, later the places taken
var<workgroup> first: array<u32, {{ME}}>;          // (E) the expert's first place in the order
var<workgroup> tile0: array<u32, {{ME}}>;          // (E) the expert's first tile
var<workgroup> part: array<vec2<u32>, 256>;        // (256) the runs' (slots, tiles), then their scan

fn expert(s: u32) -> u32 {
    return min(ids[s], p.stack - 1u);
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lid: u32) {
    for (var e = lid; e < p.stack; e += 256u) {
        atomicStore(&count[e], 0u);
    }
    workgroupBarrier();
    for (var s = lid; s < p.slots; s += 256u) {
        atomicAdd(&count[expert(s)], 1u);
    }
    workgroupBarrier();
    // This thread's run of experts: its (slots, tiles), then the inclusive scan over the runs.
    let per = (p.stack + 255u) / 256u;
    let e0 = min(lid * per, p.stack);
    let e1 = min(e0 + per, p.stack);
    var sum = vec2<u32>(0u);
    for (var e = e0; e < e1; e++) {
        let c = atomicLoad(&count[e]);
        sum += vec2<u32>(c, (c + {{TB}}u - 1u) / {{TB}}u);
    }
    part[lid] = sum;
    workgroupBarrier();
    for (var d = 1u; d < 256u; d <<= 1u) {
        var v = part[lid];
        if (lid >= d) {
            v += part[lid - d];
        }
        workgroupBarrier();
        part[lid] = v;
        workgroupBarrier();
    }
    var run = vec2<u32>(0u);
    if (lid > 0u) {
        run = part[lid - 1u];
    }
    for (var e = e0; e < e1; e++) {
        let c = atomicLoad(&count[e]);
        first[e] = run.x;
        tile0[e] = run.y;
        run += vec2<u32>(c, (c + {{TB}}u - 1u) / {{TB}}u);
    }
    let tiles = part[255].y;
    workgroupBarrier();
    // The tile table, then the unused tiles' counts.
    for (var e = lid; e < p.stack; e += 256u) {
        let c = atomicLoad(&count[e]);
        for (var i = 0u; i * {{TB}}u < c; i++) {
            let at = p.slots + 3u * (tile0[e] + i);
            groups[at] = e;
            groups[at + 1u] = first[e] + i * {{TB}}u;
            groups[at + 2u] = min({{TB}}u, c - i * {{TB}}u);
        }
    }
    for (var i = tiles + lid; i < p.max_tiles; i += 256u) {
        let at = p.slots + 3u * i;
        groups[at] = 0u;
        groups[at + 1u] = 0u;
        groups[at + 2u] = 0u;
    }
    // The order: the counts again from 0, each slot takes its expert's next place.
    workgroupBarrier();
    for (var e = lid; e < p.stack; e += 256u) {
        atomicStore(&count[e], 0u);
    }
    workgroupBarrier();
    for (var s = lid; s < p.slots; s += 256u) {
        let e = expert(s);
        groups[first[e] + atomicAdd(&count[e], 1u)] = s;
    }
}
