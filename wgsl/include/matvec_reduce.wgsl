// matvec_reduce: the end of a matvec pass (matvec.wgsl, matvec_quant.wgsl): the TPR lanes of a row
// group each hold partial sums of its 4 rows for TOK tokens (acc_j: token j, component r = row r);
// mv_reduce returns, for the lane that stores output (row r = lane % 4, token j = lane / 4), the
// totals of all 4 rows of its token (the lane stores component r, or, with GLU, lanes r = 0, 1
// combine the (gate, up) row pairs (0, 1) and (2, 3): mv_store). With SUBGROUP: subgroupAdd, then each storing lane adds its output's TPR / sg_size
// subgroup sums through workgroup memory (the host makes TPR a multiple of every possible subgroup
// size; subgroups are contiguous runs of local_invocation_index). Without: two levels of 8 and
// TPR / 8 through workgroup memory (TPR >= 8). Call from uniform control flow; the caller puts a
// barrier between passes (`red` is rewritten by the next one). The including kernel defines WG,
// TPR, TOK (and TOK4 when TOK = 4).

// Partial sums: slot s of a workgroup holds TOK vec4 at [s · TOK + j] (token j, component r for
// row r of a row group).
var<workgroup> red: array<vec4<f32>, {{WG}} * {{TOK}}>;

fn mv_reduce(acc0: vec4<f32>, acc1: vec4<f32>, acc2: vec4<f32>, acc3: vec4<f32>, lid: u32, sg_size: u32,
             sg_lane: u32) -> vec4<f32> {
    let grp = lid / {{TPR}}u;
    let lane = lid % {{TPR}}u;
    let out_j = lane / 4u;
#ifdef SUBGROUP
    // One sum per subgroup, then each storing lane adds its output's TPR / sg_size sums.
    let s0 = subgroupAdd(acc0);
#ifdef TOK4
    let s1 = subgroupAdd(acc1);
    let s2 = subgroupAdd(acc2);
    let s3 = subgroupAdd(acc3);
#endif
    if (sg_lane == 0u) {
        let slot = (lid / sg_size) * {{TOK}}u;
        red[slot] = s0;
#ifdef TOK4
        red[slot + 1u] = s1;
        red[slot + 2u] = s2;
        red[slot + 3u] = s3;
#endif
    }
    workgroupBarrier();
    let per_group = {{TPR}}u / sg_size;
    var sum = vec4<f32>(0.0);
    if (out_j < {{TOK}}u) {
        for (var g = 0u; g < per_group; g++) {
            sum += red[(grp * per_group + g) * {{TOK}}u + out_j];
        }
    }
#else
    // Two levels through workgroup memory: lane l < TPR / 8 adds the 8 slots from 8·l of its
    // row group into slot 8·l, then each storing lane adds the TPR / 8 of them.
    let slot = lid * {{TOK}}u;
    red[slot] = acc0;
#ifdef TOK4
    red[slot + 1u] = acc1;
    red[slot + 2u] = acc2;
    red[slot + 3u] = acc3;
#endif
    workgroupBarrier();
    let first = grp * {{TPR}}u;
    if (lane < {{TPR}}u / 8u) {
        let s8 = (first + 8u * lane) * {{TOK}}u;
        for (var j = 0u; j < {{TOK}}u; j++) {
            var v = red[s8 + j];
            for (var m = 1u; m < 8u; m++) {
                v += red[s8 + m * {{TOK}}u + j];
            }
            red[s8 + j] = v;
        }
    }
    workgroupBarrier();
    var sum = vec4<f32>(0.0);
    if (out_j < {{TOK}}u) {
        for (var g = 0u; g < {{TPR}}u / 8u; g++) {
            sum += red[(first + 8u * g) * {{TOK}}u + out_j];
        }
    }
#endif
    return sum;
}

// Stores a lane's output after mv_reduce: `sums` = the 4 rows from `row0` of token `t` (T
// tokens, N rows); the lane is row r = lane % 4 of token j = lane / 4. Plain: y[t, row0 + r] =
// store_value(sum r). GLU (rows are (gate, up) pairs, N / 2 outputs): lanes r = 0, 1 write
// act(gate) · up of pair r to output column row0 / 2 + r. The including kernel defines
// store(t, column, value) (bias, accumulation) and, with GLU, act (include/activation.wgsl).
fn mv_store(sums: vec4<f32>, lane: u32, t0: u32, row0: u32, n: u32, t: u32) {
    let out_r = lane % 4u;
    let out_j = lane / 4u;
    if (out_j >= {{TOK}}u || t0 + out_j >= t) {
        return;
    }
#ifdef GLU
    if (out_r < 2u && row0 + 2u * out_r < n) {
        let pair = select(sums.xy, sums.zw, out_r == 1u);
        store(t0 + out_j, row0 / 2u + out_r, act(pair.x) * pair.y);
    }
#else
    if (row0 + out_r < n) {
        store(t0 + out_j, row0 + out_r, sums[out_r]);
    }
#endif
}
