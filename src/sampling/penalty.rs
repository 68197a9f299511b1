//! Logit controls: `logit_bias`, presence and frequency penalties (OpenAI) and the repetition
//! penalty over the last N tokens (llama.cpp's `--repeat-penalty` / `--repeat-last-n`). A row
//! with controls has them applied to its raw logits before everything else of the
//! [spec](super) (before the token mask and temperature); rows without them are untouched and
//! cost nothing (no dispatch at all when no row of a draw has controls).
//!
//! # Spec
//!
//! A sequence's controls ([`LogitControls`], checked by [`LogitControls::validate`]):
//! - `logit_bias`: `(token, bias)` pairs, `bias ∈ [-100, 100]` (OpenAI's range), `token <
//!   V`; a later pair for the same token replaces an earlier one. `b[i]` = the bias of token
//!   `i`, `0` when unlisted.
//! - `presence_penalty`, `frequency_penalty ∈ [-2, 2]` (OpenAI's range); `0` = off.
//! - `repeat_penalty`: finite, `≥ f32::MIN_POSITIVE` (so `1 / r` is finite); `1` = off.
//!   `repeat_last_n`: the window, `0` = off, `1 ..= MAX_WINDOW` tokens, or [`REPEAT_ALL`]
//!   (every counted token; llama.cpp's `-1`).
//! - NaN is rejected everywhere.
//!
//! Which tokens count (vLLM's semantics, with llama.cpp's window for the repetition penalty):
//! - `c[i]` = how many times token `i` was **generated** so far in this sequence (the prompt
//!   does not count): OpenAI's presence / frequency penalties, as vLLM applies them.
//! - `w[i]` = how many times token `i` occurs among the **last `repeat_last_n` tokens of the
//!   prompt followed by the generated tokens** (all of them with [`REPEAT_ALL`], vLLM's
//!   repetition penalty; llama.cpp counts a window of the same tokens). The prompt is what the
//!   request passes (for a continued chat, the new turn's tokens).
//!
//! llama.cpp differs: its presence / frequency penalties count the window too (prompt tokens
//! included), and it divides by the penalty where we multiply by the host's `1 / r`.
//!
//! Derived once on the host, so both samplers use the same bits: `inv_repeat = 1.0f32 / r`
//! (correctly rounded; the kernel never divides). Then for every token `i` of the row, in this
//! order, each step one `f32` operation rounded to nearest-even (no FMA, no reassociation):
//! 1. **bias** (vLLM applies `logit_bias` before the penalties): if `b[i] != 0`, `l = l + b[i]`;
//! 2. **repetition** (if `r != 1` and the window is on): if `w[i] > 0`, `l = l > 0 ? l *
//!    inv_repeat : l * r` (a NaN logit stays NaN);
//! 3. **frequency, then presence** (vLLM's order): if `c[i] > 0`, `l = l - f32(frequency ·
//!    f32(c[i]))`, then `l = l - presence`.
//!
//! The sampler then runs on the result (the token mask, temperature, filters, draw); a row's
//! non-finite status is that of the controlled logits. [`control_logit`] is the single source
//! of truth; [`SeqControls::apply`] (the host sampler) and the WGSL twin follow it.
//!
//! # On the GPU
//! The device sampler keeps each controlled sequence's counts on the GPU, in a slot of one
//! state buffer (`u32` words, [`layout`]): `len` (tokens counted), `c[V]`, `w[V]`, the bias
//! bits `b[V]`, and a ring of the last `MAX_WINDOW` token ids. A sequence's slot is written once
//! from the host when it starts ([`SeqControls`]'s counts of its prompt); after that two small
//! kernels in the draw's own compute pass keep it current: `sample_penalty` (before the
//! sampler's passes) rewrites the controlled rows' logits **in place**, and `token_counts`
//! (after them) reads each controlled row's sampled id from the ids buffer the sampler wrote
//! and counts it. No host round trip: the pipelined decode loop stays pipelined. The host keeps
//! its own copy ([`SeqControls::push`] for every token delivered), which the host sampler
//! reads.
//!
//! Hazards as for the sampler: the kernel forces rounding after every operation (`fr`, see
//! `wgsl/include/philox.wgsl`) against contraction; subnormal results may flush on the device.

