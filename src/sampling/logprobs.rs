//! Log-probabilities of sampled tokens and of the most likely ones (OpenAI's `logprobs` /
//! `top_logprobs`), computed on the GPU from the logits the sampler read, only for the rows that
//! ask (`wgsl/sample_logprobs.wgsl`; [`cpu::logprobs`] is its twin).
//!
//! # Spec
//! For one row of `V` logits `l[0..V)` (NaN read as `-inf`), the sampled token `t` and a count
//! `n ≤` [`MAX_TOP_LOGPROBS`]:
//! - `m = max l`; `d[i] = l[i] - m` (one `f32` subtraction; `0` where `l[i] == m`, so an infinite
//!   maximum gives 0, not NaN); `S = Σ exp(d[i])`;
//! - `logprob(i) = d[i] - ln S`: the max-subtracted `log_softmax`;
//! - the result is `logprob(t)` and the `n` entries `(i, logprob(i))` first in the order (`l[i]`
//!   descending, `i` ascending): ties go to the lower index, like the greedy sampler.
//!
//! **Which distribution**: that of the logits the sampler received: the model's raw logits (vLLM's
//! default "raw logprobs"), before temperature, top-k / top-p / min-p and token masks; for a row
//! with logit controls ([`super::penalty`]: `logit_bias`, penalties), after them (both samplers
//! leave a controlled row's logits rewritten: the device sampler in place, the host sampler by
//! writing its row back), as vLLM's "processed logprobs". A logprob says how likely the model
//! found a token, whatever the request's temperature and filters; with a constraint
//! (`response_format`), the top tokens may be tokens the mask did not allow. A greedy row's sampled
//! token is its top-1 token (the same bits, unless the row is masked).
//!
//! # Precision
//! The kernel computes `m` and `d` exactly as the spec (the same `f32` operations), `S` as an `f32`
//! sum (each thread adds its `⌈V / 256⌉` entries in order, then a tree of 8 levels) of WGSL's `exp`
//! and `ln S` with WGSL's `log`; [`cpu::logprobs`] sums in `f64`. [`cpu::tolerance`] bounds the
//! difference from the WGSL accuracy rules ([`cpu::tolerance`] says how); the ids are exact.
//!
//! # Cost
//! One dispatch of one workgroup per asking row, two reads of the row; only recorded when some
//! row of a step asks, and its output (`(1 + 2n)` words an asking row) is read back with the ids.

use crate::error::{Error, Result};
use crate::gpu::kernel::{grid, Kernel};
use crate::gpu::{ElemType, Gpu, Tensor};
use std::sync::Arc;

/// OpenAI's limit on `top_logprobs`.
pub const MAX_TOP_LOGPROBS: u32 = 20;
/// Threads of a workgroup (the kernel's `WG`).
const WG: usize = 256;
/// An output rank past the row's length.
const NO_INDEX: u32 = u32::MAX;

/// One token's logprob and the row's top tokens with theirs (best first).
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    /// The sampled token's logprob.
    pub logprob: f32,
    /// `(token id, logprob)`, at most the `n` asked.
    pub top: Vec<(u32, f32)>,
}

crate::ops::uniform::uniform_struct! {
    /// WGSL twin: `struct LogprobInfo` of `wgsl/sample_logprobs.wgsl`.
    pub(crate) struct LogprobInfo = "LogprobInfo" {
        vocab: u32,
        asks: u32,
        top: u32,
        stride: u32,
    }
}

/// What a recorded dispatch writes, to read back and [`decode`](Self::decode): which rows asked
/// (for how many top tokens) and the output's row stride.
#[derive(Clone, Debug, PartialEq)]
pub struct Layout {
    asks: Vec<Option<u32>>,
    top: u32,
}

impl Layout {
    fn stride(&self) -> usize {
        1 + 2 * self.top as usize
    }

    fn asking(&self) -> usize {
        self.asks.iter().flatten().count()
    }

    /// Bytes of the output ([`LogprobHead::output`], from byte 0).
    pub fn bytes(&self) -> u64 {
        (self.asking() * self.stride() * 4) as u64
    }

