//! The GGUF parser: a file's header (metadata and tensor infos) read and validated, bounds
//! checked against the file's length.

use super::value::{GgufType, GgufValue};
use crate::dtype::DType;
use crate::error::{shown, Error, Result};
use crate::loader::{fmt_shape, open_regular, StoredTensor};
use std::collections::HashMap;
use std::path::Path;

pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Version written by [`GgufWriter`].
pub const GGUF_VERSION: u32 = 3;
/// `general.alignment` when the key is absent.
pub const DEFAULT_ALIGNMENT: usize = 32;
/// ggml's `GGML_MAX_DIMS`.
pub(super) const MAX_DIMS: usize = 4;
/// Arrays nested deeper than this are rejected (the spec allows nesting; nobody uses it).
const MAX_NESTING: usize = 8;

/// Limits the parser applies before it allocates, each named in its error message.
pub mod limits {
    /// Metadata key length in bytes (the GGUF spec: at most 2^16 - 1).
    pub const KEY_BYTES: u64 = (1 << 16) - 1;
    /// Tensor name length in bytes (ggml's `GGML_MAX_NAME` of 64, with its NUL).
    pub const TENSOR_NAME_BYTES: u64 = 63;
    /// One string value (a chat template, a token) in bytes.
    pub const STRING_BYTES: u64 = 1 << 24;
    /// Metadata keys.
    pub const KEYS: u64 = 1 << 16;
    /// Metadata values, array elements included (real vocabularies: under 10^6 in all).
    pub const VALUES: u64 = 1 << 22;
    /// Tensors.
    pub const TENSORS: u64 = 1 << 16;
    /// `general.alignment` (the spec: a multiple of 8; ggml: a power of two).
    pub const MAX_ALIGNMENT: u64 = 1 << 20;
}

/// One tensor's description.
#[derive(Clone, Debug, PartialEq)]
pub struct GgufTensorInfo {
    pub name: String,
    pub dtype: DType,
    /// Row-major, outermost first (GGUF's `ne` reversed).
    pub shape: Vec<usize>,
    /// Absolute offset of the data in the file.
    pub offset: u64,
    /// Bytes of data.
    pub len: usize,
}

impl GgufTensorInfo {
    /// The tensor as stored in file 0 of a [`Checkpoint`](crate::loader::Checkpoint).
    pub(super) fn stored(&self) -> StoredTensor {
        StoredTensor {
            file: 0,
            offset: self.offset,
            len: self.len,
            dtype: self.dtype,
            shape: self.shape.clone(),
            affine: None,
            pick: None,
            stack: None,
        }
    }
}

/// The header of a GGUF file: metadata and tensor infos, validated against the file's length.
#[derive(Clone, Debug)]
pub struct GgufFile {
    pub version: u32,
    /// In file order.
    pub metadata: Vec<(String, GgufValue)>,
    /// In file order.
    pub tensors: Vec<GgufTensorInfo>,
    pub alignment: usize,
    /// Absolute offset of the tensor data section.
    pub data_offset: u64,
    /// Bytes of header read (the header ends here; `data_offset` is this aligned up).
    pub header_len: u64,
    key_index: HashMap<String, usize>,
}

impl GgufFile {
    /// Parses and validates a whole GGUF file held in `bytes` (`path` only names it in errors).
    pub fn parse(bytes: &[u8], path: &Path) -> Result<GgufFile> {
        GgufFile::parse_from(bytes, bytes.len() as u64, path)
    }

