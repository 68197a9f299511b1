//! Tuning as data keyed by device: the adapter's [`DeviceProfile`], the rule table
//! ([`table::RULES`], each row citing the measurement that chose it) and the one [`Tuning`] value
//! a [`crate::gpu::Gpu`] carries: the table's choices for its profile with the measurement knobs
//! (`WGPU_LLM_*`, or a TOML file named by `WGPU_LLM_TUNING`) read once, here, by
//! [`Tuning::override_from_env`]. The ops ask `gpu.tuning()`; nothing else reads the environment.
//! TUNING.md lists every knob and says how to add a rule.

pub mod matvec;
pub mod profile;
pub mod query;
pub mod table;

pub use profile::{DeviceProfile, Family};
pub use query::{InputKind, MatvecQuery, MatvecState};
pub use table::{Act, Op, Rule, RULES};

use crate::error::{Error, Result};

/// One `WGPU_LLM_QMV` entry: the one-token matvec's shape for a type (`any`) and (N, K).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QmvOverride {
    /// `Q4_K`, ... as `DType`'s Debug prints it, or `any`.
    pub ty: String,
    pub n: usize,
    pub k: usize,
    pub wg: u32,
    pub tpr: u32,
    /// 1: integer dot products.
    pub dp4: usize,
}

/// The measurement knobs (TUNING.md): None / empty where not set. Each is a value of the
/// environment variable of the same name upper-cased with `WGPU_LLM_` before it, or a key of the
/// TOML file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Knobs {
    /// `WGPU_LLM_QMV="TYPE:N:K:wg:tpr:dp4,..."`.
    pub qmv: Vec<QmvOverride>,
    /// `WGPU_LLM_QMV_PF=0|1`.
    pub qmv_pf: Option<bool>,
    /// `WGPU_LLM_XG=0`: no projection reads x staged apart.
    pub xg_off: bool,
    /// `WGPU_LLM_XG_K`, `WGPU_LLM_XG_FREE_K`, `WGPU_LLM_XG_FREE_N`.
    pub xg_k: Option<usize>,
    pub xg_free_k: Option<usize>,
    pub xg_free_n: Option<usize>,
    /// `WGPU_LLM_XG_CFG="wg:tpr:prefetch"`.
    pub xg_cfg: Option<[u32; 3]>,
    /// `WGPU_LLM_MIX=0`.
    pub mix_off: bool,
    /// `WGPU_LLM_MIX_CFG="wg:tpr:b_dp4:a_dp4"`.
    pub mix_cfg: Option<[u32; 4]>,
    /// `WGPU_LLM_ATTN_BK`.
    pub attn_bk: Option<usize>,
    /// `WGPU_LLM_ATTN_DECODE=0`.
    pub attn_decode_off: bool,
    /// `WGPU_LLM_ATTN_DECODE_MIN_KV`.
    pub attn_decode_min_kv: Option<usize>,
    /// `WGPU_LLM_ATTN_DECODE_CE=4096`: the smaller chunks first.
    pub attn_decode_ce_small: bool,
    /// `WGPU_LLM_NORM_WG`.
    pub norm_wg: Option<u32>,
    /// `WGPU_LLM_NORMS_APART=1`.
    pub norms_apart: bool,
    /// `WGPU_LLM_MOE_GROUP=0|1`: a batch step's expert slots per slot / grouped by expert
    /// (default: the table's [`Op::MoeBatchGroup`] row).
    pub moe_group: Option<bool>,
    /// `WGPU_LLM_PROBE_DROP="name:VARIANT,..."` (a probe: wrong outputs).
    pub probe_drop: Vec<(String, String)>,
    /// `WGPU_LLM_BOUNDS_CHECKS=0|1`: none / every kernel checked.
    pub bounds_checks: Option<bool>,
}

/// Every knob's name (without `WGPU_LLM_`), as [`Knobs::set`] takes it.
pub const KNOBS: [&str; 18] = [
    "QMV",
    "QMV_PF",
    "XG",
    "XG_K",
    "XG_FREE_K",
    "XG_FREE_N",
    "XG_CFG",
    "MIX",
    "MIX_CFG",
    "ATTN_BK",
    "ATTN_DECODE",
    "ATTN_DECODE_MIN_KV",
    "ATTN_DECODE_CE",
    "NORM_WG",
    "NORMS_APART",
    "MOE_GROUP",
    "PROBE_DROP",
    "BOUNDS_CHECKS",
];

