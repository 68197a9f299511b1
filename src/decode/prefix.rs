//! The batch engine's prefix cache: KV entries of earlier requests kept on the GPU, keyed by
//! their tokens, so that a request whose prompt starts with tokens the engine has seen (an
//! earlier turn of the same chat: its prompt and its answer; a system prompt other requests
//! share) prefills only the rest.
//!
//! # Design
//! The model's KV caches are contiguous per sequence slot (f16 `[S, Hkv, max_ctx, D]` per layer,
//! [`Model::kv_caches`]), which the attention kernels read directly. The cache keeps its entries
//! beside them, each a GPU buffer of its own holding positions `0..n` of one sequence (per layer,
//! keys then values, per KV head the `n` rows: `n` × [`PrefixCache::bytes_per_token`] bytes):
//! - when a request is admitted, the entry sharing the longest prefix with its prompt (at least
//!   [`MIN_REUSE`] tokens, short of the prompt's last token, whose logits give the first answer
//!   token) is copied into the request's slot (`copy_buffer_to_buffer` per layer, K and V, and KV
//!   head) and only the rest of the prompt is prefilled there
//!   ([`Model::prefill_slot_at`]);
//! - after its prefill, the prompt's KV is copied out as an entry (so requests running at the
//!   same time share a system prompt), and when the request ends, its prompt and the tokens it
//!   generated but the last (the last one was sampled, never fed) replace it;
//! - an entry whose tokens begin another's is dropped (the longer one serves both); the entries
//!   take at most the byte limit ([`BatchOptions::prefix_cache_bytes`](super::batch::BatchOptions)),
//!   the least recently used going first.
//!
//! Entries sharing a prefix each hold their own copy of it: a paged KV cache, where sequences
//! point at shared fixed-size blocks and attention reads through a block table, would hold it
//! once and need no copies; that changes the attention kernels, and is left for later. The index
//! is a list searched end to end (the common prefix with every entry): its cost is the tokens it
//! holds, far below a prefill's.
//!
//! # Exactness
//! A request that reuses `m` positions gets the tokens of a cold run of its prompt up to the last
//! bits of arithmetic: the reused KV entries were computed by the passes that ran them (the
//! earlier request's prefill, of other lengths, and its one-token decode steps), where a cold
//! run computes them in one prefill, and the kernels' sums do not give bit-identical rows for
//! every pass length (on lavapipe, the tiny Gemma 4's logits after 30 tokens restored and 12
//! prefilled differ from the 42 prefilled whole by up to 4e-4; tests/prefix_cache.rs prints it). Greedy and seeded tokens agree
//! with a cold run's on the test fixtures; a near tie between two tokens may still flip. With the
//! cache off (a limit of 0, the library's default) a request's tokens depend only on its prompt,
//! parameters and seed, bit for bit.
//!
//! # Recurrent layers
//! A model with recurrent layers (Qwen3.5's Gated DeltaNet) keeps a state per sequence, not an
//! entry per position: KV copied into a slot is not enough. While the batch engine runs such a
//! model one request at a time on its own sequence, [`PrefixCache::resume`] reuses what that
//! sequence holds where the new prompt extends all of it (the last request's prompt and answer:
//! a chat's next turn), as [`crate::session`] does, and re-prefills from position 0 otherwise.
//! Where such a model decodes several sequences in slots, nothing is reused. A snapshot of the
//! recurrent state at the end of each prompt and generation, restored at exactly that position,
//! would let any request extending a cached sequence reuse it: not done yet.

use crate::model::Model;

/// Reuse shorter than this is not worth a copy: the prompt is prefilled whole.
pub const MIN_REUSE: usize = 16;

/// The most bytes [`default_bytes`] gives the cache.
pub const MAX_DEFAULT_BYTES: u64 = 4 << 30;

/// A sensible limit for a batch engine of `max_batch` sequences on `model`: as much KV as the
/// sequences themselves hold (`max_batch` × `max_ctx` positions), at most [`MAX_DEFAULT_BYTES`].
pub fn default_bytes(model: &Model, max_batch: usize) -> u64 {
    let per_token: u64 = runs(model, 0).iter().map(|r| r.row).sum();
    (per_token * (max_batch * model.max_ctx) as u64).min(MAX_DEFAULT_BYTES)
}

/// What the cache did so far and holds now (`/metrics`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixStats {
    /// Admissions that reused a cached prefix.
    pub hits: u64,
    /// Admissions that reused nothing (the cache on).
    pub misses: u64,
    /// Prompt positions reused, over all admissions.
    pub cached_tokens: u64,
    /// Entries held now.
    pub entries: usize,
    /// Bytes of GPU memory the entries hold now.
    pub bytes: u64,
    /// The byte limit (0: the cache is off).
    pub limit: u64,
}