    /// Parses and validates the header of a GGUF file of `file_len` bytes, reading it in order
    /// from `src` and nothing past the tensor infos. Every count, length, dimension and offset is
    /// checked (in checked arithmetic, against [`limits`] and against `file_len`) before it sizes
    /// anything, and the tensors' data must tile the data section: each tensor at the aligned
    /// end of the one before it (so no two overlap and a type or size changed to another fails),
    /// the first at the start, the last ending within one alignment of the end of the file.
    pub fn parse_from(src: impl std::io::Read, file_len: u64, path: &Path) -> Result<GgufFile> {
        let mut r = Reader { src, pos: 0, len: file_len, path, values: 0 };
        let magic = r.arr::<4>("magic")?;
        if magic != GGUF_MAGIC {
            let hex: String = magic.iter().map(|b| format!("{b:02x}")).collect();
            return Err(r.corrupt(format!("not a GGUF file (first bytes {hex}, want 47475546 \"GGUF\")")));
        }
        let version = r.u32("version")?;
        match version {
            2 | 3 => {}
            1 => return Err(Error::Unsupported(format!("{}: GGUF version 1", path.display()))),
            v if v.swap_bytes() <= 3 => return Err(Error::Unsupported(format!("{}: big-endian GGUF", path.display()))),
            v => return Err(Error::Unsupported(format!("{}: GGUF version {v}", path.display()))),
        }
        let n_tensors = r.u64("tensor count")?;
        let n_kv = r.u64("metadata count")?;
        // Each kv takes at least 13 bytes, each tensor info at least 24.
        for (what, n, limit, min) in
            [("metadata count", n_kv, limits::KEYS, 13), ("tensor count", n_tensors, limits::TENSORS, 24)]
        {
            if n > limit {
                return Err(r.corrupt(format!("{what} {n} is above the limit of {limit}")));
            }
            if n > r.remaining() / min {
                return Err(r.corrupt(format!("{what} {n} does not fit in the file ({file_len} bytes)")));
            }
        }

        let mut metadata = Vec::with_capacity(n_kv as usize);
        let mut key_index = HashMap::with_capacity(n_kv as usize);
        for i in 0..n_kv as usize {
            let key = r.string("metadata key", limits::KEY_BYTES)?;
            let ty = r.u32("metadata value type")?;
            let value = r.value(ty, &key, 0)?;
            if key_index.insert(key.clone(), i).is_some() {
                return Err(r.corrupt(format!("duplicate metadata key {}", shown(&key))));
            }
            metadata.push((key, value));
        }

        let alignment = match metadata_get(&metadata, &key_index, "general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => match v.as_u64() {
                Some(a) if a >= 8 && a.is_power_of_two() && a <= limits::MAX_ALIGNMENT => a as usize,
                _ => {
                    return Err(r.corrupt(format!(
                        "general.alignment is {}; it must be a power of two from 8 to {}",
                        v.describe(),
                        limits::MAX_ALIGNMENT
                    )))
                }
            },
        };

        struct RawInfo {
            name: String,
            dtype: DType,
            shape: Vec<usize>,
            rel: u64,
            len: usize,
        }
        let mut raw = Vec::with_capacity(n_tensors as usize);
        let mut names = std::collections::HashSet::with_capacity(n_tensors as usize);
        for _ in 0..n_tensors {
            let name = r.string("tensor name", limits::TENSOR_NAME_BYTES)?;
            let n_dims = r.u32("tensor dimension count")?;
            if n_dims as usize > MAX_DIMS {
                return Err(r.corrupt(format!("tensor {} has {n_dims} dimensions (at most {MAX_DIMS})", shown(&name))));
            }
            let mut ne = [0u64; MAX_DIMS];
            for d in ne.iter_mut().take(n_dims as usize) {
                *d = r.u64("tensor dimension")?;
            }
            let ne = &ne[..n_dims as usize];
            let ty = r.u32("tensor type")?;
            let rel = r.u64("tensor offset")?;
            let dtype = DType::from_ggml_type(ty).ok_or_else(|| {
                Error::Unsupported(format!(
                    "tensor {} in {} has ggml type {ty} ({}), which this engine does not read",
                    shown(&name),
                    path.display(),
                    ggml_type_name(ty)
                ))
            })?;
            let dims_err = || r.corrupt(format!("tensor {} dimensions {} overflow", shown(&name), fmt_shape(ne)));
            let mut numel: usize = 1;
            for &d in ne {
                numel = usize::try_from(d).ok().and_then(|d| numel.checked_mul(d)).ok_or_else(dims_err)?;
            }
            let inner = ne.first().copied().unwrap_or(1);
            if inner % dtype.block_size() as u64 != 0 {
                return Err(r.corrupt(format!(
                    "tensor {}: row length {inner} is not a multiple of the {dtype} block size {}",
                    shown(&name),
                    dtype.block_size()
                )));
            }
            let len = dtype.byte_size(numel).ok_or_else(dims_err)?;
            if !names.insert(name.clone()) {
                return Err(r.corrupt(format!("duplicate tensor {}", shown(&name))));
            }
            let shape = ne.iter().rev().map(|&d| d as usize).collect();
            raw.push(RawInfo { name, dtype, shape, rel, len });
        }
        drop(names);

