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
//! On an H100 (Vulkan; `tests::bench`, best of 5): decode with H=32, Hkv=8, D=128 takes 15 µs
//! at 1k keys, 23 µs at 4k, 57 µs at 16k (kernel + merge; one empty dispatch costs about 5 µs
//! there); causal prefill of 2048 tokens runs at about 12.7 TFLOP/s (D=128) and 9.5 (D=256).

use crate::error::{Error, Result};
use crate::gpu::{kernel::grid, ElemType, Gpu, Kernel, Tensor};

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
    /// The uniform of both attention kernels (`Params` in `wgsl/attention.wgsl` and
    /// `wgsl/attention_decode.wgsl`).
    fn uniform(&self, gpu: &Gpu, label: &str) -> wgpu::Buffer {
        let params: [u32; 8] = [
            self.heads as u32,
            self.kv_heads as u32,
            self.max_ctx as u32,
            self.window as u32,
            self.scale.to_bits(),
            self.n_tokens as u32,
            0,
            0,
        ];
        gpu.uniform(label, &params)
    }

    /// [`Self::check`] and the output `out` f32 of T rows, as both attention kernels take them.
    fn check_io(&self, qkv: &Tensor, k_cache: &Tensor, v_cache: &Tensor, out: &Tensor) {
        self.check(qkv, k_cache, v_cache);
        assert_eq!(out.ty, ElemType::F32, "attention: out must be f32");
        assert!(out.numel() >= self.n_tokens * self.heads * self.head_dim, "attention: out holds fewer than T rows");
    }

    fn row_stride(&self) -> usize {
        (self.heads + 2 * self.kv_heads) * self.head_dim
    }
    fn check(&self, qkv: &Tensor, k_cache: &Tensor, v_cache: &Tensor) {
        let d = self.head_dim;
        assert!(d >= 16 && d % 16 == 0 && d <= 512, "attention: head_dim {d} must be a multiple of 16, at most 512");
        assert!(self.kv_heads > 0 && self.heads % self.kv_heads == 0, "attention: Hkv must divide H");
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
    let params: [u32; 8] = [
        p.kv_heads as u32,
        half as u32,
        (p.heads * p.head_dim) as u32,
        p.row_stride() as u32,
        p.max_ctx as u32,
        p.n_tokens as u32,
        0,
        0,
    ];
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

    fn valid(&self, d: usize, budget: usize) -> bool {
        let (kpl, nw, ld, ql) = self.slots(d);
        self.bk % self.lpr == 0
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
    /// context (or window). Tuned on an H100 (see `tests::bench`).
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

/// Records attention for the rows `t < step.n_tokens` of `qkv` (f32 `[T, (H + 2 Hkv) * D]`,
/// q and k roped, this pass's k and v already in the caches by [`kv_cache_write`]) into `out`
/// (f32 `[T, H * D]`). One kernel, or two when the keys are split (the second merges).
pub fn attention(
    gpu: &Gpu,
    qkv: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    out: &Tensor,
    step: &wgpu::Buffer,
    p: AttnParams,
) -> Result<Vec<Kernel>> {
    if let Some(tl) = DecodeTiling::choose(gpu, &p, false) {
        return attention_decode(gpu, qkv, k_cache, v_cache, out, step, p, tl, None, None, None);
    }
    let tiling = Tiling::choose(gpu, &p)?;
    attention_with(gpu, qkv, k_cache, v_cache, out, step, p, tiling, None, None)
}

/// [`attention`] (with `rope`, [`attention_rope`]) for one decode token that also writes its
/// output staged into `xs` as [`crate::ops::matmul::gguf::quantize_x16`] would, for the o
/// projection's matvec on x staged apart: None where the one-dispatch decode kernel does not run
/// this shape or cannot stage ([`stages_output`]; the caller runs the unstaged op).
#[allow(clippy::too_many_arguments)]
pub fn attention_staged(
    gpu: &Gpu,
    qkv: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    out: &Tensor,
    step: &wgpu::Buffer,
    p: AttnParams,
    rope: Option<&Tensor>,
    xs: &Tensor,
) -> Result<Option<Vec<Kernel>>> {
    match DecodeTiling::choose(gpu, &p, rope.is_some()) {
        Some(tl) if stages_output(gpu, &p) => {
            attention_decode(gpu, qkv, k_cache, v_cache, out, step, p, tl, rope, None, Some(xs)).map(Some)
        }
        _ => Ok(None),
    }
}

/// Whether [`attention_decode`] can write one token's output staged (`STAGE8`): subgroups of 8
/// or more (a block's eight threads meet by shuffles), heads of whole 32-element blocks.
pub fn stages_output(gpu: &Gpu, p: &AttnParams) -> bool {
    p.n_tokens == 1 && p.head_dim % 32 == 0 && gpu.caps.shuffles8()
}

/// [`attention`] (or with `inv_freq`, [`attention_rope`]) for a decode step of many sequences:
/// token `t` of `qkv` is sequence `t`, at position `seqs[t].0` of KV-cache slot `seqs[t].1` (u32
/// `[T, 2]`). Each token runs with the tiling of a one-token pass, so a sequence's output does not
/// depend on which others share the step.
#[allow(clippy::too_many_arguments)]
pub fn attention_batch(
    gpu: &Gpu,
    qkv: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    out: &Tensor,
    step: &wgpu::Buffer,
    seqs: &Tensor,
    p: AttnParams,
    inv_freq: Option<&Tensor>,
) -> Result<Vec<Kernel>> {
    assert!(seqs.ty == ElemType::U32 && seqs.numel() >= 2 * p.n_tokens, "attention: seqs must be u32 [T, 2]");
    if let Some(tl) = DecodeTiling::choose(gpu, &AttnParams { n_tokens: 1, ..p }, inv_freq.is_some()) {
        return attention_decode(gpu, qkv, k_cache, v_cache, out, step, p, tl, inv_freq, Some(seqs), None);
    }
    let tiling = Tiling::choose(gpu, &AttnParams { n_tokens: 1, ..p })?;
    attention_with(gpu, qkv, k_cache, v_cache, out, step, p, tiling, inv_freq, Some(seqs))
}

/// [`attention`] for one decode token whose q and k heads in `qkv` are not yet rotated, fused with
/// what [`crate::ops::rope::rope_kv_write`] would do first (no q/k norm): the queries are rotated
/// as they load, and this step's key (rotated) and value are read from `qkv` and written to the
/// caches. `inv_freq`: f32 `[D / 2]` ([`crate::ops::rope::inv_freq`]). One dispatch fewer a layer.
#[allow(clippy::too_many_arguments)]
pub fn attention_rope(
    gpu: &Gpu,
    qkv: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    out: &Tensor,
    step: &wgpu::Buffer,
    p: AttnParams,
    inv_freq: &Tensor,
) -> Result<Vec<Kernel>> {
    assert_eq!(p.n_tokens, 1, "attention_rope: one token (decode)");
    assert_eq!(inv_freq.numel(), p.head_dim / 2, "attention_rope: inv_freq has D / 2 entries");
    if let Some(tl) = DecodeTiling::choose(gpu, &p, true) {
        return attention_decode(gpu, qkv, k_cache, v_cache, out, step, p, tl, Some(inv_freq), None, None);
    }
    let tiling = Tiling::choose(gpu, &p)?;
    attention_with(gpu, qkv, k_cache, v_cache, out, step, p, tiling, Some(inv_freq), None)
}

/// [`attention`] with a given tiling (tests, benchmarks); with `rope`, [`attention_rope`]; with
/// `seqs`, [`attention_batch`] (one row block per token).
#[allow(clippy::too_many_arguments)]
pub fn attention_with(
    gpu: &Gpu,
    qkv: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    out: &Tensor,
    step: &wgpu::Buffer,
    p: AttnParams,
    tl: Tiling,
    rope: Option<&Tensor>,
    seqs: Option<&Tensor>,
) -> Result<Vec<Kernel>> {
    p.check_io(qkv, k_cache, v_cache, out);
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
    if seqs.is_some() && bq < g {
        return Err(Error::Unsupported(format!(
            "decoding several sequences at once with {g} query heads per KV head at head dimension {d} \
             (a row block holds {bq})"
        )));
    }
    let blocks = if seqs.is_some() { p.n_tokens as u32 } else { (p.n_tokens * g).div_ceil(bq) as u32 };
    let wgs = [blocks, p.kv_heads as u32, nsplit as u32];
    let mut bindings =
        vec![qkv.binding(), k_cache.binding(), v_cache.binding(), step.as_entire_binding(), params.as_entire_binding()];
    if nsplit == 1 {
        bindings.push(out.binding());
        let m = extra(macros, &mut bindings, rope, seqs);
        return Ok(vec![gpu.kernel("attention", "main", &m, &bindings, wgs)?]);
    }
    let rows = p.n_tokens * p.heads;
    let part_o = gpu.empty("attention.part_o", &[nsplit, rows, d], ElemType::F32)?;
    let part_ml = gpu.empty("attention.part_ml", &[nsplit, rows, 2], ElemType::F32)?;
    bindings.push(part_o.binding());
    bindings.push(part_ml.binding());
    let m = extra(macros.clone().flag("SPLIT"), &mut bindings, rope, seqs);
    let main = gpu.kernel("attention", "main", &m, &bindings, wgs)?;
    let merge = gpu.kernel(
        "attention",
        "main",
        &macros.flag("MERGE"),
        &[part_o.binding(), part_ml.binding(), out.binding(), step.as_entire_binding(), params.as_entire_binding()],
        // one workgroup per row and 32 dims of it
        grid((rows * d.div_ceil(32)) as u32),
    )?;
    Ok(vec![main, merge])
}

/// The optional bindings of both attention kernels (rope's table: `ROPE`, binding `RB`; the
/// batch's sequences: `BATCH`, binding `SEQS`) after the others.
fn extra<'a>(
    mut m: crate::gpu::Macros,
    bindings: &mut Vec<wgpu::BindingResource<'a>>,
    rope: Option<&'a Tensor>,
    seqs: Option<&'a Tensor>,
) -> crate::gpu::Macros {
    if let Some(t) = rope {
        m = m.flag("ROPE").set("RB", bindings.len());
        bindings.push(t.binding());
    }
    if let Some(sq) = seqs {
        m = m.flag("BATCH").set("SEQS", bindings.len());
        bindings.push(sq.binding());
    }
    m
}

/// Subgroups exactly 32 wide (`SG32` in `wgsl/attention_decode.wgsl`).
fn sg32(gpu: &Gpu) -> bool {
    gpu.caps.subgroups && gpu.caps.subgroup_min_size == 32 && gpu.caps.subgroup_max_size == 32
}

/// Fewest KV heads [`attention_decode`] is chosen for (but see [`DECODE_HEAD_DIM`]): the tuning
/// table's `AttnDecodeMinKv` row (src/tuning/table.rs), which this names. Measured on the H100
/// (BENCHMARKS runs 30 and 36): with 2 or 3 KV heads (Qwen2.5, SmolLM2) the in-kernel merge cost
/// what the merge dispatch it replaces did (the Qwen2.5-1.5B step 1952 us against 1950); alone the
/// kernel wins from 8 KV heads on at 1-4k positions (Llama-3-8B's shape at 1024: 8.0 us against 18.1).
pub const DECODE_MIN_KV_HEADS: usize = 8;

/// Heads this wide take [`attention_decode`] whatever their KV heads (the table's
/// `AttnDecodeHeadDim` row): once the rest of the Qwen2.5-1.5B step had shrunk, its 2 KV heads of
/// 128 won there (the step 1683 -> 1659 us, BENCHMARKS runs 67-68), while the 0.5B's heads of 64
/// still lost (1236 -> 1253 us). Wider heads (Qwen3.5's and Gemma 4's 256 and 512) keep the rule
/// above: not measured.
pub const DECODE_HEAD_DIM: usize = 128;

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
    fn valid(&self, d: usize, g: usize, budget: usize, rope: bool, sg32: bool) -> bool {
        let ce = self.ck * d;
        (ce == 8192 || ce == 4096)
            && (4..=256).contains(&self.ck)
            && d % 16 == 0
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
    /// Only for heads with at least [`DECODE_MIN_KV_HEADS`] KV heads (or
    /// `WGPU_LLM_ATTN_DECODE_MIN_KV`, a benchmark knob), or heads [`DECODE_HEAD_DIM`] wide.
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

/// Records the attention of one decode token (`p.n_tokens == 1`), or with `seqs` of a decode step
/// of `p.n_tokens` sequences as [`attention_batch`], in one dispatch
/// (`wgsl/attention_decode.wgsl`): each token's keys split over `tl.nsplit` workgroups per KV
/// head, the last of which merges. Without `rope`, the tokens' k and v are already in the caches
/// (q and k roped); with `rope` (f32 `[D / 2]` inverse frequencies), q and k in `qkv` are
/// unrotated and the kernel rotates them and writes the caches, as [`attention_rope`]. A token's
/// output is the same whatever the other tokens of the step.
#[allow(clippy::too_many_arguments)]
pub fn attention_decode(
    gpu: &Gpu,
    qkv: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    out: &Tensor,
    step: &wgpu::Buffer,
    p: AttnParams,
    tl: DecodeTiling,
    rope: Option<&Tensor>,
    seqs: Option<&Tensor>,
    stage: Option<&Tensor>,
) -> Result<Vec<Kernel>> {
    p.check_io(qkv, k_cache, v_cache, out);
    assert!(p.n_tokens == 1 || seqs.is_some(), "attention_decode: one token, or a token a sequence");
    let (d, g) = (p.head_dim, p.heads / p.kv_heads);
    let limit = gpu.limits.max_compute_workgroup_storage_size as usize;
    assert!(
        tl.valid(d, g, limit, rope.is_some(), sg32(gpu)),
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
    let mut bindings = vec![
        qkv.binding(),
        k_cache.binding(),
        v_cache.binding(),
        step.as_entire_binding(),
        params.as_entire_binding(),
        out.binding(),
    ];
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
    if let Some(t) = rope {
        assert_eq!(t.numel(), d / 2, "attention_decode: inv_freq has D / 2 entries");
    }
    if let Some(sq) = seqs {
        assert!(sq.ty == ElemType::U32 && sq.numel() >= 2 * p.n_tokens, "attention: seqs must be u32 [T, 2]");
    }
    let mut macros = extra(macros, &mut bindings, rope, seqs);
    if let Some(xs) = stage {
        assert!(stages_output(gpu, &p) && seqs.is_none(), "attention_decode: no staged output for {p:?}");
        let need = 4 * crate::ops::matmul::gguf::staged_x_words(1, p.heads * d) as u64;
        assert!(xs.size_bytes() >= need, "attention_decode: xs must hold {need} bytes, got {:?}", xs.shape);
        macros = macros.flag("STAGE8").set("XB", bindings.len());
        bindings.push(xs.binding());
    }
    let wgs = [tl.nsplit as u32, p.kv_heads as u32, p.n_tokens as u32];
    Ok(vec![gpu.kernel("attention_decode", "main", &macros, &bindings, wgs)?])
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
    /// returns `[n_tokens, H * D]`. Queries of heads wider than 256 are rounded to f16 first, as
    /// the kernel stages them ([`super::q_f16`]).
    pub fn attention(
        qkv: &[f32],
        k_cache: &[f16],
        v_cache: &[f16],
        pos: usize,
        n_tokens: usize,
        p: &AttnParams,
    ) -> Vec<f32> {
        attention_q(qkv, k_cache, v_cache, pos, n_tokens, p, super::q_f16(p.head_dim))
    }

    /// [`attention`] with the queries rounded to f16 or not (`round_q`), whatever the head
    /// dimension: the exact attention over the cache, to bound what the f16 staging costs.
    pub fn attention_q(
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
mod tests {
    use super::*;
    use crate::gpu::tensor::test_util::*;
    use crate::ops::StepParams;
    use half::f16;

    const SENTINEL: f32 = 12345.0;

    /// GPU state of one layer plus its CPU mirror.
    struct Layer {
        p: AttnParams,
        k: Tensor,
        v: Tensor,
        k_cpu: Vec<f16>,
        v_cpu: Vec<f16>,
        step: wgpu::Buffer,
    }

    impl Layer {
        fn new(gpu: &Gpu, p: AttnParams) -> Layer {
            let (k, v) = kv_cache(gpu, "cache", &p, 1).unwrap();
            let n = p.kv_heads * p.max_ctx * p.head_dim;
            Layer {
                p,
                k,
                v,
                k_cpu: vec![f16::ZERO; n],
                v_cpu: vec![f16::ZERO; n],
                step: gpu.uniform("step", &StepParams::default()),
            }
        }

        /// Runs a pass of `n` tokens at `pos` with kernels recorded for `record_t` tokens and
        /// `splits`; checks the caches bit for bit and the output against the CPU; returns the
        /// output rows.
        fn pass(
            &mut self,
            gpu: &Gpu,
            pos: usize,
            n: usize,
            record_t: usize,
            tiling: Option<Tiling>,
            seed: u64,
        ) -> Vec<f32> {
            let p = AttnParams { n_tokens: record_t, ..self.p };
            let row = p.row_stride();
            // Random rows for the whole recorded T; rows >= n must be ignored.
            let mut data = random(record_t * row, seed, 1.0);
            // Sharper softmax: larger q.
            for t in 0..record_t {
                data[t * row..][..p.heads * p.head_dim].iter_mut().for_each(|x| *x *= 3.0);
            }
            let qkv = gpu.upload_f32("qkv", &[record_t, row], &data).unwrap();
            let out_len = record_t * p.heads * p.head_dim;
            let out = gpu.upload_f32("out", &[record_t, p.heads * p.head_dim], &vec![SENTINEL; out_len]).unwrap();
            let sp = StepParams { pos: pos as u32, n_tokens: n as u32, slot: 0, _pad: 0 };
            gpu.queue.write_buffer(&self.step, 0, bytemuck::bytes_of(&sp));
            let write = kv_cache_write(gpu, &qkv, &self.k, &self.v, &self.step, p).unwrap();
            let tiling = tiling.unwrap_or_else(|| Tiling::choose(gpu, &p).unwrap());
            let attn = attention_with(gpu, &qkv, &self.k, &self.v, &out, &self.step, p, tiling, None, None).unwrap();
            let mut ks = vec![&write];
            ks.extend(attn.iter());
            gpu.run(&ks).unwrap();

            cpu::kv_cache_write(&data, &mut self.k_cpu, &mut self.v_cpu, pos, n, &p);
            assert!(gpu.read_f16(&self.k).unwrap() == self.k_cpu, "K cache differs");
            assert!(gpu.read_f16(&self.v).unwrap() == self.v_cpu, "V cache differs");

            let mut got = gpu.read_f32(&out).unwrap();
            let want = cpu::attention(&data, &self.k_cpu, &self.v_cpu, pos, n, &p);
            let valid = n * p.heads * p.head_dim;
            assert!(got[valid..].iter().all(|&x| x == SENTINEL), "rows >= n_tokens were written");
            let (diff, at) = max_abs_diff(&got[..valid], &want);
            let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
            assert!(
                diff <= 2e-5 * scale.max(1.0),
                "{p:?} {tiling:?} pos={pos} n={n}: max diff {diff} at {at} ({} vs {})",
                got[at],
                want[at]
            );
            got.truncate(valid);
            got
        }
    }

    fn params(heads: usize, kv_heads: usize, head_dim: usize, max_ctx: usize, window: usize) -> AttnParams {
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

    /// Heads of 512 stage their queries as f16: against the exact attention (f32 queries), the
    /// output moves by no more than that rounding allows. Each query element moves by at most
    /// 2^-11 of itself, so score j by at most E_j = scale · 2^-11 · Σ_i |q_i k_ji|, each
    /// probability by a factor within e^(±2E), E = max_j E_j, and the output by at most
    /// (e^(2E) - 1) · max |v| (plus the kernel's own f32 error, 2e-5 of the output's scale).
    #[test]
    fn wide_heads_stay_within_the_query_rounding_bound() {
        for gpu in gpu_variants() {
            let (h, hkv, d, ctx, n) = (8usize, 1usize, 512usize, 64usize, 5usize);
            let p = AttnParams { n_tokens: n, ..params(h, hkv, d, ctx, 0) };
            let row = p.row_stride();
            let mut data = random(n * row, 97, 1.0);
            for t in 0..n {
                data[t * row..][..h * d].iter_mut().for_each(|x| *x *= 3.0);
            }
            let step = gpu.uniform("step", &StepParams { pos: 40, n_tokens: n as u32, slot: 0, _pad: 0 });
            let (kc, vc) = kv_cache(&gpu, "wide", &p, 1).unwrap();
            // Earlier positions' keys and values: random, written as the cache holds them.
            let (mut k_cpu, mut v_cpu) = (vec![f16::ZERO; hkv * ctx * d], vec![f16::ZERO; hkv * ctx * d]);
            let old = random(40 * row, 98, 1.0);
            cpu::kv_cache_write(&old, &mut k_cpu, &mut v_cpu, 0, 40, &AttnParams { n_tokens: 40, ..p });
            gpu.queue.write_buffer(&kc.buffer, kc.offset, bytemuck::cast_slice(&k_cpu));
            gpu.queue.write_buffer(&vc.buffer, vc.offset, bytemuck::cast_slice(&v_cpu));
            let qkv = gpu.upload_f32("qkv", &[n, row], &data).unwrap();
            let out = gpu.empty("out", &[n, h * d], ElemType::F32).unwrap();
            let write = kv_cache_write(&gpu, &qkv, &kc, &vc, &step, p).unwrap();
            let attn = attention(&gpu, &qkv, &kc, &vc, &out, &step, p).unwrap();
            let mut ks = vec![&write];
            ks.extend(attn.iter());
            gpu.run(&ks).unwrap();
            let got = gpu.read_f32(&out).unwrap();
            cpu::kv_cache_write(&data, &mut k_cpu, &mut v_cpu, 40, n, &p);
            let exact = cpu::attention_q(&data, &k_cpu, &v_cpu, 40, n, &p, false);
            let vmax = v_cpu.iter().fold(0f32, |m, v| m.max(v.to_f32().abs()));
            let mut moved = 0f32;
            for t in 0..n {
                for hh in 0..h {
                    let q = &data[t * row + hh * d..][..d];
                    let e = (0..=40 + t)
                        .map(|j| {
                            let k = &k_cpu[j * d..][..d];
                            q.iter().zip(k).map(|(a, b)| (a * b.to_f32()).abs()).sum::<f32>() * p.scale / 2048.0
                        })
                        .fold(0f32, f32::max);
                    let bound = ((2.0 * e).exp() - 1.0) * vmax + 2e-5;
                    let at = (t * h + hh) * d;
                    let (diff, i) = max_abs_diff(&got[at..][..d], &exact[at..][..d]);
                    assert!(diff <= bound, "t={t} head {hh}: {diff} at {i} beyond the rounding bound {bound}");
                    moved = moved.max(diff);
                }
            }
            eprintln!("D=512 against exact attention: max |diff| {moved}");
        }
    }

    #[test]
    fn prefill_then_decode() {
        for gpu in gpu_variants() {
            for (h, hkv, d) in
                [(4, 2, 64), (4, 1, 64), (6, 2, 64), (4, 1, 256), (6, 2, 256), (2, 2, 128), (8, 1, 512), (8, 2, 512)]
            {
                let mut l = Layer::new(&gpu, params(h, hkv, d, 64, 0));
                l.pass(&gpu, 0, 7, 7, None, 1);
                let mut l = Layer::new(&gpu, params(h, hkv, d, 64, 0));
                l.pass(&gpu, 0, 37, 37, None, 2);
                l.pass(&gpu, 37, 1, 1, None, 3);
                l.pass(&gpu, 38, 1, 1, None, 4);
            }
        }
    }

    /// attention_rope (rotation and cache write inside attention) leaves what rope_kv_write +
    /// attention leave: the caches bit for bit (the same f32 rotation, rounded to nearest even),
    /// and the output within f32 rounding of the same sums; at the first position, mid-context,
    /// and near the end of the cache, with and without key splits.
    #[test]
    fn attention_rope_equals_rope_then_attention() {
        use crate::ops::rope::{inv_freq, rope_kv_write, RopeParams};
        for gpu in gpu_variants() {
            for (h, hkv, d, ctx, pos) in
                [(12, 2, 128, 641, 600), (6, 2, 64, 40, 0), (4, 1, 256, 80, 79), (8, 8, 64, 300, 123)]
            {
                let p = params(h, hkv, d, ctx, 0);
                let rp = RopeParams {
                    heads: h,
                    kv_heads: hkv,
                    head_dim: d,
                    rotary_dim: d,
                    theta: 1e6,
                    scaling: 1.0,
                    n_tokens: 1,
                    proportional: false,
                    k_eq_v: false,
                    v_norm: false,
                    q_only: false,
                };
                let row = p.row_stride();
                let data = random(row, 91 + pos as u64, 1.5);
                let cache: Vec<f16> = random(hkv * ctx * d, 92, 1.0).iter().map(|x| f16::from_f32(*x)).collect();
                let step = gpu.uniform("step", &StepParams { pos: pos as u32, n_tokens: 1, slot: 0, _pad: 0 });
                let table = gpu.upload_f32("inv_freq", &[d / 2], &inv_freq(d, 1e6, 1.0)).unwrap();
                let run = |fused: bool| {
                    let qkv = gpu.upload_f32("qkv", &[1, row], &data).unwrap();
                    let kc = gpu.upload_f16("k", &[hkv, ctx, d], &cache).unwrap();
                    let vc = gpu.upload_f16("v", &[hkv, ctx, d], &cache).unwrap();
                    let out = gpu.empty("out", &[1, h * d], ElemType::F32).unwrap();
                    let mut ks = Vec::new();
                    if fused {
                        ks.extend(attention_rope(&gpu, &qkv, &kc, &vc, &out, &step, p, &table).unwrap());
                    } else {
                        ks.push(rope_kv_write(&gpu, &qkv, &step, rp, None, &kc, &vc).unwrap());
                        ks.extend(attention(&gpu, &qkv, &kc, &vc, &out, &step, p).unwrap());
                    }
                    gpu.run(&ks.iter().collect::<Vec<_>>()).unwrap();
                    (gpu.read_f32(&out).unwrap(), gpu.read_f16(&kc).unwrap(), gpu.read_f16(&vc).unwrap())
                };
                let (oa, ka, va) = run(false);
                let (ob, kb, vb) = run(true);
                let what = format!("H {h} Hkv {hkv} D {d} ctx {ctx} pos {pos} f16={}", gpu.caps.f16);
                let bits = |a: &[f16], b: &[f16]| a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
                assert_eq!(bits(&ka, &kb), 0, "K cache: {what}");
                assert_eq!(bits(&va, &vb), 0, "V cache: {what}");
                assert_ne!(ka[pos * d], cache[pos * d], "the key at pos was written: {what}");
                let (diff, at) = max_abs_diff(&oa, &ob);
                assert!(diff <= 1e-5 * (1.0 + oa[at].abs()), "out differs by {diff} at {at}: {what}");
            }
        }
    }

    /// Decode tilings: a short context takes small key tiles for more splits (Qwen2.5-1.5B's 12 /
    /// 2 heads of 128 at 641 positions: 16-key tiles, 41 splits; at 4096: 16, 128), a long one
    /// keeps 64-key tiles (32768: 128 splits of 4 tiles); 512 rows need no split.
    #[test]
    fn tiling_follows_the_context() {
        let gpu = gpu();
        let t = |ctx: usize, n_tokens: usize| {
            let tl = Tiling::choose(&gpu, &AttnParams { n_tokens, ..params(12, 2, 128, ctx, 0) }).unwrap();
            (tl.bk, tl.nsplit)
        };
        assert_eq!(t(641, 1), (16, 41));
        assert_eq!(t(4096, 1), (16, 128));
        assert_eq!(t(32768, 1), (64, 128));
        assert_eq!(t(4096, 512).1, 1);
    }

    /// The decode kernel's output staged for the o projection (STAGE8): out the same bits as
    /// without, xs word for word what quantize_x16's twin makes of it; split and whole runs, one
    /// and two pairs a thread (G · D / 4 over 256), sliding and full. Without subgroups of 8+ it
    /// says it cannot stage.
    #[test]
    fn decode_kernel_stages_its_output() {
        for gpu in gpu_variants() {
            let can = gpu.caps.shuffles8();
            let limit = gpu.limits.max_compute_workgroup_storage_size as usize;
            for (h, hkv, d, ctx, window) in [
                (12, 2, 128, 300, 0),
                (4, 1, 256, 100, 45),
                (8, 1, 256, 150, 0),
                (8, 1, 128, 150, 45),
                (4, 2, 32, 600, 0),
            ] {
                let p = params(h, hkv, d, ctx, window);
                assert_eq!(stages_output(&gpu, &p), can);
                if !can {
                    continue;
                }
                for rope in [false, true] {
                    let mut tilings: Vec<DecodeTiling> = DecodeTiling::choose(&gpu, &p, rope).into_iter().collect();
                    for nsplit in [1, 3] {
                        let tl = DecodeTiling { ck: 4096 / d, nsplit };
                        if tl.valid(d, h / hkv, limit, rope, sg32(&gpu)) && !tilings.contains(&tl) {
                            tilings.push(tl);
                        }
                    }
                    assert!(tilings.len() >= 2, "H {h} Hkv {hkv} D {d} rope {rope}: {tilings:?}");
                    let table = rope.then(|| {
                        let f = crate::ops::rope::inv_freq(d, 10000.0, 1.0);
                        gpu.upload_f32("inv_freq", &[d / 2], &f).unwrap()
                    });
                    for tl in tilings {
                        let row = p.row_stride();
                        let kv: Vec<f16> = random(hkv * ctx * d, 80, 1.0).iter().map(|x| f16::from_f32(*x)).collect();
                        let kc = gpu.upload_f16("k", &[hkv, ctx, d], &kv).unwrap();
                        let vc = gpu
                            .upload_f16("v", &[hkv, ctx, d], &kv[..].iter().rev().copied().collect::<Vec<_>>())
                            .unwrap();
                        let mut data = random(row, 81, 1.0);
                        data[..h * d].iter_mut().for_each(|x| *x *= 3.0);
                        let qkv = gpu.upload_f32("qkv", &[1, row], &data).unwrap();
                        let step =
                            gpu.uniform("step", &StepParams { pos: (ctx - 3) as u32, n_tokens: 1, slot: 0, _pad: 0 });
                        let (a, b) = (
                            gpu.empty("a", &[1, h * d], ElemType::F32).unwrap(),
                            gpu.empty("b", &[1, h * d], ElemType::F32).unwrap(),
                        );
                        let words = crate::ops::matmul::gguf::staged_x_words(1, h * d);
                        let xs = gpu.upload_u32("xs", &[words], &vec![7; words]).unwrap();
                        let rt = table.as_ref();
                        let plain = attention_decode(&gpu, &qkv, &kc, &vc, &a, &step, p, tl, rt, None, None).unwrap();
                        let staged =
                            attention_decode(&gpu, &qkv, &kc, &vc, &b, &step, p, tl, rt, None, Some(&xs)).unwrap();
                        assert!(staged[0].variant.split('+').any(|f| f == "STAGE8"));
                        assert_eq!(staged[0].variant.split('+').any(|f| f == "ROPE"), rope);
                        gpu.run(&plain.iter().chain(&staged).collect::<Vec<_>>()).unwrap();
                        let (got_a, got_b) = (gpu.read_f32(&a).unwrap(), gpu.read_f32(&b).unwrap());
                        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(&got_a), bits(&got_b), "{p:?} {tl:?} rope {rope}: the output");
                        let want = crate::ops::matmul::gguf::cpu::quantize_x16(&got_b, h * d);
                        assert_eq!(gpu.read_u32(&xs).unwrap(), want, "{p:?} {tl:?} rope {rope}: the staged output");
                    }
                }
            }
        }
    }

    /// The one-dispatch decode kernel (attention_decode) against the CPU: runs of decode steps
    /// through the same recorded kernel (the merge's counters reset between dispatches), from
    /// the first position, inside one chunk and across several, with one run, a few, and more
    /// runs than chunks (empty runs); 8192- and 4096-element chunks, full and sliding-window
    /// attention, every head shape the kernel takes. The caches past the token hold random
    /// values the kernel must not see.
    #[test]
    fn decode_kernel_matches_cpu() {
        for gpu in gpu_variants() {
            let limit = gpu.limits.max_compute_workgroup_storage_size as usize;
            for (h, hkv, d, ctx) in [
                (12, 2, 128, 300),
                (14, 2, 64, 400),
                (9, 3, 64, 200),
                (4, 1, 256, 100),
                (8, 1, 128, 150),
                (4, 2, 32, 600),
                (8, 1, 16, 600),
            ] {
                for window in [0usize, 45] {
                    let p = params(h, hkv, d, ctx, window);
                    let g = h / hkv;
                    let mut tilings: Vec<DecodeTiling> = DecodeTiling::choose(&gpu, &p, false).into_iter().collect();
                    for (ce, nsplit) in [(8192, 1), (8192, 3), (4096, 2), (4096, 7), (8192, 40)] {
                        let tl = DecodeTiling { ck: ce / d, nsplit };
                        if ce % d == 0 && tl.valid(d, g, limit, false, sg32(&gpu)) && !tilings.contains(&tl) {
                            tilings.push(tl);
                        }
                    }
                    assert!(tilings.len() >= 2, "H {h} Hkv {hkv} D {d}: {tilings:?}");
                    for tl in tilings {
                        let row = p.row_stride();
                        let (mut k_cpu, mut v_cpu): (Vec<f16>, Vec<f16>) = (
                            random(hkv * ctx * d, 60, 1.0).iter().map(|x| f16::from_f32(*x)).collect(),
                            random(hkv * ctx * d, 61, 1.0).iter().map(|x| f16::from_f32(*x)).collect(),
                        );
                        let kc = gpu.upload_f16("k", &[hkv, ctx, d], &k_cpu).unwrap();
                        let vc = gpu.upload_f16("v", &[hkv, ctx, d], &v_cpu).unwrap();
                        let qkv = gpu.upload_f32("qkv", &[1, row], &vec![0.0; row]).unwrap();
                        let out = gpu.empty("out", &[1, h * d], ElemType::F32).unwrap();
                        let step = gpu.uniform("step", &StepParams::default());
                        let write = kv_cache_write(&gpu, &qkv, &kc, &vc, &step, p).unwrap();
                        let attn =
                            attention_decode(&gpu, &qkv, &kc, &vc, &out, &step, p, tl, None, None, None).unwrap();
                        assert_eq!(attn.len(), 1, "one dispatch");
                        let mut ks = vec![&write];
                        ks.extend(attn.iter());
                        for pos in [0usize, 1, 2, 3, ctx / 2, ctx / 2 + 1, ctx - 2, ctx - 1] {
                            let mut data = random(row, 70 + pos as u64, 1.0);
                            data[..h * d].iter_mut().for_each(|x| *x *= 3.0);
                            gpu.queue.write_buffer(&qkv.buffer, qkv.offset, bytemuck::cast_slice(&data));
                            let sp = StepParams { pos: pos as u32, n_tokens: 1, slot: 0, _pad: 0 };
                            gpu.queue.write_buffer(&step, 0, bytemuck::bytes_of(&sp));
                            gpu.run(&ks).unwrap();
                            cpu::kv_cache_write(&data, &mut k_cpu, &mut v_cpu, pos, 1, &p);
                            let got = gpu.read_f32(&out).unwrap();
                            let want = cpu::attention(&data, &k_cpu, &v_cpu, pos, 1, &p);
                            let (diff, at) = max_abs_diff(&got, &want);
                            let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
                            assert!(
                                diff <= 2e-5 * scale.max(1.0),
                                "{p:?} {tl:?} pos={pos} f16={}: max diff {diff} at {at} ({} vs {})",
                                gpu.caps.f16,
                                got[at],
                                want[at]
                            );
                        }
                    }
                }
            }
        }
    }

    /// The decode path picks the one-dispatch kernel for the shapes it takes (Qwen2.5-1.5B's 12 /
    /// 2 heads of 128: 64-key chunks, 11 runs at 641 positions, 32 at 4096; Gemma 4's 512-dim
    /// heads fall back to the split kernel), and never for more than one token.
    #[test]
    fn decode_tiling_follows_the_context() {
        let gpu = gpu();
        let t =
            |h: usize, hkv: usize, d: usize, ctx: usize| DecodeTiling::choose(&gpu, &params(h, hkv, d, ctx, 0), true);
        // 2 KV heads: the one-dispatch kernel for heads of 128 (Qwen2.5-1.5B), else the split
        // kernel and its merge (the 0.5B's 64).
        assert_eq!(t(12, 2, 128, 641), Some(DecodeTiling { ck: 64, nsplit: 11 }), "Qwen2.5-1.5B");
        assert_eq!(t(12, 2, 128, 4096), Some(DecodeTiling { ck: 64, nsplit: 32 }));
        assert_eq!(t(14, 2, 64, 641), None, "Qwen2.5-0.5B");
        assert_eq!(t(64, 8, 128, 641), Some(DecodeTiling { ck: 32, nsplit: 8 }));
        assert_eq!(t(32, 16, 256, 640), Some(DecodeTiling { ck: 32, nsplit: 8 }));
        assert_eq!(t(32, 16, 256, 4096), Some(DecodeTiling { ck: 32, nsplit: 8 }));
        assert_eq!(t(32, 4, 512, 4096), None);
        assert_eq!(DecodeTiling::choose(&gpu, &AttnParams { n_tokens: 2, ..params(64, 8, 128, 641, 0) }, false), None);
    }

    #[test]
    fn key_splits() {
        for gpu in gpu_variants() {
            for (h, hkv, d) in [(4, 1, 64), (6, 2, 256)] {
                let p = params(h, hkv, d, 128, 0);
                let t = Tiling::choose(&gpu, &AttnParams { n_tokens: 1, ..p }).unwrap();
                let mut l = Layer::new(&gpu, p);
                l.pass(&gpu, 0, 70, 70, Some(Tiling { nsplit: 3, ..t }), 5);
                for (pos, splits) in [(70, 1), (71, 2), (72, 7), (73, 64)] {
                    l.pass(&gpu, pos, 1, 1, Some(Tiling { nsplit: splits, ..t }), 6 + pos as u64);
                }
                // chunk of 5 after 74 positions, split
                let t5 = Tiling::choose(&gpu, &AttnParams { n_tokens: 5, ..p }).unwrap();
                l.pass(&gpu, 74, 5, 5, Some(Tiling { nsplit: 4, ..t5 }), 9);
            }
        }
    }

    /// Every valid tiling on a causal prefill and a decode step (sliding window, GQA 3:1).
    #[test]
    fn all_tilings() {
        for gpu in gpu_variants() {
            let limit = gpu.limits.max_compute_workgroup_storage_size as usize;
            for d in [64, 256] {
                let p = params(6, 2, d, 128, 40);
                let mut l = Layer::new(&gpu, p);
                let mut seed = 50;
                let mut pos = 0;
                for bq in [4, 8, 16] {
                    for bk in [8, 16, 32, 64, 128] {
                        for nsplit in [1, 3] {
                            let tl = Tiling { bq, lpr: 128 / bq, bk, nsplit };
                            if !tl.valid(d, limit) {
                                continue;
                            }
                            seed += 1;
                            if pos + 9 > p.max_ctx {
                                l = Layer::new(&gpu, p);
                                pos = 0;
                            }
                            l.pass(&gpu, pos, 8, 8, Some(tl), seed);
                            l.pass(&gpu, pos + 8, 1, 1, Some(tl), seed + 1000);
                            pos += 9;
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn sliding_window() {
        for gpu in gpu_variants() {
            for (h, hkv, d) in [(4, 2, 64), (4, 1, 256)] {
                let p = params(h, hkv, d, 64, 5);
                let mut l = Layer::new(&gpu, p);
                l.pass(&gpu, 0, 20, 20, None, 10);
                let windowed = l.pass(&gpu, 20, 1, 1, None, 11);
                // the same keys with full attention differ
                let mut full = Layer::new(&gpu, AttnParams { window: 0, ..p });
                full.pass(&gpu, 0, 20, 20, None, 10);
                let all = full.pass(&gpu, 20, 1, 1, None, 11);
                assert!(max_abs_diff(&windowed, &all).0 > 1e-3, "window had no effect");
                // windowed prefill chunk (the window moves inside the block), split and not
                l.pass(&gpu, 21, 8, 8, None, 12);
                let t = Tiling::choose(&gpu, &AttnParams { n_tokens: 8, ..p }).unwrap();
                l.pass(&gpu, 29, 8, 8, Some(Tiling { nsplit: 3, ..t }), 13);
                l.pass(&gpu, 37, 8, 8, Some(Tiling { nsplit: 1, ..t }), 14);
            }
        }
    }

    #[test]
    fn chunked_prefill_equals_single() {
        for gpu in gpu_variants() {
            for (h, hkv, d) in [(4, 2, 64), (6, 2, 256)] {
                let p = params(h, hkv, d, 32, 0);
                let row = p.row_stride();
                let width = h * d;
                // the same 15 tokens: rows 0..10 then 10..15 of one random block
                let seed = 21;
                let mut single = Layer::new(&gpu, p);
                let all = single.pass(&gpu, 0, 15, 15, None, seed);
                let data = {
                    let mut x = random(15 * row, seed, 1.0);
                    for t in 0..15 {
                        x[t * row..][..width].iter_mut().for_each(|v| *v *= 3.0);
                    }
                    x
                };
                let chunked = Layer::new(&gpu, p);
                let step = &chunked.step;
                let mk = |rows: std::ops::Range<usize>| {
                    let mut x = data[rows.start * row..rows.end * row].to_vec();
                    x.resize(10 * row, 0.5); // recorded T = 10; the tail is ignored
                    gpu.upload_f32("qkv", &[10, row], &x).unwrap()
                };
                let out = gpu.empty("out", &[10, width], ElemType::F32).unwrap();
                let q1 = mk(0..10);
                let q2 = mk(10..15);
                let pp = AttnParams { n_tokens: 10, ..p };
                let mut got = Vec::new();
                for (qkv, pos, n) in [(&q1, 0, 10), (&q2, 10, 5)] {
                    let sp = StepParams { pos, n_tokens: n, slot: 0, _pad: 0 };
                    gpu.queue.write_buffer(step, 0, bytemuck::bytes_of(&sp));
                    let w = kv_cache_write(&gpu, qkv, &chunked.k, &chunked.v, step, pp).unwrap();
                    let a = attention(&gpu, qkv, &chunked.k, &chunked.v, &out, step, pp).unwrap();
                    let mut ks = vec![&w];
                    ks.extend(a.iter());
                    gpu.run(&ks).unwrap();
                    got.extend_from_slice(&gpu.read_f32(&out).unwrap()[..n as usize * width]);
                }
                assert!(gpu.read_f16(&chunked.k).unwrap() == single.k_cpu);
                assert!(gpu.read_f16(&chunked.v).unwrap() == single.v_cpu);
                let (diff, at) = max_abs_diff(&got, &all);
                assert!(diff <= 2e-5, "chunked vs single d={d}: {diff} at {at}");
            }
        }
    }

    /// A decode step of many sequences (each token its own slot and position, some slots idle)
    /// gives each sequence the output and cache entries it gets alone in a one-token pass, bit
    /// for bit, with the cache write in rope (q/k norm models) or inside attention (rope fused),
    /// with and without key splits; and the output matches the CPU reference.
    #[test]
    fn batch_of_sequences_equals_each_alone() {
        use crate::ops::rope::{inv_freq, rope_kv_write, rope_kv_write_batch, RopeParams};
        for gpu in gpu_variants() {
            for (h, hkv, d, ctx, fused) in
                [(12, 2, 128, 300, true), (6, 2, 64, 64, false), (4, 1, 256, 40, true), (8, 1, 512, 40, false)]
            {
                let slots = 5;
                // (position, slot) per token: different lengths, slot 2 idle, a sequence at 0.
                let seqs: [(u32, u32); 4] = [(17, 3), (0, 0), ((ctx - 1) as u32, 4), (123 % ctx as u32, 1)];
                let b = seqs.len();
                let p = AttnParams { n_tokens: b, ..params(h, hkv, d, ctx, 0) };
                let rp = RopeParams {
                    heads: h,
                    kv_heads: hkv,
                    head_dim: d,
                    rotary_dim: d,
                    theta: 1e4,
                    scaling: 1.0,
                    n_tokens: b,
                    proportional: false,
                    k_eq_v: false,
                    v_norm: false,
                    q_only: false,
                };
                let row = p.row_stride();
                let data = random(b * row, 7 + d as u64, 1.5);
                let cache: Vec<f16> = random(slots * hkv * ctx * d, 8, 1.0).iter().map(|x| f16::from_f32(*x)).collect();
                let table = gpu.upload_f32("inv_freq", &[d / 2], &inv_freq(d, 1e4, 1.0)).unwrap();
                let what = format!("H {h} Hkv {hkv} D {d} ctx {ctx} fused {fused} f16={}", gpu.caps.f16);
                let shape = [slots, hkv, ctx, d];
                // The batch.
                let qkv = gpu.upload_f32("qkv", &[b, row], &data).unwrap();
                let kc = gpu.upload_f16("k", &shape, &cache).unwrap();
                let vc = gpu.upload_f16("v", &shape, &cache).unwrap();
                let out = gpu.empty("out", &[b, h * d], ElemType::F32).unwrap();
                let flat: Vec<u32> = seqs.iter().flat_map(|&(p, s)| [p, s]).collect();
                let sq = gpu.upload_u32("seqs", &[b, 2], &flat).unwrap();
                let step = gpu.uniform("step", &StepParams { pos: 0, n_tokens: b as u32, slot: 0, _pad: 0 });
                let mut ks = Vec::new();
                if fused {
                    ks.extend(attention_batch(&gpu, &qkv, &kc, &vc, &out, &step, &sq, p, Some(&table)).unwrap());
                } else {
                    ks.push(rope_kv_write_batch(&gpu, &qkv, &step, &sq, rp, None, &kc, &vc).unwrap());
                    ks.extend(attention_batch(&gpu, &qkv, &kc, &vc, &out, &step, &sq, p, None).unwrap());
                }
                gpu.run(&ks.iter().collect::<Vec<_>>()).unwrap();
                let (got, gk, gv) =
                    (gpu.read_f32(&out).unwrap(), gpu.read_f16(&kc).unwrap(), gpu.read_f16(&vc).unwrap());
                // Each sequence alone, one after another on the same caches.
                let kc1 = gpu.upload_f16("k", &shape, &cache).unwrap();
                let vc1 = gpu.upload_f16("v", &shape, &cache).unwrap();
                let p1 = AttnParams { n_tokens: 1, ..p };
                let rp1 = RopeParams { n_tokens: 1, ..rp };
                for (t, &(pos, slot)) in seqs.iter().enumerate() {
                    let qkv1 = gpu.upload_f32("qkv", &[1, row], &data[t * row..][..row]).unwrap();
                    let out1 = gpu.empty("out", &[1, h * d], ElemType::F32).unwrap();
                    let step1 = gpu.uniform("step", &StepParams { pos, n_tokens: 1, slot, _pad: 0 });
                    let mut ks = Vec::new();
                    if fused {
                        ks.extend(attention_rope(&gpu, &qkv1, &kc1, &vc1, &out1, &step1, p1, &table).unwrap());
                    } else {
                        ks.push(rope_kv_write(&gpu, &qkv1, &step1, rp1, None, &kc1, &vc1).unwrap());
                        ks.extend(attention(&gpu, &qkv1, &kc1, &vc1, &out1, &step1, p1).unwrap());
                    }
                    gpu.run(&ks.iter().collect::<Vec<_>>()).unwrap();
                    let alone = gpu.read_f32(&out1).unwrap();
                    let mine = &got[t * h * d..][..h * d];
                    let same = mine.iter().zip(&alone).all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "sequence {t} (pos {pos}, slot {slot}) differs from its one-token pass: {what}");
                    // This step's key was written to its slot (at its position).
                    let at = (slot as usize * hkv * ctx + pos as usize) * d;
                    assert_ne!(gk[at], cache[at], "sequence {t}'s key was not written: {what}");
                }
                let bits = |a: &[f16], b: &[f16]| a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
                assert_eq!(bits(&gk, &gpu.read_f16(&kc1).unwrap()), 0, "K caches: {what}");
                assert_eq!(bits(&gv, &gpu.read_f16(&vc1).unwrap()), 0, "V caches: {what}");
                // Slot 2 (idle) untouched.
                let per_slot = hkv * ctx * d;
                assert_eq!(bits(&gk[2 * per_slot..][..per_slot], &cache[2 * per_slot..][..per_slot]), 0, "{what}");
            }
        }
    }

    /// The batch's output against the CPU reference (unrotated keys: the cache write by
    /// kv_cache_write per slot first, then attention over every sequence in one step).
    #[test]
    fn batch_of_sequences_matches_cpu() {
        let gpu = gpu();
        let (h, hkv, d, ctx, slots) = (8, 2, 64, 96, 3);
        let seqs: [(u32, u32); 3] = [(95, 2), (40, 0), (3, 1)];
        let b = seqs.len();
        let p = AttnParams { n_tokens: b, ..params(h, hkv, d, ctx, 0) };
        let row = p.row_stride();
        let mut data = random(b * row, 31, 1.0);
        for t in 0..b {
            data[t * row..][..h * d].iter_mut().for_each(|x| *x *= 3.0);
        }
        let cache: Vec<f16> = random(slots * hkv * ctx * d, 32, 1.0).iter().map(|x| f16::from_f32(*x)).collect();
        let shape = [slots, hkv, ctx, d];
        let qkv = gpu.upload_f32("qkv", &[b, row], &data).unwrap();
        let kc = gpu.upload_f16("k", &shape, &cache).unwrap();
        let vc = gpu.upload_f16("v", &shape, &cache).unwrap();
        let out = gpu.empty("out", &[b, h * d], ElemType::F32).unwrap();
        let flat: Vec<u32> = seqs.iter().flat_map(|&(p, s)| [p, s]).collect();
        let sq = gpu.upload_u32("seqs", &[b, 2], &flat).unwrap();
        let step = gpu.uniform("step", &StepParams { pos: 0, n_tokens: b as u32, slot: 0, _pad: 0 });
        let ks = attention_batch(&gpu, &qkv, &kc, &vc, &out, &step, &sq, p, None).unwrap();
        gpu.run(&ks.iter().collect::<Vec<_>>()).unwrap();
        let got = gpu.read_f32(&out).unwrap();
        let per_slot = hkv * ctx * d;
        for (t, &(pos, slot)) in seqs.iter().enumerate() {
            let s = slot as usize * per_slot;
            let want = cpu::attention(
                &data[t * row..][..row],
                &cache[s..][..per_slot],
                &cache[s..][..per_slot],
                pos as usize,
                1,
                &AttnParams { n_tokens: 1, ..p },
            );
            let (diff, at) = max_abs_diff(&got[t * h * d..][..h * d], &want);
            let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
            assert!(diff <= 2e-5 * scale.max(1.0), "sequence {t}: max diff {diff} at {at}");
        }
    }

    /// Every rounding case of the f32 -> f16 conversion (ties, subnormals, overflow, inf, NaN).
    #[test]
    fn cache_write_rounds_to_nearest_even() {
        let gpu = gpu();
        let mut vals: Vec<f32> = vec![
            0.0,
            -0.0,
            1.0,
            -1.0,
            65504.0,
            65519.0,
            65520.0,
            -65520.0,
            1e9,
            f32::INFINITY,
            f32::NEG_INFINITY,
            6.1035156e-5,
            6.097555e-5,
            5.9604645e-8,
            2.9802322e-8,
            2.9802326e-8,
            1.0e-8,
            -4.5e-6,
            1.0009766,
            1.0004883,
            1.0014648,
            2049.0,
            2051.0,
            0.1,
            1.0 / 3.0,
        ];
        vals.extend(random(900, 31, 8.0).iter().map(|x| x * x * x * 1e-3));
        // exact ties between neighbouring halves (normal and subnormal, even and odd), and the
        // f32 values just below and above them
        for b in [0x0000u16, 0x0001, 0x0002, 0x03fe, 0x03ff, 0x0400, 0x3c00, 0x3c01, 0x7bfe, 0x7bff] {
            let lo = f16::from_bits(b).to_f64();
            let hi = if b == 0x7bff { 65536.0 } else { f16::from_bits(b + 1).to_f64() };
            let tie = ((lo + hi) / 2.0) as f32;
            for x in [tie, f32::from_bits(tie.to_bits() - 1), f32::from_bits(tie.to_bits() + 1)] {
                vals.push(x);
                vals.push(-x);
            }
        }
        let p = AttnParams { n_tokens: 8, ..params(2, 2, 64, 8, 0) };
        let row = p.row_stride();
        let mut data = random(8 * row, 32, 1.0);
        let ks = p.heads * p.head_dim;
        for t in 0..8 {
            for i in 0..2 * p.kv_heads * p.head_dim {
                data[t * row + ks + i] = vals[(t * 256 + i) % vals.len()];
            }
        }
        let mut l = Layer::new(&gpu, p);
        let qkv = gpu.upload_f32("qkv", &[8, row], &data).unwrap();
        let sp = StepParams { pos: 0, n_tokens: 8, slot: 0, _pad: 0 };
        gpu.queue.write_buffer(&l.step, 0, bytemuck::bytes_of(&sp));
        let k = kv_cache_write(&gpu, &qkv, &l.k, &l.v, &l.step, p).unwrap();
        gpu.run(&[&k]).unwrap();
        cpu::kv_cache_write(&data, &mut l.k_cpu, &mut l.v_cpu, 0, 8, &p);
        let got = gpu.read_f16(&l.k).unwrap();
        for (i, (a, b)) in got.iter().zip(&l.k_cpu).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "K[{i}]: {a} vs {b}");
        }
        let got = gpu.read_f16(&l.v).unwrap();
        for (i, (a, b)) in got.iter().zip(&l.v_cpu).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "V[{i}]: {a} vs {b}");
        }
        // NaN stays NaN
        let nan = gpu.upload_f32("nan", &[8, row], &vec![f32::NAN; 8 * row]).unwrap();
        let k = kv_cache_write(&gpu, &nan, &l.k, &l.v, &l.step, p).unwrap();
        gpu.run(&[&k]).unwrap();
        assert!(gpu.read_f16(&l.k).unwrap()[..64].iter().all(|x| x.is_nan()));
    }

    /// Timings on the default adapter (not a check):
    /// `cargo test --lib ops::attention::tests::bench -- --ignored --nocapture`.
    /// Each case runs the attention kernels `iters` times in one pass; per-run time is the wall
    /// time of the pass over `iters`.
    #[test]
    #[ignore]
    fn bench() {
        let gpu = gpu();
        eprintln!("adapter: {} ({:?})", gpu.info.name, gpu.info.backend);
        let time = |kernels: &[&Kernel], iters: usize| -> f64 {
            gpu.run(kernels).unwrap();
            let mut enc = gpu.device.create_command_encoder(&Default::default());
            {
                let mut pass = enc.begin_compute_pass(&Default::default());
                for _ in 0..iters {
                    for k in kernels {
                        k.encode(&mut pass);
                    }
                }
            }
            let t0 = std::time::Instant::now();
            gpu.queue.submit([enc.finish()]);
            gpu.wait().unwrap();
            t0.elapsed().as_secs_f64() / iters as f64
        };
        // best of 5 passes of about 10 ms
        let time = |kernels: &[&Kernel]| -> f64 {
            let once = time(kernels, 3);
            let iters = ((0.01 / once) as usize).clamp(3, 300);
            (0..5).map(|_| time(kernels, iters)).fold(f64::INFINITY, f64::min)
        };
        let only: Option<String> = std::env::var("BENCH_ONLY").ok();
        // name, H, Hkv, D, context after the pass, T, window
        let cases: &[(&str, usize, usize, usize, usize, usize, usize)] = &[
            ("qwen2.5-1.5b decode", 12, 2, 128, 641, 1, 0),
            ("qwen2.5-1.5b decode", 12, 2, 128, 4096, 1, 0),
            ("llama3-8b decode", 32, 8, 128, 1024, 1, 0),
            ("llama3-8b decode", 32, 8, 128, 4096, 1, 0),
            ("llama3-8b decode", 32, 8, 128, 16384, 1, 0),
            ("qwen2.5-0.5b decode", 14, 2, 64, 4096, 1, 0),
            ("gemma3-1b decode", 4, 1, 256, 4096, 1, 0),
            ("gemma3-1b decode", 4, 1, 256, 32768, 1, 0),
            ("gemma3-1b decode sliding", 4, 1, 256, 32768, 1, 512),
            ("llama3-8b prefill", 32, 8, 128, 512, 512, 0),
            ("llama3-8b prefill", 32, 8, 128, 2048, 2048, 0),
            ("llama3-8b chunk", 32, 8, 128, 4096, 64, 0),
            ("gemma3-1b prefill", 4, 1, 256, 2048, 2048, 0),
            ("gemma3-4b prefill sliding", 8, 4, 256, 4096, 4096, 1024),
        ];
        for &(name, h, hkv, d, ctx, t, window) in cases {
            if only.as_ref().is_some_and(|o| !name.contains(o.as_str())) {
                continue;
            }
            let p = AttnParams { n_tokens: t, window, ..params(h, hkv, d, ctx, 0) };
            let n = hkv * ctx * d;
            let kv: Vec<f16> = random(n, 41, 1.0).iter().map(|x| f16::from_f32(*x)).collect();
            let kc = gpu.upload_f16("k", &[hkv, ctx, d], &kv).unwrap();
            let vc = gpu.upload_f16("v", &[hkv, ctx, d], &kv).unwrap();
            let qkv = gpu.upload_f32("qkv", &[t, p.row_stride()], &random(t * p.row_stride(), 42, 1.0)).unwrap();
            let out = gpu.empty("out", &[t, h * d], ElemType::F32).unwrap();
            let sp = StepParams { pos: (ctx - t) as u32, n_tokens: t as u32, slot: 0, _pad: 0 };
            let step = gpu.uniform("step", &sp);
            let auto = Tiling::choose(&gpu, &p).unwrap();
            let limit = gpu.limits.max_compute_workgroup_storage_size as usize;
            let mut tilings = vec![auto];
            let splits: &[usize] = if t <= 64 { &[1, 16, 32, 64, 128, 256] } else { &[1] };
            let bqs: &[usize] = if t <= 64 { &[4] } else { &[16, 8] };
            for &bq in bqs {
                for bk in [16, 32, 64, 128] {
                    for &nsplit in splits {
                        let tl = Tiling { bq, lpr: 128 / bq, bk, nsplit };
                        if tl.valid(d, limit) && !tilings.contains(&tl) {
                            tilings.push(tl);
                        }
                    }
                }
            }
            // keys visited (per query head), and bytes of K/V read once
            let keys: usize = (ctx - t..ctx).map(|q| if window > 0 { window.min(q + 1) } else { q + 1 }).sum();
            let flops = 4.0 * (h * d * keys) as f64;
            let span = if window > 0 { window.min(ctx) + t } else { ctx };
            let bytes = (2 * hkv * span.min(ctx) * d * 2) as f64;
            // The one-dispatch decode kernel: its choice, then other run counts and chunk sizes.
            if t == 1 {
                let g = h / hkv;
                let auto = DecodeTiling::choose(&gpu, &p, false);
                let mut dts: Vec<DecodeTiling> = auto.into_iter().collect();
                for ce in [8192, 4096] {
                    for nsplit in [1, 4, 8, 16, 32, 64, 128] {
                        let tl = DecodeTiling { ck: ce / d, nsplit };
                        if ce % d == 0 && tl.valid(d, g, limit, false, sg32(&gpu)) && !dts.contains(&tl) {
                            dts.push(tl);
                        }
                    }
                }
                let table = gpu.upload_f32("inv_freq", &[d / 2], &crate::ops::rope::inv_freq(d, 1e6, 1.0)).unwrap();
                for tl in dts {
                    for rope in [false, true] {
                        if rope && Some(tl) != auto {
                            continue;
                        }
                        let ks = attention_decode(
                            &gpu,
                            &qkv,
                            &kc,
                            &vc,
                            &out,
                            &step,
                            p,
                            tl,
                            rope.then_some(&table),
                            None,
                            None,
                        )
                        .unwrap();
                        let refs: Vec<&Kernel> = ks.iter().collect();
                        let s = time(&refs);
                        eprintln!(
                            "{name:28} H={h:2} Hkv={hkv} D={d} ctx={ctx:5} T={t:4} w={window:4} decode{} {:?}: {:8.1} us  {:6.0} GB/s{}",
                            if rope { "+rope" } else { "" },
                            tl,
                            s * 1e6,
                            bytes / s * 1e-9,
                            if Some(tl) == auto { "  (auto)" } else { "" },
                        );
                    }
                }
            }
            for tl in tilings {
                let ks = attention_with(&gpu, &qkv, &kc, &vc, &out, &step, p, tl, None, None).unwrap();
                let refs: Vec<&Kernel> = ks.iter().collect();
                let s = time(&refs);
                let parts = if refs.len() > 1 {
                    format!("  (main {:.1} us, merge {:.1} us)", time(&refs[..1]) * 1e6, time(&refs[1..]) * 1e6)
                } else {
                    String::new()
                };
                eprintln!(
                    "{name:28} H={h:2} Hkv={hkv} D={d} ctx={ctx:5} T={t:4} w={window:4} {:?}: {:8.1} us  {:6.0} GB/s  {:6.2} TFLOP/s{}{}",
                    tl,
                    s * 1e6,
                    bytes / s * 1e-9,
                    flops / s * 1e-12,
                    if tl == auto { "  (auto)" } else { "" },
                    parts
                );
            }
        }
        // rope and the cache write, for scale
        for t in [1usize, 2048] {
            let p = AttnParams { n_tokens: t, ..params(32, 8, 128, 4096, 0) };
            let (kc, vc) = kv_cache(&gpu, "c", &p, 1).unwrap();
            let qkv = gpu.upload_f32("qkv", &[t, p.row_stride()], &random(t * p.row_stride(), 43, 1.0)).unwrap();
            let sp = StepParams { pos: 0, n_tokens: t as u32, slot: 0, _pad: 0 };
            let step = gpu.uniform("step", &sp);
            let w = kv_cache_write(&gpu, &qkv, &kc, &vc, &step, p).unwrap();
            let rp = crate::ops::rope::RopeParams {
                heads: 32,
                kv_heads: 8,
                head_dim: 128,
                rotary_dim: 128,
                theta: 5e5,
                scaling: 1.0,
                n_tokens: t,
                proportional: false,
                k_eq_v: false,
                v_norm: false,
                q_only: false,
            };
            let nw = gpu.upload_f32("n", &[128], &[1.0; 128]).unwrap();
            let r = crate::ops::rope::rope(&gpu, &qkv, &step, rp, Some((&nw, &nw, 1e-6))).unwrap();
            let f = crate::ops::rope::rope_kv_write(&gpu, &qkv, &step, rp, Some((&nw, &nw, 1e-6)), &kc, &vc).unwrap();
            eprintln!(
                "T={t:4}: kv_cache_write {:7.1} us, rope+qk_norm {:7.1} us, fused rope+qk_norm+kv write {:7.1} us",
                time(&[&w]) * 1e6,
                time(&[&r]) * 1e6,
                time(&[&f]) * 1e6
            );
        }
    }
}
