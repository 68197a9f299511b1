//! Attention over the f16 KV cache: the cache write (`wgsl/kv_cache_write.wgsl`) and causal /
//! sliding-window grouped-query attention (`wgsl/attention.wgsl`), one kernel for prefill and
//! decode.
//!
//! Inputs are the rows of the fused QKV projection, `[q: H*D | k: Hkv*D | v: Hkv*D]` per token
//! (q and k already roped); token `t` of a pass is at position `step.pos + t` of KV-cache slot
//! `step.slot` ([`StepParams`](super::StepParams)), or, in a decode step of many sequences
//! ([`attention_batch`]), at its own sequence's position and slot. Each layer's K and V caches are
//! f16 `[S, Hkv, max_ctx, D]`, S slots of one sequence each (see [`kv_cache`]). [`rope_kv_write`](super::rope::rope_kv_write) does the cache write inside
//! the RoPE dispatch (one dispatch less per layer).
//!
//! Tiling ([`Tiling`]): a workgroup takes `bq` rows, each a (token, query head) pair of one KV
//! head, and walks its keys in tiles of `bk` staged in workgroup memory with an online softmax.
//! When there are few row blocks (decode, short chunks) the keys are also split over `nsplit`
//! workgroups (flash decoding) and a second dispatch merges the partial results.
//!
//! On an H100 (Vulkan; `benches/attention.rs`, best of 5): decode with H=32, Hkv=8, D=128 takes 15 µs
//! at 1k keys, 23 µs at 4k, 57 µs at 16k (kernel + merge; one empty dispatch costs about 5 µs
//! there); causal prefill of 2048 tokens runs at about 12.7 TFLOP/s (D=128) and 9.5 (D=256).

use crate::error::{Error, Result};
use crate::gpu::{kernel::grid, ElemType, Gpu, Kernel, Macros, Tensor};
use crate::ops::signature::shared_params;

/// Shape of one layer's attention.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttnParams {
    /// Query heads (H).
    pub heads: usize,
    /// Key/value heads (Hkv); divides H.
    pub kv_heads: usize,
    /// Head dimension D (a multiple of 16, ≤ 512).
    pub head_dim: usize,
    /// Positions the KV cache holds.
    pub max_ctx: usize,
    /// Sliding window (keys `p + 1 - window ..= p`); 0 = full causal.
    pub window: usize,
    /// Score scale: 1/sqrt(D), or Gemma's query_pre_attn_scalar^-0.5.
    pub scale: f32,
    /// Tokens per pass the kernels are recorded for (T); a step may use fewer (`step.n_tokens`).
    pub n_tokens: usize,
    /// Key splits (flash decoding); 0 = choose from the shape.
    pub splits: usize,
}

impl AttnParams {
    /// One token a pass over a cache of `max_ctx` positions (`window` 0: every earlier position),
    /// scores scaled by 1/sqrt(head_dim), the split chosen by the kernel: a layer's decode shape.
    pub fn one_token(heads: usize, kv_heads: usize, head_dim: usize, max_ctx: usize, window: usize) -> AttnParams {
        AttnParams {
            heads,
            kv_heads,
            head_dim,
            max_ctx,
            window,
            scale: 1.0 / (head_dim as f32).sqrt(),
            n_tokens: 1,
            splits: 0,
        }
    }

    /// The uniform of both attention kernels (`Params` in `wgsl/attention.wgsl` and
    /// `wgsl/attention_decode.wgsl`).
    fn uniform(&self, gpu: &Gpu, label: &str) -> wgpu::Buffer {
        let params = AttentionUniform {
            heads: self.heads as u32,
            kv_heads: self.kv_heads as u32,
            max_ctx: self.max_ctx as u32,
            window: self.window as u32,
            scale: self.scale,
            n_rows: self.n_tokens as u32,
            ..Default::default()
        };
        gpu.uniform(label, &params)
    }

    /// [`Self::check`] and the output `out` f32 of T rows, as both attention kernels take them.
    fn check_io(&self, io: &Io) {
        self.check(io.qkv, io.k_cache, io.v_cache);
        assert_eq!(io.out.ty, ElemType::F32, "attention: out must be f32");
        assert!(io.out.numel() >= self.n_tokens * self.heads * self.head_dim, "attention: out holds fewer than T rows");
    }

