// matvec_reduce: the end of a matvec pass (matvec.wgsl, matvec_quant.wgsl): the TPR lanes of a row
// group each hold partial sums of its 4 rows for TOK tokens (acc_j: token j, component r = row r);
// mv_reduce returns, for the lane that stores output (row r = lane % 4, token j = lane / 4), the
// total. With SUBGROUP: subgroupAdd, then each storing lane adds its output's TPR / sg_size
// subgroup sums through workgroup memory (the host makes TPR a multiple of every possible subgroup
// size; subgroups are contiguous runs of local_invocation_index). Without: two levels of 8 and
// TPR / 8 through workgroup memory (TPR >= 8). Call from uniform control flow; the caller puts a
// barrier between passes (`red` is rewritten by the next one). The including kernel defines WG,
// TPR, TOK (and TOK4 when TOK = 4).

// Partial sums: slot s of a workgroup holds TOK vec4 at [s · TOK + j] (token j, component r for
// row r of a row group).
var<workgroup> red: array<vec4<f32>, {{WG}} * {{TOK}}>;

fn mv_reduce(acc0: vec4<f32>, acc1: vec4<f32>, acc2: vec4<f32>, acc3: vec4<f32>, lid: u32, sg_size: u32,
             sg_lane: u32) -> f32 {
    let grp = lid / {{TPR}}u;
    let lane = lid % {{TPR}}u;
    let out_r = lane % 4u;
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
    var sum = 0.0;
    if (out_j < {{TOK}}u) {
        for (var g = 0u; g < per_group; g++) {
            sum += red[(grp * per_group + g) * {{TOK}}u + out_j][out_r];
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
    var sum = 0.0;
    if (out_j < {{TOK}}u) {
        for (var g = 0u; g < {{TPR}}u / 8u; g++) {
            sum += red[(first + 8u * g) * {{TOK}}u + out_j][out_r];
        }
    }
#endif
    return sum;
}