        let header_len = r.pos;
        let data_offset = header_len.div_ceil(alignment as u64) * alignment as u64;
        let data_len = file_len.saturating_sub(data_offset);
        if !raw.is_empty() && data_offset > file_len {
            return Err(r.corrupt(format!(
                "tensor data section starts at {data_offset}, past the end of the file ({file_len} bytes): truncated?"
            )));
        }
        // Each tensor inside the file and aligned...
        for t in &raw {
            let end = t.rel.checked_add(t.len as u64);
            if end.is_none_or(|e| e > data_len) {
                return Err(r.corrupt(format!(
                    "tensor {} data ({} bytes at data offset {}) extends past the end of the file ({file_len} bytes): truncated?",
                    shown(&t.name),
                    t.len,
                    t.rel
                )));
            }
            if t.rel % alignment as u64 != 0 {
                return Err(r.corrupt(format!(
                    "tensor {} data offset {} is not a multiple of the alignment {alignment}",
                    shown(&t.name),
                    t.rel
                )));
            }
        }
        // ...and the tensors tiling the data section in offset order.
        let mut order: Vec<usize> = (0..raw.len()).collect();
        order.sort_by_key(|&i| raw[i].rel);
        let mut expect = 0u64; // the aligned end of the previous tensor
        let mut prev: Option<&RawInfo> = None;
        for &i in &order {
            let t = &raw[i];
            if t.rel != expect {
                let after = match prev {
                    None => "the start of the data section".to_string(),
                    Some(p) => format!("tensor {} ({} bytes at data offset {})", shown(&p.name), p.len, p.rel),
                };
                let what = if t.rel < expect { "overlaps" } else { "leaves a gap after" };
                return Err(r.corrupt(format!(
                    "tensor {} at data offset {} {what} {after}; the next aligned offset is {expect} \
                     (wrong offset, type or shape, or wrong general.alignment?)",
                    shown(&t.name),
                    t.rel
                )));
            }
            let end = t.rel + t.len as u64;
            expect = end.div_ceil(alignment as u64) * alignment as u64;
            prev = Some(t);
        }
        if let Some(last) = prev {
            let end = data_offset + last.rel + last.len as u64;
            let trailing = file_len - end;
            if trailing >= alignment as u64 {
                return Err(r.corrupt(format!(
                    "{trailing} bytes follow the data of the last tensor {} (at most {} of padding expected): \
                     wrong offsets, types or shapes, or wrong general.alignment?",
                    shown(&last.name),
                    alignment - 1
                )));
            }
        }

        let tensors = raw
            .into_iter()
            .map(|t| GgufTensorInfo {
                name: t.name,
                dtype: t.dtype,
                shape: t.shape,
                offset: data_offset + t.rel,
                len: t.len,
            })
            .collect();
        Ok(GgufFile { version, metadata, tensors, alignment, data_offset, header_len, key_index })
    }

    /// Reads and parses the header of a GGUF file: nothing past the tensor infos is read.
    pub fn read(path: &Path) -> Result<GgufFile> {
        let (file, len) = open_regular(path)?;
        GgufFile::parse_from(std::io::BufReader::with_capacity(1 << 20, file), len, path)
    }

    /// A metadata value by key.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        metadata_get(&self.metadata, &self.key_index, key)
    }

    pub fn tensor(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

fn metadata_get<'a>(md: &'a [(String, GgufValue)], index: &HashMap<String, usize>, key: &str) -> Option<&'a GgufValue> {
    index.get(key).map(|&i| &md[i].1)
}

/// ggml's name of a type id, for messages about types this engine does not read.
fn ggml_type_name(id: u32) -> &'static str {
    const NAMES: [&str; 42] = [
        "f32",
        "f16",
        "q4_0",
        "q4_1",
        "q4_2 (removed)",
        "q4_3 (removed)",
        "q5_0",
        "q5_1",
        "q8_0",
        "q8_1",
        "q2_K",
        "q3_K",
        "q4_K",
        "q5_K",
        "q6_K",
        "q8_K",
        "iq2_xxs",
        "iq2_xs",
        "iq3_xxs",
        "iq1_s",
        "iq4_nl",
        "iq3_s",
        "iq2_s",
        "iq4_xs",
        "i8",
        "i16",
        "i32",
        "i64",
        "f64",
        "iq1_m",
        "bf16",
        "q4_0_4_4 (removed)",
        "q4_0_4_8 (removed)",
        "q4_0_8_8 (removed)",
        "tq1_0",
        "tq2_0",
        "iq4_nl_4_4 (removed)",
        "iq4_nl_4_8 (removed)",
        "iq4_nl_8_8 (removed)",
        "mxfp4",
        "nvfp4",
        "?",
    ];
    NAMES.get(id as usize).copied().unwrap_or("unknown")
}

/// Bounds-checked little-endian reader: every length is checked against what is left of the
/// file before anything is allocated for it.
struct Reader<'a, R> {
    src: R,
    pos: u64,
    len: u64,
    path: &'a Path,
    /// Metadata values read so far (against [`limits::VALUES`]).
    values: u64,
}

