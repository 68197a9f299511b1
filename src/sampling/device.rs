//! The device sampler: the [spec](super) in WGSL. The logits never leave the GPU; one `u32` id
//! per row is written to a GPU buffer (the next step's input ids, or a small buffer that
//! [`DeviceSampler::sample`] reads back).
//!
//! # Passes
//! Three dispatches for a batch with any sampling row, two for an all-greedy batch, whatever
//! the parameters (they are data in a buffer: changing them never recompiles or rebinds):
//!
//! 1. `sample_stats` (`rows × G` workgroups, `G = ⌈V / 1024⌉`, 4 consecutive logits a thread):
//!    per chunk, the greedy argmax of the raw logits, the max order key of `s = l · inv_T`, the
//!    candidate count and the `+inf` flag; zeroes the row's histogram.
//! 2. `sample_histogram` (`rows × G` workgroups, sampling rows only): every workgroup reduces
//!    its row's partials to `m = max s`, then for each candidate `d = s - m`:
//!    - **bins** `d` by value: bin `b` = `d ∈ (-(b+1)/8, -b/8]` for `d > -40` (320 bins),
//!      then a tail; counts and fixed-point weights `⌊exp(d) · 2^40⌋` per bin, merged into the
//!      row's histogram with 64-bit integer atomics (exact, order-independent);
//!    - writes the candidates into the row's **list bucketed by bin** (each workgroup's region
//!      is a local counting sort of its chunk; bucket offsets go to its metadata), so the last
//!      pass can fetch the entries of any one bin of the row without scanning the row;
//!    - for **draw-window** tokens (`d > -20`) that pass min-p, the Gumbel key `d + g` (one
//!      Philox block per thread serves its 4 logits) and, per window bin `b`, the best
//!      `(key, lowest index)` over the workgroup's bins `0..=b` (a prefix record).
//! 3. `sample_select` (one workgroup per row): fixed outcomes (greedy, `+inf`, no candidate)
//!    from the partials; otherwise the thresholds and the draw:
//!    - top-k: the bin where the cumulative count reaches `k`, then the exact `t_k` by a
//!      4 × 8-bit radix select over that bin's entries; `Z` = weight of `K1`;
//!    - top-p: the bin where the cumulative `K1` weight reaches `⌈top_p · Z⌉`, then the exact
//!      level inside it by the same radix search with the weight as the predicate;
//!    - min-p: the bin of `ln_min_p`;
//!    - draw: with `b*` the first bin not wholly kept, the winner is the best of the
//!      workgroups' prefix records for bin `b* - 1` and of the entries of bin `b*` that pass
//!      the thresholds. No full sort and no full second read of the row.
//!
//! Greedy is passes 1 and 3 (in a mixed batch, pass 2 skips greedy rows).
//!
//! # Token masks
//! A row with a mask ([`set_masked`](DeviceSampler::set_masked), [`super::mask`]'s spec) has
//! its disallowed tokens left out where the logits are read: passes 1 and 2 read the mask word
//! of a thread's 4 logits (one `u32`) and skip those tokens for the argmax, the candidates and
//! the bins, so every later step sees the restricted row; `sample_select` gives the masked
//! argmax where the unmasked spec gives 0 (no candidate). Only masked rows' masks are uploaded
//! (`⌈V / 32⌉` words each, one binding of passes 1 and 2); a row without one reads nothing.
//!
//! # Why the window is exact
//! `u ∈ [2^-24, 1 - 2^-24]` bounds the Gumbel noise to `g ∈ [-2.812, 16.636]`, so the maximum
//! (`d = 0`, always kept) has key `≥ -2.812` and a token with `d ≤ -20` has key
//! `≤ -3.36`: it can never win. Only tokens with `d > -20` need random bits, and a threshold
//! whose bin lies wholly below the window cannot change the winner. Tokens with `d ≤ -40`
//! weigh `< 2^-57`, which the 2^-40 fixed point rounds to 0, so the tail needs no bins.
//!
//! # Exactness against the host
//! Steps 1–3, 5 and 6 of the spec are bit-exact: integer keys and counts, the spec's rounded
//! `f32` operations (with rounding barriers against FMA contraction and fast-math
//! reassociation: see `wgsl/include/philox.wgsl`), the same Philox counters. Top-p (step 4) is
//! exact for the weights `q_i = ⌊exp_f32(d_i) · 2^40⌋`: masses are exact 64-bit integer sums
//! (no `f32` atomics needed, independent of workgroup order) and the predicate is
//! `M ≥ ⌈top_p · Z⌉` in exact integer arithmetic. The host uses `exp` in `f64`. So `K2` differs
//! only where `M(t)` is within the device `exp` error (a few `f32` ulp, ~1e-6 relative) plus
//! `V · 2^-40` of `top_p · Z`: the top-p boundary case the spec allows.
//!
//! # Memory
//! Scratch grows with the largest `(rows, vocab)` seen: `rows · V · 24` bytes (the bucketed list
//! and one fetched bin, 12 bytes an entry) plus `rows · G · 2.6 KB` of metadata.

