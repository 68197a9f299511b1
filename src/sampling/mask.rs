//! A row's token mask: which tokens a constraint (a grammar, a JSON schema) allows next. Both
//! samplers apply it before every other step of the [spec](super), so the constrained
//! distribution is the model's distribution restricted to the allowed tokens and renormalized.
//!
//! # Spec (a row with a mask `A`)
//! Every step of the spec runs on the logits with `l[i] = -inf` for `i ∉ A` (so disallowed
//! tokens are never candidates, never counted by top-k, never weigh in top-p, never drawn),
//! except the fixed outcomes, which all become the **masked argmax**: the lowest `i ∈ A`
//! maximizing `l[i]` (NaN as `-inf`), or the lowest `i ∈ A` when every allowed logit is NaN or
//! `-inf`:
//! - greedy: the masked argmax;
//! - some allowed `s[i] == +inf`: the masked argmax (as without a mask, the `T → 0` limit);
//! - no candidate (every allowed `s` is `-inf`): the masked argmax (a row without a mask
//!   gives 0; a masked row must give an allowed token).
//!
//! A row's reported non-finite status still looks at the whole row. A mask with no allowed
//! token is an error before anything runs (never a token outside the mask).

use super::params::{RowKey, SamplingParams};
use crate::error::{Error, Result};

/// The rows of one draw: each row's parameters, its place in the random streams and its token
/// mask (`None`: free).
#[derive(Clone, Copy, Debug)]
pub struct Rows<'a> {
    pub params: &'a [SamplingParams],
    pub keys: &'a [RowKey],
    pub masks: &'a [Option<&'a TokenMask>],
}

/// One bit per token: bit `i % 32` of word `i / 32` set = token `i` allowed. Bits past the
/// vocabulary are always clear.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenMask {
    vocab: usize,
    words: Vec<u32>,
}

impl TokenMask {
    /// Words for a vocabulary.
    pub fn words_for(vocab: usize) -> usize {
        vocab.div_ceil(32)
    }

    /// Nothing allowed (fill it with [`allow`](Self::allow)).
    pub fn none(vocab: usize) -> Self {
        Self { vocab, words: vec![0; Self::words_for(vocab)] }
    }

    /// Every token allowed.
    pub fn all(vocab: usize) -> Self {
        let mut m = Self { vocab, words: vec![u32::MAX; Self::words_for(vocab)] };
        m.clear_tail();
        m
    }

    /// From `words` (`⌈vocab / 32⌉` of them; bits past the vocabulary are ignored).
    pub fn from_words(vocab: usize, words: Vec<u32>) -> Result<Self> {
        if words.len() != Self::words_for(vocab) {
            return Err(Error::InvalidArgument(format!(
                "token mask: {} words for a vocabulary of {vocab} (needs {})",
                words.len(),
                Self::words_for(vocab)
            )));
        }
        let mut m = Self { vocab, words };
        m.clear_tail();
        Ok(m)
    }

    /// The allowed tokens of `ids` (ids past the vocabulary are ignored).
    pub fn from_ids(vocab: usize, ids: impl IntoIterator<Item = u32>) -> Self {
        let mut m = Self::none(vocab);
        ids.into_iter().for_each(|i| m.allow(i));
        m
    }

    fn clear_tail(&mut self) {
        let rem = self.vocab % 32;
        if rem != 0 {
            if let Some(last) = self.words.last_mut() {
                *last &= (1u32 << rem) - 1;
            }
        }
    }

    /// Allows token `i` (ignored past the vocabulary).
    pub fn allow(&mut self, i: u32) {
        if (i as usize) < self.vocab {
            self.words[i as usize / 32] |= 1 << (i % 32);
        }
    }

    /// Whether token `i` is allowed.
    #[inline]
    pub fn allows(&self, i: u32) -> bool {
        (i as usize) < self.vocab && self.words[i as usize / 32] >> (i % 32) & 1 != 0
    }

    /// The vocabulary this mask covers.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// The words, as the device sampler uploads them.
    pub fn words(&self) -> &[u32] {
        &self.words
    }

    /// How many tokens are allowed.
    pub fn count(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// The error a sampler gives for this mask on logits of `vocab` entries: a vocabulary
    /// mismatch, or no allowed token.
    pub fn check(&self, vocab: usize) -> Result<()> {
        if self.vocab != vocab {
            return Err(Error::InvalidArgument(format!(
                "token mask for a vocabulary of {} applied to logits of {vocab}",
                self.vocab
            )));
        }
        if self.count() == 0 {
            return Err(Error::InvalidArgument("token mask allows no token: the constraint cannot continue".into()));
        }
        Ok(())
    }
}

/// Checks one optional mask per row against the logits' vocabulary.
pub fn check_masks(masks: &[Option<&TokenMask>], rows: usize, vocab: usize) -> Result<()> {
    if masks.len() != rows {
        return Err(Error::InvalidArgument(format!("sampling: {} token masks for {rows} rows", masks.len())));
    }
    masks.iter().flatten().try_for_each(|m| m.check(vocab))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_past_the_vocabulary_stay_clear() {
        let m = TokenMask::all(70);
        assert_eq!(m.count(), 70);
        assert_eq!(m.words(), &[u32::MAX, u32::MAX, 0x3F]);
        let m = TokenMask::from_words(33, vec![0, u32::MAX]).unwrap();
        assert_eq!(m.count(), 1);
        assert!(m.allows(32) && !m.allows(33) && !m.allows(0));
        assert!(TokenMask::from_words(33, vec![0]).is_err());
    }

    #[test]
    fn check_names_the_problem() {
        let empty = TokenMask::from_ids(40, [45]);
        assert!(format!("{}", empty.check(40).unwrap_err()).contains("allows no token"));
        let m = TokenMask::from_ids(40, [3, 39]);
        assert_eq!(m.count(), 2);
        m.check(40).unwrap();
        assert!(format!("{}", m.check(41).unwrap_err()).contains("vocabulary of 40"));
    }
}
