// sample_philox: test kernel for the sampler's random numbers. For j in [0, n), with vocab index
// i = first + j: bits[j] = uniform_bits(seed, step, row, i) and gumbel[j] = the bits of
// gumbel(bits_to_unit(bits[j])), exactly what the sampler's draw uses (include/philox.wgsl), so
// tests can compare them with src/sampling/philox.rs bit for bit.
// Grid: 1-D over ceil(n / WG) workgroups, 2-D folded (see gpu/kernel.rs).
// Rust: src/sampling/device.rs philox_bits
#include "philox"

const WG: u32 = 256u;

struct Info {
    seed_lo: u32,
    seed_hi: u32,
    step: u32,
    row: u32,
    first: u32,
    n: u32,
    zero: u32,  // always 0: the run-time source of the rounding barrier (include/philox.wgsl)
    _pad: u32,
}

@group(0) @binding(0) var<storage, read_write> bits: array<u32>;    // (n)
@group(0) @binding(1) var<storage, read_write> noise: array<f32>;   // (n) Gumbel values
@group(0) @binding(2) var<storage, read> info: Info;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    fr_zero = info.zero;
    let j = (wid.x + wid.y * nwg.x) * WG + lid;
    if (j >= info.n) {
        return;
    }
    let i = info.first + j;
    let block = philox_block(info.seed_lo, info.seed_hi, info.step, info.row, i);
    let b = block[i & 3u];
    bits[j] = b;
    noise[j] = gumbel(bits_to_unit(b));
}
