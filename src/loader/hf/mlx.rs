//! MLX quantized folders: each quantized layer's `weight`, `scales` and `biases` gathered into one
//! affine tensor.

use super::safetensors::{MlxParts, Part};
use crate::dtype::DType;
use crate::error::{shown, Error, Result};
use crate::loader::{AffineParts, StoredTensor};
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::path::Path;

/// Gathers each MLX quantized layer's `weight`, `scales` and `biases` into one [`DType::Affine`]
/// tensor, by config.json's `quantization` (or `quantization_config`). Errors: parts without a
/// quantization config, a config without `group_size` or `bits` (or another `mode` than affine),
/// a weight without its scales or biases (or the other way round), shapes that do not agree
/// (`weight` `[N, K·bits/32]`, `scales` and `biases` `[N, K/group]`), scales and biases of
/// different types or not f16/bf16, unsupported bits or group sizes.
pub(super) fn mlx_affine(
    root: &Map<String, Value>,
    config_path: &Path,
    mut parts: MlxParts,
    tensors: &mut HashMap<String, (String, StoredTensor)>,
) -> Result<()> {
    let q = root.get("quantization").or_else(|| root.get("quantization_config"));
    let any = [&parts.packed, &parts.scales, &parts.biases].iter().find_map(|m| m.values().next().map(|p| p.0.clone()));
    let Some(q) = q else {
        return match any {
            None => Ok(()),
            Some(name) => Err(Error::corrupt(
                config_path,
                format!(
                    "tensor {} is quantized (U32, scales, biases) but config.json has no quantization",
                    shown(&name)
                ),
            )),
        };
    };
    let bad = |msg: String| Error::corrupt(config_path, format!("quantization: {msg}"));
    let q = q.as_object().ok_or_else(|| bad("not an object".into()))?;
    if let Some(mode) = q.get("mode") {
        if mode.as_str() != Some("affine") {
            return Err(Error::Unsupported(format!(
                "quantization mode {} in {} (affine is supported)",
                shown(&mode.to_string()),
                config_path.display()
            )));
        }
    }
    let int = |o: &Map<String, Value>, key: &str, module: &str| -> Result<u64> {
        o.get(key).and_then(Value::as_u64).ok_or_else(|| bad(format!("{module}has no integer {key}")))
    };
    let (bits, group) = (int(q, "bits", "")?, int(q, "group_size", "")?);
    let mut names: Vec<String> = parts.packed.keys().cloned().collect();
    names.sort();
    for canonical in names {
        let (name, file, offset, len, st_dtype, shape) = parts.packed.remove(&canonical).expect("listed");
        let module = name.strip_suffix(".weight").unwrap_or(&name);
        let (bits, group) = match q.get(module) {
            None => (bits, group),
            Some(Value::Object(o)) => {
                (int(o, "bits", &format!("{module} "))?, int(o, "group_size", &format!("{module} "))?)
            }
            Some(Value::Bool(false)) => {
                return Err(bad(format!("{module} is not quantized, but its weight is stored as U32")));
            }
            Some(other) => return Err(bad(format!("{module}: {}", shown(&other.to_string())))),
        };
        let part = |map: &mut HashMap<String, Part>, what: &str| {
            map.remove(&canonical).ok_or_else(|| {
                Error::Mismatch(format!("{}: quantized {} has no {what}", config_path.display(), shown(&name)))
            })
        };
        let scales = part(&mut parts.scales, "scales")?;
        let biases = part(&mut parts.biases, "biases")?;
        let mismatch = |msg: String| Error::Mismatch(format!("{}: {}: {msg}", config_path.display(), shown(&name)));
        // 2-D, or stacked experts [E, N, K·bits/32] (mlx-lm's switch_mlp).
        if st_dtype != ::safetensors::Dtype::U32 || !(2..=3).contains(&shape.len()) {
            return Err(mismatch(format!("a quantized weight is 2-D (or 3-D, stacked) U32, not {st_dtype} {shape:?}")));
        }
        let (&packed, lead) = shape.split_last().expect("2-D or 3-D");
        if scales.4 != biases.4 {
            return Err(mismatch(format!("scales are {} but biases {}", scales.4, biases.4)));
        }
        let scale_type = match scales.4 {
            ::safetensors::Dtype::F16 => DType::F16,
            ::safetensors::Dtype::BF16 => DType::BF16,
            ::safetensors::Dtype::F32 => DType::F32,
            other => return Err(mismatch(format!("scales of type {other}"))),
        };
        let dtype =
            DType::affine(bits, group, scale_type).map_err(|m| Error::Unsupported(format!("{}: {m}", shown(&name))))?;
        let n: usize = lead.iter().product();
        let k = packed * 32 / bits as usize;
        let groups = k / group as usize;
        let want: Vec<usize> = lead.iter().copied().chain([groups]).collect();
        if !k.is_multiple_of(group as usize) || scales.5 != want || biases.5 != want {
            return Err(mismatch(format!(
                "weight {shape:?} ({bits}-bit: K = {k}) needs scales and biases {want:?} (group {group}), \
                 got {:?} and {:?}",
                scales.5, biases.5
            )));
        }
        let st = StoredTensor {
            file,
            offset,
            len: dtype.byte_size(n * k).expect("whole groups"),
            dtype,
            shape: lead.iter().copied().chain([k]).collect(),
            affine: Some(Box::new(AffineParts {
                weight: (file, offset, len),
                scales: (scales.1, scales.2, scales.3),
                biases: (biases.1, biases.2, biases.3),
            })),
            pick: None,
            stack: None,
        };
        if let Some((prev, _)) = tensors.insert(canonical.clone(), (name.clone(), st)) {
            return Err(mismatch(format!("{} maps to {canonical} too", shown(&prev))));
        }
    }
    if let Some((_, p)) = parts.scales.iter().chain(parts.biases.iter()).next() {
        return Err(Error::Mismatch(format!(
            "{}: {} belongs to no quantized weight",
            config_path.display(),
            shown(&p.0)
        )));
    }
    Ok(())
}