    fn row_stride(&self) -> usize {
        (self.heads + 2 * self.kv_heads) * self.head_dim
    }
    fn check(&self, qkv: &Tensor, k_cache: &Tensor, v_cache: &Tensor) {
        let d = self.head_dim;
        assert!(
            d >= 16 && d.is_multiple_of(16) && d <= 512,
            "attention: head_dim {d} must be a multiple of 16, at most 512"
        );
        assert!(self.kv_heads > 0 && self.heads.is_multiple_of(self.kv_heads), "attention: Hkv must divide H");
        assert!(self.n_tokens > 0 && self.max_ctx > 0);
        assert_eq!(qkv.ty, ElemType::F32, "attention: qkv must be f32");
        assert!(qkv.numel() >= self.n_tokens * self.row_stride(), "attention: qkv holds fewer than T rows");
        for c in [k_cache, v_cache] {
            assert_eq!(c.ty, ElemType::F16, "attention: KV cache must be f16");
            let (_, hkv, ctx, cd) = cache_dims(c);
            assert!(
                hkv == self.kv_heads && ctx == self.max_ctx && cd == d,
                "attention: KV cache must be [S, Hkv, max_ctx, D]"
            );
        }
    }
}

crate::ops::uniform::uniform_struct! {
    /// WGSL twin: `struct Params` of `wgsl/include/attention_params.wgsl` (attention, attention_decode).
    pub(crate) struct AttentionUniform = "Params" {
        heads: u32,
        kv_heads: u32,
        max_ctx: u32,
        window: u32,
        scale: f32,
        n_rows: u32,
        _pad0: u32,
        _pad1: u32,
    }
}

/// (slots, Hkv, max_ctx, D) of a KV cache, f16 `[S, Hkv, max_ctx, D]` or `[Hkv, max_ctx, D]`
/// (one slot).
pub fn cache_dims(c: &Tensor) -> (usize, usize, usize, usize) {
    match c.shape[..] {
        [s, h, n, d] => (s, h, n, d),
        [h, n, d] => (1, h, n, d),
        _ => panic!("a KV cache is [S, Hkv, max_ctx, D], not {:?}", c.shape),
    }
}

/// Allocates one layer's K and V caches of `slots` sequences, f16 `[S, Hkv, max_ctx, D]` (zeroed).
pub fn kv_cache(gpu: &Gpu, label: &str, p: &AttnParams, slots: usize) -> Result<(Tensor, Tensor)> {
    let shape = [slots, p.kv_heads, p.max_ctx, p.head_dim];
    Ok((
        gpu.empty(&format!("{label}.k"), &shape, ElemType::F16)?,
        gpu.empty(&format!("{label}.v"), &shape, ElemType::F16)?,
    ))
}

crate::ops::uniform::uniform_struct! {
    /// WGSL twin: `struct Params` of `wgsl/kv_cache_write.wgsl`.
    pub(crate) struct KvCacheWriteUniform = "Params" {
        kv_heads: u32,
        half_dim: u32,
        q_dim: u32,
        row_stride: u32,
        max_ctx: u32,
        n_rows: u32,
        _pad0: u32,
        _pad1: u32,
    }
}

/// Records the copy of the k and v parts of `qkv` rows `t < step.n_tokens` into the caches at
/// positions `step.pos + t`, rounded to f16 (nearest even, the same bits on every device).
/// Positions at or past `max_ctx` are dropped: the caller keeps `pos + n_tokens <= max_ctx`.
pub fn kv_cache_write(
    gpu: &Gpu,
    qkv: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    step: &wgpu::Buffer,
    p: AttnParams,
) -> Result<Kernel> {
    p.check(qkv, k_cache, v_cache);
    let half = p.head_dim / 2;
    let params = KvCacheWriteUniform {
        kv_heads: p.kv_heads as u32,
        half_dim: half as u32,
        q_dim: (p.heads * p.head_dim) as u32,
        row_stride: p.row_stride() as u32,
        max_ctx: p.max_ctx as u32,
        n_rows: p.n_tokens as u32,
        ..Default::default()
    };
    let params = gpu.uniform("kv_cache_write.params", &params);
    let threads = (p.n_tokens * p.kv_heads * half) as u32;
    gpu.kernel(
        "kv_cache_write",
        "main",
        &gpu.macros(),
        &[qkv.binding(), k_cache.binding(), v_cache.binding(), step.as_entire_binding(), params.as_entire_binding()],
        grid(threads.div_ceil(256)),
    )
}

/// Heads wider than 256 stage their queries as f16 (`Q_F16` in `wgsl/attention.wgsl`: 8 bytes per
/// 4-dim unit instead of 16), so that Gemma 4's 512-dim heads fit a 16-key tile in 32 KiB.
pub fn q_f16(head_dim: usize) -> bool {
    head_dim > 256
}