use super::mask::{check_masks, Rows};
use super::params::{check_keys, logits_shape, prepare_rows, row_keys, Draw, RowKey, SamplingParams};
use super::penalty::{check_rows, DeviceControls, RowControls, SeqControls};
use crate::error::{Error, Result};
use crate::gpu::{kernel::grid, ElemType, Gpu, Tensor};
use std::sync::Arc;

/// Workgroup sizes by vocabulary (the same kernels under the `WG` / `SEG` macros, `CHUNK` =
/// 4 · `WG` logits a workgroup in the multi-workgroup passes): `(largest vocab, WG, SEG)`.
/// Small workgroups waste less on small vocabularies (and CPU drivers, which run a workgroup
/// as masked SIMD in `WG / 8` coroutines, pay per thread for all of a kernel's code).
const WORKGROUPS: [(usize, usize, usize); 3] = [(64, 16, 4), (16_384, 64, 8), (usize::MAX, 256, 16)];
/// Histogram bins per row (`NBINS`) and words per bin (`HW`).
const NBINS: usize = 321;
const HW: usize = 5;
/// Metadata words per workgroup (`META`).
const META: usize = 642;
/// Vocabularies must be smaller: a row's fixed-point weights then sum below 2^63, and the
/// histogram's 13-bit weight parts of its at most 2^12 workgroups below 2^25.
pub const MAX_VOCAB: usize = 1 << 22;
/// Bind-group sets kept for different (logits, out, rows, vocab).
const CACHE: usize = 8;

const STORAGE: wgpu::BufferUsages =
    wgpu::BufferUsages::STORAGE.union(wgpu::BufferUsages::COPY_DST).union(wgpu::BufferUsages::COPY_SRC);

/// A storage buffer that only grows.
struct Scratch {
    label: &'static str,
    buffer: Option<wgpu::Buffer>,
}

impl Scratch {
    const fn new(label: &'static str) -> Self {
        Self { label, buffer: None }
    }

