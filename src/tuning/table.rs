//! The rule table: which kernel shape a family of devices takes for an op and a shape, each row
//! with the measurement that chose it.
//!
//! Rows of one op apply in table order, each whose family and predicate match doing its action
//! (later rows refine earlier ones, as the measurements were made: each on top of the rules before
//! it). An op with a single value (a threshold) takes the first row of the device's own family,
//! else the first row for any family. Every row measured so far was measured on an NVIDIA H100
//! (BENCHMARKS.md); the families never measured (AMD, Intel, Apple, software, other NVIDIA) take
//! those rows as they are, which `measured` says for each row, except where a family has a row of
//! its own (Apple's, from its hazards).

use super::profile::Family;
use super::query::{MatvecQuery, MatvecState};
use crate::dtype::DType;

/// Which devices a row is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fam {
    /// Every family without a row of its own for this op.
    Any,
    Only(Family),
}

impl Fam {
    pub fn matches(self, f: Family) -> bool {
        match self {
            Fam::Any => true,
            Fam::Only(g) => g == f,
        }
    }
}

/// What a row chooses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// The quantized matvec's workgroup shape, integer dot products and early loads
    /// (`matvec_quant`, one token or passes of 4).
    Matvec,
    /// ... refined for how x is read (plain, through the fused norm).
    MatvecInput,
    /// ... for x staged apart (`quantize_x16`, then the matvec's XG variant).
    MatvecStaged,
    /// Whether packed integer dot products (`DP4`) are used at all.
    IntDot,
    /// Which one-token projections read x staged apart (`StageApart`).
    StageApart,
    /// Longest rows (elements) a two-type projection runs as one mixed dispatch.
    MixMaxK,
    /// Workgroup size of a mixed dispatch whose first weight takes the float path.
    MixFloatWg,
    /// Largest attention key tile (keys).
    AttnKeyTile,
    /// Fewest KV heads the one-dispatch decode attention runs for.
    AttnDecodeMinKv,
    /// Head width that takes the one-dispatch decode attention whatever its KV heads.
    AttnDecodeHeadDim,
    /// The decode attention's chunk (elements of K) tried first.
    AttnDecodeChunk,
    /// Rows (elements) above which `rms_norm` takes 512 threads.
    NormWideRows,
    /// Whether a batch decode step (the batched form) groups its quantized expert slots by
    /// expert (`moe_group`: 1) or runs them per slot (the one-token matvec: 0), at every batch
    /// size (a row's numbers must not depend on the batch).
    MoeBatchGroup,
    /// Kernels compiled without wgpu's injected bounds checks.
    Unchecked,
}

/// A lane count for a row group: as is, or within the shape's bounds (no wider than the row's
/// units, no narrower than a pass needs: `.min(widest).max(min_tpr)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lanes {
    Fixed(u32),
    Clamped(u32),
}

/// What a matching row does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Act {
    /// Row groups as wide as keeps about this many lanes busy.
    LanesFor(u32),
    /// The wide rows' shape: 32-lane row groups in full workgroups (and the flag for later rows).
    WideRows,
    /// Row groups at most this wide.
    CapLanes(u32),
    /// Halve the workgroup while fewer than 512 workgroups would run.
    ShrinkWorkgroup,
    /// Integer dot products on.
    Dp4,
    /// Q6_K / Q4_1 rows that stage whole: DP4 in 128 threads of 32 lanes (and the flag).
    Q6Whole,
    /// A vocabulary's rows: 128 threads of 32 lanes (and the flag).
    Vocab,
    /// This workgroup shape.
    Shape { wg: u32, tpr: Lanes },
    /// This workgroup shape with integer dot products, no early loads (and no later rows).
    InputShape { wg: u32, tpr: Lanes },
    /// Each unit's loads issued an iteration early.
    Prefetch,
    /// Row groups of about 2 units a lane, 32 to 128 lanes, workgroups of at least 64 threads.
    StagedLanes,
    /// A threshold or size.
    Value(usize),
    /// Packed integer dot products on (true) or off.
    IntDot(bool),
    /// The rows staged apart: `k` (a dispatch of its own), `free_k` / `free_n` (by the norm).
    StageApart { k: usize, free_k: usize, free_n: usize },
    /// These kernels without bounds checks.
    Unchecked(&'static [&'static str]),
}

/// A row's shape predicate (None: every shape).
pub type When = Option<fn(&MatvecQuery, &MatvecState) -> bool>;