fn q_unit_bytes(d: usize) -> usize {
    if q_f16(d) {
        8
    } else {
        16
    }
}

/// How [`attention`] cuts the work (see `wgsl/attention.wgsl`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tiling {
    /// Rows ((token, query head) pairs of one KV head) per workgroup.
    pub bq: usize,
    /// Lanes (threads) per row; the workgroup has `bq * lpr` threads.
    pub lpr: usize,
    /// Keys per tile.
    pub bk: usize,
    /// Workgroups sharing one row block's keys (1: no merge pass).
    pub nsplit: usize,
}

impl Tiling {
    /// Workgroup memory of a tiling (see the arrays of `wgsl/attention.wgsl`).
    pub fn workgroup_bytes(&self, d: usize) -> usize {
        let row = d / 4 + 1;
        q_unit_bytes(d) * self.bq * row + 8 * self.bk * row + 4 * self.bq * (self.bk + 1) + 8 * self.bq * self.lpr
    }

    /// Per-thread counts of the kernel's unrolled register slots: (keys per lane, 4-dim output
    /// units per lane, 16-byte loads per K/V tile, 16-byte loads of the queries).
    fn slots(&self, d: usize) -> (usize, usize, usize, usize) {
        let wg = self.bq * self.lpr;
        (self.bk / self.lpr, (d / 4).div_ceil(self.lpr), (self.bk * d / 8).div_ceil(wg), (self.bq * d / 4).div_ceil(wg))
    }

    #[doc(hidden)]
    pub fn valid(&self, d: usize, budget: usize) -> bool {
        let (kpl, nw, ld, ql) = self.slots(d);
        self.bk.is_multiple_of(self.lpr)
            && (1..=4).contains(&kpl)
            && nw <= 8
            && ld <= 8
            && ql <= 8
            && self.workgroup_bytes(d) <= budget
    }

    /// The tiling for `p` on `gpu`: 128 threads; 4, 8 or 16 rows per workgroup (as T * G
    /// allows: 4 in decode), 32, 16 or 8 lanes per row; the largest key tile up to 64 that
    /// fits the register slots and 28 KiB of workgroup memory (smaller where a short context
    /// would otherwise give too few splits); and, when there are fewer than 128 row blocks, key
    /// splits for about 512 workgroups, at most 128 splits and one tile per split at full
    /// context (or window). Tuned on an H100 (see `benches/attention.rs`).
    pub fn choose(gpu: &Gpu, p: &AttnParams) -> Result<Tiling> {
        let g = p.heads / p.kv_heads;
        let d = p.head_dim;
        let budget = (gpu.limits.max_compute_workgroup_storage_size as usize).min(32 << 10) - (4 << 10);
        // Wide heads (Gemma 4's 512) take the block size nearest the rows that fits the register
        // slots and the memory with some key tile (D = 512: 8 rows of 16 lanes, 16-key tiles).
        let any_tile =
            |bq: usize| [8, 16, 32, 64].iter().any(|&bk| Tiling { bq, lpr: 128 / bq, bk, nsplit: 1 }.valid(d, budget));
        let bq = (p.n_tokens * g).next_power_of_two().clamp(4, 16);
        let bq = [bq, bq / 2, bq / 4, 8, 16].into_iter().find(|&b| (4..=16).contains(&b) && any_tile(b)).unwrap_or(bq);
        let lpr = 128 / bq;
        let blocks = (p.n_tokens * g).div_ceil(bq) * p.kv_heads;
        // keys one row block can see at most
        let span = if p.window > 0 { p.max_ctx.min(p.window + p.n_tokens) } else { p.max_ctx };
        // Split decode (fewer than 128 row blocks) aims at ~512 workgroups, one key tile each at
        // full span: where the span is too short for that, smaller tiles make more splits (H100,
        // Qwen2.5-1.5B decode at 641 positions: 16-key tiles, 41 splits, 8.4 us a layer against
        // 12.3 us with 64-key tiles and 11 splits; -4.5 % a step). Otherwise the largest tile that
        // fits, at most the tuning's key tile (64; WGPU_LLM_ATTN_BK caps it, a knob for benchmarks).
        let target = 512usize.div_ceil(blocks);
        let bk_cap = gpu.tuning().attn_key_tile();
        let fits = |bk: usize| bk <= bk_cap && Tiling { bq, lpr, bk, nsplit: 1 }.valid(d, budget);
        let short = blocks < 128 && p.splits == 0 && span.div_ceil(64) < target;
        let bk = if short {
            // The largest tile that still gives `target` splits, else the smallest that fits.
            [64, 32, 16, 8]
                .into_iter()
                .filter(|&bk| fits(bk))
                .find(|&bk| span.div_ceil(bk) >= target)
                .or_else(|| [8, 16, 32, 64].into_iter().find(|&bk| fits(bk)))
        } else {
            [64, 32, 16, 8].into_iter().find(|&bk| fits(bk))
        }
        .ok_or_else(|| Error::Gpu(format!("attention: head_dim {d} does not fit the device's workgroup memory")))?;
        let nsplit = if p.splits > 0 {
            p.splits
        } else if blocks >= 128 {
            1
        } else {
            target.min(span.div_ceil(bk)).clamp(1, 128)
        };
        // The partial results must fit a binding.
        let max_bytes = (gpu.limits.max_storage_buffer_binding_size as usize).min(64 << 20);
        let per_split = 4 * p.n_tokens * p.heads * d;
        let nsplit = nsplit.min(max_bytes / per_split).max(1);
        Ok(Tiling { bq, lpr, bk, nsplit })
    }
}

