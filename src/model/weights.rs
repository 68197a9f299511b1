//! Uploading a checkpoint's weights to the GPU in the layout the layer loop computes with.
//!
//! Linear weights stay in the checkpoint's own format where a kernel reads it: GGUF block types
//! (Q4_0 … Q6_K) as [`QuantWeight`]s, read directly by `ops::matmul::gguf` (no f16 copy); float
//! tensors (F32/F16/BF16) as f16. Norms and biases are f32. Projections that read the same input
//! are stacked along their output rows so one dispatch computes them: `qkv` = [q; k; v] and
//! `gate_up` = [gate; up] ([`Proj`]); where the parts' formats differ (a Q4_K_M file's Q6_K `v`
//! beside Q4_K `q`, `k`), each part is its own weight writing its columns of the same output.
//! The lm_head is split into row chunks that each fit the device's max storage binding. The
//! embedding table stays in its quantized type too (`ops::embedding::embedding` dequantizes
//! the rows it gathers), and a tied lm_head reads the embedding's own chunks.

use super::config::{Mixer, MlpSpec, ModelConfig};
use super::source::TensorSource;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::gpu::{Gpu, Kernel, Tensor};
use crate::ops::embedding::{upload_row_chunks, CHUNK_ROW_ALIGN};
use crate::ops::matmul::gguf::{is_supported, matvec_quant_mixed_rows, mixes, QuantWeight};
/// Records `y (+)= input(x) · Wᵀ (+ bias)` for either kind of weight ([`Linear`] is a [`Weight`]).
pub use crate::ops::matmul::linear_in as linear;
use crate::ops::matmul::{Input, LinearOpts, Operands, Weight};
use half::f16;
use std::borrow::Cow;
use std::sync::Arc;

/// A linear layer's weight `[N, K]` on the GPU.
#[derive(Clone, Debug)]
pub enum Linear {
    /// f16, packed two per u32.
    F16(Tensor),
    /// The checkpoint's quantized blocks.
    Quant(QuantWeight),
}

impl Linear {
    /// `[N, K]`.
    pub fn shape(&self) -> [usize; 2] {
        match self {
            Linear::F16(t) => [t.shape[0], t.shape[1]],
            Linear::Quant(q) => q.shape,
        }
    }

    pub fn gpu_bytes(&self) -> u64 {
        match self {
            Linear::F16(t) => t.size_bytes(),
            Linear::Quant(q) => q.gpu_bytes(),
        }
    }

    /// The storage format, for summaries: `f16` or the GGUF type.
    pub fn format(&self) -> &'static str {
        match self {
            Linear::F16(_) => "f16",
            Linear::Quant(q) => q.dtype.name(),
        }
    }
}

impl Weight for Linear {
    fn record(gpu: &Gpu, op: &Operands<'_, Linear>) -> Result<Kernel> {
        match op.w {
            Linear::F16(t) => Tensor::record(gpu, &op.with_weight(t)),
            Linear::Quant(q) => QuantWeight::record(gpu, &op.with_weight(q)),
        }
    }
}

/// A projection whose output stacks parts along its columns (`[q; k; v]`): one weight when the
/// parts share a format, else one weight per run of parts of one format, with its first column.
/// `gate_up` with one format is instead one weight of interleaved rows (gate 0, up 0, gate 1,
/// up 1, ...): `glu`, so that a matvec can end in the gated activation ([`LinearOpts::glu`]).
#[derive(Clone, Debug)]
pub struct Proj {
    pub parts: Vec<(usize, Linear)>,
    /// Output columns in all.
    pub n: usize,
    /// One weight whose rows are (gate, up) pairs.
    pub glu: bool,
}

impl Proj {
    /// The dispatches of `y (+)= x · Wᵀ (+ bias)`: a part starting at column `c` writes the view of
    /// `y` from column `c` (row stride `n`) with the matching slice of the bias.
    pub fn linear(
        &self,
        gpu: &Gpu,
        x: &Tensor,
        input: Input<'_>,
        bias: Option<&Tensor>,
        y: &Tensor,
        opts: LinearOpts,
    ) -> Result<Vec<Kernel>> {
        if let [(0, w)] = self.parts.as_slice() {
            return Ok(vec![linear(gpu, x, input, w, bias, y, opts)?]);
        }
        // Two quantized types (a Q4_K_M file's Q4_K q/k beside its Q6_K v): one dispatch where
        // the matvec takes both.
        if let [(0, Linear::Quant(a)), (col, Linear::Quant(b))] = self.parts.as_slice() {
            if mixes(gpu, a, b, y.shape[0], input, &opts) {
                return matvec_quant_mixed_rows(
                    gpu,
                    &Operands { input, bias, ..Operands::new(x, a, y, opts) },
                    (b, *col),
                );
            }
        }
        let t = y.shape[0];
        self.parts
            .iter()
            .map(|(col, w)| {
                let n = w.shape()[0];
                let yv = y.view(*col, &[t, n]);
                let bv = bias.map(|b| b.view(*col, &[n]));
                let ld_out = Some(opts.ld_out.unwrap_or(self.n));
                linear(gpu, x, input, w, bv.as_ref(), &yv, LinearOpts { ld_out, ..opts })
            })
            .collect()
    }