    /// Makes the buffer at least `bytes` long; true when it was (re)allocated.
    fn ensure(&mut self, gpu: &Gpu, bytes: u64) -> Result<bool> {
        let bytes = bytes.max(16).next_multiple_of(16);
        if self.buffer.as_ref().is_some_and(|b| b.size() >= bytes) {
            return Ok(false);
        }
        let max = gpu.limits.max_storage_buffer_binding_size;
        if bytes > max {
            return Err(Error::InvalidArgument(format!(
                "device sampler: {} needs {} MiB, over the device's max storage binding of {} MiB \
                 (sample fewer rows at a time)",
                self.label,
                bytes >> 20,
                max >> 20
            )));
        }
        let label = self.label;
        let buffer = gpu.scoped(&format!("allocating {label}"), || {
            gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: bytes,
                usage: STORAGE,
                mapped_at_creation: false,
            })
        })?;
        self.buffer = Some(buffer);
        Ok(true)
    }

    fn get(&self) -> &wgpu::Buffer {
        self.buffer.as_ref().expect("scratch buffer allocated before use")
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct BindKey {
    logits: usize,
    logits_offset: u64,
    logits_size: u64,
    out: usize,
    out_offset: u64,
    /// Steps of the step log ([`PassLog::Steps`]).
    log: usize,
    rows: usize,
    vocab: usize,
    generation: u64,
}

/// The bind groups of one (logits, out, rows, vocab) and the buffers they keep alive.
struct Bound {
    key: BindKey,
    pipelines: [Arc<wgpu::ComputePipeline>; 3],
    _logits: Arc<wgpu::Buffer>,
    _out: Arc<wgpu::Buffer>,
    _info: wgpu::Buffer,
    groups: [wgpu::BindGroup; 3],
    grids: [[u32; 3]; 3],
}

/// The sampling head on the GPU (see the [module docs](self)). Pipelines are compiled once in
/// [`new`](Self::new); scratch grows on demand; bind groups are cached per (logits buffer, out
/// buffer, rows, vocab), so repeated calls on the same tensors rebuild nothing.
pub struct DeviceSampler {
    /// (stats, histogram, select) for each entry of `WORKGROUPS`, compiled on first use.
    pipelines: [Option<[Arc<wgpu::ComputePipeline>; 3]>; 3],
    params: Scratch,
    partials: Scratch,
    hist: Scratch,
    list: Scratch,
    meta: Scratch,
    fetched: Scratch,
    /// Per row: 1 when its logits held a NaN or an infinity (written by `sample_select`).
    status: Scratch,
    /// The step log of [`encode_pass`](Self::encode_pass) with [`PassLog::Steps`].
    log: Scratch,
    /// The token masks of the masked rows ([`set_masked`](Self::set_masked)), `⌈V / 32⌉` words
    /// each; the rows' parameters say which is theirs.
    masks: Scratch,
    /// The vocabulary of the masks of the last `set_masked` (`None`: no row has a mask).
    mask_vocab: Option<usize>,
    /// The logit controls' state and kernels ([`super::penalty`]); rows set by `set_controls`.
    controls: DeviceControls,
    /// Ids of [`sample`](super::SamplingBackend::sample) and their readback buffer.
    ids: Option<Tensor>,
    staging: Option<wgpu::Buffer>,
    /// Rows of the last [`set_params`](Self::set_params), and whether all are greedy.
    rows: usize,
    all_greedy: bool,
    /// Bumped whenever a buffer the bind groups use is reallocated.
    generation: u64,
    cache: Vec<Bound>,
    /// Bind-group sets built so far (for tests: repeated calls must build none).
    built: u64,
}

impl DeviceSampler {
    /// Compiles the pipelines for large vocabularies (those for small ones on first use; the
    /// pipeline cache keeps them for the device).
    pub fn new(gpu: &Gpu) -> Result<Self> {
        let mut s = Self {
            pipelines: [None, None, None],
            params: Scratch::new("sampler params"),
            partials: Scratch::new("sampler partials"),
            hist: Scratch::new("sampler histogram"),
            list: Scratch::new("sampler bucketed list"),
            meta: Scratch::new("sampler metadata"),
            fetched: Scratch::new("sampler fetched bin"),
            status: Scratch::new("sampler status"),
            log: Scratch::new("sampler step log"),
            masks: Scratch::new("sampler token masks"),
            mask_vocab: None,
            controls: DeviceControls::default(),
            ids: None,
            staging: None,
            rows: 0,
            all_greedy: true,
            generation: 0,
            cache: Vec::new(),
            built: 0,
        };
        s.pipelines_for(gpu, usize::MAX)?;
        Ok(s)
    }

    /// Index into `WORKGROUPS` for a vocabulary.
    fn config(vocab: usize) -> usize {
        WORKGROUPS.iter().position(|&(max, _, _)| vocab <= max).unwrap_or(WORKGROUPS.len() - 1)
    }

    /// Threads per workgroup for a vocabulary.
    pub fn workgroup_size(vocab: usize) -> usize {
        WORKGROUPS[Self::config(vocab)].1
    }

    /// The kernels' macros for a vocabulary.
    fn macros(gpu: &Gpu, vocab: usize) -> crate::gpu::Macros {
        let (_, wg, seg) = WORKGROUPS[Self::config(vocab)];
        gpu.macros().set("WG", wg).set("SEG", seg)
    }

    fn pipelines_for(&mut self, gpu: &Gpu, vocab: usize) -> Result<[Arc<wgpu::ComputePipeline>; 3]> {
        let slot = Self::config(vocab);
        if let Some(p) = &self.pipelines[slot] {
            return Ok(p.clone());
        }
        let macros = Self::macros(gpu, vocab);
        let p = [
            gpu.pipeline("sample_stats", "main", &macros)?,
            gpu.pipeline("sample_histogram", "main", &macros)?,
            gpu.pipeline("sample_select", "main", &macros)?,
        ];
        self.pipelines[slot] = Some(p.clone());
        Ok(p)
    }

    /// [`pipelines_for`](Self::pipelines_for) with sample_select's `LOG` variant where `log`.
    fn pipelines_logged(&mut self, gpu: &Gpu, vocab: usize, log: bool) -> Result<[Arc<wgpu::ComputePipeline>; 3]> {
        let [stats, histogram, select] = self.pipelines_for(gpu, vocab)?;
        let select = match log {
            // (The device's pipeline cache keeps the variant.)
            true => gpu.pipeline("sample_select", "main", &Self::macros(gpu, vocab).flag("LOG"))?,
            false => select,
        };
        Ok([stats, histogram, select])
    }

    /// Validates `params` (one per row) and uploads them for decode step `step`; they apply to
    /// the next [`encode`](Self::encode)d work submitted (`queue.write_buffer` semantics).
    /// Invalid parameters are an [`Error::InvalidArgument`] and nothing is written.
    /// Row `r` draws from Philox stream `r`.
    pub fn set_params(&mut self, gpu: &Gpu, params: &[SamplingParams], step: u32) -> Result<()> {
        self.set_rows(gpu, params, &row_keys(params.len(), step))
    }

    /// [`set_params`](Self::set_params) with each row's own decode step and Philox stream.
    pub fn set_rows(&mut self, gpu: &Gpu, params: &[SamplingParams], keys: &[RowKey]) -> Result<()> {
        self.set_masked(gpu, Rows { params, keys, masks: &vec![None; params.len()] })
    }

    /// [`set_rows`](Self::set_rows) with an optional token mask per row ([`super::mask`]): only
    /// the masked rows' masks are uploaded (`⌈V / 32⌉` words each); rows without one read none.
    /// The masks must share one vocabulary (the logits' at [`encode`](Self::encode)) and each
    /// allow some token.
    pub fn set_masked(&mut self, gpu: &Gpu, rows: Rows<'_>) -> Result<()> {
        let Rows { params, keys, masks } = rows;
        if params.is_empty() {
            return Err(Error::InvalidArgument("sampling: no rows".into()));
        }
        let mut prepared = prepare_rows(params, keys)?;
        let mask_vocab = masks.iter().flatten().next().map(|m| m.vocab());
        check_masks(masks, params.len(), mask_vocab.unwrap_or(0))?;
        let mut words = Vec::new();
        for (p, m) in prepared.iter_mut().zip(masks) {
            if let Some(m) = m {
                p.mask = 1 + (words.len() / m.words().len()) as u32;
                words.extend_from_slice(m.words());
            }
        }
        if self.masks.ensure(gpu, std::mem::size_of_val(words.as_slice()) as u64)? {
            self.invalidate();
        }
        if !words.is_empty() {
            gpu.queue.write_buffer(self.masks.get(), 0, bytemuck::cast_slice(&words));
        }
        self.mask_vocab = mask_vocab;
        let bytes = std::mem::size_of_val(prepared.as_slice()) as u64;
        if self.params.ensure(gpu, bytes)? {
            self.invalidate();
        }
        gpu.queue.write_buffer(self.params.get(), 0, bytemuck::cast_slice(&prepared));
        self.rows = params.len();
        self.all_greedy = params.iter().all(|p| p.is_greedy());
        self.controls.clear();
        Ok(())
    }

    /// Per-row logit controls for the rows of the last [`set_masked`](Self::set_masked) (which
    /// clears them), kept for every draw until the next `set_masked`: a controlled row's logits
    /// are rewritten in place by `sample_penalty` before the sampler's passes, and its sampled
    /// id is counted into its sequence's slot by `token_counts` after them ([`super::penalty`]).
    /// Each controlled sequence must have been [`start_controls`](Self::start_controls)ed.
    pub fn set_controls(&mut self, gpu: &Gpu, controls: RowControls) -> Result<()> {
        check_rows(controls, self.rows)?;
        self.controls.set_rows(gpu, controls)
    }

    /// Writes a sequence's first counts (its prompt's) into its slot on the GPU.
    pub fn start_controls(&mut self, gpu: &Gpu, seq: &SeqControls) -> Result<()> {
        self.controls.start(gpu, seq)
    }

    /// The bytes [`set_params`](Self::set_params) would write for decode step `step` with the
    /// parameters of the last `set_params` (the same rows, so the same encoded work), for the
    /// caller to copy into [`params_buffer`](Self::params_buffer) inside a command buffer, before
    /// the step's [`encode_pass`](Self::encode_pass): several decode steps in one submission.
    pub fn step_params(&self, params: &[SamplingParams], step: u32) -> Result<Vec<u8>> {
        if params.len() != self.rows || params.iter().all(|p| p.is_greedy()) != self.all_greedy {
            return Err(Error::InvalidArgument(
                "sampling: step parameters must keep the rows (and greedy or not) of the last set_params".into(),
            ));
        }
        if self.mask_vocab.is_some() {
            return Err(Error::InvalidArgument(
                "sampling: step parameters cannot carry token masks (set_masked each step)".into(),
            ));
        }
        Ok(bytemuck::cast_slice(&prepare_rows(params, &row_keys(params.len(), step))?).to_vec())
    }

    /// The buffer the sampler's parameters live in (see [`step_params`](Self::step_params)).
    pub fn params_buffer(&self) -> Result<&wgpu::Buffer> {
        self.params.buffer.as_ref().ok_or_else(|| Error::Gpu("the sampler's parameters were never set".into()))
    }

    /// How many bind-group sets this sampler has built: one per new (logits buffer, out buffer,
    /// rows, vocab) or scratch growth, none for repeated calls or new parameters.
    pub fn bind_groups_built(&self) -> u64 {
        self.built
    }

    /// Dispatches the next [`encode`](Self::encode) records: 2 when every row is greedy, else 3.
    pub fn dispatches(&self) -> usize {
        let controls = self.controls.dispatches();
        if self.all_greedy {
            2 + controls
        } else {
            3 + controls
        }
    }

    /// The per-row status the last [`encode`](Self::encode)d work writes (u32 `[rows]`, valid once
    /// that work has run): 1 where the row's logits held a NaN or an infinity, else 0. A decode
    /// loop copies it beside the ids to notice a failed model without reading the logits.
    pub fn status(&self) -> Option<&wgpu::Buffer> {
        self.status.buffer.as_ref()
    }

    /// Records the sampling of `rows` rows of f32 `logits` (`[rows, vocab]`, any shape with
    /// `rows · vocab` elements) into one compute pass on `encoder`, writing the ids to the
    /// first `rows` elements of `out` (u32), e.g. the next decode step's input ids. Call
    /// [`set_params`](Self::set_params) with `rows` parameters first.
    pub fn encode(
        &mut self,
        gpu: &Gpu,
        encoder: &mut wgpu::CommandEncoder,
        logits: &Tensor,
        rows: usize,
        out: &Tensor,
    ) -> Result<()> {
        let bound = self.prepare(gpu, logits, rows, out, None)?;
        let controls = self.controls.prepare(gpu, logits, out)?;
        let mut pass = encoder
            .begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("sampling"), timestamp_writes: None });
        self.controls.record_apply(controls, &mut pass);
        self.record_with(bound, &mut pass, None);
        self.controls.record_count(controls, &mut pass);
        Ok(())
    }

    /// [`encode`](Self::encode) into a compute pass the caller owns (to share a decode step's
    /// pass, or to time the sampler with the pass's timestamp writes); `also` says what else the
    /// pass writes ([`PassLog`]).
    pub fn encode_pass(
        &mut self,
        gpu: &Gpu,
        pass: &mut wgpu::ComputePass<'_>,
        logits: &Tensor,
        rows: usize,
        out: &Tensor,
        also: PassLog<'_>,
    ) -> Result<()> {
        let (log, stamps) = match also {
            PassLog::Nothing => (None, None),
            PassLog::Steps(steps) => (Some(steps), None),
            PassLog::Timestamps(set, first) => {
                if !gpu.device.features().contains(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES) {
                    return Err(Error::Unsupported("timestamps inside passes".into()));
                }
                (None, Some((set, first)))
            }
        };
        let bound = self.prepare(gpu, logits, rows, out, log)?;
        let controls = self.controls.prepare(gpu, logits, out)?;
        self.controls.record_apply(controls, pass);
        self.record_with(bound, pass, stamps);
        self.controls.record_count(controls, pass);
        Ok(())
    }

    /// The step log [`encode_pass`](Self::encode_pass) writes with [`PassLog::Steps`] (from byte 0; valid
    /// once that work has run).
    pub fn step_log(&self) -> Result<&wgpu::Buffer> {
        self.log.buffer.as_ref().ok_or_else(|| Error::Gpu("the sampler's step log was never used".into()))
    }

    fn record_with(&self, bound: usize, pass: &mut wgpu::ComputePass<'_>, stamps: Option<(&wgpu::QuerySet, u32)>) {
        let b = &self.cache[bound];
        let mut index = stamps.map(|(q, first)| {
            pass.write_timestamp(q, first);
            first + 1
        });
        for k in 0..3 {
            if k == 1 && self.all_greedy {
                continue;
            }
            pass.set_pipeline(&b.pipelines[k]);
            pass.set_bind_group(0, &b.groups[k], &[]);
            let [x, y, z] = b.grids[k];
            pass.dispatch_workgroups(x, y, z);
            if let (Some((q, _)), Some(i)) = (stamps, index.as_mut()) {
                pass.write_timestamp(q, *i);
                *i += 1;
            }
        }
    }

    fn invalidate(&mut self) {
        self.generation += 1;
        self.cache.clear();
    }

    /// Checks the arguments, grows the scratch, and returns the index of the cached bind groups.
    fn prepare(&mut self, gpu: &Gpu, logits: &Tensor, rows: usize, out: &Tensor, log: Option<usize>) -> Result<usize> {
        if rows == 0 || rows != self.rows {
            return Err(Error::InvalidArgument(format!(
                "sampling {rows} rows, but set_params was given {} rows",
                self.rows
            )));
        }
        if logits.ty != ElemType::F32 {
            return Err(Error::InvalidArgument(format!("sampling needs f32 logits, got {:?}", logits.ty)));
        }
        let n = logits.numel();
        if n == 0 || !n.is_multiple_of(rows) {
            return Err(Error::InvalidArgument(format!("{n} logits do not split into {rows} non-empty rows")));
        }
        let vocab = n / rows;
        if self.mask_vocab.is_some_and(|v| v != vocab) {
            return Err(Error::InvalidArgument(format!(
                "token masks for a vocabulary of {} applied to logits of {vocab}",
                self.mask_vocab.unwrap_or(0)
            )));
        }
        if vocab >= MAX_VOCAB {
            return Err(Error::InvalidArgument(format!(
                "vocabulary of {vocab} entries: the device sampler supports < {MAX_VOCAB}"
            )));
        }
        if out.ty != ElemType::U32 || out.numel() < rows {
            return Err(Error::InvalidArgument(format!(
                "sampling output must be u32 with at least {rows} elements, got {:?} {:?}",
                out.ty, out.shape
            )));
        }
        if log == Some(0) {
            return Err(Error::InvalidArgument("the sampler's step log needs at least one step".into()));
        }
        let groups = vocab.div_ceil(4 * Self::workgroup_size(vocab));
        let rg = rows as u64 * groups as u64;
        let rv = rows as u64 * vocab as u64;
        // An all-greedy batch only needs the partials (sample_select never reads the rest).
        let sampling = u64::from(!self.all_greedy);
        let mut grown = false;
        grown |= self.partials.ensure(gpu, rg * 16)?;
        grown |= self.hist.ensure(gpu, sampling * rows as u64 * (NBINS * HW * 4) as u64)?;
        grown |= self.list.ensure(gpu, sampling * rv * 8)?;
        grown |= self.meta.ensure(gpu, sampling * rg * META as u64 * 4)?;
        grown |= self.fetched.ensure(gpu, sampling * rv * 8)?;
        grown |= self.status.ensure(gpu, rows as u64 * 4)?;
        grown |= self.log.ensure(gpu, log.unwrap_or(0) as u64 * rows as u64 * 8)?;
        grown |= self.masks.ensure(gpu, 0)?;
        if grown {
            self.invalidate();
        }
        if rg * 4 > u64::from(gpu.limits.max_compute_workgroups_per_dimension).pow(2) {
            return Err(Error::InvalidArgument(format!(
                "sampling {rows} rows of {vocab}: too many workgroups for one dispatch"
            )));
        }
        let key = BindKey {
            logits: Arc::as_ptr(&logits.buffer) as usize,
            logits_offset: logits.offset,
            logits_size: logits.size_bytes(),
            out: Arc::as_ptr(&out.buffer) as usize,
            out_offset: out.offset,
            log: log.unwrap_or(0),
            rows,
            vocab,
            generation: self.generation,
        };
        if let Some(i) = self.cache.iter().position(|b| b.key == key) {
            return Ok(i);
        }
        let pipelines = self.pipelines_logged(gpu, vocab, log.is_some())?;
        let bound = self.bind(gpu, key, pipelines, logits, out, groups)?;
        self.built += 1;
        if self.cache.len() >= CACHE {
            self.cache.remove(0);
        }
        self.cache.push(bound);
        Ok(self.cache.len() - 1)
    }

    fn bind(
        &self,
        gpu: &Gpu,
        key: BindKey,
        pipelines: [Arc<wgpu::ComputePipeline>; 3],
        logits: &Tensor,
        out: &Tensor,
        groups: usize,
    ) -> Result<Bound> {
        use wgpu::util::DeviceExt;
        let info_words = SampleInfo { rows: key.rows as u32, vocab: key.vocab as u32, groups: groups as u32, zero: 0 };
        let info = gpu.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("sampler info"),
            contents: bytemuck::bytes_of(&info_words),
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::STORAGE,
        });
        let make = |pipeline: &wgpu::ComputePipeline, name: &str, res: Vec<wgpu::BindingResource<'_>>| {
            let entries: Vec<wgpu::BindGroupEntry> = res
                .into_iter()
                .enumerate()
                .map(|(i, resource)| wgpu::BindGroupEntry { binding: i as u32, resource })
                .collect();
            gpu.scoped(&format!("binding {name}"), || {
                gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: Some(name),
                    layout: &pipeline.get_bind_group_layout(0),
                    entries: &entries,
                })
            })
        };
        // What the passes share, in their binding order: the parameters, the per-chunk partials,
        // the histograms; then (the last two passes) the bucketed list and its metadata.
        let shared = || vec![whole(&self.params), whole(&self.partials), whole(&self.hist)];
        let listed = || [shared(), vec![whole(&self.list), whole(&self.meta)]].concat();
        let stats = make(
            &pipelines[0],
            "sample_stats",
            [vec![logits.binding()], shared(), vec![info.as_entire_binding(), whole(&self.masks)]].concat(),
        )?;
        let histogram = make(
            &pipelines[1],
            "sample_histogram",
            [vec![logits.binding()], listed(), vec![info.as_entire_binding(), whole(&self.masks)]].concat(),
        )?;
        let mut select_bindings =
            [listed(), vec![whole(&self.fetched), out.binding(), info.as_entire_binding(), whole(&self.status)]]
                .concat();
        if key.log > 0 {
            // Exactly the log's steps: the kernel takes N from the binding's length.
            select_bindings.push(wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: self.log.get(),
                offset: 0,
                size: std::num::NonZeroU64::new((key.log * key.rows * 8) as u64),
            }));
        }
        let select = make(&pipelines[2], "sample_select", select_bindings)?;
        let wide = grid((key.rows * groups) as u32);
        Ok(Bound {
            key,
            pipelines,
            _logits: logits.buffer.clone(),
            _out: out.buffer.clone(),
            _info: info,
            groups: [stats, histogram, select],
            grids: [wide, wide, grid(key.rows as u32)],
        })
    }

    /// The internal ids tensor (at least `rows` long) and its readback buffer.
    fn ids(&mut self, gpu: &Gpu, rows: usize) -> Result<Tensor> {
        if self.ids.as_ref().is_none_or(|t| t.numel() < rows) {
            let cap = rows.next_power_of_two();
            self.ids = Some(gpu.empty("sampled ids", &[cap], ElemType::U32)?);
            self.staging = Some(gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("sampled ids readback"),
                size: (cap * 8) as u64,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }));
        }
        let ids = self.ids.as_ref().expect("just made");
        Ok(ids.view(0, &[rows]))
    }
}

