//! Safetensors files: headers read and validated, tensors registered under canonical names.

use crate::dtype::DType;
use crate::error::{shown, Error, Result};
use crate::loader::{open_regular, DataFile, StoredTensor};
use crate::model::arch::{self, TensorName};
use crate::model::config::Arch;
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::path::Path;

// ---------------------------------------------------------------------------------------------
// Safetensors
// ---------------------------------------------------------------------------------------------

/// The largest safetensors header read (the `safetensors` crate's own limit).
pub const MAX_SAFETENSORS_HEADER: u64 = 100_000_000;

/// One stored tensor of an MLX quantized layer: (safetensors name, file, offset, bytes, dtype,
/// shape).
pub(super) type Part = (String, usize, u64, usize, ::safetensors::Dtype, Vec<usize>);

/// The parts of MLX quantized layers, by the canonical name of the layer's weight.
#[derive(Default)]
pub(super) struct MlxParts {
    pub(super) packed: HashMap<String, Part>,
    pub(super) scales: HashMap<String, Part>,
    pub(super) biases: HashMap<String, Part>,
}

/// Reads and validates one safetensors file's header and adds its tensors (under canonical
/// names) to `out`, which maps canonical name → (original name, tensor). `expect`: the names an
/// index says are in the file. MLX's quantized parts (U32 weights, scales, biases) go to `mlx`.
pub(super) fn load_safetensors(
    path: &Path,
    arch: Arch,
    files: &mut Vec<DataFile>,
    out: &mut HashMap<String, (String, StoredTensor)>,
    mlx: &mut MlxParts,
    expect: Option<&[&str]>,
) -> Result<()> {
    let (file, file_len) = open_regular(path)?;
    let file_index = files.len();
    let data = DataFile::file(path, file, file_len);
    let entries = read_safetensors_header(&data)?;
    if let Some(expect) = expect {
        for name in expect {
            if !entries.iter().any(|e| e.name == *name) {
                return Err(Error::Mismatch(format!(
                    "{}: the index lists {} in this shard, but it is not there",
                    path.display(),
                    shown(name)
                )));
            }
        }
    }
    for e in entries {
        // MLX's quantization parts: `scales` and `biases` beside a `weight` stored as U32.
        let side = [("scales", &mut mlx.scales), ("biases", &mut mlx.biases)]
            .into_iter()
            .find_map(|(suffix, map)| e.name.strip_suffix(suffix).map(|stem| (format!("{stem}weight"), map)));
        let side = side.filter(|(w, _)| w.ends_with(".weight"));
        let (key, map) = match side {
            Some((w, map)) => (canonical_name(&w, arch), Some(map)),
            None if e.dtype == ::safetensors::Dtype::U32 => (canonical_name(&e.name, arch), Some(&mut mlx.packed)),
            None => (canonical_name(&e.name, arch), None),
        };
        let Some(canonical) = key else {
            continue;
        };
        if let Some(map) = map {
            let part = (e.name.clone(), file_index, e.start, e.len, e.dtype, e.shape.clone());
            if let Some(prev) = map.insert(canonical.clone(), part) {
                return Err(Error::corrupt(
                    path,
                    format!("tensors {} and {} both map to {canonical}", shown(&prev.0), shown(&e.name)),
                ));
            }
            continue;
        }
        let dtype = match e.dtype {
            ::safetensors::Dtype::F32 => DType::F32,
            ::safetensors::Dtype::F16 => DType::F16,
            ::safetensors::Dtype::BF16 => DType::BF16,
            other => {
                return Err(Error::Unsupported(format!(
                    "tensor {} in {} has dtype {other} (F32, F16 and BF16 are read)",
                    shown(&e.name),
                    path.display()
                )))
            }
        };
        let st = StoredTensor {
            file: file_index,
            offset: e.start,
            len: e.len,
            dtype,
            shape: e.shape,
            affine: None,
            pick: None,
            stack: None,
        };
        if let Some((prev, _)) = out.insert(canonical.clone(), (e.name.clone(), st)) {
            return Err(Error::corrupt(
                path,
                format!("tensors {} and {} both map to {canonical}", shown(&prev), shown(&e.name)),
            ));
        }
    }
    files.push(data);
    Ok(())
}