    /// Its weights, part by part.
    pub fn weights(&self) -> impl Iterator<Item = &Linear> {
        self.parts.iter().map(|(_, w)| w)
    }

    pub fn gpu_bytes(&self) -> u64 {
        self.weights().map(Linear::gpu_bytes).sum()
    }
}

/// A layer's token mixer.
pub enum MixerWeights {
    Attention {
        /// [q; k; v]: rows H*D + 2*Hkv*D.
        qkv: Proj,
        qkv_bias: Option<Tensor>,
        /// Per-head norms of q and k, f32 `[D]` each.
        qk_norm: Option<(Tensor, Tensor)>,
        /// The output gate's projection (Qwen3.5: q_proj's gate rows), [H*D, hidden].
        gate: Option<Linear>,
        out: Linear,
    },
    DeltaNet {
        /// [qkv; z; b; a]: rows conv_dim + Hv*Dv + 2*Hv.
        in_proj: Proj,
        /// The causal conv's taps, f32 [conv_dim, kernel].
        conv: Tensor,
        /// f32 `[Hv]` each.
        a_log: Tensor,
        dt_bias: Tensor,
        /// The gated RMSNorm's weight, f32 `[Dv]`.
        norm: Tensor,
        out: Linear,
    },
}

/// A layer's feed-forward block.
pub enum MlpWeights {
    Dense {
        /// [gate; up]: rows 2F.
        gate_up: Proj,
        down: Linear,
    },
    Moe {
        /// [router (E rows); shared expert gate (1 row, when there is a shared expert)].
        router: Proj,
        /// Every expert's gate and up rows interleaved (gate 0, up 0, gate 1, ...), expert after
        /// expert: [E * 2I, hidden] ([(E + 1) * 2I, hidden] with the shared expert stacked).
        gate_up_exps: Linear,
        /// [E * hidden, I] ([(E + 1) * hidden, I] with the shared expert stacked).
        down_exps: Linear,
        shared: SharedExpert,
    },
}

/// Where a MoE block's shared expert is.
pub enum SharedExpert {
    None,
    /// Expert E of the stacks (it has the experts' size): the router gives it the last slot.
    Stacked,
    /// Its own (gate_up, down), for a size other than the experts'.
    Separate(Proj, Linear),
}

pub struct LayerWeights {
    pub attn_norm: Tensor,
    pub mixer: MixerWeights,
    pub post_attn_norm: Option<Tensor>,
    pub ffn_norm: Tensor,
    pub mlp: MlpWeights,
    pub post_ffw_norm: Option<Tensor>,
    /// The layer's output scale (Gemma 4's `layer_scalar`; 1 = none).
    pub output_scale: f32,
    /// Per-layer input: (gate `[P, hidden]`, projection `[hidden, P]`, post-norm f32 `[hidden]`).
    pub per_layer_input: Option<(Linear, Linear, Tensor)>,
}

/// The model-level weights of per-layer inputs ([`crate::model::config::PerLayerInput`]).
pub struct PerLayerInputWeights {
    /// (first row, chunk) of the per-layer embedding table `[vocab, layers * P]`.
    pub embed: Vec<(u32, Linear)>,
    /// `[layers * P, hidden]`.
    pub model_proj: Linear,
    /// f32 `[P]`.
    pub norm: Tensor,
}

impl LayerWeights {
    /// The linear weights, for summaries and byte counts.
    fn linears(&self) -> Vec<&Linear> {
        let mut out: Vec<&Linear> = Vec::new();
        match &self.mixer {
            MixerWeights::Attention { qkv, gate, out: o, .. } => {
                out.extend(qkv.weights());
                out.extend(gate.iter());
                out.push(o);
            }
            MixerWeights::DeltaNet { in_proj, out: o, .. } => {
                out.extend(in_proj.weights());
                out.push(o);
            }
        }
        match &self.mlp {
            MlpWeights::Dense { gate_up, down } => {
                out.extend(gate_up.weights());
                out.push(down);
            }
            MlpWeights::Moe { router, gate_up_exps, down_exps, shared } => {
                out.extend(router.weights());
                out.push(gate_up_exps);
                out.push(down_exps);
                if let SharedExpert::Separate(gu, d) = shared {
                    out.extend(gu.weights());
                    out.push(d);
                }
            }
        }
        if let Some((gate, proj, _)) = &self.per_layer_input {
            out.push(gate);
            out.push(proj);
        }
        out
    }
}