/// The operands every attention kernel binds: the fused QKV rows, the layer's KV caches, the
/// output rows and the step's [`StepParams`](super::StepParams) uniform.
#[derive(Clone, Copy)]
struct Io<'a> {
    qkv: &'a Tensor,
    k_cache: &'a Tensor,
    v_cache: &'a Tensor,
    out: &'a Tensor,
    step: &'a wgpu::Buffer,
}

/// The optional inputs, each of which picks a variant of the kernels (a WGSL macro and a binding
/// after the others): `rope`'s inverse frequencies (`ROPE`, binding `RB`), a batch's sequences
/// (`BATCH`, binding `SEQS`) and the staged output of [`attention_staged`] (`STAGE8`, binding
/// `XB`; the decode kernel only).
#[derive(Clone, Copy, Default)]
struct Variant<'a> {
    rope: Option<&'a Tensor>,
    seqs: Option<&'a Tensor>,
    stage: Option<&'a Tensor>,
}

// The public constructors: each takes `gpu` and the operands of an [`Io`] first.
shared_params! {
    (gpu: &Gpu, qkv: &Tensor, k_cache: &Tensor, v_cache: &Tensor, out: &Tensor, step: &wgpu::Buffer)

    /// Records attention for the rows `t < step.n_tokens` of `qkv` (f32 `[T, (H + 2 Hkv) * D]`,
    /// q and k roped, this pass's k and v already in the caches by [`kv_cache_write`]) into `out`
    /// (f32 `[T, H * D]`). One kernel, or two when the keys are split (the second merges).
    pub fn attention(p: AttnParams) -> Result<Vec<Kernel>> {
        let io = Io { qkv, k_cache, v_cache, out, step };
        io.record(gpu, p, Variant::default())
    }

    /// [`attention`] (with `rope`, [`attention_rope`]) for one decode token that also writes its
    /// output staged into `xs` as [`crate::ops::matmul::gguf::quantize_x16`] would, for the o
    /// projection's matvec on x staged apart: None where the one-dispatch decode kernel does not
    /// run this shape or cannot stage ([`stages_output`]; the caller runs the unstaged op).
    pub fn attention_staged(p: AttnParams, rope: Option<&Tensor>, xs: &Tensor) -> Result<Option<Vec<Kernel>>> {
        let io = Io { qkv, k_cache, v_cache, out, step };
        match DecodeTiling::choose(gpu, &p, rope.is_some()) {
            Some(tl) if stages_output(gpu, &p) => {
                io.decode(gpu, p, tl, Variant { rope, seqs: None, stage: Some(xs) }).map(Some)
            }
            _ => Ok(None),
        }
    }

    /// [`attention`] (or with `inv_freq`, [`attention_rope`]) for a decode step of many sequences:
    /// token `t` of `qkv` is sequence `t`, at position `seqs[t].0` of KV-cache slot `seqs[t].1`
    /// (u32 `[T, 2]`). Each token runs with the tiling of a one-token pass, so a sequence's output
    /// does not depend on which others share the step.
    pub fn attention_batch(seqs: &Tensor, p: AttnParams, inv_freq: Option<&Tensor>) -> Result<Vec<Kernel>> {
        assert!(seqs.ty == ElemType::U32 && seqs.numel() >= 2 * p.n_tokens, "attention: seqs must be u32 [T, 2]");
        let io = Io { qkv, k_cache, v_cache, out, step };
        io.record(gpu, p, Variant { rope: inv_freq, seqs: Some(seqs), stage: None })
    }

    /// [`attention`] for one decode token whose q and k heads in `qkv` are not yet rotated, fused
    /// with what [`crate::ops::rope::rope_kv_write`] would do first (no q/k norm): the queries are
    /// rotated as they load, and this step's key (rotated) and value are read from `qkv` and
    /// written to the caches. `inv_freq`: f32 `[D / 2]` ([`crate::ops::rope::inv_freq`]). One
    /// dispatch fewer a layer.
    pub fn attention_rope(p: AttnParams, inv_freq: &Tensor) -> Result<Vec<Kernel>> {
        assert_eq!(p.n_tokens, 1, "attention_rope: one token (decode)");
        assert_eq!(inv_freq.numel(), p.head_dim / 2, "attention_rope: inv_freq has D / 2 entries");
        let io = Io { qkv, k_cache, v_cache, out, step };
        io.record(gpu, p, Variant { rope: Some(inv_freq), ..Variant::default() })
    }

    /// [`attention`] with a given tiling (tests, benchmarks); with `rope`, [`attention_rope`]; with
    /// `seqs`, [`attention_batch`] (one row block per token).
    pub fn attention_with(
        p: AttnParams, tl: Tiling, rope: Option<&Tensor>, seqs: Option<&Tensor>
    ) -> Result<Vec<Kernel>> {
        let io = Io { qkv, k_cache, v_cache, out, step };
        io.tiled(gpu, p, tl, Variant { rope, seqs, stage: None })
    }

    /// Records the attention of one decode token (`p.n_tokens == 1`), or with `seqs` of a decode
    /// step of `p.n_tokens` sequences as [`attention_batch`], in one dispatch
    /// (`wgsl/attention_decode.wgsl`): each token's keys split over `tl.nsplit` workgroups per KV
    /// head, the last of which merges. Without `rope`, the tokens' k and v are already in the
    /// caches (q and k roped); with `rope` (f32 `[D / 2]` inverse frequencies), q and k in `qkv`
    /// are unrotated and the kernel rotates them and writes the caches, as [`attention_rope`]. A
    /// token's output is the same whatever the other tokens of the step.
    pub fn attention_decode(
        p: AttnParams, tl: DecodeTiling, rope: Option<&Tensor>, seqs: Option<&Tensor>, stage: Option<&Tensor>
    ) -> Result<Vec<Kernel>> {
        let io = Io { qkv, k_cache, v_cache, out, step };
        io.decode(gpu, p, tl, Variant { rope, seqs, stage })
    }
}

