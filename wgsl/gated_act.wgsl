// gated_act: the gated MLP activation after the fused gate+up projection.
//   out[t, f] = act(gu[t, f]) * gu[t, F + f]      (rows of gu = [gate: F | up: F])
// act = SiLU (default; also macro SILU) or, with macro GELU_TANH, PyTorch's
// gelu(approximate='tanh') = 0.5 x (1 + tanh(z)), z = sqrt(2/pi) (x + 0.044715 x^3).
// Both are evaluated as x * sigmoid(y) = x / (1 + exp(-y)) (y = x for SiLU, y = 2z for GELU-tanh,
// using 1 + tanh(z) = 2 sigmoid(2z)): no tanh (NaN for large |z| on some drivers), no
// cancellation in the negative tail. The exp argument is clamped to +-80 (exp(80) = 5.5e34 is
// finite in f32, fast-math safe); the clamp changes only results below 2e-35 |x| in magnitude.
// Grid: 1-D over ceil(n_tokens * F / WG) workgroups, 2-D folded (see gpu/kernel.rs).
#define WG 256

struct Params {
    n_tokens: u32,
    f: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<storage, read> gu: array<f32>;         // (T, 2F) = [gate | up] per row
@group(0) @binding(1) var<storage, read_write> out: array<f32>;  // (T, F)
@group(0) @binding(2) var<uniform> p: Params;

fn sigmoid_times(x: f32, y: f32) -> f32 {
    return x / (1.0 + exp(clamp(-y, -80.0, 80.0)));
}

fn act(x: f32) -> f32 {
#ifdef GELU_TANH
    let z = 0.7978845608028654 * (x + 0.044715 * x * x * x);
    return sigmoid_times(x, 2.0 * z);
#else
    return sigmoid_times(x, x);
#endif
}

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = (wid.x + wid.y * nwg.x) * {{WG}}u + lid;
    if (i >= p.n_tokens * p.f) {
        return;
    }
    let t = i / p.f;
    let j = i - t * p.f;
    let g = gu[t * 2u * p.f + j];
    let u = gu[t * 2u * p.f + p.f + j];
    out[i] = act(g) * u;
}