pub struct Weights {
    /// (first row, chunk) of the embedding table [vocab, hidden]: the checkpoint's quantized
    /// blocks, or f16.
    pub embed: Vec<(u32, Linear)>,
    /// (first row, chunk) of the lm_head [vocab, hidden].
    pub lm_head: Vec<(u32, Linear)>,
    pub output_norm: Tensor,
    pub layers: Vec<LayerWeights>,
    pub per_layer_input: Option<PerLayerInputWeights>,
    /// Bytes of GPU memory the weights take.
    pub bytes: u64,
}

impl Weights {
    /// The formats of the linear weights with their GPU bytes, e.g. `Q4_K 700 MB, Q6_K 300 MB`.
    pub fn summary(&self) -> String {
        let mut by: Vec<(&'static str, u64)> = Vec::new();
        let mut add = |w: &Linear| match by.iter_mut().find(|(f, _)| *f == w.format()) {
            Some((_, b)) => *b += w.gpu_bytes(),
            None => by.push((w.format(), w.gpu_bytes())),
        };
        for l in &self.layers {
            l.linears().into_iter().for_each(&mut add);
        }
        self.embed.iter().for_each(|(_, w)| add(w));
        // A tied lm_head is the embedding's chunks: counted once.
        let tied = match (self.embed.first(), self.lm_head.first()) {
            (Some((_, Linear::F16(a))), Some((_, Linear::F16(b)))) => Arc::ptr_eq(&a.buffer, &b.buffer),
            (Some((_, Linear::Quant(a))), Some((_, Linear::Quant(b)))) => Arc::ptr_eq(&a.buffer, &b.buffer),
            _ => false,
        };
        if !tied {
            self.lm_head.iter().for_each(|(_, w)| add(w));
        }
        by.iter().map(|(f, b)| format!("{f} {:.0} MB", *b as f64 / 1e6)).collect::<Vec<_>>().join(", ")
    }
}

/// How linear weights (projections, embedding, lm_head) go to the GPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WeightFormat {
    /// In the checkpoint's own type: quantized blocks stay quantized, floats become f16.
    #[default]
    Native,
    /// Every one as f16 (dequantized at load; for comparisons).
    F16,
    /// Float weights (F32, F16, BF16) quantized at load to this MLX affine type (`--quantize`);
    /// quantized ones stay as they are.
    Quantize(DType),
}

/// The stored bytes of `name` (rows `[n, k]`) in the type `format` puts on the GPU, if that type
/// has quantized kernels; `None`: the weight goes through f16.
fn gpu_rows<'a>(
    ck: &'a dyn TensorSource,
    name: &'a str,
    n: usize,
    k: usize,
    format: WeightFormat,
) -> Result<Option<RawRows<'a>>> {
    let stored = match format {
        WeightFormat::F16 => return Ok(None),
        _ => raw_rows(ck, name, n, k)?,
    };
    match (stored, format) {
        (Some((dtype, bytes)), _) if is_supported(dtype) && dtype.byte_size(k).is_some() => {
            check_scales(name, dtype, &bytes)?;
            Ok(Some((dtype, bytes)))
        }
        (_, WeightFormat::Quantize(t)) if k.is_multiple_of(t.block_size()) => {
            let x = finite32(name, ck.f32(name, &as_rows(ck, name, n, k)?)?)?;
            Ok(Some((t, Cow::Owned(crate::dtype::quantize_affine(t, &x)?))))
        }
        _ => Ok(None),
    }
}

/// The stored shape of `name` if it is `[n, k]`, or stacked experts `[E, n / E, k]`.
fn as_rows(ck: &dyn TensorSource, name: &str, n: usize, k: usize) -> Result<Vec<usize>> {
    let shape = ck.shape(name)?;
    match shape.split_last() {
        Some((&last, rows)) if last == k && rows.iter().product::<usize>() == n => Ok(shape),
        _ => Err(Error::Mismatch(format!("tensor {name} has shape {shape:?}, the config implies {:?}", [n, k]))),
    }
}

/// The bytes of tensor `name` as stored, rows `[n, k]` (`None` when its values must change
/// first: then the tensor goes through f16).
fn raw_rows<'a>(ck: &'a dyn TensorSource, name: &'a str, n: usize, k: usize) -> Result<Option<RawRows<'a>>> {
    as_rows(ck, name, n, k)?;
    Ok(ck.stored(name)?.map(|(dtype, bytes)| (dtype, Cow::Owned(bytes))))
}

/// Byte range of each block scale of a GGUF block type: a quantized value is a finite multiple
/// of its block's scales, so the tensor is finite exactly when every scale is.
fn scale_fields(dtype: DType) -> &'static [(usize, usize)] {
    match dtype {
        DType::Q4_0 | DType::Q5_0 | DType::Q8_0 => &[(0, 2)],
        DType::Q4_1 | DType::Q5_1 | DType::Q4_K | DType::Q5_K | DType::Affine { .. } => &[(0, 2), (2, 4)],
        DType::Q6_K => &[(208, 210)],
        DType::F32 | DType::F16 | DType::BF16 => &[],
    }
}

