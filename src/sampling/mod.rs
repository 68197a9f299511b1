//! Token sampling: the exact semantics, the counter-based RNG, the host implementation and
//! the backend trait the device (WGSL) implementation plugs into.
//!
//! [`host::sample_row`] is the single source of truth; the WGSL kernel is its twin and is
//! tested against it. Everything below is written so a kernel can follow it without a sort
//! (thresholds are found by searching over float bit patterns) and without any dependence on
//! thread, workgroup or subgroup counts.
//!
//! # Spec
//!
//! Input: one row of `V` logits `l[0..V)` (`f32`), a validated [`SamplingParams`], the decode
//! `step` and the row's Philox `stream` (written `row` below: by default the row's index in the
//! logits matrix; [`RowKey`]). Output: one token id `< V`
//! (or 0 when `V = 0`).
//!
//! Every `f32` operation below is a single IEEE-754 operation rounded to nearest-even, with no
//! fused multiply-add and no reassociation (Rust never contracts; see "Host vs device").
//!
//! ## Parameters ([`SamplingParams::validate`], [`SamplingParams::prepare`])
//! - `temperature`: finite, `0` or `≥ f32::MIN_POSITIVE` (a subnormal `T` would make `1/T`
//!   overflow). `0` = greedy.
//! - `top_k`: `0` = off; any `k ≥` the number of candidates keeps all of them.
//! - `top_p ∈ (0, 1]`: `1` = off.
//! - `min_p ∈ [0, 1)`: `0` = off.
//! - NaN is rejected everywhere. `seed`: any `u64`.
//!
//! Derived once on the host, in [`PreparedParams`] (the per-row struct the kernel reads), so
//! both sides use the identical bits: `inv_temperature = 1.0f32 / T` (correctly rounded `f32`
//! division; WGSL division is not correctly rounded, so the kernel never divides) and
//! `ln_min_p = f32(ln(f64(min_p)))` (`-inf` when `min_p = 0`).
//!
//! ## Greedy (`temperature == 0`)
//! The lowest index `i` maximizing `l[i]`, comparing raw logits (no scaling), with NaN treated
//! as `-inf`. Defined outcomes: ties → lowest index; `+inf` wins (the first `+inf`); a row that
//! is all NaN/`-inf` (or empty) → token `0`.
//!
//! ## Sampling (`temperature > 0`)
//! 1. **Scale**: `s[i] = l[i] * inv_temperature` (one `f32` multiply), then NaN → `-inf`.
//!    Finite logits may overflow to `±inf` for tiny `T`. Comparisons of `s` are IEEE
//!    comparisons (`-0 == +0`); a kernel mapping `s` to order-preserving `u32` keys must map
//!    `-0` to `+0` first ([`host::order_key`]).
//! 2. **Degenerate rows**: if some `s[i] == +inf` (a `+inf` logit, or `l / T` overflowing for
//!    a tiny `T`), the result is the greedy token `argmax(l)` (no randomness; scaling is
//!    monotone, so that token has `s = +inf` too and this is the `T → 0` limit). Candidates
//!    are `C = {i : s[i] > -inf}`; if `C` is empty the result is `0`. Otherwise `m = max
//!    over C of s` (finite) and `d[i] = s[i] - m` (one `f32` subtract, `≤ 0`, `d = 0` for
//!    the maxima; `-inf` only when the subtraction overflows).
//! 3. **Top-k**: if `0 < k < |C|`, `t_k` = the `k`-th largest value of `s` over `C` counted with
//!    multiplicity, i.e. the largest `v` with `#{i ∈ C : s[i] ≥ v} ≥ k`; `K1 = {i ∈ C : s[i] ≥
//!    t_k}`. Ties at the threshold are all kept, so `|K1|` may exceed `k`. Otherwise `K1 = C`.
//!    A kernel finds `t_k` by a bit-by-bit search over the `u32` keys of `s` with integer counts:
//!    exact, no rounding involved.
//! 4. **Top-p**: weights `w[i] = exp(d[i])` (real numbers) and `Z = Σ_{K1} w`. If `top_p < 1`,
//!    `t_p` = the largest `v ∈ {s[j] : j ∈ K1}` with `M(v) = Σ_{i ∈ K1, s[i] ≥ v} w[i] ≥ top_p ·
//!    Z`; `K2 = {i ∈ K1 : s[i] ≥ t_p}`. Otherwise `K2 = K1` (`t_p = t_k`). This is the smallest
//!    set of whole value levels, taken from the top, whose softmax mass (softmax over `K1`)
//!    reaches `top_p`; tokens tied with the last level taken are all kept. Equivalently, with
//!    `p = w / Z`: keep `p[i] ≥ τ` for the largest `τ` whose set has mass `≥ top_p`. `t_p` is
//!    always one of the `s` values and `t_p ≥ t_k`; a kernel finds it by the same key search
//!    with `M(v) ≥ top_p · Z` as the predicate.
//! 5. **Min-p**: `K = {i ∈ K2 : d[i] ≥ ln_min_p}` (⇔ `p[i] ≥ min_p · p_max`); a per-token
//!    predicate, no search. With `min_p = 0`, `ln_min_p = -inf` keeps everything. The maxima
//!    (`d = 0`) are always in `K`.
//! 6. **Draw** (Gumbel-max): the lowest index maximizing `key[i] = d[i] + g[i]` over `i ∈ K`
//!    (one `f32` add), with `g[i] = gumbel(bits_to_unit(uniform_bits(seed, step, row, i)))`:
//!    - `uniform_bits`: word `i & 3` of `philox4x32_10((i >> 2, row, step, 0), (seed as u32,
//!      (seed >> 32) as u32))` ([`philox::philox4x32_10`], Random123-exact);
//!    - `bits_to_unit(b) = (f32(b >> 9) + 0.5) * 2^-23`, exactly, in `[2^-24, 1 - 2^-24]`
//!      (23 bits, not 24: see [`philox::bits_to_unit`]);
//!    - `gumbel(u) = -ln(-ln(u))` with [`philox::ln_portable`], a fixed sequence of `f32`
//!      operations (not the platform `ln`), so the WGSL twin gives identical bits.
//!
//! The draw gives token `i ∈ K` with probability `w[i] / Σ_K w` (up to the 23-bit uniform and
//! `f32` rounding). The random bits of token `i` depend only on `(seed, step, row, i)`, not on
//! which tokens the filters kept.
//!
//! **Order** is scale → top-k → top-p → min-p → draw. Top-p's softmax is over the top-k set;
//! min-p is relative to the overall maximum, which every filter keeps.
//!
//! **Token masks** ([`mask`]): a row may carry a set of allowed tokens (a grammar's next
//! tokens); before step 1 its disallowed logits become `-inf`, and its fixed outcomes are the
//! best allowed token. Rows with and without masks mix in one batch.
//!
//! **Logit controls** ([`penalty`]): a row may carry its sequence's `logit_bias` and presence,
//! frequency and repetition penalties; they rewrite its raw logits before the token mask and
//! step 1, in a fixed order of single `f32` operations from counts both samplers keep alike
//! (the device's on the GPU), so the two stay bit-identical. Rows with and without them mix.
//!
//! **Seed schedule**: the token sampled from the prompt's last position is `step = 0`; each
//! decode step adds 1. `row` is the row's stream: by default its index in the logits matrix
//! passed to the sampler, so the same seed in a different row draws different tokens (the
//! Philox counter words are `(i >> 2, row, step, 0)`). A batch of requests
//! ([`crate::decode::batch`]) gives every row stream 0 and its request's own step
//! ([`SamplingBackend::draw_rows`]), so a request draws the same tokens whatever its row. Without a user seed, use [`philox::random_seed`].
//!
//! # Host vs device
//! The host evaluates the mass comparison of step 4 as accurately as it can: `w[i] =
//! exp(f64(d[i]))` in `f64` and sums in `f64` (relative error < 1e-12 for any vocabulary).
//! The device uses `f32` `exp` and `f32` tree sums (relative error ~1e-6), so `K2` can differ
//! only when `M(t)` for some level `t` is within that rounding of `top_p · Z`: the level is in
//! on one side and out on the other. Everything else (steps 1–3, 5, 6) is specified down to
//! the bit. Hazards the kernel must handle to stay bit-exact:
//! - **Contraction**: naga 30 emits no `NoContraction` decorations and wgpu-hal 30 leaves
//!   Metal's default (fast-math) compile options, so a driver may fuse `l * inv_t - m` or
//!   the Horner steps of `ln_portable` into FMAs. Keep `s` in memory between passes (or
//!   otherwise force rounding) and measure parity.
//! - **Subnormals**: WGSL may flush them. They arise only for `|s| < 2^-126` (tiny logits or
//!   huge `T`); `bits_to_unit` and `ln_portable`'s inputs are always normal.
//!
//! **Logprobs** ([`logprobs`]): a row may also ask for the log-probabilities of its sampled
//! token and of its most likely tokens; they are those of the model's raw logits after the row's
//! logit controls (before temperature and the filters), computed on the GPU after the draw.
//!
//! The accepted host/device parity is ≥ 99.9 % of tokens; mismatches should trace to the
//! top-p boundary (or to contraction) as described above.