/// One row of the table.
#[derive(Clone, Copy, Debug)]
pub struct Rule {
    pub family: Fam,
    pub op: Op,
    /// The predicate in words (`when`'s meaning; "" where there is none).
    pub shape: &'static str,
    pub when: When,
    pub act: Act,
    /// Where it was measured ("H100"), or "nowhere" with the reason for the row.
    pub measured: &'static str,
    /// The measurement: "BENCHMARKS run N" / "BENCHMARKS session N", or the bench that chose it.
    pub cite: &'static str,
}

const H100: &str = "H100 (other families: measured nowhere else, H100 defaults)";

/// The whole-row Q6_K / Q4_1 rows ([`Act::Q6Whole`]) but a vocabulary's.
fn q6_whole_rows(s: &MatvecState) -> bool {
    s.q6_whole && !s.vocab
}

/// The table. Order matters within an op (see the module docs).
pub static RULES: &[Rule] = &[
    // ---- Packed integer dot products ----
    Rule {
        family: Fam::Only(Family::Apple),
        op: Op::IntDot,
        shape: "",
        when: None,
        act: Act::IntDot(false),
        measured: "nowhere: Metal has no instruction for WGSL's dot4I8Packed (naga writes a bit-field polyfill, slower than the float path)",
        cite: "none (profile fact, see TUNING.md)",
    },
    Rule {
        family: Fam::Any,
        op: Op::IntDot,
        shape: "where the backend compiles them to instructions (Vulkan)",
        when: None,
        act: Act::IntDot(true),
        measured: H100,
        cite: "BENCHMARKS run 22",
    },
    // ---- The quantized matvec (QMatvecConfig::new) ----
    // About 256k lanes (a full H100's worth of resident threads), each on units of 4 rows; never
    // wider than a row's units (rounded up to a power of two), nor than the workgroup. Measured on
    // the H100 (`bench_quant`, every type): K = 1536 (48 units) wants 64 lanes per row group at
    // N = 2048 and 17920 (5-10% over 32), 32 at N = 151936 (10-40% over 64); K = 8960 (280 units) at
    // N = 1536 wants 256. Software-pipelined loads (the next unit's issued before this one's math)
    // were 5-40% slower everywhere (registers), but for the wide DP4 rows below (`Prefetch`).
    Rule {
        family: Fam::Any,
        op: Op::Matvec,
        shape: "every shape: row groups for ~256k lanes, within the row's units",
        when: None,
        act: Act::LanesFor(262144),
        measured: H100,
        cite: "bench_quant on the H100, every type (isolated kernels; no BENCHMARKS run)",
    },
    // Gemma-4-31B's shapes on the H100 (`bench_quant` with QSHAPES): rows of 4096 to 8192 elements
    // over 4096 rows or more run best as 32-lane row groups with the integer dot products (N = 5376,
    // K = 8192: Q4_K 17.5 us against 20.7 at 256 lanes, Q6_K 23.4 against 30.0; N = 16384, K = 5376:
    // 29.9 / 43.6 against 34.7 / 56.5 at 64 lanes) (measured with 256-thread workgroups: 32 rows
    // each, which the staging pays off on).
    Rule {
        family: Fam::Any,
        op: Op::Matvec,
        shape: "one token, DP4, rows of 4096-8192 over 4096 or more (Gemma-4-31B)",
        when: Some(|q, _| q.tok == 1 && q.dp4_ok() && (4096..=8192).contains(&q.k) && q.n >= 4096),
        act: Act::WideRows,
        measured: H100,
        cite: "bench_quant with QSHAPES, Gemma-4-31B's shapes (isolated kernels; no BENCHMARKS run)",
    },
    // Q6_K rows of 16384 or more want 64 lanes (N = 5376, K = 21504: 71.5 us against 88.4 at 256).
    Rule {
        family: Fam::Any,
        op: Op::Matvec,
        shape: "one token, Q6_K rows of 16384 or more",
        when: Some(|q, s| !s.wide_rows && q.tok == 1 && q.dtype == DType::Q6_K && q.k >= 16384),
        act: Act::CapLanes(64),
        measured: H100,
        cite: "bench_quant with QSHAPES (N = 5376, K = 21504: 71.5 us against 88.4; isolated kernels, no BENCHMARKS run)",
    },
    // Few rows (a v or o projection): smaller workgroups, so that more of them spread over the GPU
    // (N = 256, 32 lanes a row group: 8 workgroups of 256 threads, or 64 of 32), down to one row
    // group, or 32 threads, a workgroup.
    Rule {
        family: Fam::Any,
        op: Op::Matvec,
        shape: "few rows (not the wide rows)",
        when: Some(|_, s| !s.wide_rows),
        act: Act::ShrinkWorkgroup,
        measured: H100,
        cite: "bench_quant (v and o projections; no BENCHMARKS run)",
    },
    // Integer dot products where the backend compiles them to instructions (the IntDot rows). The
    // staging (K elements a workgroup) pays off from 16 rows a workgroup on (measured on the H100:
    // 1.2-1.8x at 32 rows, 1.15-1.3x at 16, slower at 4). Passes of 4 tokens (a short prompt; batch
    // steps run matvec_quant_batch) stage 4 rows of x a pass: worth it for Q6_K only (H100,
    // `bench_quant_batch`, N = 17920, K = 1536 at 32 tokens: Q6_K 279 us against 457 float, Q4_K 380
    // against 324). One token a pass: only rows that stage whole (chunked one-token DP4 ran at half
    // the float kernel's speed on Gemma 4's K = 21504 rows: `bench_quant`, W cold).
    Rule {
        family: Fam::Any,
        op: Op::Matvec,
        shape: "16+ rows a workgroup, the row staged whole (one token) or Q6_K in chunks (4 tokens)",
        when: Some(|q, s| {
            let staged = if q.tok == 1 {
                (q.whole)(s.wg)
            } else {
                q.dtype == DType::Q6_K && (q.fits)(s.wg, q.tok)
            };
            4 * s.wg / s.tpr >= 16 && staged && q.int_dot
        }),
        act: Act::Dp4,
        measured: H100,
        cite: "bench_quant, bench_quant_batch (1.2-1.8x at 32 rows; Q6_K 279 us against 457 at 32 tokens)",
    },
    // One-token Q6_K and Q4_1 rows that stage whole: DP4 in 128-thread workgroups of 32-lane row
    // groups whatever N (the float Q6_K path costs 2-3x its isolated time inside a step; H100, a
    // Qwen2.5-1.5B Q4_K_M step: v (N = 256) 20.7 -> 14.7 us, down (K = 8960) 28.1 -> 23.1, the step
    // 2177 -> 1969 us; SmolLM2-135M Q4_1: the step 1100 -> 945 us). Not Q4_K (the 1.5B step 1960 ->
    // 2013 us, the 0.5B 1373 -> 1418: BENCHMARKS run 22). Rows that would stage in chunks stay float.
    Rule {
        family: Fam::Any,
        op: Op::Matvec,
        shape: "one token, Q6_K or Q4_1 rows that stage whole in 128 threads, 32-lane row groups",
        when: Some(|q, _| {
            q.tok == 1
                && q.narrow()
                && matches!(q.dtype, DType::Q6_K | DType::Q4_1)
                && q.int_dot
                && (q.whole)(128)
        }),
        act: Act::Q6Whole,
        measured: H100,
        cite: "BENCHMARKS run 22",
    },
    // A vocabulary's rows (lm_head) with DP4 likewise (Gemma-4-31B's Q6_K lm_head, N = 262144,
    // K = 5376: 593 us with 256 threads against 519 in the step; Qwen2.5's, N = 151936, K = 1536:
    // 159 -> 100 us).
    Rule {
        family: Fam::Any,
        op: Op::Matvec,
        shape: "one token, DP4, a vocabulary's rows (131072 or more)",
        when: Some(|q, s| s.dp4 && q.tok == 1 && q.narrow() && q.n >= 131072 && (q.whole)(128)),
        act: Act::Vocab,
        measured: H100,
        cite: "BENCHMARKS run 31 (the lm_head, call 6) and run 22",
    },
    // Of those, rows of 48 units or more, longer than they are many (the down projections; not a v
    // projection's 24-unit rows) take 256 threads, with 128-lane row groups where that keeps to 128
    // workgroups, else 64-lane (H100, inside the step, `WGPU_LLM_QMV`: Qwen2.5-1.5B's Q6_K down,
    // N = 1536, K = 8960, 64 lanes: the step 1946 -> 1905 us, 128 lanes 1936; the 0.5B's, N = 896,
    // K = 4864, 128 lanes: 1369 -> 1329, 64 lanes 1347; SmolLM2's Q4_1 down, N = 576, K = 1536, 64
    // lanes: 945 -> 928).
    Rule {
        family: Fam::Any,
        op: Op::Matvec,
        shape: "those Q6_K/Q4_1 rows: down projections (K > N, 48+ units), N/8 <= 128",
        when: Some(|q, s| q6_whole_rows(s) && q.k > q.n && q.units >= 48 && q.n.div_ceil(8) <= 128 && (q.whole)(256)),
        act: Act::Shape { wg: 256, tpr: Lanes::Clamped(128) },
        measured: H100,
        cite: "WGPU_LLM_QMV inside the step (Qwen2.5-0.5B's down 1369 -> 1329 us; BENCHMARKS run 31)",
    },
    Rule {
        family: Fam::Any,
        op: Op::Matvec,
        shape: "those Q6_K/Q4_1 rows: down projections (K > N, 48+ units), N/8 > 128",
        when: Some(|q, s| q6_whole_rows(s) && q.k > q.n && q.units >= 48 && q.n.div_ceil(8) > 128 && (q.whole)(256)),
        act: Act::Shape { wg: 256, tpr: Lanes::Clamped(64) },
        measured: H100,
        cite: "WGPU_LLM_QMV inside the step (Qwen2.5-1.5B's down 1946 -> 1905 us; BENCHMARKS run 31)",
    },
    // Q6_K rows of 128 units (8192 elements) or more that stage whole in 512 threads: 128-lane row
    // groups, 16 rows a workgroup (the 1.5B's down, K = 8960: the step 1683 -> 1671 us against 256
    // threads of 64 lanes, BENCHMARKS run 67).
    Rule {
        family: Fam::Any,
        op: Op::Matvec,
        shape: "those Q6_K rows of 128+ units (K > N) that stage whole in 512 threads",
        when: Some(|q, s| q6_whole_rows(s) && q.dtype == DType::Q6_K && q.k > q.n && q.units >= 128 && q.stages_in(512)),
        act: Act::Shape { wg: 512, tpr: Lanes::Clamped(128) },
        measured: H100,
        cite: "BENCHMARKS run 67",
    },
    // A v projection's few short rows (N <= 256, under 48 units) in 256-thread workgroups of 32-lane
    // row groups: fewer, wider workgroups (Qwen2.5-1.5B's Q6_K v, 256 x 1536, 8 workgroups: the step
    // 1889 -> 1846 us against 16 workgroups of 128 threads, 1877 with 64-lane row groups; the 0.5B's
    // 128 x 896 the same).
    Rule {
        family: Fam::Any,
        op: Op::Matvec,
        shape: "those Q6_K/Q4_1 rows: a v projection (N <= 256, under 48 units)",
        when: Some(|q, s| q6_whole_rows(s) && q.n <= 256 && q.units < 48 && (q.whole)(256)),
        act: Act::Shape { wg: 256, tpr: Lanes::Fixed(32) },
        measured: H100,
        cite: "WGPU_LLM_QMV inside the step (Qwen2.5-1.5B's v 1889 -> 1846 us; BENCHMARKS run 31)",
    },
    // Q4_K rows of at most 1536 elements (48 units) over many rows, integer dot products (the gate_up
    // projections): 128 threads of 32-lane row groups (Qwen2.5-1.5B's 17920 x 1536: the step 1946 ->
    // 1931 us against 256 threads of 64 lanes; the 0.5B's 9728 x 896 the same).
    Rule {
        family: Fam::Any,
        op: Op::Matvec,
        shape: "one token, DP4, Q4_K rows of at most 1536 over 8192 or more (gate_up)",
        when: Some(|q, s| {
            s.dp4 && q.tok == 1 && q.dtype == DType::Q4_K && q.k <= 1536 && q.n >= 8192 && q.narrow() && (q.whole)(128)
        }),
        act: Act::Shape { wg: 128, tpr: Lanes::Fixed(32) },
        measured: H100,
        cite: "WGPU_LLM_QMV inside the step (Qwen2.5-1.5B's gate_up 1946 -> 1931 us; BENCHMARKS run 31)",
    },
    // Q4_K rows of 4096-8192 elements over 12288 rows or more (Gemma-4-31B's gate_up and qkv) in
    // 1024-thread workgroups where the device takes them and the row stages whole there: x staged once
    // for 128 rows instead of 32 (H100, BENCHMARKS run 40, the step 14979 -> 14764 us: gate_up 78.6 ->
    // 75.6 us, qkv 32.4 -> 29.7 and 37.9 -> 34.4; 512 threads: no gain).
    Rule {
        family: Fam::Any,
        op: Op::Matvec,
        shape: "the wide rows, DP4, Q4_K over 12288 or more, staging whole in 1024 threads",
        when: Some(|q, s| s.wide_rows && s.dp4 && !s.vocab && q.dtype == DType::Q4_K && q.n >= 12288 && q.stages_in(1024)),
        act: Act::Shape { wg: 1024, tpr: Lanes::Fixed(32) },
        measured: H100,
        cite: "BENCHMARKS run 40",
    },
    // Those rows of 4096-8192 elements over 4096 or more (Gemma-4-31B's gate_up, qkv, o and lm_head)
    // with each unit's loads issued an iteration early: the step 14848 -> 14728, 14774 -> 14678 and
    // 14766 -> 14662 us in three calls (H100, BENCHMARKS run 43, session 14); the other shapes keep
    // the plain loop (slower on Qwen2.5's in `bench_quant`).
    Rule {
        family: Fam::Any,
        op: Op::Matvec,
        shape: "the wide rows with DP4",
        when: Some(|_, s| s.wide_rows && s.dp4),
        act: Act::Prefetch,
        measured: H100,
        cite: "BENCHMARKS run 43 (session 14)",
    },
    // ---- ... for how x is read (QMatvecConfig::for_input; the first matching row) ----
    Rule {
        family: Fam::Any,
        op: Op::MatvecInput,
        shape: "one token, float path, Q4_K rows of 1536 over at most 4096, plain or through the norm",
        when: Some(|q, s| q.q4k_short(s) && q.k == 1536 && (q.plain() || q.norm()) && (q.whole)(256)),
        act: Act::InputShape { wg: 256, tpr: Lanes::Fixed(64) },
        measured: H100,
        cite: "BENCHMARKS run 65",
    },
    Rule {
        family: Fam::Any,
        op: Op::MatvecInput,
        shape: "one token, float path, Q4_K rows of at most 1536 over at most 4096, plain",
        when: Some(|q, s| q.q4k_short(s) && q.plain() && q.k <= 1536 && (q.whole)(128)),
        act: Act::InputShape { wg: 128, tpr: Lanes::Fixed(32) },
        measured: H100,
        cite: "BENCHMARKS run 31 (the o rule: 1886 -> 1875 us)",
    },
    // ---- ... for x staged apart (QMatvecConfig::staged) ----
    Rule {
        family: Fam::Any,
        op: Op::MatvecStaged,
        shape: "every shape",
        when: None,
        act: Act::StagedLanes,
        measured: H100,
        cite: "bench_quant, Gemma-4-31B's rows of 16384 and 21504 (BENCHMARKS run 50, session 15)",
    },
    // ---- Which rows read x staged apart (StageApart::rule) ----
    Rule {
        family: Fam::Any,
        op: Op::StageApart,
        shape: "rows of 16384+ by quantize_x16; 4096+ by the norm before them",
        when: None,
        act: Act::StageApart { k: 16384, free_k: 4096, free_n: 0 },
        measured: H100,
        cite: "BENCHMARKS runs 50-52 (session 15)",
    },
    // ---- The mixed-type projection (mixes, mix_config) ----
    Rule {
        family: Fam::Any,
        op: Op::MixMaxK,
        shape: "one token, two GGUF types, plain or normalized x",
        when: None,
        act: Act::Value(1536),
        measured: H100,
        cite: "BENCHMARKS runs 64-66 (rows of 2048 lost 1.7 %: run 71)",
    },
    Rule {
        family: Fam::Any,
        op: Op::MixFloatWg,
        shape: "the first weight on its float path, the second with DP4",
        when: None,
        act: Act::Value(256),
        measured: H100,
        cite: "BENCHMARKS runs 63-64",
    },
    // ---- Attention ----
    Rule {
        family: Fam::Any,
        op: Op::AttnKeyTile,
        shape: "every shape (split decode picks smaller tiles for more splits)",
        when: None,
        act: Act::Value(64),
        measured: H100,
        cite: "Qwen2.5-1.5B decode at 641 positions, 16-key tiles -4.5 % a step (no BENCHMARKS run)",
    },
    // With 2 or 3 KV heads (Qwen2.5, SmolLM2) the in-kernel merge cost what the merge dispatch it replaces did
    // (the Qwen2.5-1.5B step 1952 us against 1950); alone the kernel wins from 8 KV heads on at 1-4k positions
    // (Llama-3-8B's shape at 1024: 8.0 us against 18.1).
    Rule {
        family: Fam::Any,
        op: Op::AttnDecodeMinKv,
        shape: "one decode token",
        when: None,
        act: Act::Value(8),
        measured: H100,
        cite: "BENCHMARKS runs 30 and 36",
    },
    // Once the rest of the Qwen2.5-1.5B step had shrunk, its 2 KV heads of 128 won (the step 1683 -> 1659 us),
    // while the 0.5B's heads of 64 still lost (1236 -> 1253 us). Wider heads (Qwen3.5's and Gemma 4's 256 and
    // 512) keep the KV-head rule above: not measured.
    Rule {
        family: Fam::Any,
        op: Op::AttnDecodeHeadDim,
        shape: "one decode token",
        when: None,
        act: Act::Value(128),
        measured: H100,
        cite: "BENCHMARKS runs 67-68",
    },
    Rule {
        family: Fam::Any,
        op: Op::AttnDecodeChunk,
        shape: "the larger chunk where it fits the workgroup memory",
        when: None,
        act: Act::Value(8192),
        measured: "nowhere: the kernel's design (the knob WGPU_LLM_ATTN_DECODE_CE=4096 measures the other)",
        cite: "none",
    },
    // ---- Norms ----
    Rule {
        family: Fam::Any,
        op: Op::NormWideRows,
        shape: "rows of more than this many elements take 512 threads",
        when: None,
        act: Act::Value(4096),
        measured: H100,
        cite: "BENCHMARKS run 55 (session 16)",
    },
    // ---- Mixture of experts ----
    Rule {
        family: Fam::Any,
        op: Op::MoeBatchGroup,
        shape: "a batch decode step's expert slots: per slot (0) or grouped by expert (1)",
        when: None,
        act: Act::Value(0),
        measured: "H200 (the H100's family, NvidiaHopper; other families: measured nowhere else)",
        cite: "BENCHMARKS runs 82-83 (Qwen3.5-35B-A3B Q4_K_M, 8 and 32 streams: per slot 788.7 / 1,126.3 tok/s, grouped 561.6 / 892.1)",
    },
    // ---- Bounds checks ----
    Rule {
        family: Fam::Any,
        op: Op::Unchecked,
        shape: "kernels whose every index is in range by construction",
        when: None,
        act: Act::Unchecked(&["matvec_quant", "quantize_x16", "rms_norm", "rope", "attention_decode"]),
        measured: H100,
        cite: "BENCHMARKS runs 48 and 55 (sessions 15-16)",
    },
];