/// Errors when a block of `name` has a NaN or infinite scale.
fn check_scales(name: &str, dtype: DType, bytes: &[u8]) -> Result<()> {
    let fields = scale_fields(dtype);
    let blocks = bytes.chunks_exact(dtype.block_bytes());
    let total = blocks.len();
    let bad: Vec<usize> = blocks
        .enumerate()
        .filter(|(_, b)| {
            fields.iter().any(|&(s, e)| match dtype {
                DType::Affine { bf16: true, .. } => !half::bf16::from_le_bytes([b[s], b[e - 1]]).is_finite(),
                _ => !f16::from_le_bytes([b[s], b[e - 1]]).is_finite(),
            })
        })
        .map(|(i, _)| i)
        .collect();
    match bad.first() {
        None => Ok(()),
        Some(first) => Err(Error::Mismatch(format!(
            "tensor {name} has {} {dtype} blocks of {total} with a NaN or infinite scale (the first: block {first}): \
             the file is corrupt",
            bad.len()
        ))),
    }
}

/// The rows of `a` and `b` (each `rows` rows of `row` items) interleaved: a0, b0, a1, b1, ...
fn interleave_rows<T: Copy>(a: &[T], b: &[T], row: usize) -> Vec<T> {
    a.chunks(row).zip(b.chunks(row)).flat_map(|(x, y)| x.iter().chain(y).copied()).collect()
}

/// A weight's stored rows in the type the GPU reads ([`gpu_rows`]).
type RawRows<'a> = (DType, Cow<'a, [u8]>);

/// What the layers' projections load from: the device, the checkpoint and the weights' format.
#[derive(Clone, Copy)]
struct Loader<'a> {
    gpu: &'a Gpu,
    ck: &'a dyn TensorSource,
    format: WeightFormat,
}

impl Loader<'_> {
    /// The stored rows of every part `(name, rows)` ([`gpu_rows`]), or None where one goes through
    /// f16 (the parts after it are not read).
    fn gpu_parts<'p>(&'p self, parts: &'p [(String, usize)], k: usize) -> Result<Option<Vec<RawRows<'p>>>> {
        let mut raws = Vec::with_capacity(parts.len());
        for (name, rows) in parts {
            match gpu_rows(self.ck, name, *rows, k, self.format)? {
                Some(r) => raws.push(r),
                None => return Ok(None),
            }
        }
        Ok(Some(raws))
    }

    /// The parts' values as f16, stacked (each checked finite).
    fn f16_parts(&self, parts: &[(String, usize)], k: usize) -> Result<Vec<f16>> {
        let mut data = Vec::with_capacity(parts.iter().map(|p| p.1).sum::<usize>() * k);
        for (name, rows) in parts {
            data.extend(finite16(name, self.ck.f16(name, &as_rows(self.ck, name, *rows, k)?)?)?);
        }
        Ok(data)
    }

    /// `name` (`[rows, cols]`) in row chunks that each fit a storage binding, labelled `label`: in
    /// its stored type where a kernel reads it ([`gpu_rows`]), else f16.
    fn row_chunks(&self, name: &str, label: &str, rows: usize, cols: usize) -> Result<Vec<(u32, Linear)>> {
        Ok(match gpu_rows(self.ck, name, rows, cols, self.format)? {
            Some((dtype, raw)) => QuantWeight::row_chunks(self.gpu, label, dtype, [rows, cols], &raw)?
                .into_iter()
                .map(|(r, w)| (r, Linear::Quant(w)))
                .collect(),
            None => {
                let t = finite16(name, self.ck.f16(name, &[rows, cols])?)?;
                upload_row_chunks(self.gpu, label, &t, rows, cols)?
                    .into_iter()
                    .map(|(r, t)| (r, Linear::F16(t)))
                    .collect()
            }
        })
    }

    /// The one weight `[rows, k]` named `name`.
    fn single(&self, name: &str, rows: usize, k: usize) -> Result<Linear> {
        let p = self.proj(name, &[(name.to_string(), rows)], k, false)?;
        Ok(p.parts.into_iter().next().expect("one part").1)
    }

    /// Uploads the parts `(name, rows)` of a projection with rows of `k` (see [`Proj`]); `glu`: two
    /// parts (gate, up) of one format become one weight of interleaved rows.
    fn proj(&self, label: &str, parts: &[(String, usize)], k: usize, glu: bool) -> Result<Proj> {
        let gpu = self.gpu;
        let n: usize = parts.iter().map(|p| p.1).sum();
        let glu = glu && parts.len() == 2 && parts[0].1 == parts[1].1;
        if let Some(raws) = self.gpu_parts(parts, k)? {
            if glu && raws[0].0 == raws[1].0 {
                let (dtype, row) = (raws[0].0, raws[0].0.byte_size(k).unwrap_or(0));
                let rows = interleave_rows(&raws[0].1, &raws[1].1, row);
                let w = QuantWeight::concat_rows(gpu, label, dtype, k, &[&rows])?;
                return Ok(Proj { parts: vec![(0, Linear::Quant(w))], n, glu: true });
            }
            // Runs of consecutive parts of one type become one weight each (all of them when the types
            // match; a Q4_K_M file's [q; k] Q4_K and v Q6_K: two), if each run's columns start where
            // an output view may.
            let (mut out, mut col, mut i) = (Vec::new(), 0, 0);
            while i < parts.len() && col % CHUNK_ROW_ALIGN == 0 {
                let dtype = raws[i].0;
                let end = (i..parts.len()).find(|&j| raws[j].0 != dtype).unwrap_or(parts.len());
                let slices: Vec<&[u8]> = raws[i..end].iter().map(|(_, b)| b.as_ref()).collect();
                let run_label = if end - i == parts.len() { label.to_string() } else { parts[i].0.clone() };
                out.push((col, Linear::Quant(QuantWeight::concat_rows(gpu, &run_label, dtype, k, &slices)?)));
                col += parts[i..end].iter().map(|p| p.1).sum::<usize>();
                i = end;
            }
            if i == parts.len() {
                return Ok(Proj { parts: out, n, glu: false });
            }
        }
        // Float tensors, fixups that change values, or parts that cannot be split: f16, stacked.
        let mut data = self.f16_parts(parts, k)?;
        if glu {
            data = interleave_rows(&data[..n / 2 * k], &data[n / 2 * k..], k);
        }
        Ok(Proj { parts: vec![(0, Linear::F16(gpu.upload_f16(label, &[n, k], &data)?))], n, glu })
    }
}

