//! Typed GGUF metadata lookups, each error naming the key.

use super::file::GgufFile;
use super::value::GgufValue;
use crate::error::{shown, Error, Result};
use crate::loader::capped;
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
    pub(super) fn opt_u64(&self, key: &str) -> Result<Option<u64>> {
        match self.g.get(key) {
            None => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| self.wrong(key, "a non-negative integer", v)),
        }
    }
    pub(super) fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        match self.opt_u64(key)? {
            None => Ok(None),
            Some(v) => usize::try_from(v)
                .map(Some)
                .map_err(|_| Error::corrupt(self.path, format!("metadata {} = {v} is too large", shown(key)))),
        }
    }
    /// A required count, at most `limit`.
    pub(super) fn req_capped(&self, key: &str, limit: usize) -> Result<usize> {
        let v = self.opt_usize(key)?.ok_or_else(|| self.missing(key))?;
        capped(self.path, key, v, limit)
    }
    pub(super) fn opt_u32(&self, key: &str) -> Result<Option<u32>> {
        match self.opt_u64(key)? {
            None => Ok(None),
            Some(v) => u32::try_from(v)
                .map(Some)
                .map_err(|_| Error::corrupt(self.path, format!("metadata {} = {v} is too large", shown(key)))),
        }
    }
    pub(super) fn opt_f32(&self, key: &str) -> Result<Option<f32>> {
        match self.g.get(key) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) if x.is_finite() => Ok(Some(x as f32)),
                _ => Err(self.wrong(key, "a finite number", v)),
            },
        }
    }
    pub(super) fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.g.get(key) {
            None => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| self.wrong(key, "a bool", v)),
        }
    }
    pub(super) fn opt_str(&self, key: &str) -> Result<Option<&str>> {
        match self.g.get(key) {
            None => Ok(None),
            Some(v) => v.as_str().map(Some).ok_or_else(|| self.wrong(key, "a string", v)),
        }
    }
    pub(super) fn opt_array(&self, key: &str) -> Result<Option<&[GgufValue]>> {
        match self.g.get(key) {
            None => Ok(None),
            Some(v) => v.as_array().map(Some).ok_or_else(|| self.wrong(key, "an array", v)),
        }
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
                Some((first, rest)) if rest.iter().all(|x| x == first) => usize::try_from(*first)
                    .map(Some)
                    .map_err(|_| Error::corrupt(self.path, format!("metadata {} = {first} is too large", shown(key)))),
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