impl Knobs {
    /// Sets knob `name` (one of [`KNOBS`], with or without `WGPU_LLM_`, any case) from its text
    /// form, as the environment gives it. A value that does not parse leaves the default (as the
    /// knobs always did); an unknown name is an error.
    pub fn set(&mut self, name: &str, v: &str) -> Result<()> {
        let upper = name.to_ascii_uppercase();
        let key = upper.strip_prefix("WGPU_LLM_").unwrap_or(&upper);
        let nums = |sep: char| v.split(sep).filter_map(|x| x.parse::<u32>().ok()).collect::<Vec<_>>();
        match key {
            "QMV" => {
                self.qmv = v
                    .split(',')
                    .filter_map(|e| {
                        let ty = e.split(':').next().unwrap_or_default().to_string();
                        let f: Vec<usize> = e.split(':').skip(1).filter_map(|x| x.parse().ok()).collect();
                        match f[..] {
                            [n, k, w, t, d] => Some(QmvOverride { ty, n, k, wg: w as u32, tpr: t as u32, dp4: d }),
                            _ => None,
                        }
                    })
                    .collect()
            }
            "QMV_PF" => {
                self.qmv_pf = match v {
                    "0" => Some(false),
                    "1" => Some(true),
                    _ => self.qmv_pf,
                }
            }
            "XG" => self.xg_off = v == "0",
            "XG_K" => self.xg_k = v.parse().ok().or(self.xg_k),
            "XG_FREE_K" => self.xg_free_k = v.parse().ok().or(self.xg_free_k),
            "XG_FREE_N" => self.xg_free_n = v.parse().ok().or(self.xg_free_n),
            "XG_CFG" => self.xg_cfg = nums(':').try_into().ok().or(self.xg_cfg),
            "MIX" => self.mix_off = v == "0",
            "MIX_CFG" => self.mix_cfg = nums(':').try_into().ok().or(self.mix_cfg),
            "ATTN_BK" => self.attn_bk = v.parse().ok().or(self.attn_bk),
            "ATTN_DECODE" => self.attn_decode_off = v == "0",
            "ATTN_DECODE_MIN_KV" => self.attn_decode_min_kv = v.parse().ok().or(self.attn_decode_min_kv),
            "ATTN_DECODE_CE" => self.attn_decode_ce_small = v == "4096",
            "NORM_WG" => self.norm_wg = v.parse().ok().or(self.norm_wg),
            "NORMS_APART" => self.norms_apart = v == "1",
            "MOE_GROUP" => self.moe_group = Some(v != "0"),
            "PROBE_DROP" => {
                self.probe_drop = v
                    .split(',')
                    .filter_map(|e| e.rsplit_once(':'))
                    .map(|(n, var)| (n.to_string(), var.to_string()))
                    .collect()
            }
            "BOUNDS_CHECKS" => {
                self.bounds_checks = match v {
                    "0" => Some(false),
                    "1" => Some(true),
                    _ => self.bounds_checks,
                }
            }
            _ => return Err(Error::InvalidArgument(format!("unknown tuning knob {name:?} (see TUNING.md)"))),
        }
        Ok(())
    }
}

/// The tuning of one device: its profile, the table's rows for it, the knobs set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tuning {
    pub profile: DeviceProfile,
    pub knobs: Knobs,
}

impl Tuning {
    /// The table's choices for `profile`, no knob set.
    pub fn new(profile: DeviceProfile) -> Tuning {
        Tuning { profile, knobs: Knobs::default() }
    }

    /// The one place the knobs are read: the TOML file named by `WGPU_LLM_TUNING` (if set), then
    /// each `WGPU_LLM_<KNOB>` variable set (over the file's value).
    pub fn override_from_env(mut self) -> Result<Tuning> {
        if let Ok(path) = std::env::var("WGPU_LLM_TUNING") {
            let text = std::fs::read_to_string(&path)
                .map_err(|e| Error::InvalidArgument(format!("WGPU_LLM_TUNING={path}: {e}")))?;
            self.override_from_toml(&text).map_err(|e| {
                let why = match e {
                    Error::InvalidArgument(m) => m,
                    other => other.to_string(),
                };
                Error::InvalidArgument(format!("WGPU_LLM_TUNING={path}: {why}"))
            })?;
        }
        for name in KNOBS {
            if let Ok(v) = std::env::var(format!("WGPU_LLM_{name}")) {
                self.knobs.set(name, &v)?;
            }
        }
        Ok(self)
    }

    /// Sets the knobs a TOML document names (`attn_decode_min_kv = 1`, `qmv = "Q6_K:..."`: the
    /// knob names in lower case, values as strings, integers or booleans).
    pub fn override_from_toml(&mut self, text: &str) -> Result<()> {
        let table: toml::Table = text.parse().map_err(|e: toml::de::Error| Error::InvalidArgument(e.to_string()))?;
        for (key, value) in table {
            let v = match value {
                toml::Value::String(s) => s,
                toml::Value::Integer(i) => i.to_string(),
                toml::Value::Boolean(b) => if b { "1" } else { "0" }.to_string(),
                other => {
                    return Err(Error::InvalidArgument(format!("{key}: {other} is not a string, integer or boolean")))
                }
            };
            self.knobs.set(&key, &v)?;
        }
        Ok(())
    }