pub(super) struct SafetensorsEntry {
    name: String,
    dtype: ::safetensors::Dtype,
    shape: Vec<usize>,
    /// Absolute byte offset in the file.
    start: u64,
    len: usize,
}

/// Reads a safetensors header (`u64` JSON length, then the JSON) and validates it with the
/// `safetensors` crate: tensors contiguous from the start of the data, each range the size its
/// dtype and shape imply, no overflow. The data must end exactly where the file ends.
pub(super) fn read_safetensors_header(f: &DataFile) -> Result<Vec<SafetensorsEntry>> {
    let path = f.path.as_path();
    let corrupt = |msg: String| Error::corrupt(path, msg);
    if f.len < 8 {
        return Err(corrupt(format!("truncated: {} bytes, no safetensors header", f.len)));
    }
    let n = u64::from_le_bytes(f.read(0, 8)?.try_into().expect("8 bytes"));
    if n > MAX_SAFETENSORS_HEADER {
        return Err(corrupt(format!("header length {n} is above the limit of {MAX_SAFETENSORS_HEADER}")));
    }
    if n > f.len - 8 {
        return Err(corrupt(format!("header length {n} runs past the end of the file ({} bytes)", f.len)));
    }
    let header = f.read(8, n as usize)?;
    // JSON first, then what the safetensors crate makes of it (its own validation: offsets
    // contiguous from 0, each range the size its dtype and shape imply).
    let json: Value = serde_json::from_slice(&header).map_err(|e| {
        corrupt(format!("bad safetensors header JSON: {}", crate::error::one_line(&e.to_string(), 300)))
    })?;
    let meta: ::safetensors::tensor::Metadata = serde_json::from_value(json.clone()).map_err(|e| {
        let text = e.to_string();
        // Name the tensor where the crate's message does not.
        let which = match text.contains('`') {
            true => None,
            false => json.as_object().and_then(wrong_size_tensor),
        };
        let which = which.map(|t| format!(" ({t})")).unwrap_or_default();
        corrupt(format!("invalid safetensors header: {}{which}", crate::error::one_line(&text, 300)))
    })?;
    drop(json);
    let data_start = 8 + n;
    let data_len = meta.data_len() as u64;
    let have = f.len - data_start;
    if data_len > have {
        let tensors = meta.tensors();
        let mut past: Vec<_> = tensors.iter().filter(|(_, t)| t.data_offsets.1 as u64 > have).collect();
        past.sort_by_key(|(_, t)| t.data_offsets);
        let (name, t) = past[0];
        return Err(corrupt(format!(
            "tensor {}: data_offsets [{}, {}] run past the end of the data ({have} bytes after the {n}-byte header): truncated?",
            shown(name),
            t.data_offsets.0,
            t.data_offsets.1
        )));
    }
    if data_len < have {
        return Err(corrupt(format!(
            "{} bytes follow the data of the last tensor (the header accounts for {data_len} of the {have} data bytes)",
            have - data_len
        )));
    }
    let mut out = Vec::new();
    for (name, info) in meta.tensors() {
        let (begin, end) = info.data_offsets;
        if info.shape.len() > 8 {
            return Err(corrupt(format!("tensor {} has {} dimensions", shown(&name), info.shape.len())));
        }
        out.push(SafetensorsEntry {
            name,
            dtype: info.dtype,
            shape: info.shape.clone(),
            start: data_start + begin as u64,
            len: end - begin,
        });
    }
    out.sort_by_key(|e| e.start);
    Ok(out)
}

/// The first entry of a safetensors header whose byte range is not the size its dtype and shape
/// imply, described for a message (the safetensors crate's error does not name it).
pub(super) fn wrong_size_tensor(header: &Map<String, Value>) -> Option<String> {
    header.iter().filter(|(k, _)| *k != "__metadata__").find_map(|(name, v)| {
        let dtype: ::safetensors::Dtype = serde_json::from_value(v.get("dtype")?.clone()).ok()?;
        let shape: Vec<usize> = serde_json::from_value(v.get("shape")?.clone()).ok()?;
        let [begin, end]: [usize; 2] = serde_json::from_value(v.get("data_offsets")?.clone()).ok()?;
        let bits = shape.iter().try_fold(dtype.bitsize(), |a, &d| a.checked_mul(d));
        let have = end.checked_sub(begin);
        (bits.map(|b| b / 8) != have).then(|| {
            format!(
                "tensor {}: {dtype} {} needs {} bytes, data_offsets [{begin}, {end}] hold {}",
                shown(name),
                crate::loader::fmt_shape(&shape),
                bits.map_or("more than 2^64".to_string(), |b| (b / 8).to_string()),
                have.map_or("a negative count".to_string(), |h| h.to_string())
            )
        })
    })
}