pub mod device;
pub mod host;
pub mod logprobs;
pub mod mask;
pub mod params;
pub mod penalty;
pub mod philox;

pub use device::DeviceSampler;
pub use host::{sample_row, sample_row_masked, sample_row_prepared};
pub use logprobs::{LogprobHead, TokenLogprobs, MAX_TOP_LOGPROBS};
pub use mask::{Rows, TokenMask};
pub use params::{check_keys, logits_shape, Draw, PreparedParams, RowKey, SamplingParams, MODE_GREEDY, MODE_SAMPLE};
pub use penalty::{LogitControls, RowControls, SeqControls};
pub use philox::{bits_to_unit, gumbel, philox4x32_10, random_seed, uniform_bits};

use crate::error::Result;
use crate::gpu::{Gpu, Tensor};

/// A sampling head: one token per row of last-position logits that live on the GPU, with one
/// [`SamplingParams`] per row and a shared decode `step` (the Philox counter's step word; the
/// row index is its row word).
///
/// - [`HostSampler`] reads the logits back and runs [`host::sample_row`] on the CPU (the
///   reference, and the comparison point for the device path);
/// - the device sampler runs the same spec in WGSL: the logits never leave the GPU; the ids
///   are written into a GPU buffer (usable as the next step's input) and only they are read.
///
/// `logits` is f32 `[rows, vocab]` (or `[vocab]` for one row), `rows = params.len()`.
pub trait SamplingBackend {
    fn name(&self) -> &'static str;

