// quant_nibble_vals: the weight values of a unit of 32 plain 4-bit elements, for the types whose
// unit is 16 qs bytes holding elements l (low nibble) and l + 16 (high nibble) with no offset
// folded into q_vals: Q4_1 and Q4_K (include/quant_q4_1.wgsl, include/quant_q4_k.wgsl, which
// include it where their q_vals stands; pasted with their prefix in the mixed matvec).
alias QV = QV32;

fn q_vals(r: QRaw) -> QV {
    let c = vec4<f32>(Q_2P23);
    return QV(mat4x4<f32>(q_lo(r.qs.x) - c, q_lo(r.qs.y) - c, q_lo(r.qs.z) - c, q_lo(r.qs.w) - c),
              mat4x4<f32>(q_hi(r.qs.x) - c, q_hi(r.qs.y) - c, q_hi(r.qs.z) - c, q_hi(r.qs.w) - c));
}