/// One entry of a [`PrefixIndex`].
#[derive(Debug)]
struct Entry<T> {
    tokens: Vec<u32>,
    bytes: u64,
    /// The index's clock when it was last found or added.
    used: u64,
    value: T,
}

/// Token sequences with a value each (the GPU buffer of their KV entries), bounded by a byte
/// limit with least-recently-used eviction. No entry's tokens begin another's.
#[derive(Debug)]
pub struct PrefixIndex<T> {
    entries: Vec<Entry<T>>,
    limit: u64,
    bytes: u64,
    clock: u64,
}

/// Length of the common prefix of `a` and `b`.
fn common(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl<T> PrefixIndex<T> {
    /// An empty index that holds at most `limit` bytes.
    pub fn new(limit: u64) -> Self {
        Self { entries: Vec::new(), limit, bytes: 0, clock: 0 }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes the entries hold.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The entry sharing the longest prefix with `tokens` (the most recently used among equals)
    /// and that prefix's length; `None` when no entry shares a token. The entry counts as used.
    pub fn longest(&mut self, tokens: &[u32]) -> Option<(&T, usize)> {
        let (i, n) = self
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| (i, common(&e.tokens, tokens)))
            .filter(|&(_, n)| n > 0)
            .max_by_key(|&(i, n)| (n, self.entries[i].used))?;
        self.clock += 1;
        self.entries[i].used = self.clock;
        Some((&self.entries[i].value, n))
    }

    /// Whether [`insert`](Self::insert) would keep an entry of `tokens` taking `bytes`: it fits
    /// the limit, and no entry holds `tokens` already (as all or the start of its own).
    pub fn wants(&self, tokens: &[u32], bytes: u64) -> bool {
        !tokens.is_empty() && bytes <= self.limit && !self.entries.iter().any(|e| e.tokens.starts_with(tokens))
    }

    /// Adds `tokens` with `value` (taking `bytes`) if [`wants`](Self::wants) says so, dropping
    /// the entries whose tokens begin `tokens` and then the least recently used ones until it
    /// fits; returns whether it was added.
    pub fn insert(&mut self, tokens: Vec<u32>, bytes: u64, value: T) -> bool {
        if !self.wants(&tokens, bytes) {
            return false;
        }
        self.entries.retain(|e| !tokens.starts_with(&e.tokens));
        self.bytes = self.entries.iter().map(|e| e.bytes).sum();
        while self.bytes + bytes > self.limit {
            let oldest = (0..self.entries.len()).min_by_key(|&i| self.entries[i].used).expect("over the limit");
            self.bytes -= self.entries.swap_remove(oldest).bytes;
        }
        self.clock += 1;
        self.bytes += bytes;
        self.entries.push(Entry { tokens, bytes, used: self.clock, value });
        true
    }

    /// Drops every entry.
    pub fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }
}

/// One run of positions in a KV cache: `row` bytes per position, from byte `offset` of `buffer`.
struct Run<'a> {
    buffer: &'a wgpu::Buffer,
    offset: u64,
    row: u64,
}

/// Where positions `0..` of `slot` lie in the model's KV caches: per layer owning a cache, keys
/// then values, per KV head (an entry holds the same runs in this order, `n` rows each).
fn runs(model: &Model, slot: usize) -> Vec<Run<'_>> {
    let mut out = Vec::new();
    for (k, v) in model.kv_caches() {
        for t in [k, v] {
            let (heads, ctx, d) = (t.shape[1], t.shape[2], t.shape[3]);
            let row = t.ty.bytes(d);
            for h in 0..heads {
                out.push(Run { buffer: &t.buffer, offset: t.offset + ((slot * heads + h) * ctx) as u64 * row, row });
            }
        }
    }
    out
}

/// Which way [`copy`] moves KV entries.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Way {
    /// From the slot into the entry.
    Out,
    /// From the entry into the slot.
    In,
}

/// Copies positions `0..m` between `slot` and `entry`, an entry of `n` positions, and submits.
fn copy(model: &Model, slot: usize, entry: &wgpu::Buffer, n: usize, m: usize, way: Way) {
    let gpu = &model.gpu;
    let mut enc = gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("prefix cache") });
    let mut at = 0;
    for r in runs(model, slot) {
        let bytes = m as u64 * r.row;
        match way {
            Way::Out => enc.copy_buffer_to_buffer(r.buffer, r.offset, entry, at, bytes),
            Way::In => enc.copy_buffer_to_buffer(entry, at, r.buffer, r.offset, bytes),
        }
        at += n as u64 * r.row;
    }
    gpu.queue.submit([enc.finish()]);
}