    /// Samples one token per row and reports which rows had non-finite logits. Errors on invalid
    /// parameters or mismatched sizes.
    fn draw(&mut self, gpu: &Gpu, logits: &Tensor, params: &[SamplingParams], step: u32) -> Result<Draw> {
        self.draw_rows(gpu, logits, params, &params::row_keys(params.len(), step))
    }

    /// [`draw`](Self::draw) with each row's own decode step and Philox stream: rows of different
    /// requests in one batch, each drawing what it draws alone.
    fn draw_rows(&mut self, gpu: &Gpu, logits: &Tensor, params: &[SamplingParams], keys: &[RowKey]) -> Result<Draw> {
        self.draw_masked(gpu, logits, Rows { params, keys, masks: &vec![None; params.len()] })
    }

    /// [`draw_rows`](Self::draw_rows) with an optional token mask per row ([`mask`]'s spec):
    /// constrained and free rows in one batch. A mask that allows no token (or has another
    /// vocabulary) is an error before anything runs.
    fn draw_masked(&mut self, gpu: &Gpu, logits: &Tensor, rows: Rows<'_>) -> Result<Draw>;

    /// [`draw_masked`](Self::draw_masked) with per-row logit controls ([`penalty`]'s spec; `None`:
    /// none), applied to the row's logits before everything else. A controlled row's sequence
    /// must have been [`start_controls`](Self::start_controls)ed; the device sampler counts each
    /// controlled row's token on the GPU itself, the caller [`SeqControls::push`]es it on the host.
    fn draw_controlled(&mut self, gpu: &Gpu, logits: &Tensor, rows: Rows<'_>, controls: RowControls) -> Result<Draw> {
        if controls.iter().all(Option::is_none) {
            return self.draw_masked(gpu, logits, rows);
        }
        Err(crate::error::Error::Unsupported(format!("logit controls in the {} sampler", self.name())))
    }

    /// Takes a sequence's controls as they start (its prompt counted): the device sampler writes
    /// them into the sequence's slot on the GPU; the host sampler needs nothing.
    fn start_controls(&mut self, gpu: &Gpu, seq: &SeqControls) -> Result<()> {
        let _ = (gpu, seq);
        Ok(())
    }

    /// [`draw`](Self::draw)'s ids alone.
    fn sample(&mut self, gpu: &Gpu, logits: &Tensor, params: &[SamplingParams], step: u32) -> Result<Vec<u32>> {
        Ok(self.draw(gpu, logits, params, step)?.ids)
    }

    /// The device sampler, for loops that keep the sampled ids on the GPU (encode the sampling
    /// into a decode step's command buffer); `None` for samplers that read the logits back.
    fn as_device(&mut self) -> Option<&mut DeviceSampler> {
        None
    }
}

/// The CPU sampler: reads the logits back, then [`host::sample_row`] on each row.
#[derive(Clone, Copy, Debug, Default)]
pub struct HostSampler;

impl SamplingBackend for HostSampler {
    fn name(&self) -> &'static str {
        "host"
    }

