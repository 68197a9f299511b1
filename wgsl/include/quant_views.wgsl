// quant_views: W bound twice, as 16-byte and as 4-byte words (bindings 0 and 1, as
// src/ops/matmul/gguf.rs `quant_bindings` and the quantized embedding gather bind it), and
// include/quant.wgsl's weight accessors over the two views. The including kernel declares the uniform `p` (o1, o2: the first words of planes
// 1 and 2) and qx4.
@group(0) @binding(0) var<storage, read> wv: array<vec4<u32>>;   // the planes (16-byte view)
@group(0) @binding(1) var<storage, read> ww: array<u32>;         // the same buffer (word view)

fn qw4(i: u32) -> vec4<u32> {
    return wv[i];
}
fn qw1(i: u32) -> u32 {
    return ww[i];
}
fn q_planes() -> vec2<u32> {
    return vec2<u32>(p.o1, p.o2);
}