/// Whether [`attention_decode`] can write one token's output staged (`STAGE8`): subgroups of 8
/// or more (a block's eight threads meet by shuffles), heads of whole 32-element blocks.
pub fn stages_output(gpu: &Gpu, p: &AttnParams) -> bool {
    p.n_tokens == 1 && p.head_dim.is_multiple_of(32) && gpu.caps.shuffles8()
}

impl<'a> Io<'a> {
    /// The one-dispatch decode kernel where it takes this shape, else the tiled kernel with the
    /// tiling chosen for it; a batch (`seqs`) runs each token with a one-token pass's choice.
    fn record(self, gpu: &Gpu, p: AttnParams, v: Variant<'a>) -> Result<Vec<Kernel>> {
        let shape = if v.seqs.is_some() { AttnParams { n_tokens: 1, ..p } } else { p };
        match DecodeTiling::choose(gpu, &shape, v.rope.is_some()) {
            Some(tl) => self.decode(gpu, p, tl, v),
            None => self.tiled(gpu, p, Tiling::choose(gpu, &shape)?, v),
        }
    }

    /// The bindings both attention kernels start with: qkv, the caches, step and their uniform.
    fn bindings<'b>(&self, params: &'b wgpu::Buffer) -> Vec<wgpu::BindingResource<'b>>
    where
        'a: 'b,
    {
        vec![
            self.qkv.binding(),
            self.k_cache.binding(),
            self.v_cache.binding(),
            self.step.as_entire_binding(),
            params.as_entire_binding(),
        ]
    }

    /// [`attention_with`]: the tiled kernel (`wgsl/attention.wgsl`), and its merge where the keys
    /// are split.
    fn tiled(self, gpu: &Gpu, p: AttnParams, tl: Tiling, v: Variant<'a>) -> Result<Vec<Kernel>> {
        p.check_io(&self);
        assert!(v.stage.is_none(), "attention: only the decode kernel stages its output");
        let Tiling { bq, lpr, bk, nsplit } = tl;
        let (d, g) = (p.head_dim, p.heads / p.kv_heads);
        let limit = gpu.limits.max_compute_workgroup_storage_size as usize;
        assert!(tl.valid(d, limit) && bq * lpr <= 256 && nsplit >= 1, "attention: invalid tiling {tl:?} for D = {d}");
        let (kpl, nw, ld, ql) = tl.slots(d);
        let params = p.uniform(gpu, "attention.params");
        let macros = gpu
            .macros()
            .set("D", d)
            .set("G", g)
            .set("BQ", bq)
            .set("LPR", lpr)
            .set("WG", bq * lpr)
            .set("BK", bk)
            .set("KPL", kpl)
            .set("NW", nw)
            .set("LD", ld)
            .set("QL", ql)
            .set("NSPLIT", nsplit)
            .flag_if("Q_F16", q_f16(d));
        // A batch of sequences: one row block per token (its G heads), so bq must hold them.
        if v.seqs.is_some() && bq < g {
            return Err(Error::Unsupported(format!(
                "decoding several sequences at once with {g} query heads per KV head at head dimension {d} \
                 (a row block holds {bq})"
            )));
        }
        let blocks = if v.seqs.is_some() { p.n_tokens as u32 } else { (p.n_tokens * g).div_ceil(bq) as u32 };
        let wgs = [blocks, p.kv_heads as u32, nsplit as u32];
        let mut bindings = self.bindings(&params);
        if nsplit == 1 {
            bindings.push(self.out.binding());
            let m = v.bind(macros, &mut bindings);
            return Ok(vec![gpu.kernel("attention", "main", &m, &bindings, wgs)?]);
        }
        let rows = p.n_tokens * p.heads;
        let part_o = gpu.empty("attention.part_o", &[nsplit, rows, d], ElemType::F32)?;
        let part_ml = gpu.empty("attention.part_ml", &[nsplit, rows, 2], ElemType::F32)?;
        bindings.push(part_o.binding());
        bindings.push(part_ml.binding());
        let m = v.bind(macros.clone().flag("SPLIT"), &mut bindings);
        let main = gpu.kernel("attention", "main", &m, &bindings, wgs)?;
        let merge = gpu.kernel(
            "attention",
            "main",
            &macros.flag("MERGE"),
            &[
                part_o.binding(),
                part_ml.binding(),
                self.out.binding(),
                self.step.as_entire_binding(),
                params.as_entire_binding(),
            ],
            // one workgroup per row and 32 dims of it
            grid((rows * d.div_ceil(32)) as u32),
        )?;
        Ok(vec![main, merge])
    }
}