    fn draw_masked(&mut self, gpu: &Gpu, logits: &Tensor, input: Rows<'_>) -> Result<Draw> {
        self.draw_controlled(gpu, logits, input, &vec![None; input.params.len()])
    }

    fn draw_controlled(&mut self, gpu: &Gpu, logits: &Tensor, input: Rows<'_>, controls: RowControls) -> Result<Draw> {
        let (rows, vocab) = logits_shape(logits, input.params)?;
        let prepared = params::prepare_rows(input.params, input.keys)?;
        mask::check_masks(input.masks, rows, vocab)?;
        penalty::check_rows(controls, rows)?;
        let mut host_logits = gpu.read_f32(logits)?;
        if vocab > 0 {
            for (r, (row, c)) in host_logits.chunks_mut(vocab).zip(controls).enumerate() {
                if let Some(c) = c {
                    c.apply(row);
                    // As the device sampler leaves them (its controls rewrite the logits in
                    // place): what is read after the draw (logprobs) sees the controlled row on
                    // either sampler.
                    let at = logits.offset + (r * vocab * 4) as u64;
                    gpu.queue.write_buffer(&logits.buffer, at, bytemuck::cast_slice(row));
                }
            }
        }
        let ids = if vocab == 0 {
            vec![0; rows]
        } else {
            host_logits
                .chunks(vocab)
                .zip(&prepared)
                .zip(input.masks)
                .map(|((l, p), m)| host::sample_row_masked(l, p, *m))
                .collect()
        };
        let non_finite =
            (0..rows).map(|r| host_logits[r * vocab..(r + 1) * vocab].iter().any(|l| !l.is_finite())).collect();
        Ok(Draw { ids, non_finite })
    }
}

impl SamplingBackend for DeviceSampler {
    fn name(&self) -> &'static str {
        "device"
    }

    fn draw_masked(&mut self, gpu: &Gpu, logits: &Tensor, rows: Rows<'_>) -> Result<Draw> {
        self.draw_now(gpu, logits, rows, &[])
    }

    fn draw_controlled(&mut self, gpu: &Gpu, logits: &Tensor, rows: Rows<'_>, controls: RowControls) -> Result<Draw> {
        self.draw_now(gpu, logits, rows, controls)
    }

    fn start_controls(&mut self, gpu: &Gpu, seq: &SeqControls) -> Result<()> {
        self.start_controls(gpu, seq)
    }

    fn as_device(&mut self) -> Option<&mut DeviceSampler> {
        Some(self)
    }
}