use crate::error::{Error, Result};
use crate::gpu::{ElemType, Gpu, Kernel, Tensor};
use std::collections::{HashMap, VecDeque};

/// [`LogitControls::repeat_last_n`]: every counted token (llama.cpp's `-1`).
pub const REPEAT_ALL: u32 = u32::MAX;
/// The longest finite repetition window (the GPU ring's length a sequence).
pub const MAX_WINDOW: u32 = 8192;
/// llama.cpp's `--repeat-last-n` default.
pub const DEFAULT_REPEAT_LAST_N: u32 = 64;

/// [`ControlRow::flags`]: the row has a `logit_bias`.
pub const FLAG_BIAS: u32 = 1;
/// [`ControlRow::flags`]: the repetition penalty is on.
pub const FLAG_REPEAT: u32 = 2;
/// [`ControlRow::flags`]: a presence or frequency penalty is on.
pub const FLAG_COUNTS: u32 = 4;

/// A sequence's logit controls as the user gives them (see the [module docs](self)). The
/// default is off: no bias, no penalty.
#[derive(Clone, Debug, PartialEq)]
pub struct LogitControls {
    /// `(token, bias)`, bias in `[-100, 100]`; a later pair for a token replaces an earlier one.
    pub logit_bias: Vec<(u32, f32)>,
    /// In `[-2, 2]`, subtracted once from every token generated at least once; 0 = off.
    pub presence_penalty: f32,
    /// In `[-2, 2]`, times the token's count of generated occurrences; 0 = off.
    pub frequency_penalty: f32,
    /// The repetition penalty (llama.cpp's `repeat_penalty`): `> 0`; 1 = off.
    pub repeat_penalty: f32,
    /// Its window: 0 = off, `1..=MAX_WINDOW`, or [`REPEAT_ALL`].
    pub repeat_last_n: u32,
}

impl Default for LogitControls {
    fn default() -> Self {
        Self {
            logit_bias: Vec::new(),
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repeat_penalty: 1.0,
            repeat_last_n: DEFAULT_REPEAT_LAST_N,
        }
    }
}

impl LogitControls {
    /// Whether the controls change nothing (no work is done for such a sequence).
    pub fn is_off(&self) -> bool {
        self.logit_bias.is_empty() && self.presence_penalty == 0.0 && self.frequency_penalty == 0.0 && !self.repeats()
    }

    fn repeats(&self) -> bool {
        self.repeat_penalty != 1.0 && self.repeat_last_n != 0
    }

    /// The first field out of range, by its API name (`logit_bias`, `presence_penalty`,
    /// `frequency_penalty`, `repeat_penalty`, `repeat_last_n`), with the message.
    pub fn check(&self) -> std::result::Result<(), (&'static str, String)> {
        for &(token, bias) in &self.logit_bias {
            if !(-100.0..=100.0).contains(&bias) {
                return Err(("logit_bias", format!("logit_bias of token {token} must be in [-100, 100], got {bias}")));
            }
        }
        for (name, v) in [("presence_penalty", self.presence_penalty), ("frequency_penalty", self.frequency_penalty)] {
            if !(-2.0..=2.0).contains(&v) {
                return Err((name, format!("{name} must be in [-2, 2] (0 = off), got {v}")));
            }
        }
        let r = self.repeat_penalty;
        if !r.is_finite() || r < f32::MIN_POSITIVE {
            return Err(("repeat_penalty", format!("repeat_penalty must be a finite number > 0 (1 = off), got {r}")));
        }
        let n = self.repeat_last_n;
        if n > MAX_WINDOW && n != REPEAT_ALL {
            return Err((
                "repeat_last_n",
                format!("repeat_last_n must be 0 (off), 1 to {MAX_WINDOW}, or -1 (every token), got {n}"),
            ));
        }
        Ok(())
    }

