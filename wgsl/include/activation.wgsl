// activation: the gated MLP activations, shared by gated_act and the matvecs that fuse it into
// the down projection (include/linear_input.wgsl). act = SiLU (default) or, with the macro
// GELU_TANH, PyTorch's gelu(approximate='tanh') = 0.5 x (1 + tanh(z)), z = sqrt(2/pi) (x + 0.044715 x^3).
// Both are evaluated as x * sigmoid(y) = x / (1 + exp(-y)) (y = x for SiLU, y = 2z for GELU-tanh,
// using 1 + tanh(z) = 2 sigmoid(2z)): no tanh (NaN for large |z| on some drivers), no
// cancellation in the negative tail. The exp argument is clamped to +-80 (exp(80) = 5.5e34 is
// finite in f32, fast-math safe); the clamp changes only results below 2e-35 |x| in magnitude.

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

fn act4(x: vec4<f32>) -> vec4<f32> {
    return vec4<f32>(act(x.x), act(x.y), act(x.z), act(x.w));
}
