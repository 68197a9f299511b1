// philox: the WGSL twin of src/sampling/philox.rs, bit for bit: Philox4x32-10 (Random123) with
// the 64-bit products emulated on 16-bit halves (WGSL has no 64-bit integers), the 23-bit
// uniform mapping, and the portable natural logarithm / Gumbel noise.
//
// Rounding barriers: naga emits no NoContraction decorations and Metal compiles with fast math,
// so a driver may fuse `a * b + c` into an FMA or reassociate sums, which changes the bits.
// `fr(x)` forces `x` to be a rounded f32: it XORs the bits with `fr_zero`, a 0 the entry point
// loads from a storage buffer at run time (so no compiler can prove it is 0 and fold it away).
// Every f32 operation of the spec whose result feeds an add or a multiply goes through `fr`.
// The including entry point must set `fr_zero` before calling anything here.

var<private> fr_zero: u32;

fn fr(x: f32) -> f32 {
    return bitcast<f32>(bitcast<u32>(x) ^ fr_zero);
}

const PHILOX_M0: u32 = 0xD2511F53u;
const PHILOX_M1: u32 = 0xCD9E8D57u;
const PHILOX_W0: u32 = 0x9E3779B9u;
const PHILOX_W1: u32 = 0xBB67AE85u;

// (hi, lo) of the 64-bit product a * b (philox::mulhilo32_emulated).
fn mulhilo(a: u32, b: u32) -> vec2<u32> {
    let a0 = a & 0xFFFFu;
    let a1 = a >> 16u;
    let b0 = b & 0xFFFFu;
    let b1 = b >> 16u;
    let p00 = a0 * b0;
    let p01 = a0 * b1;
    let p10 = a1 * b0;
    let p11 = a1 * b1;
    let mid = (p00 >> 16u) + (p01 & 0xFFFFu) + (p10 & 0xFFFFu);
    let hi = p11 + (p01 >> 16u) + (p10 >> 16u) + (mid >> 16u);
    return vec2<u32>(hi, a * b);
}

// philox::philox4x32_10: 10 rounds, key bumped before every round but the first.
fn philox4x32_10(ctr: vec4<u32>, key: vec2<u32>) -> vec4<u32> {
    var x = ctr;
    var k = key;
    for (var r = 0u; r < 10u; r++) {
        if (r > 0u) {
            k = k + vec2<u32>(PHILOX_W0, PHILOX_W1);
        }
        let p0 = mulhilo(PHILOX_M0, x.x);
        let p1 = mulhilo(PHILOX_M1, x.z);
        x = vec4<u32>(p1.x ^ x.y ^ k.x, p1.y, p0.x ^ x.w ^ k.y, p0.y);
    }
    return x;
}

// The Philox block of vocab entry `index` (philox::counter_block): entry `index` uses word
// `index & 3` of philox4x32_10((index >> 2, row, step, 0), (seed_lo, seed_hi)).
fn philox_block(seed_lo: u32, seed_hi: u32, step: u32, row: u32, index: u32) -> vec4<u32> {
    return philox4x32_10(vec4<u32>(index >> 2u, row, step, 0u), vec2<u32>(seed_lo, seed_hi));
}

// philox::bits_to_unit: (f32(bits >> 9) + 0.5) * 2^-23, every step exact.
fn bits_to_unit(bits: u32) -> f32 {
    return (f32(bits >> 9u) + 0.5) * 1.1920928955078125e-7;
}

// philox::ln_portable: positive normal finite x only.
fn ln_portable(x: f32) -> f32 {
    let bits = bitcast<u32>(x);
    var e = i32(bits >> 23u) - 127;
    var mbits = (bits & 0x007FFFFFu) | 0x3F800000u;
    if (mbits > 0x3FB504F3u) {
        mbits -= 0x00800000u;
        e += 1;
    }
    let f = fr(bitcast<f32>(mbits) - 1.0);
    var p = bitcast<f32>(0x3D8EC752u);              // c8
    p = fr(fr(p * f) + bitcast<f32>(0xBDEB1ADEu));   // c7
    p = fr(fr(p * f) + bitcast<f32>(0x3DEF5141u));   // c6
    p = fr(fr(p * f) + bitcast<f32>(0xBDFE7A63u));   // c5
    p = fr(fr(p * f) + bitcast<f32>(0x3E11E90Du));   // c4
    p = fr(fr(p * f) + bitcast<f32>(0xBE2AADA5u));   // c3
    p = fr(fr(p * f) + bitcast<f32>(0x3E4CCEADu));   // c2
    p = fr(fr(p * f) + bitcast<f32>(0xBE7FFFFEu));   // c1
    p = fr(fr(p * f) + bitcast<f32>(0x3EAAAAAAu));   // c0
    let z = fr(f * f);
    let hf = fr(0.5 * z);
    let q = fr(fr(z * f) * p);
    let ef = f32(e);
    let lo = fr(ef * bitcast<f32>(0x3717F7D1u));     // E * LN2_LO
    let hi = fr(ef * bitcast<f32>(0x3F317180u));     // E * LN2_HI (exact)
    return fr(fr(fr(fr(q + lo) - hf) + f) + hi);
}

// philox::gumbel: -ln(-ln(u)), finite for every u bits_to_unit produces.
fn gumbel(u: f32) -> f32 {
    return -ln_portable(-ln_portable(u));
}
