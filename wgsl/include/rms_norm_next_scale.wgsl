// rms_norm_next_scale: statements pasted into rms_norm.wgsl (NEXT), once in the register path
// (REG) and once in the other (exclusive branches: one paste survives): the next norm's scale of
// the updated row, scale2 = 1 / sqrt(mean(s2) + eps), from each thread's sum of squares s2.
    let total2 = row_sum(s2, lid
#ifdef SUBGROUP
        , sg_lane, sg_id, sg_count
#endif
        );
    let scale2 = inverseSqrt(total2 / f32(n) + p.eps);