    /// The output's words, per row of the step: `None` for the rows that did not ask.
    pub fn decode(&self, words: &[u32]) -> Vec<Option<TokenLogprobs>> {
        let stride = self.stride();
        let mut next = words.chunks(stride);
        self.asks
            .iter()
            .map(|ask| {
                let n = (*ask)?;
                let w = next.next().unwrap_or(&[]);
                let logprob = f32::from_bits(*w.first()?);
                let top = w[1..]
                    .chunks(2)
                    .take(n as usize)
                    .filter(|p| p[0] != NO_INDEX)
                    .map(|p| (p[0], f32::from_bits(p[1])))
                    .collect();
                Some(TokenLogprobs { logprob, top })
            })
            .collect()
    }
}

/// A bound tensor: its buffer's address, offset and size.
type Bound = (usize, u64, u64);

fn bound(t: &Tensor) -> Bound {
    (Arc::as_ptr(&t.buffer) as usize, t.offset, t.size_bytes())
}

/// What a cached kernel is bound to: the logits, the ids, and the generation of the head's own
/// buffers.
type BindKey = (Bound, Bound, u64);

/// A buffer that only grows.
struct Grown {
    label: &'static str,
    usage: wgpu::BufferUsages,
    buffer: Option<wgpu::Buffer>,
}

impl Grown {
    /// Makes the buffer at least `bytes` long; true when it was (re)allocated.
    fn ensure(&mut self, gpu: &Gpu, bytes: u64) -> bool {
        let bytes = bytes.max(16).next_multiple_of(16);
        if self.buffer.as_ref().is_some_and(|b| b.size() >= bytes) {
            return false;
        }
        self.buffer = Some(gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(self.label),
            size: bytes,
            usage: self.usage,
            mapped_at_creation: false,
        }));
        true
    }

    fn get(&self) -> &wgpu::Buffer {
        self.buffer.as_ref().expect("allocated before use")
    }
}

/// The logprob head: the kernel's pipeline, its small buffers and cached bind groups. One per
/// decode loop; [`encode_pass`](Self::encode_pass) records it after the sampler.
pub struct LogprobHead {
    info: wgpu::Buffer,
    /// The asking rows' indices in the batch.
    asked: Grown,
    out: Grown,
    /// Sampled ids uploaded by [`compute`](Self::compute).
    ids: Option<Tensor>,
    generation: u64,
    /// The kernel bound to (logits, ids), with those buffers kept alive (so that their
    /// addresses, part of the key, are not reused by other buffers while cached).
    cache: Vec<(BindKey, Kernel, [Arc<wgpu::Buffer>; 2])>,
}

const STORAGE: wgpu::BufferUsages =
    wgpu::BufferUsages::STORAGE.union(wgpu::BufferUsages::COPY_DST).union(wgpu::BufferUsages::COPY_SRC);

impl LogprobHead {
    pub fn new(gpu: &Gpu) -> Result<Self> {
        // Compiled now, not at the first step that asks.
        gpu.pipeline("sample_logprobs", "main", &Self::macros())?;
        Ok(Self {
            info: gpu.uniform("logprob info", &LogprobInfo::default()),
            asked: Grown { label: "logprob rows", usage: STORAGE, buffer: None },
            out: Grown { label: "logprobs", usage: STORAGE, buffer: None },
            ids: None,
            generation: 0,
            cache: Vec::new(),
        })
    }

    fn macros() -> crate::gpu::Macros {
        crate::gpu::Macros::new().set("WG", WG)
    }

