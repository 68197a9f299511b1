//! The quantized matvec's shape chosen from the rule table ([`super::table`]): what a row's
//! predicate sees ([`MatvecQuery`]), what the rows build ([`MatvecState`]).

use super::table::{Act, Lanes, Op};
use super::Tuning;
use crate::dtype::DType;

/// How x reaches the matvec.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputKind {
    Plain,
    Norm,
    Staged,
}

/// One projection's shape on one device, as the rows' predicates see it.
pub struct MatvecQuery<'a> {
    pub dtype: DType,
    /// Output rows.
    pub n: usize,
    /// Row length.
    pub k: usize,
    /// Tokens a pass over W: 1 or 4.
    pub tok: u32,
    /// The row's units (32 or 64 elements: what a lane streams).
    pub units: u32,
    /// Narrowest row group a pass allows (every output a storing lane, whole subgroups).
    pub min_tpr: u32,
    /// Widest row group (the row's units, at most the workgroup).
    pub widest: u32,
    /// The default workgroup size.
    pub max_wg: u32,
    /// Whether the configuration reduces with subgroups, and the adapter's largest subgroup.
    pub subgroups: bool,
    pub subgroup_max_size: u32,
    pub max_invocations: u32,
    /// Packed integer dot products usable here (the profile's, after the IntDot rows).
    pub int_dot: bool,
    pub input: InputKind,
    /// Whether one token's row stages whole for DP4 in workgroups of this many threads.
    pub whole: &'a dyn Fn(u32) -> bool,
    /// Whether the DP4 form takes this type at (workgroup, tokens) at all.
    pub fits: &'a dyn Fn(u32, u32) -> bool,
}

impl MatvecQuery<'_> {
    /// Row groups of at most 32 lanes.
    pub fn narrow(&self) -> bool {
        self.min_tpr <= 32
    }
    /// DP4 would take this type in the default workgroup.
    pub fn dp4_ok(&self) -> bool {
        (self.fits)(self.max_wg, 1) && self.int_dot
    }
    /// The adapter takes workgroups of `wg` threads and one token's row stages whole in them.
    pub fn stages_in(&self, wg: u32) -> bool {
        self.max_invocations >= wg && (self.whole)(wg)
    }
    pub fn plain(&self) -> bool {
        self.input == InputKind::Plain
    }
    pub fn norm(&self) -> bool {
        self.input == InputKind::Norm
    }
    /// One token's short Q4_K rows on the float path (the o and q/k/v projections).
    pub fn q4k_short(&self, s: &MatvecState) -> bool {
        let narrow = !s.subgroups || self.subgroup_max_size <= 32;
        self.int_dot && narrow && s.tok == 1 && !s.dp4 && self.dtype == DType::Q4_K && self.n <= 4096
    }
}

/// The shape the rows build.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MatvecState {
    pub wg: u32,
    pub tpr: u32,
    pub tok: u32,
    pub subgroups: bool,
    pub dp4: bool,
    pub prefetch: bool,
    /// Set by the rows (for later rows): the wide DP4 rows, the whole-row Q6_K/Q4_1 rows, a vocabulary.
    pub wide_rows: bool,
    pub q6_whole: bool,
    pub vocab: bool,
}

impl Tuning {
    /// The matvec's shape for `q` from the table's [`Op::Matvec`] rows.
    pub fn matvec(&self, q: &MatvecQuery) -> MatvecState {
        let s = MatvecState { wg: q.max_wg, tok: q.tok, subgroups: q.subgroups, ..Default::default() };
        self.apply(Op::Matvec, q, s, false).0
    }

    /// `s` refined for how x is read: the first [`Op::MatvecInput`] row that matches (None: none).
    pub fn matvec_input(&self, q: &MatvecQuery, s: MatvecState) -> Option<MatvecState> {
        let (s, matched) = self.apply(Op::MatvecInput, q, s, true);
        matched.then_some(s)
    }

    /// `s` for x staged apart ([`Op::MatvecStaged`]): DP4 without the kernel's own staging.
    pub fn matvec_staged(&self, q: &MatvecQuery, s: MatvecState) -> MatvecState {
        let s = MatvecState { dp4: true, prefetch: false, ..s };
        self.apply(Op::MatvecStaged, q, s, true).0
    }

    /// Applies `op`'s rows in order (`first`: only the first that matches); whether one matched.
    fn apply(&self, op: Op, q: &MatvecQuery, mut s: MatvecState, first: bool) -> (MatvecState, bool) {
        for r in self.rows(op) {
            if r.when.is_some_and(|w| !w(q, &s)) {
                continue;
            }
            let lanes = |l: Lanes| match l {
                Lanes::Fixed(t) => t,
                Lanes::Clamped(t) => t.min(q.widest).max(q.min_tpr),
            };
            match r.act {
                Act::LanesFor(lanes) => {
                    let groups = q.n.div_ceil(4) as u32;
                    let want = lanes.div_ceil(groups).next_power_of_two();
                    s.tpr = want.clamp(q.min_tpr.max(16).min(q.widest), q.widest);
                }
                Act::WideRows => {
                    s.wide_rows = true;
                    s.tpr = q.min_tpr.max(32);
                }
                Act::CapLanes(t) => s.tpr = s.tpr.min(t).max(q.min_tpr),
                Act::ShrinkWorkgroup => {
                    while s.wg / 2 >= s.tpr.max(32) && (q.n as u32).div_ceil(4 * s.wg / s.tpr) < 512 {
                        s.wg /= 2;
                    }
                }
                Act::Dp4 => s.dp4 = true,
                Act::Q6Whole => (s.q6_whole, s.dp4, s.wg, s.tpr) = (true, true, 128, 32),
                Act::Vocab => (s.vocab, s.wg, s.tpr) = (true, 128, 32),
                Act::Shape { wg, tpr } => (s.wg, s.tpr) = (wg, lanes(tpr)),
                Act::InputShape { wg, tpr } => {
                    (s.wg, s.tpr, s.dp4, s.prefetch) = (wg, lanes(tpr), true, false);
                }
                Act::Prefetch => s.prefetch = true,
                Act::StagedLanes => {
                    let sg = if s.subgroups { q.subgroup_max_size.max(1).next_power_of_two() } else { 1 };
                    let tpr = (1u32 << (q.units / 2).max(1).ilog2()).clamp(32, 128);
                    (s.wg, s.tpr) = (tpr.max(64).max(sg), tpr.max(sg));
                }
                other => unreachable!("{other:?} in a matvec row"),
            }
            if first {
                return (s, true);
            }
        }
        (s, false)
    }
}