impl<'a> Variant<'a> {
    /// Sets the flags of `rope` and `seqs` and adds their bindings after `bindings` (the staged
    /// output is the decode kernel's own).
    fn bind<'b>(self, mut m: Macros, bindings: &mut Vec<wgpu::BindingResource<'b>>) -> Macros
    where
        'a: 'b,
    {
        if let Some(t) = self.rope {
            m = m.flag("ROPE").set("RB", bindings.len());
            bindings.push(t.binding());
        }
        if let Some(sq) = self.seqs {
            m = m.flag("BATCH").set("SEQS", bindings.len());
            bindings.push(sq.binding());
        }
        m
    }
}

/// Subgroups exactly 32 wide (`SG32` in `wgsl/attention_decode.wgsl`).
#[doc(hidden)]
pub fn sg32(gpu: &Gpu) -> bool {
    gpu.caps.subgroups && gpu.caps.subgroup_min_size == 32 && gpu.caps.subgroup_max_size == 32
}

/// How [`attention_decode`] cuts one decode token's keys (see `wgsl/attention_decode.wgsl`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeTiling {
    /// Keys per chunk (`CK`): a chunk is 8192 or 4096 elements of K (and as many of V).
    pub ck: usize,
    /// Workgroups per KV head (`NSPLIT`), each a run of whole chunks; the last to finish merges.
    pub nsplit: usize,
}

impl DecodeTiling {
    /// Workgroup memory of the kernel (its arrays; `rope`: the rotation table and this step's
    /// key and value too; the lanes' reductions where subgroups do not take them).
    pub fn workgroup_bytes(&self, d: usize, g: usize, rope: bool, sg32: bool) -> usize {
        let (kp, kl) = (256 / self.ck, self.ck * d / 2048);
        16 * g * kp * (2 * kl + 1)       // q_s
            + 8 * self.ck * d / 4        // v_s
            + 4 * g * self.ck * kp       // s_part
            + 4 * g * self.ck            // p_s
            + 2 * 32 + 4                 // alpha_s, l_s, last
            + if sg32 { 0 } else { 2 * 4 * 256 } // red_m, red_l
            + if rope { 8 * d / 2 + 4 * d } else { 0 }
    }

