//! The quantized matvec's shape chosen from the rule table ([`super::table`]): the matvec rows
//! applied to what a row's predicate sees ([`MatvecQuery`]), building a [`MatvecState`].

pub use super::query::{InputKind, MatvecQuery, MatvecState};
use super::table::{Act, Lanes, Op};
use super::Tuning;

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