impl DeviceSampler {
    /// [`SamplingBackend::draw_controlled`](super::SamplingBackend::draw_controlled): records the
    /// passes, submits them and waits for the ids and the rows' status words. `controls`: one
    /// per row, or empty for none.
    pub fn draw_now(&mut self, gpu: &Gpu, logits: &Tensor, input: Rows<'_>, controls: RowControls) -> Result<Draw> {
        let (rows, vocab) = logits_shape(logits, input.params)?;
        check_keys(input.params, input.keys)?;
        check_masks(input.masks, rows, vocab)?;
        if logits.ty != ElemType::F32 {
            return Err(Error::InvalidArgument(format!("sampling needs f32 logits, got {:?}", logits.ty)));
        }
        if vocab == 0 {
            return Ok(Draw { ids: vec![0; rows], non_finite: vec![false; rows] });
        }
        self.set_masked(gpu, input)?;
        if !controls.is_empty() {
            self.set_controls(gpu, controls)?;
        }
        let out = self.ids(gpu, rows)?;
        let mut enc = gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("sampling") });
        self.encode(gpu, &mut enc, logits, rows, &out)?;
        // The ids, then the status words, in one readback.
        let staging = self.staging.as_ref().expect("made with the ids");
        let bytes = (rows * 4) as u64;
        enc.copy_buffer_to_buffer(&out.buffer, 0, staging, 0, bytes);
        enc.copy_buffer_to_buffer(self.status.get(), 0, staging, bytes, bytes);
        gpu.queue.submit([enc.finish()]);
        let words: Vec<u32> = bytemuck::pod_collect_to_vec(&gpu.map_read(staging, 2 * bytes)?);
        let (ids, status) = words.split_at(rows);
        Ok(Draw { ids: ids.to_vec(), non_finite: status.iter().map(|&s| s != 0).collect() })
    }
}