    /// [`check`](Self::check) as an [`Error::InvalidArgument`].
    pub fn validate(&self) -> Result<()> {
        self.check().map_err(|(_, m)| Error::InvalidArgument(m))
    }

    /// [`validate`](Self::validate), and every biased token inside a vocabulary of `vocab`.
    pub fn validate_for(&self, vocab: usize) -> Result<()> {
        self.validate()?;
        match self.logit_bias.iter().find(|&&(t, _)| t as usize >= vocab) {
            Some(&(t, _)) => Err(Error::InvalidArgument(format!(
                "logit_bias names token {t}, outside the vocabulary ({vocab} tokens)"
            ))),
            None => Ok(()),
        }
    }

    /// The per-row record the kernels read (`row` and `slot` filled in by the caller).
    fn prepare(&self) -> ControlRow {
        let mut flags = 0;
        if !self.logit_bias.is_empty() {
            flags |= FLAG_BIAS;
        }
        if self.repeats() {
            flags |= FLAG_REPEAT;
        }
        if self.presence_penalty != 0.0 || self.frequency_penalty != 0.0 {
            flags |= FLAG_COUNTS;
        }
        ControlRow {
            row: 0,
            slot: 0,
            flags,
            window: if self.repeats() { self.repeat_last_n } else { 0 },
            repeat: self.repeat_penalty,
            inv_repeat: 1.0 / self.repeat_penalty,
            presence: self.presence_penalty,
            frequency: self.frequency_penalty,
        }
    }
}

/// One controlled row as the kernels read it (`struct Row` of `wgsl/sample_penalty.wgsl` and
/// `wgsl/token_counts.wgsl`: eight 4-byte members, no padding).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct ControlRow {
    /// The row of the logits matrix (and of the sampled ids).
    pub row: u32,
    /// The sequence's slot in the state buffer.
    pub slot: u32,
    /// [`FLAG_BIAS`] | [`FLAG_REPEAT`] | [`FLAG_COUNTS`].
    pub flags: u32,
    /// The repetition window (0 when the repetition penalty is off; [`REPEAT_ALL`]).
    pub window: u32,
    pub repeat: f32,
    /// `1.0f32 / repeat`, computed on the host.
    pub inv_repeat: f32,
    pub presence: f32,
    pub frequency: f32,
}

/// Step 1–3 of the spec for one logit: `bias` = `b[i]`, `in_window` = `w[i] > 0`, `count` =
/// `c[i]`. The single source of truth for both samplers.
#[inline]
pub fn control_logit(logit: f32, bias: f32, in_window: bool, count: u32, row: &ControlRow) -> f32 {
    let mut l = logit;
    if row.flags & FLAG_BIAS != 0 && bias != 0.0 {
        l += bias;
    }
    if row.flags & FLAG_REPEAT != 0 && in_window {
        l *= if l > 0.0 { row.inv_repeat } else { row.repeat };
    }
    if row.flags & FLAG_COUNTS != 0 && count > 0 {
        l -= row.frequency * count as f32;
        l -= row.presence;
    }
    l
}

/// One sequence's controls and counts on the host: made from its prompt when it starts, moved
/// on by [`push`](Self::push) for each token it generates. The host sampler applies them
/// ([`apply`](Self::apply)); the device sampler takes their first state into the sequence's
/// slot ([`crate::sampling::SamplingBackend::start_controls`]) and counts on the GPU from there.
#[derive(Clone, Debug)]
pub struct SeqControls {
    row: ControlRow,
    vocab: usize,
    /// Sorted by token, one entry a token.
    bias: Vec<(u32, f32)>,
    /// `c`: generated occurrences (no zero entries).
    generated: HashMap<u32, u32>,
    /// `w`: occurrences in the window (no zero entries).
    window: HashMap<u32, u32>,
    /// The window's tokens, oldest first (finite windows only).
    history: VecDeque<u32>,
    /// Tokens counted (the prompt's and the generated).
    len: u32,
}

