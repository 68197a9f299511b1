//! What the rule table's matvec rows see and build: the projection's shape on a device
//! ([`MatvecQuery`], what a row's predicate sees) and the shape the rows build ([`MatvecState`]).
//! Shared by the table ([`super::table`]) and the code that applies its rows ([`super::matvec`]).

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

/// The shape the rows build: the quantized matvec's workgroup shape and path (the engine runs it
/// as `QMatvecConfig::shape`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MatvecState {
    /// Threads per workgroup.
    pub wg: u32,
    /// Threads per row group of 4 rows (a power of two dividing the workgroup).
    pub tpr: u32,
    /// Tokens per pass over W: 1 or 4.
    pub tok: u32,
    /// Reduce with subgroup operations.
    pub subgroups: bool,
    /// Stage x as 16-bit fixed point and sum with integer dot products (`DP4`).
    pub dp4: bool,
    /// With `dp4`, one token, the row staged whole: each unit's loads issued one iteration early.
    pub prefetch: bool,
    /// Set by the rows (for later rows): the wide DP4 rows, the whole-row Q6_K/Q4_1 rows, a vocabulary.
    pub wide_rows: bool,
    pub q6_whole: bool,
    pub vocab: bool,
}
