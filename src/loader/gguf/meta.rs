//! Typed GGUF metadata lookups, each error naming the key.

use super::file::GgufFile;
use super::value::GgufValue;
use crate::error::{shown, Error, Result};
use crate::loader::{capped, check_layer_count, limits};
use std::path::Path;

/// Typed metadata lookups with errors naming the key.
pub(super) struct Meta<'a> {
    pub(super) g: &'a GgufFile,
    pub(super) path: &'a Path,
    pub(super) arch: &'a str,
}

impl Meta<'_> {
    pub(super) fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }
    pub(super) fn wrong(&self, key: &str, want: &str, v: &GgufValue) -> Error {
        Error::corrupt(self.path, format!("metadata {} should be {want}, is {}", shown(key), v.describe()))
    }
    pub(super) fn missing(&self, key: &str) -> Error {
        Error::corrupt(self.path, format!("required metadata {} is missing", shown(key)))
    }
    /// The value of `key` read by `read`, if present; `want` says what it should be in the error.
    fn opt<'v, T>(&'v self, key: &str, want: &str, read: impl FnOnce(&'v GgufValue) -> Option<T>) -> Result<Option<T>> {
        match self.g.get(key) {
            None => Ok(None),
            Some(v) => read(v).map(Some).ok_or_else(|| self.wrong(key, want, v)),
        }
    }
    pub(super) fn opt_u64(&self, key: &str) -> Result<Option<u64>> {
        self.opt(key, "a non-negative integer", GgufValue::as_u64)
    }
    /// A non-negative integer that fits `T`, if present.
    fn opt_int<T: TryFrom<u64>>(&self, key: &str) -> Result<Option<T>> {
        self.opt_u64(key)?.map(|v| self.fit(key, v)).transpose()
    }
    /// `v` (the value of `key`) as a `T`, or an error saying it is too large.
    fn fit<T: TryFrom<u64>>(&self, key: &str, v: u64) -> Result<T> {
        T::try_from(v).map_err(|_| Error::corrupt(self.path, format!("metadata {} = {v} is too large", shown(key))))
    }
    pub(super) fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        self.opt_int(key)
    }
    /// `{arch}.block_count`: at most the layer limit, and agreeing with the `blk.{i}.` tensors
    /// present (checked before anything is sized by it).
    pub(super) fn layer_count(&self) -> Result<usize> {
        let key = self.key("block_count");
        let n = self.req_capped(&key, limits::LAYERS)?;
        check_layer_count(self.g.tensors.iter().map(|t| t.name.as_str()), n, &key, self.path)?;
        Ok(n)
    }
    /// A required count, at most `limit`.
    pub(super) fn req_capped(&self, key: &str, limit: usize) -> Result<usize> {
        let v = self.opt_usize(key)?.ok_or_else(|| self.missing(key))?;
        capped(self.path, key, v, limit)
    }
    pub(super) fn opt_u32(&self, key: &str) -> Result<Option<u32>> {
        self.opt_int(key)
    }
    pub(super) fn opt_f32(&self, key: &str) -> Result<Option<f32>> {
        self.opt(key, "a finite number", |v| v.as_f64().filter(|x| x.is_finite()).map(|x| x as f32))
    }
    pub(super) fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        self.opt(key, "a bool", GgufValue::as_bool)
    }
    pub(super) fn opt_str(&self, key: &str) -> Result<Option<&str>> {
        self.opt(key, "a string", GgufValue::as_str)
    }
    pub(super) fn opt_array(&self, key: &str) -> Result<Option<&[GgufValue]>> {
        self.opt(key, "an array", GgufValue::as_array)
    }
    /// A count llama.cpp takes per layer: an array of `layers` integers, or one for every layer;
    /// `None` when absent.
    pub(super) fn per_layer(&self, key: &str, layers: usize) -> Result<Option<Vec<usize>>> {
        let Some(v) = self.g.get(key) else {
            return Ok(None);
        };
        match v.as_array() {
            Some(a) if a.len() == layers => a
                .iter()
                .map(|x| x.as_u64().and_then(|n| usize::try_from(n).ok()).ok_or_else(|| self.wrong(key, "integers", x)))
                .collect::<Result<Vec<_>>>()
                .map(Some),
            Some(a) => Err(Error::Mismatch(format!(
                "{}: {} has {} entries for {layers} layers",
                self.path.display(),
                shown(key),
                a.len()
            ))),
            None => Ok(self.opt_usize(key)?.map(|n| vec![n; layers])),
        }
    }

    /// A count that llama.cpp allows to be per-layer (an array); this engine needs one value.
    pub(super) fn uniform_usize(&self, key: &str) -> Result<Option<usize>> {
        let Some(v) = self.g.get(key) else {
            return Ok(None);
        };
        if let Some(a) = v.as_array() {
            let vals: Option<Vec<u64>> = a.iter().map(|x| x.as_u64()).collect();
            let vals = vals.ok_or_else(|| self.wrong(key, "integers", v))?;
            return match vals.split_first() {
                Some((first, rest)) if rest.iter().all(|x| x == first) => self.fit(key, *first).map(Some),
                Some(_) => Err(Error::Unsupported(format!(
                    "per-layer values of {} ({} different values; this engine needs one)",
                    shown(key),
                    vals.iter().collect::<std::collections::BTreeSet<_>>().len()
                ))),
                None => Err(self.wrong(key, "a non-empty array", v)),
            };
        }
        self.opt_usize(key)
    }
}