/// The rows of `op` that apply to `family`, in table order: for an op of one value, the first
/// row of the family's own, else the first for any; otherwise every row of the family or any.
pub fn rows(family: Family, op: Op) -> Vec<&'static Rule> {
    let of_op = RULES.iter().filter(|r| r.op == op);
    if op.single() {
        let own = of_op.clone().find(|r| r.family == Fam::Only(family));
        return own.or_else(|| of_op.clone().find(|r| r.family == Fam::Any)).into_iter().collect();
    }
    of_op.filter(|r| r.family.matches(family)).collect()
}

impl Op {
    /// Every op, in table order.
    pub const ALL: [Op; 14] = [
        Op::IntDot,
        Op::Matvec,
        Op::MatvecInput,
        Op::MatvecStaged,
        Op::StageApart,
        Op::MixMaxK,
        Op::MixFloatWg,
        Op::AttnKeyTile,
        Op::AttnDecodeMinKv,
        Op::AttnDecodeHeadDim,
        Op::AttnDecodeChunk,
        Op::NormWideRows,
        Op::MoeBatchGroup,
        Op::Unchecked,
    ];

    /// Whether the op takes one row (a value) rather than a sequence of refinements.
    pub fn single(self) -> bool {
        !matches!(self, Op::Matvec | Op::MatvecInput)
    }
}

impl std::fmt::Display for Rule {
    /// One line: op, family, shape, choice, citation (and why, for a row measured nowhere).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let fam = match self.family {
            Fam::Any => "any".to_string(),
            Fam::Only(g) => format!("{g:?}"),
        };
        write!(f, "{:?} [{fam}] {}: {:?} ({})", self.op, self.shape, self.act, self.cite)?;
        if !self.measured.starts_with("H100") {
            write!(f, " (measured {})", self.measured)?;
        }
        Ok(())
    }
}