    /// The rows of `op` that apply to this device ([`table::rows`]).
    pub fn rows(&self, op: Op) -> Vec<&'static Rule> {
        table::rows(self.profile.family, op)
    }

    /// Every row that applies to this device, op by op.
    pub fn applicable(&self) -> Vec<&'static Rule> {
        Op::ALL.iter().flat_map(|&op| self.rows(op)).collect()
    }

    /// The value of a one-row op.
    fn value(&self, op: Op) -> usize {
        match self.rows(op).first().map(|r| r.act) {
            Some(Act::Value(v)) => v,
            other => unreachable!("{op:?}: {other:?}"),
        }
    }

    /// Whether the matvec uses packed integer dot products (the profile's backend, and the
    /// family's [`Op::IntDot`] row).
    pub fn int_dot(&self) -> bool {
        self.profile.int_dot && self.rows(Op::IntDot).first().is_none_or(|r| r.act == Act::IntDot(true))
    }

    /// Which one-token projections read x staged apart: `(k, free_k, free_n)` (None: none).
    pub fn stage_apart(&self) -> Option<(usize, usize, usize)> {
        if self.knobs.xg_off {
            return None;
        }
        let Some(Act::StageApart { k, free_k, free_n }) = self.rows(Op::StageApart).first().map(|r| r.act) else {
            unreachable!("the StageApart row")
        };
        let kn = &self.knobs;
        Some((kn.xg_k.unwrap_or(k), kn.xg_free_k.unwrap_or(free_k), kn.xg_free_n.unwrap_or(free_n)))
    }

    /// Whether two quantized types may run as one mixed dispatch, and over rows of at most how
    /// many elements.
    pub fn mix_max_k(&self) -> Option<usize> {
        (!self.knobs.mix_off).then(|| self.value(Op::MixMaxK))
    }

    /// The mixed dispatch's workgroup where its first weight takes the float path.
    pub fn mix_float_wg(&self) -> u32 {
        self.value(Op::MixFloatWg) as u32
    }

    /// Whether a batch decode step in the batched form groups its quantized expert slots by
    /// expert (else each slot runs the one-token matvec); the same at every batch size.
    pub fn moe_batch_group(&self) -> bool {
        self.knobs.moe_group.unwrap_or_else(|| self.value(Op::MoeBatchGroup) != 0)
    }

    /// The attention's largest key tile.
    pub fn attn_key_tile(&self) -> usize {
        self.knobs.attn_bk.unwrap_or_else(|| self.value(Op::AttnKeyTile))
    }

    /// Whether the one-dispatch decode attention may run, and for which heads: `(min KV heads,
    /// head width taken whatever its KV heads)`.
    pub fn decode_attention(&self) -> Option<(usize, usize)> {
        (!self.knobs.attn_decode_off).then(|| {
            let min_kv = self.knobs.attn_decode_min_kv.unwrap_or_else(|| self.value(Op::AttnDecodeMinKv));
            (min_kv, self.value(Op::AttnDecodeHeadDim))
        })
    }

    /// The decode attention's chunk sizes (elements of K) in the order tried.
    pub fn decode_chunks(&self) -> [usize; 2] {
        let first = if self.knobs.attn_decode_ce_small { 4096 } else { self.value(Op::AttnDecodeChunk) };
        if first == 4096 {
            [4096, 8192]
        } else {
            [8192, 4096]
        }
    }

    /// `rms_norm`'s workgroup for rows of `n` (`default` threads, or 512 for wide rows) where
    /// `fits(wg)` says the adapter takes `wg` threads.
    pub fn norm_wg(&self, n: u32, default: u32, fits: impl Fn(u32) -> bool) -> u32 {
        match self.knobs.norm_wg.filter(|&wg| matches!(wg, 256 | 512 | 1024) && fits(wg)) {
            Some(wg) => wg,
            None if n as usize > self.value(Op::NormWideRows) && fits(512) => 512,
            None => default,
        }
    }

    /// Whether `shader` is compiled with wgpu's injected bounds checks.
    pub fn bounds_checked(&self, shader: &str) -> bool {
        if let Some(all) = self.knobs.bounds_checks {
            return all;
        }
        !self.rows(Op::Unchecked).iter().any(|r| matches!(r.act, Act::Unchecked(list) if list.contains(&shader)))
    }
}

#[cfg(test)]
mod tests;