    /// The head in `slot`, made on first use (a decode loop makes one only once a row asks).
    pub fn lazy<'a>(slot: &'a mut Option<Self>, gpu: &Gpu) -> Result<&'a mut Self> {
        if slot.is_none() {
            *slot = Some(Self::new(gpu)?);
        }
        Ok(slot.as_mut().expect("just made"))
    }

    /// The most bytes an output of `rows` rows takes (every row asking for the most top tokens):
    /// what a readback buffer beside a step's ids needs.
    pub fn max_bytes(rows: usize) -> u64 {
        (rows * (1 + 2 * MAX_TOP_LOGPROBS as usize) * 4) as u64
    }

    /// The output the last recorded dispatch writes (u32 words, [`Layout::bytes`] of them from
    /// byte 0; valid once that work has run).
    pub fn output(&self) -> &wgpu::Buffer {
        self.out.get()
    }

    /// Records the logprobs of the rows of `logits` (f32 `[rows, V]`, `rows = asks.len()`) whose
    /// `asks` entry is `Some(n)` (`n` top tokens, `n ≤` [`MAX_TOP_LOGPROBS`]) into `pass`, the
    /// sampled token of row `r` being `ids[r]` (u32, e.g. the sampler's output). `None`, and
    /// nothing recorded, when no row asks. The row table and sizes are written with
    /// `queue.write_buffer`: they apply to the next submission (the one carrying `pass`).
    pub fn encode_pass(
        &mut self,
        gpu: &Gpu,
        pass: &mut wgpu::ComputePass<'_>,
        logits: &Tensor,
        ids: &Tensor,
        asks: &[Option<u32>],
    ) -> Result<Option<Layout>> {
        let rows = asks.len();
        let asked: Vec<u32> = (0..rows as u32).filter(|&r| asks[r as usize].is_some()).collect();
        if asked.is_empty() {
            return Ok(None);
        }
        let top = asks.iter().flatten().copied().max().unwrap_or(0);
        if top > MAX_TOP_LOGPROBS {
            return Err(Error::InvalidArgument(format!("{top} top logprobs: at most {MAX_TOP_LOGPROBS}")));
        }
        let n = logits.numel();
        if logits.ty != ElemType::F32 || n == 0 || !n.is_multiple_of(rows) {
            return Err(Error::InvalidArgument(format!(
                "logprobs: {n} {:?} logits do not split into {rows} rows of f32",
                logits.ty
            )));
        }
        if ids.ty != ElemType::U32 || ids.numel() < rows {
            return Err(Error::InvalidArgument(format!("logprobs: {} sampled ids for {rows} rows", ids.numel())));
        }
        let layout = Layout { asks: asks.to_vec(), top };
        let info =
            LogprobInfo { vocab: (n / rows) as u32, asks: asked.len() as u32, top, stride: layout.stride() as u32 };
        let grown = self.asked.ensure(gpu, (asked.len() * 4) as u64) | self.out.ensure(gpu, layout.bytes());
        if grown {
            self.generation += 1;
            self.cache.clear();
        }
        gpu.queue.write_buffer(&self.info, 0, bytemuck::bytes_of(&info));
        gpu.queue.write_buffer(self.asked.get(), 0, bytemuck::cast_slice(&asked));
        let k = self.bind(gpu, logits, ids)?;
        let kernel = &mut self.cache[k].1;
        kernel.workgroups = grid(asked.len() as u32);
        kernel.encode(pass);
        Ok(Some(layout))
    }

    /// The index in the cache of the kernel bound to (logits, ids).
    fn bind(&mut self, gpu: &Gpu, logits: &Tensor, ids: &Tensor) -> Result<usize> {
        let key = (bound(logits), bound(ids), self.generation);
        if let Some(i) = self.cache.iter().position(|(k, _, _)| *k == key) {
            return Ok(i);
        }
        let bindings = [
            logits.binding(),
            ids.binding(),
            self.asked.get().as_entire_binding(),
            self.out.get().as_entire_binding(),
            self.info.as_entire_binding(),
        ];
        let kernel = gpu.kernel("sample_logprobs", "main", &Self::macros(), &bindings, [1, 1, 1])?;
        if self.cache.len() >= 8 {
            self.cache.remove(0);
        }
        self.cache.push((key, kernel, [logits.buffer.clone(), ids.buffer.clone()]));
        Ok(self.cache.len() - 1)
    }

    /// The logprobs of rows whose tokens were sampled on the host (or read back already):
    /// uploads `ids`, runs the kernel over `logits` and waits for its output. No GPU work when no
    /// row asks.
    pub fn compute(
        &mut self,
        gpu: &Gpu,
        logits: &Tensor,
        ids: &[u32],
        asks: &[Option<u32>],
    ) -> Result<Vec<Option<TokenLogprobs>>> {
        if asks.iter().all(Option::is_none) {
            return Ok(vec![None; asks.len()]);
        }
        if ids.len() != asks.len() {
            return Err(Error::InvalidArgument(format!("logprobs: {} ids for {} rows", ids.len(), asks.len())));
        }
        if self.ids.as_ref().is_none_or(|t| t.numel() < ids.len()) {
            self.ids = Some(gpu.empty("logprob sampled ids", &[ids.len().next_power_of_two()], ElemType::U32)?);
        }
        let ids_tensor = self.ids.as_ref().expect("just made").view(0, &[ids.len()]);
        gpu.queue.write_buffer(&ids_tensor.buffer, 0, bytemuck::cast_slice(ids));
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        let layout = {
            let mut pass = enc.begin_compute_pass(&Default::default());
            self.encode_pass(gpu, &mut pass, logits, &ids_tensor, asks)?.expect("some row asks")
        };
        gpu.queue.submit([enc.finish()]);
        let bytes = gpu.read_bytes(self.out.get(), 0, layout.bytes())?;
        Ok(layout.decode(&bytemuck::pod_collect_to_vec(&bytes)))
    }
}