    /// Whether the kernel takes heads of `d` with `g` query heads per KV head at chunks of `ck`
    /// keys: 8192 or 4096 elements a chunk, whole 16-byte words a thread, at most 8 query heads
    /// (a softmax group of 32 lanes each), at most 512 (head, unit) pairs (two a thread).
    #[doc(hidden)]
    pub fn valid(&self, d: usize, g: usize, budget: usize, rope: bool, sg32: bool) -> bool {
        let ce = self.ck * d;
        (ce == 8192 || ce == 4096)
            && (4..=256).contains(&self.ck)
            && d.is_multiple_of(16)
            && (1..=8).contains(&g)
            && g * d / 4 <= 512
            && (1..=128).contains(&self.nsplit)
            && self.workgroup_bytes(d, g, rope, sg32) <= budget
    }

    /// The tiling for one decode token of `p`, or None where the kernel does not apply (the
    /// split attention kernel then runs; `WGPU_LLM_ATTN_DECODE=0` forces that, a benchmark knob):
    /// chunks of 8192 elements where they fit the workgroup memory, else 4096 (or 4096 first with
    /// `WGPU_LLM_ATTN_DECODE_CE=4096`, a benchmark knob); a run per chunk
    /// of the context (or window), at most `(64 / Hkv).clamp(8, 32)` runs per KV head (longer
    /// runs walk several chunks, and the merge reads fewer partial results), or `p.splits`.
    /// Only for heads with at least the tuning table's `AttnDecodeMinKv` KV heads (8 on every family
    /// today: BENCHMARKS runs 30 and 36; `WGPU_LLM_ATTN_DECODE_MIN_KV`, a benchmark knob), or heads
    /// `AttnDecodeHeadDim` wide (128: runs 67-68) — src/tuning/table.rs, where each row says why.
    pub fn choose(gpu: &Gpu, p: &AttnParams, rope: bool) -> Option<DecodeTiling> {
        let (min_kv, wide) = gpu.tuning().decode_attention()?;
        if p.n_tokens != 1 || (p.kv_heads < min_kv && p.head_dim != wide) {
            return None;
        }
        let (d, g) = (p.head_dim, p.heads / p.kv_heads);
        let budget = (gpu.limits.max_compute_workgroup_storage_size as usize).min(32 << 10);
        let span = if p.window > 0 { p.max_ctx.min(p.window + 1) } else { p.max_ctx };
        // (`WGPU_LLM_ATTN_DECODE_CE=4096`, a benchmark knob: the smaller chunks first.)
        gpu.tuning().decode_chunks().into_iter().filter(|ce| ce % d == 0).find_map(|ce| {
            let ck = ce / d;
            let cap = (64 / p.kv_heads).clamp(8, 32);
            let nsplit = if p.splits > 0 { p.splits } else { span.div_ceil(ck).clamp(1, cap) };
            let tl = DecodeTiling { ck, nsplit };
            tl.valid(d, g, budget, rope, sg32(gpu)).then_some(tl)
        })
    }
}