/// The batch engine's prefix cache (see the [module docs](self)).
pub struct PrefixCache {
    index: PrefixIndex<(wgpu::Buffer, usize)>,
    /// KV bytes of one position over every layer.
    per_token: u64,
    /// The largest buffer the device makes.
    max_buffer: u64,
    /// The tokens whose KV entries the model's own sequence holds at positions `0..pos` (an
    /// engine running one request at a time), as the last request left them.
    own: Vec<u32>,
    stats: PrefixStats,
}

impl PrefixCache {
    /// A cache of at most `limit` bytes for `model` (0: off).
    pub fn new(model: &Model, limit: u64) -> Self {
        Self {
            index: PrefixIndex::new(limit),
            per_token: runs(model, 0).iter().map(|r| r.row).sum(),
            max_buffer: model.gpu.limits.max_buffer_size,
            own: Vec::new(),
            stats: PrefixStats { limit, ..Default::default() },
        }
    }

    pub fn enabled(&self) -> bool {
        self.stats.limit > 0
    }

    /// KV bytes of one position (every layer's keys and values).
    pub fn bytes_per_token(&self) -> u64 {
        self.per_token
    }

    pub fn stats(&self) -> PrefixStats {
        PrefixStats { entries: self.index.len(), bytes: self.index.bytes(), ..self.stats }
    }

    /// Counts an admission that reused `m` positions.
    fn count(&mut self, m: usize) {
        if self.enabled() {
            if m > 0 {
                self.stats.hits += 1;
                self.stats.cached_tokens += m as u64;
            } else {
                self.stats.misses += 1;
            }
        }
    }

    /// Positions of `prompt` worth reusing from a common prefix of `common` tokens: all but the
    /// prompt's last, at least [`MIN_REUSE`]; else 0.
    fn reusable(common: usize, prompt: &[u32]) -> usize {
        let m = common.min(prompt.len().saturating_sub(1));
        if m >= MIN_REUSE {
            m
        } else {
            0
        }
    }

    /// Copies the KV entries of the longest cached prefix of `prompt` into `slot` (ordered before
    /// the next submission) and returns its length: the prompt's prefill starts there (0: the
    /// whole prompt). A model with recurrent layers reuses nothing this way.
    pub fn restore(&mut self, model: &Model, slot: usize, prompt: &[u32]) -> usize {
        if !self.enabled() || model.is_recurrent() {
            return 0;
        }
        let found = self.index.longest(prompt).map(|(e, n)| (e, Self::reusable(n, prompt)));
        let m = match found {
            Some(((buffer, n), m)) if m > 0 => {
                copy(model, slot, buffer, *n, m, Way::In);
                m
            }
            _ => 0,
        };
        self.count(m);
        m
    }

    /// Keeps the KV entries of `tokens`, which `slot` holds at positions `0..len`, as an entry
    /// (copied out, ordered after the work submitted so far). Nothing is kept where the cache is
    /// off, holds them already, they are fewer than [`MIN_REUSE`] or more than it or the device
    /// can hold, or the model has recurrent layers.
    pub fn store(&mut self, model: &Model, slot: usize, tokens: &[u32]) {
        let bytes = tokens.len() as u64 * self.per_token;
        let fits = bytes <= self.max_buffer && bytes > 0;
        if !self.enabled()
            || model.is_recurrent()
            || tokens.len() < MIN_REUSE
            || !fits
            || !self.index.wants(tokens, bytes)
        {
            return;
        }
        let gpu = &model.gpu;
        let made = gpu.scoped("keeping a prefix's KV entries", || {
            gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("prefix cache entry"),
                size: bytes,
                usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        });
        // No memory for it: the cache keeps what it has (it is an optimization, never an error).
        let Ok(buffer) = made else { return };
        copy(model, slot, &buffer, tokens.len(), tokens.len(), Way::Out);
        self.index.insert(tokens.to_vec(), bytes, (buffer, tokens.len()));
    }

    /// For an engine running one request at a time on the model's own sequence: keeps what the
    /// sequence holds that `prompt` begins with (rolling the model back to it) or resets the
    /// model, and returns the positions kept: the prompt's prefill starts there. A model with
    /// recurrent layers keeps all it holds or nothing ([`Model::rollback`] reaches only the
    /// ends of its last passes).
    pub fn resume(&mut self, model: &mut Model, prompt: &[u32]) -> usize {
        let held = std::mem::take(&mut self.own);
        let mut m =
            if self.enabled() && held.len() == model.pos { Self::reusable(common(&held, prompt), prompt) } else { 0 };
        if model.is_recurrent() && m != model.pos {
            m = 0;
        }
        if m == 0 {
            model.reset();
        } else {
            model.rollback(m);
        }
        self.count(m);
        m
    }