impl<R: std::io::Read> Reader<'_, R> {
    fn corrupt(&self, msg: impl Into<String>) -> Error {
        Error::corrupt(self.path, msg)
    }
    fn remaining(&self) -> u64 {
        self.len.saturating_sub(self.pos)
    }
    fn truncated(&self, what: &str, n: u64) -> Error {
        self.corrupt(format!("truncated: {what} needs {n} bytes at offset {}, the file has {}", self.pos, self.len))
    }
    fn fill(&mut self, buf: &mut [u8], what: &str) -> Result<()> {
        let n = buf.len() as u64;
        if n > self.remaining() {
            return Err(self.truncated(what, n));
        }
        self.src.read_exact(buf).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => self.corrupt(format!(
                "the file ended at offset {} while reading {what}: it changed while being read?",
                self.pos
            )),
            _ => Error::io(self.path, e),
        })?;
        self.pos += n;
        Ok(())
    }
    fn arr<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        self.fill(&mut a, what)?;
        Ok(a)
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.arr(what)?))
    }
    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.arr(what)?))
    }
    /// A string of at most `limit` bytes.
    fn string(&mut self, what: &str, limit: u64) -> Result<String> {
        let len = self.u64(what)?;
        if len > limit {
            return Err(self.corrupt(format!(
                "{what} at offset {} is {len} bytes long, above the limit of {limit}",
                self.pos - 8
            )));
        }
        if len > self.remaining() {
            return Err(self.truncated(what, len));
        }
        let mut b = vec![0u8; len as usize];
        self.fill(&mut b, what)?;
        // Strings should be UTF-8; a stray invalid byte in a vocabulary is not worth refusing
        // the model over.
        Ok(String::from_utf8(b).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
    }

    fn value(&mut self, id: u32, key: &str, depth: usize) -> Result<GgufValue> {
        use GgufType as t;
        self.values += 1;
        if self.values > limits::VALUES {
            return Err(self.corrupt(format!(
                "metadata {} takes the metadata past the limit of {} values",
                shown(key),
                limits::VALUES
            )));
        }
        let what = || format!("metadata {}", shown(key));
        let Some(ty) = GgufType::from_id(id) else {
            return Err(self.corrupt(format!("{}: unknown value type {id}", what())));
        };
        Ok(match ty {
            t::U8 => GgufValue::U8(self.arr::<1>(&what())?[0]),
            t::I8 => GgufValue::I8(self.arr::<1>(&what())?[0] as i8),
            t::U16 => GgufValue::U16(u16::from_le_bytes(self.arr(&what())?)),
            t::I16 => GgufValue::I16(i16::from_le_bytes(self.arr(&what())?)),
            t::U32 => GgufValue::U32(u32::from_le_bytes(self.arr(&what())?)),
            t::I32 => GgufValue::I32(i32::from_le_bytes(self.arr(&what())?)),
            t::F32 => GgufValue::F32(f32::from_le_bytes(self.arr(&what())?)),
            t::Bool => match self.arr::<1>(&what())?[0] {
                0 => GgufValue::Bool(false),
                1 => GgufValue::Bool(true),
                b => return Err(self.corrupt(format!("{}: bool byte {b}", what()))),
            },
            t::String => GgufValue::String(self.string(&what(), limits::STRING_BYTES)?),
            t::U64 => GgufValue::U64(u64::from_le_bytes(self.arr(&what())?)),
            t::I64 => GgufValue::I64(i64::from_le_bytes(self.arr(&what())?)),
            t::F64 => GgufValue::F64(f64::from_le_bytes(self.arr(&what())?)),
            t::Array => {
                if depth >= MAX_NESTING {
                    return Err(self.corrupt(format!("{}: arrays nested too deep", what())));
                }
                let elem = self.u32(&what())?;
                let count = self.u64(&what())?;
                let min = match GgufType::from_id(elem) {
                    Some(t::U8 | t::I8 | t::Bool) => 1,
                    Some(t::U16 | t::I16) => 2,
                    Some(t::U32 | t::I32 | t::F32) => 4,
                    Some(t::U64 | t::I64 | t::F64 | t::String) => 8,
                    Some(t::Array) => 12,
                    None => return Err(self.corrupt(format!("{}: unknown array element type {elem}", what()))),
                };
                if count > limits::VALUES {
                    return Err(self.corrupt(format!(
                        "{}: array of {count} elements is above the limit of {} values",
                        what(),
                        limits::VALUES
                    )));
                }
                if count > self.remaining() / min {
                    return Err(self.corrupt(format!(
                        "truncated: {} array of {count} elements runs past the end of the file",
                        what()
                    )));
                }
                // Grown as elements are read, so memory follows the bytes actually present.
                let mut v = Vec::with_capacity((count as usize).min(1 << 16));
                for _ in 0..count {
                    v.push(self.value(elem, key, depth + 1)?);
                }
                GgufValue::Array(v)
            }
        })
    }
}