/// Maps a Hugging Face tensor name to the canonical (GGUF) one; `None` for tensors the engine
/// does not use.
pub fn canonical_name(hf: &str, arch: Arch) -> Option<String> {
    let name = if let Some(r) = hf.strip_prefix("model.language_model.") {
        format!("model.{r}")
    } else if let Some(r) = hf.strip_prefix("language_model.model.") {
        format!("model.{r}")
    } else if let Some(r) = hf.strip_prefix("language_model.") {
        r.to_string()
    } else {
        hf.to_string()
    };
    match name.as_str() {
        "model.embed_tokens.weight" => return Some("token_embd.weight".into()),
        "model.embed_tokens_per_layer.weight" => return Some("per_layer_token_embd.weight".into()),
        "model.per_layer_model_projection.weight" => return Some("per_layer_model_proj.weight".into()),
        "model.per_layer_projection_norm.weight" => return Some("per_layer_proj_norm.weight".into()),
        "model.norm.weight" => return Some("output_norm.weight".into()),
        "lm_head.weight" => return Some("output.weight".into()),
        _ => {}
    }
    let rest = name.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    // Only canonical decimal (transformers' state-dict keys): "00" or "+1" name no layer.
    if layer.is_empty()
        || layer.len() > 9
        || !layer.bytes().all(|b| b.is_ascii_digit())
        || (layer.len() > 1 && layer.starts_with('0'))
    {
        return None;
    }
    let layer: usize = layer.parse().ok()?;
    // A tensor split in two by rows is named `a|b` until split_halves, an expert's `name#e` until
    // stack_experts.
    match arch::tensor_name(arch, rest)? {
        TensorName::One(n) => Some(format!("blk.{layer}.{n}")),
        TensorName::Halves(a, b) => Some(format!("blk.{layer}.{a}|{b}")),
        TensorName::Expert(n, e) => Some(format!("blk.{layer}.{n}#{e}")),
    }
}

// ---------------------------------------------------------------------------------------------
/// Stacks each expert tensor `name#e` (e = 0..E, all present, one shape and type) into `name`
/// of shape [E, ..].
pub(super) fn stack_experts(tensors: &mut HashMap<String, StoredTensor>, path: &Path) -> Result<()> {
    let mut stacks: HashMap<String, Vec<(usize, StoredTensor)>> = HashMap::new();
    let keys: Vec<String> = tensors.keys().filter(|k| k.contains('#')).cloned().collect();
    for key in keys {
        let (name, e) = key.split_once('#').expect("an expert key");
        let e: usize = e.parse().expect("written by canonical_name");
        let t = tensors.remove(&key).expect("listed");
        stacks.entry(name.to_string()).or_default().push((e, t));
    }
    for (name, mut parts) in stacks {
        parts.sort_by_key(|(e, _)| *e);
        let bad = |msg: String| Err(Error::Mismatch(format!("{}: experts of {name}: {msg}", path.display())));
        if let Some((i, (e, _))) = parts.iter().enumerate().find(|(i, (e, _))| i != e) {
            return bad(format!("expert {i} is missing (the next present is {e})"));
        }
        let first = parts[0].1.clone();
        if let Some((e, t)) = parts.iter().find(|(_, t)| t.shape != first.shape || t.dtype != first.dtype) {
            return bad(format!("expert {e} is {} {:?}, expert 0 {} {:?}", t.dtype, t.shape, first.dtype, first.shape));
        }
        let n = parts.len();
        let st = StoredTensor {
            len: first.len * n,
            shape: [n].into_iter().chain(first.shape.iter().copied()).collect(),
            pick: None,
            stack: Some(parts.into_iter().map(|(_, t)| t).collect()),
            ..first
        };
        if tensors.insert(name.clone(), st).is_some() {
            return bad("both stacked and per-expert tensors are present".into());
        }
    }
    Ok(())
}