    /// For an engine running one request at a time: records what the model's own sequence holds
    /// after a request, `tokens` (its prompt and generated tokens) up to the model's position.
    pub fn hold(&mut self, model: &Model, mut tokens: Vec<u32>) {
        if tokens.len() >= model.pos {
            tokens.truncate(model.pos);
            self.own = tokens;
        } else {
            self.own.clear();
        }
    }

    /// Forgets what the model's own sequence holds (the model was changed otherwise): the next
    /// request on it prefills from position 0.
    pub fn forget_sequence(&mut self) {
        self.own.clear();
    }

    /// Drops every entry (and what the model's own sequence holds).
    pub fn clear(&mut self) {
        self.index.clear();
        self.own.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(s: &str) -> Vec<u32> {
        s.split_whitespace().map(|w| w.parse().unwrap()).collect()
    }

    #[test]
    fn longest_common_prefix_wins() {
        let mut ix = PrefixIndex::new(1000);
        assert!(ix.insert(toks("1 2 3 4 5"), 10, 'a'));
        assert!(ix.insert(toks("1 2 9 9"), 10, 'b'));
        assert!(ix.insert(toks("7 8"), 10, 'c'));
        assert_eq!(ix.longest(&toks("1 2 3 4 6 6")), Some((&'a', 4)));
        assert_eq!(ix.longest(&toks("1 2 9 9 9")), Some((&'b', 4)));
        // A tie: the most recently used of the two.
        assert_eq!(ix.longest(&toks("1 2 5")).map(|(v, n)| (*v, n)), Some(('b', 2)));
        ix.longest(&toks("1 2 3"));
        assert_eq!(ix.longest(&toks("1 2 5")).map(|(v, n)| (*v, n)), Some(('a', 2)));
        assert_eq!(ix.longest(&toks("5 1 2")), None);
        assert_eq!(ix.longest(&[]), None);
    }

    #[test]
    fn a_prefix_is_never_matched_past_a_difference() {
        let mut ix = PrefixIndex::new(1000);
        ix.insert((0..40).collect(), 40, ());
        let mut other: Vec<u32> = (0..40).collect();
        other[17] = 999;
        assert_eq!(ix.longest(&other).map(|(_, n)| n), Some(17));
    }

    #[test]
    fn covered_entries_are_not_added_and_covering_ones_replace() {
        let mut ix = PrefixIndex::new(1000);
        assert!(ix.insert(toks("1 2 3"), 3, 0));
        // Its extension (a chat's next turn) replaces it.
        assert!(ix.insert(toks("1 2 3 4 5"), 5, 1));
        assert_eq!((ix.len(), ix.bytes()), (1, 5));
        // What an entry holds already is not added again.
        assert!(!ix.wants(&toks("1 2 3"), 3));
        assert!(!ix.insert(toks("1 2 3 4 5"), 5, 2));
        assert!(!ix.insert(vec![], 0, 3));
        // A branch is an entry of its own.
        assert!(ix.insert(toks("1 2 3 7"), 4, 4));
        assert_eq!((ix.len(), ix.bytes()), (2, 9));
    }

    #[test]
    fn least_recently_used_goes_first_by_bytes() {
        let mut ix = PrefixIndex::new(100);
        ix.insert(toks("1"), 40, 'a');
        ix.insert(toks("2"), 40, 'b');
        // 'a' used: 'b' is the least recently used.
        assert!(ix.longest(&toks("1 5")).is_some());
        assert!(ix.insert(toks("3"), 30, 'c'));
        assert_eq!(ix.longest(&toks("2")), None, "b was evicted");
        assert_eq!((ix.len(), ix.bytes()), (2, 70));
        // One entry taking everything evicts both.
        assert!(ix.insert(toks("4"), 100, 'd'));
        assert_eq!((ix.len(), ix.bytes()), (1, 100));
        // More than the limit: not kept, nothing evicted.
        assert!(!ix.insert(toks("5"), 101, 'e'));
        assert_eq!((ix.len(), ix.bytes()), (1, 100));
        ix.clear();
        assert!(ix.is_empty() && ix.bytes() == 0);
    }

    #[test]
    fn a_limit_of_zero_keeps_nothing() {
        let mut ix = PrefixIndex::new(0);
        assert!(!ix.insert(toks("1 2"), 1, ()));
        assert!(ix.is_empty());
    }

    #[test]
    fn reuse_keeps_the_last_prompt_token_and_a_minimum() {
        let p: Vec<u32> = (0..40).collect();
        assert_eq!(PrefixCache::reusable(40, &p), 39);
        assert_eq!(PrefixCache::reusable(100, &p), 39);
        assert_eq!(PrefixCache::reusable(MIN_REUSE, &p), MIN_REUSE);
        assert_eq!(PrefixCache::reusable(MIN_REUSE - 1, &p), 0);
        assert_eq!(PrefixCache::reusable(5, &p[..6]), 0);
    }
}