/// Reads and uploads every weight; `progress(done, total)` is called after each tensor group.
/// `format`: the type linear weights take on the GPU.
pub fn load(
    gpu: &Gpu,
    ck: &dyn TensorSource,
    format: WeightFormat,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Weights> {
    let c: &ModelConfig = ck.config();
    let h = c.hidden_size;
    let total = 3 + c.num_layers();
    let norm =
        |name: &str, n: usize| -> Result<Tensor> { gpu.upload_f32(name, &[n], &finite32(name, ck.f32(name, &[n])?)?) };

    // The embedding table in its own quantized type (the gather dequantizes the rows it reads), or
    // f16.
    let ld = Loader { gpu, ck, format };
    let embed = ld.row_chunks("token_embd.weight", "token_embd", c.vocab_size, h)?;
    let mut bytes: u64 = embed.iter().map(|(_, w)| w.gpu_bytes()).sum();
    progress(1, total);
    let head_name = if ck.has("output.weight") { "output.weight" } else { "token_embd.weight" };
    // A tied lm_head reads the embedding's own chunks, quantized or f16.
    let lm_head = match head_name {
        "token_embd.weight" => embed.clone(),
        _ => ld.row_chunks(head_name, "output", c.vocab_size, h)?,
    };
    if head_name != "token_embd.weight" {
        bytes += lm_head.iter().map(|(_, w)| w.gpu_bytes()).sum::<u64>();
    }
    progress(2, total);
    let output_norm = norm("output_norm.weight", h)?;
    let per_layer_input = match c.per_layer_input {
        None => None,
        Some(ple) => {
            let all = c.num_layers() * ple.dim;
            let name = "per_layer_token_embd.weight";
            let embed = ld.row_chunks(name, "per_layer_token_embd", ple.vocab, all)?;
            let w = PerLayerInputWeights {
                embed,
                model_proj: ld.single("per_layer_model_proj.weight", all, h)?,
                norm: norm("per_layer_proj_norm.weight", ple.dim)?,
            };
            bytes += w.embed.iter().map(|(_, e)| e.gpu_bytes()).sum::<u64>() + w.model_proj.gpu_bytes();
            Some(w)
        }
    };
    progress(3, total);

    let mut layers = Vec::with_capacity(c.num_layers());
    for i in 0..c.num_layers() {
        let lw = load_layer(gpu, ck, i, format)?;
        bytes += lw.linears().iter().map(|w| w.gpu_bytes()).sum::<u64>();
        layers.push(lw);
        progress(4 + i, total);
    }
    gpu.wait()?;
    Ok(Weights { embed, lm_head, output_norm, layers, per_layer_input, bytes })
}

/// One layer's weights, by its spec ([`ModelConfig::layer`]).
fn load_layer(gpu: &Gpu, ck: &dyn TensorSource, i: usize, format: WeightFormat) -> Result<LayerWeights> {
    let c: &ModelConfig = ck.config();
    let spec = c.layer(i);
    let h = c.hidden_size;
    let n = |s: &str| format!("blk.{i}.{s}");
    let norm = |name: &str, len: usize| -> Result<Tensor> {
        gpu.upload_f32(name, &[len], &finite32(name, ck.f32(name, &[len])?)?)
    };
    let ld = Loader { gpu, ck, format };
    let single = |name: &str, rows: usize, k: usize| ld.single(name, rows, k);
    let mixer = match spec.mixer {
        Mixer::Attention(a) => {
            let (qd, kvd, d) = (a.q_dim(), a.kv_dim(), a.head_dim);
            // [q; k; v], or [q; k] when the values are the keys (k_eq_v), or [q] alone for a layer
            // that reads another layer's KV cache.
            let mut parts = vec![("attn_q", qd)];
            if a.kv_from.is_none() {
                parts.push(("attn_k", kvd));
                if !a.k_eq_v {
                    parts.push(("attn_v", kvd));
                }
            }
            let weights: Vec<(String, usize)> = parts.iter().map(|&(p, r)| (n(&format!("{p}.weight")), r)).collect();
            let qkv = ld.proj(&n("attn_qkv.weight"), &weights, h, false)?;
            let qkv_bias = if a.bias {
                let mut b = Vec::with_capacity(a.qkv_dim());
                for &(p, rows) in &parts {
                    let name = n(&format!("{p}.bias"));
                    b.extend(finite32(&name, ck.f32(&name, &[rows])?)?);
                }
                Some(gpu.upload_f32(&n("attn_qkv.bias"), &[b.len()], &b)?)
            } else {
                None
            };
            let qk_norm = match (a.qk_norm, a.kv_from) {
                (false, _) => None,
                (true, None) => Some((norm(&n("attn_q_norm.weight"), d)?, norm(&n("attn_k_norm.weight"), d)?)),
                // No k heads to norm: the q norm stands in for the k norm's binding.
                (true, Some(_)) => {
                    let q = norm(&n("attn_q_norm.weight"), d)?;
                    Some((q.clone(), q))
                }
            };
            let gate = if a.output_gate { Some(single(&n("attn_out_gate.weight"), qd, h)?) } else { None };
            MixerWeights::Attention { qkv, qkv_bias, qk_norm, gate, out: single(&n("attn_output.weight"), h, qd)? }
        }
        Mixer::DeltaNet(d) => {
            let hv = d.v_heads;
            let in_proj = ld.proj(
                &n("ssm_in.weight"),
                &[
                    (n("ssm_in_qkv.weight"), d.conv_dim()),
                    (n("ssm_in_z.weight"), d.value_dim()),
                    (n("ssm_beta.weight"), hv),
                    (n("ssm_alpha.weight"), hv),
                ],
                h,
                false,
            )?;
            let conv_name = n("ssm_conv1d.weight");
            let conv_shape = ck.shape(&conv_name)?;
            if conv_shape.iter().product::<usize>() != d.conv_dim() * d.conv_kernel
                || conv_shape.first() != Some(&d.conv_dim())
            {
                return Err(Error::Mismatch(format!(
                    "tensor {conv_name} has shape {conv_shape:?}, the config implies [{}, {}]",
                    d.conv_dim(),
                    d.conv_kernel
                )));
            }
            let conv = finite32(&conv_name, ck.f32(&conv_name, &conv_shape)?)?;
            MixerWeights::DeltaNet {
                in_proj,
                conv: gpu.upload_f32(&conv_name, &[d.conv_dim(), d.conv_kernel], &conv)?,
                a_log: norm(&n("ssm_a_log.weight"), hv)?,
                dt_bias: norm(&n("ssm_dt_bias.weight"), hv)?,
                norm: norm(&n("ssm_norm.weight"), d.v_dim)?,
                out: single(&n("ssm_out.weight"), h, d.value_dim())?,
            }
        }
    };
    let mlp = match spec.mlp {
        MlpSpec::Dense { intermediate: f, .. } => MlpWeights::Dense {
            gate_up: ld.proj(
                &n("ffn_gate_up.weight"),
                &[(n("ffn_gate.weight"), f), (n("ffn_up.weight"), f)],
                h,
                true,
            )?,
            down: single(&n("ffn_down.weight"), h, f)?,
        },
        MlpSpec::Moe { experts, intermediate: f, shared_intermediate: fs, .. } => {
            let mut router_parts = vec![(n("ffn_gate_inp.weight"), experts)];
            if fs > 0 {
                router_parts.push((n("ffn_gate_inp_shexp.weight"), 1));
            }
            let router = ld.proj(&n("ffn_router.weight"), &router_parts, h, false)?;
            let exps = (n("ffn_gate_exps.weight"), n("ffn_up_exps.weight"), experts * f);
            let shexp = (n("ffn_gate_shexp.weight"), n("ffn_up_shexp.weight"), fs);
            let (down_exps, down_shexp) = ((n("ffn_down_exps.weight"), experts * h), (n("ffn_down_shexp.weight"), h));
            let (gu_label, down_label) = (n("ffn_gate_up_exps.weight"), n("ffn_down_exps.weight"));
            if fs == f {
                // A shared expert of the experts' size runs as one more expert of the stack (the
                // router gives it a slot of its own): two dispatches fewer a layer.
                MlpWeights::Moe {
                    router,
                    gate_up_exps: ld.glu_stack(&gu_label, &[exps, shexp], h)?,
                    down_exps: ld.stack(&down_label, &[down_exps, down_shexp], f)?,
                    shared: SharedExpert::Stacked,
                }
            } else {
                let shared = if fs > 0 {
                    let gu = ld.proj(&n("ffn_gate_up_shexp.weight"), &[(shexp.0, fs), (shexp.1, fs)], h, true)?;
                    SharedExpert::Separate(gu, single(&n("ffn_down_shexp.weight"), h, fs)?)
                } else {
                    SharedExpert::None
                };
                MlpWeights::Moe {
                    router,
                    gate_up_exps: ld.glu_stack(&gu_label, &[exps], h)?,
                    down_exps: ld.stack(&down_label, &[down_exps], f)?,
                    shared,
                }
            }
        }
    };
    let (post_attn_norm, post_ffw_norm) = if spec.sandwich_norm {
        (Some(norm(&n("post_attention_norm.weight"), h)?), Some(norm(&n("post_ffw_norm.weight"), h)?))
    } else {
        (None, None)
    };
    let output_scale = if spec.output_scale {
        let name = n("layer_output_scale.weight");
        match finite32(&name, ck.f32(&name, &[1])?)?[..] {
            [s] => s,
            _ => unreachable!("a tensor of shape [1]"),
        }
    } else {
        1.0
    };
    let per_layer_input = match c.per_layer_input {
        None => None,
        Some(ple) => Some((
            single(&n("inp_gate.weight"), ple.dim, h)?,
            single(&n("proj.weight"), h, ple.dim)?,
            norm(&n("post_norm.weight"), h)?,
        )),
    };
    if output_scale != 1.0 && post_ffw_norm.is_none() {
        return Err(Error::Unsupported(format!("layer {i}: an output scale without a post-MLP norm")));
    }
    Ok(LayerWeights {
        attn_norm: norm(&n("attn_norm.weight"), h)?,
        mixer,
        post_attn_norm,
        ffn_norm: norm(&n("ffn_norm.weight"), h)?,
        mlp,
        post_ffw_norm,
        output_scale,
        per_layer_input,
    })
}

/// Gate and up weights (pairs of `(gate, up, rows)`, each `[rows, k]`) as one weight whose rows
/// interleave gate and up within each pair (what the GLU epilogue of the expert matvec reads), the
/// pairs one after another: stacked experts `[E, I, k]` become rows e·2I .. (e+1)·2I for expert
/// e; a shared expert of the same size, appended, becomes expert E.
impl Loader<'_> {
    fn glu_stack(&self, label: &str, pairs: &[(String, String, usize)], k: usize) -> Result<Linear> {
        let Loader { gpu, ck, format } = *self;
        let mut raws = Vec::new();
        for (g, u, rows) in pairs {
            match (gpu_rows(ck, g, *rows, k, format)?, gpu_rows(ck, u, *rows, k, format)?) {
                (Some(g), Some(u)) if g.0 == u.0 => raws.push((g, u)),
                _ => break,
            }
        }
        if raws.len() == pairs.len() && raws.iter().all(|(g, _)| g.0 == raws[0].0 .0) {
            let dtype = raws[0].0 .0;
            let row = dtype.byte_size(k).unwrap_or(0);
            let rows: Vec<Vec<u8>> = raws.iter().map(|(g, u)| interleave_rows(&g.1, &u.1, row)).collect();
            let slices: Vec<&[u8]> = rows.iter().map(Vec::as_slice).collect();
            return Ok(Linear::Quant(QuantWeight::concat_rows(gpu, label, dtype, k, &slices)?));
        }
        let mut data = Vec::new();
        for (g, u, rows) in pairs {
            let gv = finite16(g, ck.f16(g, &as_rows(ck, g, *rows, k)?)?)?;
            let uv = finite16(u, ck.f16(u, &as_rows(ck, u, *rows, k)?)?)?;
            data.extend(interleave_rows(&gv, &uv, k));
        }
        let n = data.len() / k;
        Ok(Linear::F16(gpu.upload_f16(label, &[n, k], &data)?))
    }

    /// Weights (`(name, rows)` parts, each `[rows, k]`) stacked into one weight: the checkpoint's
    /// type when all parts share it, else f16.
    fn stack(&self, label: &str, parts: &[(String, usize)], k: usize) -> Result<Linear> {
        if let Some(raws) = self.gpu_parts(parts, k)? {
            if raws.iter().all(|r| r.0 == raws[0].0) {
                let slices: Vec<&[u8]> = raws.iter().map(|r| r.1.as_ref()).collect();
                return Ok(Linear::Quant(QuantWeight::concat_rows(self.gpu, label, raws[0].0, k, &slices)?));
            }
        }
        let data = self.f16_parts(parts, k)?;
        Ok(Linear::F16(self.gpu.upload_f16(label, &[data.len() / k, k], &data)?))
    }
}