/// The CPU twin and the kernel's error bound.
pub mod cpu {
    use super::TokenLogprobs;

    fn value(l: f32) -> f32 {
        if l.is_nan() {
            f32::NEG_INFINITY
        } else {
            l
        }
    }

    /// `d[i]` of the spec: one `f32` subtraction, 0 where `l[i]` is the maximum.
    fn shifted(v: f32, m: f32) -> f32 {
        if v == m {
            0.0
        } else {
            v - m
        }
    }

    /// `m` and `ln S` of the spec, `S` summed in `f64`.
    fn log_norm(row: &[f32]) -> (f32, f64) {
        let m = row.iter().map(|&l| value(l)).fold(f32::NEG_INFINITY, f32::max);
        let s: f64 = row.iter().map(|&l| (shifted(value(l), m) as f64).exp()).sum();
        (m, s.ln())
    }

    /// The [spec](super): the logprob of `sampled` and the `top` best entries of `row`.
    pub fn logprobs(row: &[f32], sampled: u32, top: usize) -> TokenLogprobs {
        let (m, ln_s) = log_norm(row);
        let lp = |i: usize| (shifted(value(row[i]), m) as f64 - ln_s) as f32;
        let mut order: Vec<usize> = (0..row.len()).collect();
        // Stable, and -0 == +0 as in the kernel's comparisons (no NaN left).
        order.sort_by(|&a, &b| value(row[b]).partial_cmp(&value(row[a])).expect("no NaN"));
        let logprob = if (sampled as usize) < row.len() { lp(sampled as usize) } else { f32::NEG_INFINITY };
        TokenLogprobs { logprob, top: order.into_iter().take(top).map(|i| (i as u32, lp(i))).collect() }
    }