impl<'a> Io<'a> {
    /// [`attention_decode`].
    fn decode(self, gpu: &Gpu, p: AttnParams, tl: DecodeTiling, v: Variant<'a>) -> Result<Vec<Kernel>> {
        p.check_io(&self);
        assert!(p.n_tokens == 1 || v.seqs.is_some(), "attention_decode: one token, or a token a sequence");
        let (d, g) = (p.head_dim, p.heads / p.kv_heads);
        let limit = gpu.limits.max_compute_workgroup_storage_size as usize;
        assert!(
            tl.valid(d, g, limit, v.rope.is_some(), sg32(gpu)),
            "attention_decode: invalid tiling {tl:?} for D = {d}, G = {g}"
        );
        let (ck, kp, kl) = (tl.ck, 256 / tl.ck, tl.ck * d / 2048);
        let params = p.uniform(gpu, "attention_decode.params");
        let mut macros = gpu
            .macros()
            .set("D", d)
            .set("G", g)
            .set("CK", ck)
            .set("KP", kp)
            .set("KL", kl)
            .set("VL", kl)
            .set("NP", (g * d / 4).div_ceil(256))
            .set("NSPLIT", tl.nsplit)
            .flag_if("SG32", sg32(gpu));
        let mut bindings = self.bindings(&params);
        bindings.push(self.out.binding());
        // Per token, the runs' partial results and the KV heads' counters (zeroed at creation; the
        // merging workgroup resets its counter).
        let part;
        if tl.nsplit > 1 {
            part = gpu.empty(
                "attention_decode.part",
                &[p.n_tokens, tl.nsplit * p.heads * (d + 2) + p.kv_heads],
                ElemType::U32,
            )?;
            macros = macros.flag("SPLIT").set("PB", bindings.len());
            bindings.push(part.binding());
        }
        if let Some(t) = v.rope {
            assert_eq!(t.numel(), d / 2, "attention_decode: inv_freq has D / 2 entries");
        }
        if let Some(sq) = v.seqs {
            assert!(sq.ty == ElemType::U32 && sq.numel() >= 2 * p.n_tokens, "attention: seqs must be u32 [T, 2]");
        }
        let mut macros = v.bind(macros, &mut bindings);
        if let Some(xs) = v.stage {
            assert!(stages_output(gpu, &p) && v.seqs.is_none(), "attention_decode: no staged output for {p:?}");
            let need = 4 * crate::ops::matmul::gguf::staged_x_words(1, p.heads * d) as u64;
            assert!(xs.size_bytes() >= need, "attention_decode: xs must hold {need} bytes, got {:?}", xs.shape);
            macros = macros.flag("STAGE8").set("XB", bindings.len());
            bindings.push(xs.binding());
        }
        let wgs = [tl.nsplit as u32, p.kv_heads as u32, p.n_tokens as u32];
        Ok(vec![gpu.kernel("attention_decode", "main", &macros, &bindings, wgs)?])
    }
}

pub mod cpu {
    use super::AttnParams;
    use half::f16;

    /// Reference cache write of rows `t < n_tokens` at positions `pos + t`.
    pub fn kv_cache_write(
        qkv: &[f32],
        k_cache: &mut [f16],
        v_cache: &mut [f16],
        pos: usize,
        n_tokens: usize,
        p: &AttnParams,
    ) {
        let d = p.head_dim;
        let row = p.row_stride();
        for t in 0..n_tokens {
            for g in 0..p.kv_heads {
                let src = t * row + p.heads * d + g * d;
                let vsrc = src + p.kv_heads * d;
                let dst = (g * p.max_ctx + pos + t) * d;
                for i in 0..d {
                    k_cache[dst + i] = f16::from_f32(qkv[src + i]);
                    v_cache[dst + i] = f16::from_f32(qkv[vsrc + i]);
                }
            }
        }
    }

    /// Reference attention (f64 accumulation) of rows `t < n_tokens` at positions `pos + t`:
    /// returns `[n_tokens, H * D]`. With `round_q`, the queries are rounded to f16 first: the
    /// kernel's twin passes [`super::q_f16`]`(p.head_dim)` (heads wider than 256 stage their queries
    /// as f16), `false` gives the exact attention over the cache, to bound what that staging costs.
    pub fn attention(
        qkv: &[f32],
        k_cache: &[f16],
        v_cache: &[f16],
        pos: usize,
        n_tokens: usize,
        p: &AttnParams,
        round_q: bool,
    ) -> Vec<f32> {
        let d = p.head_dim;
        let g = p.heads / p.kv_heads;
        let row = p.row_stride();
        let mut out = vec![0f32; n_tokens * p.heads * d];
        for t in 0..n_tokens {
            let q_pos = pos + t;
            let lo = if p.window > 0 { (q_pos + 1).saturating_sub(p.window) } else { 0 };
            for h in 0..p.heads {
                let kv = h / g;
                let q: Vec<f32> = qkv[t * row + h * d..][..d]
                    .iter()
                    .map(|&x| if round_q { f16::from_f32(x).to_f32() } else { x })
                    .collect();
                let scores: Vec<f64> = (lo..=q_pos)
                    .map(|j| {
                        let k = &k_cache[(kv * p.max_ctx + j) * d..][..d];
                        let dot: f64 = q.iter().zip(k).map(|(a, b)| *a as f64 * b.to_f64()).sum();
                        dot * p.scale as f64
                    })
                    .collect();
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                let l: f64 = e.iter().sum();
                let o = &mut out[(t * p.heads + h) * d..][..d];
                for (i, o) in o.iter_mut().enumerate() {
                    let acc: f64 =
                        (lo..=q_pos).zip(&e).map(|(j, w)| w * v_cache[(kv * p.max_ctx + j) * d + i].to_f64()).sum();
                    *o = (acc / l) as f32;
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests;