/// The values of `name` if they are all finite. A NaN or an infinity in a weight (a block scale
/// that is NaN or inf, or a value beyond the f16 range the GPU copy holds) makes every logit that
/// reads it NaN: the file is corrupt, and saying so at load beats streaming noise.
fn finite<T>(name: &str, data: Vec<T>, is_finite: fn(&T) -> bool) -> Result<Vec<T>> {
    let Some(first) = data.iter().position(|x| !is_finite(x)) else {
        return Ok(data);
    };
    Err(Error::Mismatch(format!(
        "tensor {name} holds {} non-finite values of {} (the first at element {first}) after \
         dequantization: a NaN or infinite block scale, or a value beyond the f16 range; the file is corrupt",
        data.iter().filter(|x| !is_finite(x)).count(),
        data.len()
    )))
}

fn finite16(name: &str, data: Vec<f16>) -> Result<Vec<f16>> {
    finite(name, data, |x| x.is_finite())
}

fn finite32(name: &str, data: Vec<f32>) -> Result<Vec<f32>> {
    finite(name, data, |x| x.is_finite())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::tensor::test_util::{gpu, random};
    use crate::ops::matmul::gguf::cpu;
    use crate::ops::matmul::gguf::tests::{random_blocks, stage_steps16};

    /// A projection of two quantized types writing a view of wider rows (a [q | k] whose layer's
    /// cache takes v from k): each part lands in its columns of every row at the caller's row
    /// stride, through one mixed dispatch (one token) or a dispatch per part (three tokens); the
    /// columns past the view keep their values. Tolerance: the f32 sums' (4 eps sqrt(K) S) plus
    /// x's 16-bit staging where a part takes the integer dot products (half a step d a term).
    #[test]
    fn mixed_format_parts_write_their_columns() {
        let gpu = gpu();
        let (k, na, nb, ld) = (256, 64, 32, 112);
        let (ta, tb) = (DType::Q4_K, DType::Q6_K);
        let (ra, rb) = (random_blocks(ta, na, k, 1), random_blocks(tb, nb, k, 2));
        let wa = QuantWeight::new(&gpu, "a", ta, [na, k], &ra).unwrap();
        let wb = QuantWeight::new(&gpu, "b", tb, [nb, k], &rb).unwrap();
        let proj = Proj { parts: vec![(0, Linear::Quant(wa)), (na, Linear::Quant(wb))], n: na + nb, glu: false };
        for t in [1usize, 3] {
            let xv = random(t * k, 3 + t as u64, 1.0);
            let y0 = random(t * ld, 7, 1.0);
            let x = gpu.upload_f32("x", &[t, k], &xv).unwrap();
            let buf = gpu.upload_f32("y", &[t, ld], &y0).unwrap();
            let y = buf.view(0, &[t, na + nb]);
            let opts = LinearOpts { ld_out: Some(ld), ..Default::default() };
            let kernels = proj.linear(&gpu, &x, Input::Plain, None, &y, opts).unwrap();
            assert_eq!(kernels.len(), if t == 1 { 1 } else { 2 }, "T = {t}: one mixed dispatch for one token");
            gpu.run(&kernels.iter().collect::<Vec<_>>()).unwrap();
            let got = gpu.read_f32(&buf).unwrap();
            let d = stage_steps16(&xv);
            for (ty, raw, c0, n) in [(ta, &ra, 0, na), (tb, &rb, na, nb)] {
                let wf = crate::dtype::to_f32(ty, raw, n * k).unwrap();
                let mut want = vec![0f32; t * n];
                cpu::linear_quant(&xv, ty, raw, k, None, &mut want, false).unwrap();
                for r in 0..t {
                    for j in 0..n {
                        let row = &wf[j * k..(j + 1) * k];
                        let xr = &xv[r * k..(r + 1) * k];
                        let s: f32 = row.iter().zip(xr).map(|(w, x)| (w * x).abs()).sum();
                        let staging: f32 = row.iter().zip(&d[r * k..(r + 1) * k]).map(|(w, d)| w.abs() * d / 2.0).sum();
                        let tol = 4.0 * f32::EPSILON / 2.0 * (k as f32).sqrt() * s + staging;
                        let (g, w) = (got[r * ld + c0 + j], want[r * n + j]);
                        assert!(
                            (g - w).abs() <= tol,
                            "T = {t}, {ty} row {r} column {}: {g} against {w} (tol {tol})",
                            c0 + j
                        );
                    }
                }
            }
            for r in 0..t {
                assert_eq!(&got[r * ld + na + nb..(r + 1) * ld], &y0[r * ld + na + nb..(r + 1) * ld], "row {r}'s tail");
            }
        }
    }
}