impl SeqControls {
    /// The controls of a sequence in state slot `slot` whose prompt is `prompt`, or `None` when
    /// they are off. Checks the controls and the biased tokens against the vocabulary.
    pub fn start(controls: &LogitControls, vocab: usize, slot: u32, prompt: &[u32]) -> Result<Option<Self>> {
        controls.validate_for(vocab)?;
        if controls.is_off() {
            return Ok(None);
        }
        let mut bias: Vec<(u32, f32)> = Vec::new();
        for &(t, b) in controls.logit_bias.iter().rev() {
            if !bias.iter().any(|&(u, _)| u == t) {
                bias.push((t, b));
            }
        }
        bias.sort_by_key(|&(t, _)| t);
        let row = ControlRow { slot, ..controls.prepare() };
        let mut s = Self {
            row,
            vocab,
            bias,
            generated: HashMap::new(),
            window: HashMap::new(),
            history: VecDeque::new(),
            len: 0,
        };
        for &t in prompt {
            s.count(t, false);
        }
        Ok(Some(s))
    }

    /// Its state slot.
    pub fn slot(&self) -> u32 {
        self.row.slot
    }

    /// Counts a generated token.
    pub fn push(&mut self, token: u32) {
        self.count(token, true);
    }

    fn count(&mut self, token: u32, generated: bool) {
        if token as usize >= self.vocab {
            return;
        }
        if generated {
            *self.generated.entry(token).or_default() += 1;
        }
        let n = self.row.window;
        if n != 0 {
            if n != REPEAT_ALL && self.history.len() >= n as usize {
                let old = self.history.pop_front().expect("a full window");
                let w = self.window.get_mut(&old).expect("a token in the window is counted");
                *w -= 1;
                if *w == 0 {
                    self.window.remove(&old);
                }
            }
            if n != REPEAT_ALL {
                self.history.push_back(token);
            }
            *self.window.entry(token).or_default() += 1;
        }
        self.len += 1;
    }

    fn bias_of(&self, token: u32) -> f32 {
        self.bias.binary_search_by_key(&token, |&(t, _)| t).map_or(0.0, |i| self.bias[i].1)
    }

    /// Applies the controls to one row of logits (the spec, on the tokens with a bias or a
    /// count: every other logit is unchanged by definition).
    pub fn apply(&self, logits: &mut [f32]) {
        let mut tokens: Vec<u32> = self.bias.iter().map(|&(t, _)| t).collect();
        tokens.extend(self.window.keys().chain(self.generated.keys()));
        tokens.sort_unstable();
        tokens.dedup();
        for t in tokens {
            if let Some(l) = logits.get_mut(t as usize) {
                let c = self.generated.get(&t).copied().unwrap_or(0);
                *l = control_logit(*l, self.bias_of(t), self.window.contains_key(&t), c, &self.row);
            }
        }
    }

    /// The slot's words in the state buffer ([`layout`]).
    pub fn state_words(&self) -> Vec<u32> {
        let v = self.vocab;
        let mut s = vec![0u32; layout::stride(v)];
        s[layout::LEN] = self.len;
        for (&t, &c) in &self.generated {
            s[layout::generated(v) + t as usize] = c;
        }
        for (&t, &c) in &self.window {
            s[layout::window(v) + t as usize] = c;
        }
        for &(t, b) in &self.bias {
            s[layout::bias(v) + t as usize] = b.to_bits();
        }
        let first = self.len as usize - self.history.len();
        for (j, &t) in self.history.iter().enumerate() {
            s[layout::ring(v) + (first + j) % MAX_WINDOW as usize] = t;
        }
        s
    }
}

/// Where a slot's words lie in the state buffer (a slot of [`stride`](layout::stride) words,
/// slot `s` at word `s · stride`): `len` at 0 (words 1–3 unused), then `c[V]`, `w[V]`, the bias
/// bits `b[V]`, and the ring of the last `MAX_WINDOW` ids (the `p`-th counted token at
/// `p % MAX_WINDOW`).
pub mod layout {
    use super::MAX_WINDOW;