/// What [`DeviceSampler::encode_pass`] writes besides the ids.
#[derive(Clone, Copy, Debug)]
pub enum PassLog<'a> {
    /// The ids alone.
    Nothing,
    /// With `Steps(steps)`, each row's id and status also go to entry `(step % steps, row)` of the
    /// sampler's step log ([`step_log`](DeviceSampler::step_log): u32 `[steps, rows, 2]`; `step`:
    /// the decode step of [`set_params`](DeviceSampler::set_params) or
    /// [`step_params`](DeviceSampler::step_params)), so that a loop running several steps in one
    /// submission reads all their tokens back with one copy.
    Steps(usize),
    /// A timestamp written to the query set before the first dispatch and after each one
    /// (indices `first ..= first + dispatches()`), for per-kernel GPU times. Needs
    /// `wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES`.
    Timestamps(&'a wgpu::QuerySet, u32),
}

crate::ops::uniform::uniform_struct! {
    /// WGSL twin: `struct Info` of `wgsl/include/sample_common.wgsl` (the uniform of sample_stats, read as storage by sample_histogram and sample_select).
    pub(crate) struct SampleInfo = "Info" {
        rows: u32,
        vocab: u32,
        groups: u32,
        zero: u32,
    }
}

/// Test hook for the WGSL random numbers (`wgsl/sample_philox.wgsl`): for `j < n`, the
/// `uniform_bits(seed, step, row, first + j)` and the Gumbel noise the draw derives from them,
/// computed on the device, for comparison with [`super::philox`].
pub fn philox_bits(gpu: &Gpu, seed: u64, step: u32, row: u32, first: u32, n: u32) -> Result<(Vec<u32>, Vec<f32>)> {
    let len = (n as usize).max(1);
    let bits = gpu.empty("philox bits", &[len], ElemType::U32)?;
    let noise = gpu.empty("philox gumbel", &[len], ElemType::F32)?;
    let info = gpu.upload_u32("philox info", &[8], &[seed as u32, (seed >> 32) as u32, step, row, first, n, 0, 0])?;
    let k = gpu.kernel(
        "sample_philox",
        "main",
        &gpu.macros(),
        &[bits.binding(), noise.binding(), info.binding()],
        grid(n.div_ceil(256)),
    )?;
    gpu.run(&[&k])?;
    let mut b = gpu.read_u32(&bits)?;
    let mut g = gpu.read_f32(&noise)?;
    b.truncate(n as usize);
    g.truncate(n as usize);
    Ok((b, g))
}

fn whole(s: &Scratch) -> wgpu::BindingResource<'_> {
    s.get().as_entire_binding()
}