    /// How far the kernel's `logprob` may be from [`logprobs`]'s for an entry whose value is
    /// `lp`, on `row`: the first-order bound from WGSL's accuracy rules (`u = 2^-24`):
    /// - `d` is the same `f32` operation on both sides (exact; 0 error);
    /// - `exp(d)`: `3 + 2|d|` ULP, i.e. a relative error of `(3 + 2|d|) · 2u` per term; the terms
    ///   are positive, so `S`'s relative error from them is their `exp`-weighted mean;
    /// - the sum: each thread chains `⌈V / 256⌉` additions, then 8 tree levels, every partial
    ///   `≤ S`: relative error `≤ (⌈V / 256⌉ + 8) · u`;
    /// - `ln S` (`S ≥ 1`): absolute error `≤ 2^-21` for `S ≤ 2`, else 3 ULP of `ln S`; `S`'s
    ///   relative error adds to `ln S` as an absolute error;
    /// - the final subtraction rounds on both sides (the twin rounds its `f64` once): 1 ULP of `lp`.
    pub fn tolerance(row: &[f32], lp: f32) -> f32 {
        let u = 2f64.powi(-24);
        let (m, ln_s) = log_norm(row);
        let (mut mass, mut weighted) = (0f64, 0f64);
        for &l in row {
            let d = shifted(value(l), m) as f64;
            let w = d.exp();
            if w > 0.0 {
                mass += w;
                weighted += w * (3.0 + 2.0 * d.abs()) * 2.0 * u;
            }
        }
        let sum = (row.len().div_ceil(super::WG) + 8) as f64 * u;
        let log = if ln_s <= 2f64.ln() { 2f64.powi(-21) } else { 3.0 * 2.0 * u * ln_s };
        let last = 2.0 * u * lp.abs() as f64;
        (weighted / mass.max(1.0) + sum + log + last) as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::tensor::test_util::{gpu, random, xorshift};

    /// Rows of `v` random logits (scale 8, some rows with ties, NaN and -inf), sampled ids, and
    /// the asks.
    fn case(rows: usize, v: usize, seed: u64) -> (Vec<f32>, Vec<u32>) {
        let mut l = random(rows * v, seed, 8.0);
        let mut r = xorshift(seed ^ 0x5EED);
        for (k, row) in l.chunks_mut(v).enumerate() {
            if k % 3 == 1 {
                // Coarse values: many ties, among the best ones too.
                row.iter_mut().for_each(|x| *x = (*x * 2.0).round() / 2.0);
            }
            if k % 3 == 2 && v > 4 {
                row[(r.next().unwrap() % v as u64) as usize] = f32::NAN;
                row[(r.next().unwrap() % v as u64) as usize] = f32::NEG_INFINITY;
            }
        }
        let ids = (0..rows).map(|_| (r.next().unwrap() % v as u64) as u32).collect();
        (l, ids)
    }

    fn check(v: usize, asks: &[Option<u32>], seed: u64) {
        let g = gpu();
        let rows = asks.len();
        let (l, ids) = case(rows, v, seed);
        let logits = g.upload_f32("logits", &[rows, v], &l).unwrap();
        let mut head = LogprobHead::new(&g).unwrap();
        let got = head.compute(&g, &logits, &ids, asks).unwrap();
        for (r, (got, ask)) in got.iter().zip(asks).enumerate() {
            let row = &l[r * v..(r + 1) * v];
            let Some(n) = ask else {
                assert!(got.is_none(), "row {r} did not ask");
                continue;
            };
            let got = got.as_ref().expect("asked");
            let want = cpu::logprobs(row, ids[r], *n as usize);
            let close = |a: f32, b: f32| a == b || (a - b).abs() <= cpu::tolerance(row, b);
            assert!(close(got.logprob, want.logprob), "V {v} row {r}: {} vs {}", got.logprob, want.logprob);
            let ids_of = |t: &TokenLogprobs| t.top.iter().map(|p| p.0).collect::<Vec<_>>();
            assert_eq!(ids_of(got), ids_of(&want), "V {v} row {r}: top ids");
            for (a, b) in got.top.iter().zip(&want.top) {
                assert!(close(a.1, b.1), "V {v} row {r} token {}: {} vs {}", a.0, a.1, b.1);
            }
        }
    }

    #[test]
    fn logprobs_match_cpu() {
        // A real vocabulary (Qwen2.5's), odd sizes, fewer entries than ranks.
        check(151_936, &[Some(20), None, Some(5), Some(0)], 1);
        check(1_000_003, &[Some(3)], 2);
        for (v, seed) in [(1, 3), (7, 4), (255, 5), (257, 6), (4_099, 7)] {
            check(v, &[Some(20), Some(1), None, Some(0), Some(13), Some(2)], seed);
        }
    }

    #[test]
    fn rows_do_not_depend_on_the_batch() {
        let g = gpu();
        let v = 32_003;
        let (l, ids) = case(6, v, 9);
        let mut head = LogprobHead::new(&g).unwrap();
        let all = g.upload_f32("logits", &[6, v], &l).unwrap();
        let asks = [Some(20), None, Some(20), Some(20), Some(4), Some(20)];
        let batch = head.compute(&g, &all, &ids, &asks).unwrap();
        for r in [0, 2, 3, 5] {
            let one = g.upload_f32("logits", &[1, v], &l[r * v..(r + 1) * v]).unwrap();
            let alone = head.compute(&g, &one, &ids[r..r + 1], &[Some(20)]).unwrap();
            let (a, b) = (alone[0].as_ref().unwrap(), batch[r].as_ref().unwrap());
            assert_eq!(a.logprob.to_bits(), b.logprob.to_bits(), "row {r}");
            assert_eq!(a.top.len(), b.top.len());
            for (x, y) in a.top.iter().zip(&b.top) {
                assert_eq!((x.0, x.1.to_bits()), (y.0, y.1.to_bits()), "row {r}");
            }
        }
    }

    #[test]
    fn nothing_runs_when_no_row_asks() {
        let g = gpu();
        let logits = g.upload_f32("logits", &[2, 5], &random(10, 3, 1.0)).unwrap();
        let mut head = LogprobHead::new(&g).unwrap();
        assert_eq!(head.compute(&g, &logits, &[0, 1], &[None, None]).unwrap(), vec![None, None]);
        assert!(head.out.buffer.is_none(), "no output was made");
        let e = head.compute(&g, &logits, &[0, 1], &[Some(21), None]).unwrap_err();
        assert!(e.to_string().contains("at most 20"), "{e}");
    }
}