    pub const LEN: usize = 0;
    pub fn generated(_vocab: usize) -> usize {
        4
    }
    pub fn window(vocab: usize) -> usize {
        4 + vocab
    }
    pub fn bias(vocab: usize) -> usize {
        4 + 2 * vocab
    }
    pub fn ring(vocab: usize) -> usize {
        4 + 3 * vocab
    }
    pub fn stride(vocab: usize) -> usize {
        ring(vocab) + MAX_WINDOW as usize
    }
}

crate::ops::uniform::uniform_struct! {
    /// WGSL twin: `struct Info` of `wgsl/include/logit_controls.wgsl` (`sample_penalty`,
    /// `token_counts`): controlled rows, vocabulary, words a slot, ring length a slot, and 0 for
    /// the rounding barriers (a value no compiler can fold).
    pub(crate) struct ControlInfo = "Info" { rows: u32, vocab: u32, stride: u32, hist: u32,
        zero: u32, _pad0: u32, _pad1: u32, _pad2: u32 }
}

impl ControlInfo {
    fn new(rows: usize, vocab: usize) -> Self {
        Self {
            rows: rows as u32,
            vocab: vocab as u32,
            stride: layout::stride(vocab) as u32,
            hist: MAX_WINDOW,
            ..Self::default()
        }
    }
}

/// What both kernels bind besides the logits or the ids: the state buffer, the `rows` records
/// ([`ControlRow`]s) of the controlled rows and the [`ControlInfo`] uniform.
pub struct ControlBindings<'a> {
    pub state: &'a Tensor,
    pub records: &'a Tensor,
    pub info: &'a wgpu::Buffer,
    pub rows: usize,
}

/// Records `sample_penalty`: the controls of the records applied in place to `logits` (f32
/// `[·, vocab]`), reading their slots of the state.
pub fn sample_penalty(gpu: &Gpu, logits: &Tensor, b: &ControlBindings, vocab: usize) -> Result<Kernel> {
    if logits.ty != ElemType::F32 || vocab == 0 || !logits.numel().is_multiple_of(vocab) {
        return Err(Error::InvalidArgument(format!(
            "sample_penalty: need f32 logits of rows of {vocab}, got {:?} {:?}",
            logits.ty, logits.shape
        )));
    }
    let bindings = [logits.binding(), b.state.binding(), b.records.binding(), b.info.as_entire_binding()];
    gpu.kernel("sample_penalty", "main", &gpu.macros(), &bindings, [vocab.div_ceil(256) as u32, b.rows as u32, 1])
}

/// Records `token_counts`: each record's sampled id (`ids[record.row]`) counted into its slot of
/// the state.
pub fn token_counts(gpu: &Gpu, ids: &Tensor, b: &ControlBindings) -> Result<Kernel> {
    if ids.ty != ElemType::U32 {
        return Err(Error::InvalidArgument(format!("token_counts: ids must be u32, got {:?}", ids.ty)));
    }
    let bindings = [ids.binding(), b.state.binding(), b.records.binding(), b.info.as_entire_binding()];
    gpu.kernel("token_counts", "main", &gpu.macros(), &bindings, [(b.rows as u32).div_ceil(64), 1, 1])
}

/// The kernels' CPU twins, on the same state words.
pub mod cpu {
    use super::{control_logit, layout, ControlRow, REPEAT_ALL};

    /// `sample_penalty`: every token of every record's row.
    pub fn sample_penalty(logits: &mut [f32], state: &[u32], rows: &[ControlRow], vocab: usize) {
        let stride = layout::stride(vocab);
        for r in rows {
            let s = &state[r.slot as usize * stride..][..stride];
            let row = &mut logits[r.row as usize * vocab..][..vocab];
            for (i, l) in row.iter_mut().enumerate() {
                let bias = f32::from_bits(s[layout::bias(vocab) + i]);
                let in_window = s[layout::window(vocab) + i] > 0;
                *l = control_logit(*l, bias, in_window, s[layout::generated(vocab) + i], r);
            }
        }
    }

