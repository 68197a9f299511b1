// stage_x16: x as the integer-dot-product (DP4) kernels meet it: per 32-element block a power-of-two
// scale d under its largest |x| and each element as round(x / d), a 16-bit two's complement value
// (|q| < 2^14 + 1), split into low and high bytes. Shared by matvec_quant (which stages into
// workgroup memory), quantize_x16, rms_norm's STAGE and attention_decode's STAGE8 (which stage into
// a buffer, once for every workgroup of the matvec that reads it). CPU twins: src/ops/matmul/gguf.rs `cpu::stage_x16` (the
// values) and `cpu::quantize_x16` (the buffer's words).

// 4 elements as 16-bit two's complement: their low bytes and their high bytes, packed.
fn x16_bytes(q: vec4<i32>) -> vec2<u32> {
    let w = bitcast<vec4<u32>>(q);
    return vec2<u32>(pack4xU8(w & vec4<u32>(0xFFu)), pack4xU8((w >> vec4<u32>(8u)) & vec4<u32>(0xFFu)));
}

// The block's scale from the bits of its largest |x| (NaN and inf have the largest bit patterns):
// (1 / d, d) with d = 2^(E - 140) for biased exponent E, so |x| / d < 2^14; blocks under 2^-113
// stage as 0, and non-finite ones get a NaN scale (the output turns non-finite, as the plain
// kernel's would).
fn stage_scale(bits: u32) -> vec2<f32> {
    let e = bits >> 23u;
    let big = e >= 14u;
    let inv = select(0.0, bitcast<f32>((267u - e) << 23u), big && e < 255u);
    let d = select(select(0.0, bitcast<f32>((e - 13u) << 23u), big), bitcast<f32>(0x7FC00000u), e >= 255u);
    return vec2<f32>(inv, d);
}

fn abs_bits(v: vec4<f32>) -> u32 {
    let b = bitcast<vec4<u32>>(abs(v));
    return max(max(b.x, b.y), max(b.z, b.w));
}

// One 32-element block v[0..8] as quantize_x16 lays it out (wgsl/quantize_x16.wgsl): the low bytes
// of elements 0..15 and 16..31, their high bytes, then bits of (d · Σ q over 0..15, over 16..31,
// d, 0).
fn stage_block(v: array<vec4<f32>, 8>) -> array<vec4<u32>, 5> {
    var m = 0u;
    for (var j = 0u; j < 8u; j++) {
        m = max(m, abs_bits(v[j]));
    }
    let sc = stage_scale(m);
    var lo: array<u32, 8>;
    var hi: array<u32, 8>;
    var sums = vec2<i32>(0);
    for (var j = 0u; j < 8u; j++) {
        let q = vec4<i32>(round(v[j] * sc.x));
        let b = x16_bytes(q);
        lo[j] = b.x;
        hi[j] = b.y;
        sums[j / 4u] += dot(q, vec4<i32>(1));
    }
    return array<vec4<u32>, 5>(vec4<u32>(lo[0], lo[1], lo[2], lo[3]), vec4<u32>(lo[4], lo[5], lo[6], lo[7]),
                               vec4<u32>(hi[0], hi[1], hi[2], hi[3]), vec4<u32>(hi[4], hi[5], hi[6], hi[7]),
                               vec4<u32>(bitcast<u32>(sc.y * f32(sums.x)), bitcast<u32>(sc.y * f32(sums.y)),
                                         bitcast<u32>(sc.y), 0u));
}

#ifdef SUBGROUP
#ifdef STAGE8
// A 32-element block staged by its eight threads, a vec4 each (an aligned run of eight lanes of
// a subgroup at least 8 wide: the host sets STAGE8 only so): the block's largest |x| and the
// 16-element sums by shuffles, the same values as stage_block. Every thread of the subgroup
// calls it (the shuffles); one with nothing to stage passes any v and stores nothing. Lane l of
// the eight stores lo and hi as words l and 8 + l of the block's 20, lane 0 also `tail` as words
// 16..19 (tail: bits of d · Σq over the lane's own half of the block, over the other half, d, 0;
// lane 0's own half is the first). The callers give a block to eight threads of consecutive local_invocation_index from a
// multiple of 8, taking them for an aligned run of lanes: subgroups made of consecutive indices of
// a 1-D workgroup, as NVIDIA, AMD, Intel, Apple and lavapipe make them (WGSL does not promise it;
// the tests, bit for bit against the CPU twin, would catch an adapter that differs).
struct Staged8 {
    lo: u32,
    hi: u32,
    tail: vec4<u32>,
}

fn stage_lanes8(v: vec4<f32>) -> Staged8 {
    var m = abs_bits(v);
    m = max(m, subgroupShuffleXor(m, 1u));
    m = max(m, subgroupShuffleXor(m, 2u));
    m = max(m, subgroupShuffleXor(m, 4u));
    let sc = stage_scale(m);
    let q = vec4<i32>(round(v * sc.x));
    let b = x16_bytes(q);
    var sum = dot(q, vec4<i32>(1));
    sum += subgroupShuffleXor(sum, 1u);
    sum += subgroupShuffleXor(sum, 2u);
    let other = subgroupShuffleXor(sum, 4u);
    let tail = vec4<u32>(bitcast<u32>(sc.y * f32(sum)), bitcast<u32>(sc.y * f32(other)), bitcast<u32>(sc.y), 0u);
    return Staged8(b.x, b.y, tail);
}

#ifdef XS_STORE
// (Kernels that stage into a buffer `xs: array<u32>` define XS_STORE.) v (lane `lane` of the eight
// holding a block) staged by stage_lanes8 into the block's 20 words from word `at` of xs: lo and hi
// as words lane and 8 + lane, lane 0 also the tail as words 16..19. Every thread of the subgroup
// calls it (the shuffles); one of a block past the end (inside false: the whole eight alike)
// stores nothing.
fn stage_store8(at: u32, lane: u32, v: vec4<f32>, inside: bool) {
    let st = stage_lanes8(select(vec4<f32>(0.0), v, inside));
    if (!inside) {
        return;
    }
    xs[at + lane] = st.lo;
    xs[at + 8u + lane] = st.hi;
    if (lane == 0u) {
        for (var w = 0u; w < 4u; w++) {
            xs[at + 16u + w] = st.tail[w];
        }
    }
}
#endif
#endif
#endif