    /// `token_counts`: `ids[r.row]` counted into each record's slot.
    pub fn token_counts(ids: &[u32], state: &mut [u32], rows: &[ControlRow], vocab: usize) {
        let stride = layout::stride(vocab);
        let hist = super::MAX_WINDOW as usize;
        for r in rows {
            let t = ids[r.row as usize] as usize;
            if t >= vocab {
                continue;
            }
            let s = &mut state[r.slot as usize * stride..][..stride];
            let len = s[layout::LEN] as usize;
            s[layout::generated(vocab) + t] += 1;
            let (win, ring) = (layout::window(vocab), layout::ring(vocab));
            if r.window == REPEAT_ALL {
                s[win + t] += 1;
            } else if r.window > 0 {
                let n = r.window as usize;
                if len >= n {
                    let old = s[ring + (len - n) % hist] as usize;
                    s[win + old] -= 1;
                }
                s[ring + len % hist] = t as u32;
                s[win + t] += 1;
            }
            s[layout::LEN] = len as u32 + 1;
        }
    }
}

/// One optional [`SeqControls`] a row of a draw.
pub type RowControls<'a> = &'a [Option<&'a SeqControls>];

/// Checks that there is one optional control a row.
pub fn check_rows(controls: &[Option<&SeqControls>], rows: usize) -> Result<()> {
    if controls.len() != rows {
        return Err(Error::InvalidArgument(format!("sampling: {} logit controls for {rows} rows", controls.len())));
    }
    Ok(())
}

/// The device sampler's side of the controls: the state buffer (one slot a sequence), the
/// controlled rows of the next draw, and the two kernels for the (logits, ids) buffers used.
#[derive(Default)]
pub struct DeviceControls {
    state: Option<Tensor>,
    vocab: usize,
    slots: usize,
    /// The controlled rows of the next encoded draw (empty: no dispatch).
    rows: Vec<ControlRow>,
    records: Option<Tensor>,
    info: Option<wgpu::Buffer>,
    /// Bumped when a buffer the kernels bind is remade.
    generation: u64,
    cache: Vec<(BindKey, [Kernel; 2])>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct BindKey {
    logits: usize,
    logits_offset: u64,
    logits_size: u64,
    ids: usize,
    ids_offset: u64,
    rows: usize,
    generation: u64,
}

/// Bind-group sets kept.
const CACHE: usize = 8;

impl DeviceControls {
    /// Writes a sequence's first state into its slot (growing the state buffer, slots kept; a
    /// new vocabulary drops every slot).
    pub fn start(&mut self, gpu: &Gpu, seq: &SeqControls) -> Result<()> {
        let slot = seq.slot() as usize;
        let stride = layout::stride(seq.vocab);
        if seq.vocab != self.vocab {
            self.state = None;
            self.slots = 0;
            self.vocab = seq.vocab;
        }
        if slot >= self.slots {
            let slots = (slot + 1).next_power_of_two();
            let bytes = (slots * stride * 4) as u64;
            if bytes > gpu.limits.max_storage_buffer_binding_size {
                return Err(Error::InvalidArgument(format!(
                    "logit controls: {slots} sequences of a {}-token vocabulary need {} MiB, over the device's max \
                     storage binding (decode fewer sequences with penalties or a bias at once)",
                    seq.vocab,
                    bytes >> 20
                )));
            }
            let grown = gpu.empty("logit control state", &[slots * stride], ElemType::U32)?;
            if let Some(old) = &self.state {
                let mut enc = gpu.device.create_command_encoder(&Default::default());
                enc.copy_buffer_to_buffer(&old.buffer, 0, &grown.buffer, 0, old.size_bytes());
                gpu.queue.submit([enc.finish()]);
            }
            self.state = Some(grown);
            self.slots = slots;
            self.invalidate();
        }
        let state = self.state.as_ref().expect("made above");
        gpu.queue.write_buffer(&state.buffer, (slot * stride * 4) as u64, bytemuck::cast_slice(&seq.state_words()));
        Ok(())
    }

    /// The controlled rows of the next draws (row `r` of the draw: `controls[r]`); every row's
    /// sequence must have been [`start`](Self::start)ed.
    pub fn set_rows(&mut self, gpu: &Gpu, controls: &[Option<&SeqControls>]) -> Result<()> {
        self.rows.clear();
        for (r, c) in controls.iter().enumerate() {
            let Some(c) = c else { continue };
            if c.vocab != self.vocab || c.slot() as usize >= self.slots {
                return Err(Error::InvalidArgument(format!(
                    "logit controls of row {r}: its sequence (slot {}) was never started on this sampler",
                    c.slot()
                )));
            }
            self.rows.push(ControlRow { row: r as u32, ..c.row });
        }
        if self.rows.is_empty() {
            return Ok(());
        }
        if self.records.as_ref().is_none_or(|t| t.numel() < self.rows.len() * 8) {
            let cap = self.rows.len().next_power_of_two();
            self.records = Some(gpu.empty("logit control rows", &[cap * 8], ElemType::U32)?);
            self.invalidate();
        }
        let records = self.records.as_ref().expect("made above");
        gpu.queue.write_buffer(&records.buffer, 0, bytemuck::cast_slice(&self.rows));
        let info = ControlInfo::new(self.rows.len(), self.vocab);
        match &self.info {
            Some(b) => gpu.queue.write_buffer(b, 0, bytemuck::bytes_of(&info)),
            None => self.info = Some(gpu.uniform("logit control info", &info)),
        }
        Ok(())
    }

    /// No controlled row in the next draws.
    pub fn clear(&mut self) {
        self.rows.clear();
    }

    /// Whether the next draw has controlled rows.
    pub fn active(&self) -> bool {
        !self.rows.is_empty()
    }

    fn invalidate(&mut self) {
        self.generation += 1;
        self.cache.clear();
    }

    /// The two kernels for a draw of `logits` into `ids` (`None` when no row has controls).
    pub fn prepare(&mut self, gpu: &Gpu, logits: &Tensor, ids: &Tensor) -> Result<Option<usize>> {
        if self.rows.is_empty() {
            return Ok(None);
        }
        if !logits.numel().is_multiple_of(self.vocab)
            || self.rows.iter().any(|r| (r.row as usize + 1) * self.vocab > logits.numel())
        {
            return Err(Error::InvalidArgument(format!(
                "logit controls for a vocabulary of {} applied to {} logits",
                self.vocab,
                logits.numel()
            )));
        }
        let key = BindKey {
            logits: std::sync::Arc::as_ptr(&logits.buffer) as usize,
            logits_offset: logits.offset,
            logits_size: logits.size_bytes(),
            ids: std::sync::Arc::as_ptr(&ids.buffer) as usize,
            ids_offset: ids.offset,
            rows: self.rows.len(),
            generation: self.generation,
        };
        if let Some(i) = self.cache.iter().position(|(k, _)| *k == key) {
            return Ok(Some(i));
        }
        let (state, records, info) = match (&self.state, &self.records, &self.info) {
            (Some(s), Some(r), Some(i)) => (s, r, i),
            _ => return Err(Error::Gpu("logit controls: state not set up".into())),
        };
        let b = ControlBindings { state, records, info, rows: self.rows.len() };
        let apply = sample_penalty(gpu, logits, &b, self.vocab)?;
        let count = token_counts(gpu, ids, &b)?;
        if self.cache.len() >= CACHE {
            self.cache.remove(0);
        }
        self.cache.push((key, [apply, count]));
        Ok(Some(self.cache.len() - 1))
    }

    /// Records `sample_penalty` (before the sampler's dispatches).
    pub fn record_apply(&self, prepared: Option<usize>, pass: &mut wgpu::ComputePass<'_>) {
        if let Some(i) = prepared {
            self.cache[i].1[0].encode(pass);
        }
    }

    /// Records `token_counts` (after the sampler's dispatches).
    pub fn record_count(&self, prepared: Option<usize>, pass: &mut wgpu::ComputePass<'_>) {
        if let Some(i) = prepared {
            self.cache[i].1[1].encode(pass);
        }
    }

    /// Dispatches a draw adds (0 or 2).
    pub fn dispatches(&self) -> usize {
        if self.rows.is_empty() {
            0
        } else {
            2
        }
    }
}

#[cfg(test)]
mod tests;
