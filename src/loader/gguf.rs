//! GGUF (v2 and v3): a bounds-checked parser over a memory map, the [`Checkpoint`] builder for
//! GGUF files ([`open`]), and a writer ([`GgufWriter`]) for synthetic test/benchmark models.
//!
//! File layout (all little endian):
//! ```text
//! magic "GGUF" | version u32 | tensor_count u64 | kv_count u64
//! kv_count × { key: string, value_type: u32, value }
//! tensor_count × { name: string, n_dims: u32, ne: [u64; n_dims], ggml_type: u32, offset: u64 }
//! padding to `general.alignment` (default 32) | tensor data (each offset relative to here)
//! string = len u64 + UTF-8 bytes; array = elem_type u32 + count u64 + elems
//! ```
//! GGUF dims are ggml's `ne`, innermost first; [`GgufTensorInfo::shape`] is reversed to the
//! crate's row-major, outermost-first convention (a linear weight is `[out, in]`).

use super::{
    capped, check_layer_count, check_tensors, fmt_shape, limits as cfg_limits, open_regular, Checkpoint, DType,
    DataFile, Fixup, StoredTensor, TokenizerSource,
};
use crate::error::{shown, Error, Result};
use crate::model::arch::{self, Hyperparams};
use crate::model::config::{Arch, LayerAttention, Mixer, MlpSpec, ModelConfig};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Version written by [`GgufWriter`].
pub const GGUF_VERSION: u32 = 3;
/// `general.alignment` when the key is absent.
pub const DEFAULT_ALIGNMENT: usize = 32;
/// ggml's `GGML_MAX_DIMS`.
const MAX_DIMS: usize = 4;
/// Arrays nested deeper than this are rejected (the spec allows nesting; nobody uses it).
const MAX_NESTING: usize = 8;

// ---------------------------------------------------------------------------------------------
// Metadata values
// ---------------------------------------------------------------------------------------------

/// A GGUF metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    /// All elements have one type (the writer panics otherwise); an empty array is written
    /// as an array of u8.
    Array(Vec<GgufValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// GGUF value type ids (`enum gguf_type`).
pub mod value_type {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

impl GgufValue {
    /// The GGUF value type id.
    pub fn type_id(&self) -> u32 {
        use value_type as t;
        match self {
            GgufValue::U8(_) => t::U8,
            GgufValue::I8(_) => t::I8,
            GgufValue::U16(_) => t::U16,
            GgufValue::I16(_) => t::I16,
            GgufValue::U32(_) => t::U32,
            GgufValue::I32(_) => t::I32,
            GgufValue::F32(_) => t::F32,
            GgufValue::Bool(_) => t::BOOL,
            GgufValue::String(_) => t::STRING,
            GgufValue::Array(_) => t::ARRAY,
            GgufValue::U64(_) => t::U64,
            GgufValue::I64(_) => t::I64,
            GgufValue::F64(_) => t::F64,
        }
    }

    /// Any integer value (not bool, not float) as u64, if non-negative.
    pub fn as_u64(&self) -> Option<u64> {
        self.as_i128().and_then(|v| u64::try_from(v).ok())
    }

    /// Any integer value as i64, if it fits.
    pub fn as_i64(&self) -> Option<i64> {
        self.as_i128().and_then(|v| i64::try_from(v).ok())
    }

    fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            GgufValue::U8(v) => v as i128,
            GgufValue::I8(v) => v as i128,
            GgufValue::U16(v) => v as i128,
            GgufValue::I16(v) => v as i128,
            GgufValue::U32(v) => v as i128,
            GgufValue::I32(v) => v as i128,
            GgufValue::U64(v) => v as i128,
            GgufValue::I64(v) => v as i128,
            _ => return None,
        })
    }

    /// Any float or integer value as f64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v as f64),
            GgufValue::F64(v) => Some(v),
            _ => self.as_i128().map(|v| v as f64),
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }

    /// Short description for error messages: the value (strings quoted and cut short, arrays
    /// by length) and its type.
    pub fn describe(&self) -> String {
        match self {
            GgufValue::U8(v) => format!("{v} (u8)"),
            GgufValue::I8(v) => format!("{v} (i8)"),
            GgufValue::U16(v) => format!("{v} (u16)"),
            GgufValue::I16(v) => format!("{v} (i16)"),
            GgufValue::U32(v) => format!("{v} (u32)"),
            GgufValue::I32(v) => format!("{v} (i32)"),
            GgufValue::U64(v) => format!("{v} (u64)"),
            GgufValue::I64(v) => format!("{v} (i64)"),
            GgufValue::F32(v) => format!("{v} (f32)"),
            GgufValue::F64(v) => format!("{v} (f64)"),
            GgufValue::Bool(v) => format!("{v} (bool)"),
            GgufValue::String(s) if s.len() > 40 => format!("a string of {} bytes", s.len()),
            GgufValue::String(s) => format!("the string {}", crate::error::one_line(&format!("{s:?}"), 200)),
            GgufValue::Array(a) => format!("an array of {} elements", a.len()),
        }
    }
}

macro_rules! value_from {
    ($($t:ty => $v:ident),*) => {$(
        impl From<$t> for GgufValue {
            fn from(x: $t) -> Self { GgufValue::$v(x) }
        }
        impl From<Vec<$t>> for GgufValue {
            fn from(x: Vec<$t>) -> Self { GgufValue::Array(x.into_iter().map(GgufValue::$v).collect()) }
        }
        impl From<&[$t]> for GgufValue {
            fn from(x: &[$t]) -> Self { GgufValue::Array(x.iter().cloned().map(GgufValue::$v).collect()) }
        }
    )*};
}
value_from!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, f32 => F32,
    bool => Bool, String => String, u64 => U64, i64 => I64, f64 => F64);

impl From<&str> for GgufValue {
    fn from(x: &str) -> Self {
        GgufValue::String(x.to_string())
    }
}
impl From<Vec<&str>> for GgufValue {
    fn from(x: Vec<&str>) -> Self {
        GgufValue::Array(x.into_iter().map(GgufValue::from).collect())
    }
}
impl From<&[&str]> for GgufValue {
    fn from(x: &[&str]) -> Self {
        GgufValue::Array(x.iter().map(|s| GgufValue::from(*s)).collect())
    }
}

// ---------------------------------------------------------------------------------------------
// Parsed file
// ---------------------------------------------------------------------------------------------

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
    /// The tensor as stored in file 0 of a [`Checkpoint`].
    fn stored(&self) -> StoredTensor {
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

    fn value(&mut self, ty: u32, key: &str, depth: usize) -> Result<GgufValue> {
        use value_type as t;
        self.values += 1;
        if self.values > limits::VALUES {
            return Err(self.corrupt(format!(
                "metadata {} takes the metadata past the limit of {} values",
                shown(key),
                limits::VALUES
            )));
        }
        let what = || format!("metadata {}", shown(key));
        Ok(match ty {
            t::U8 => GgufValue::U8(self.arr::<1>(&what())?[0]),
            t::I8 => GgufValue::I8(self.arr::<1>(&what())?[0] as i8),
            t::U16 => GgufValue::U16(u16::from_le_bytes(self.arr(&what())?)),
            t::I16 => GgufValue::I16(i16::from_le_bytes(self.arr(&what())?)),
            t::U32 => GgufValue::U32(u32::from_le_bytes(self.arr(&what())?)),
            t::I32 => GgufValue::I32(i32::from_le_bytes(self.arr(&what())?)),
            t::F32 => GgufValue::F32(f32::from_le_bytes(self.arr(&what())?)),
            t::BOOL => match self.arr::<1>(&what())?[0] {
                0 => GgufValue::Bool(false),
                1 => GgufValue::Bool(true),
                b => return Err(self.corrupt(format!("{}: bool byte {b}", what()))),
            },
            t::STRING => GgufValue::String(self.string(&what(), limits::STRING_BYTES)?),
            t::U64 => GgufValue::U64(u64::from_le_bytes(self.arr(&what())?)),
            t::I64 => GgufValue::I64(i64::from_le_bytes(self.arr(&what())?)),
            t::F64 => GgufValue::F64(f64::from_le_bytes(self.arr(&what())?)),
            t::ARRAY => {
                if depth >= MAX_NESTING {
                    return Err(self.corrupt(format!("{}: arrays nested too deep", what())));
                }
                let elem = self.u32(&what())?;
                let count = self.u64(&what())?;
                let min = match elem {
                    t::U8 | t::I8 | t::BOOL => 1,
                    t::U16 | t::I16 => 2,
                    t::U32 | t::I32 | t::F32 => 4,
                    t::U64 | t::I64 | t::F64 | t::STRING => 8,
                    t::ARRAY => 12,
                    other => return Err(self.corrupt(format!("{}: unknown array element type {other}", what()))),
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
            other => return Err(self.corrupt(format!("{}: unknown value type {other}", what()))),
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Tokenizer data
// ---------------------------------------------------------------------------------------------

/// GGUF token types (`tokenizer.ggml.token_type`, llama.cpp's `llama_token_type`).
pub mod token_type {
    pub const UNDEFINED: i32 = 0;
    pub const NORMAL: i32 = 1;
    pub const UNKNOWN: i32 = 2;
    /// Special/control tokens (`<|im_end|>`, `<bos>`, ...): never produced by splitting text.
    pub const CONTROL: i32 = 3;
    pub const USER_DEFINED: i32 = 4;
    pub const UNUSED: i32 = 5;
    /// SentencePiece byte-fallback tokens `<0x00>`..`<0xFF>`.
    pub const BYTE: i32 = 6;
}

/// Everything GGUF's `tokenizer.ggml.*` metadata says, as owned copies. The tokenizer is built
/// from this (see `crate::tokenizer`). Ids are validated to be inside `tokens` when `tokens`
/// is not empty.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GgufTokenizerData {
    /// `tokenizer.ggml.model`: `"gpt2"` (byte-level BPE: SmolLM2, Qwen, Llama 3) or `"llama"`
    /// (SentencePiece: Gemma, Llama 2). Empty when the file has no tokenizer.
    pub model: String,
    /// `tokenizer.ggml.pre`: the pre-tokenizer (regex split) name for BPE models, such as
    /// `"smollm"`, `"qwen2"`, `"llama-bpe"`, `"default"`.
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`: the vocabulary, indexed by token id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.scores` (SentencePiece piece scores); empty when absent, else one per token.
    pub scores: Vec<f32>,
    /// `tokenizer.ggml.token_type` (see [`token_type`]); empty when absent, else one per token.
    pub token_types: Vec<i32>,
    /// `tokenizer.ggml.merges`: BPE merges in priority order, each `"left right"`.
    pub merges: Vec<String>,
    /// `tokenizer.ggml.bos_token_id`
    pub bos_token_id: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`
    pub eos_token_id: Option<u32>,
    /// `tokenizer.ggml.eot_token_id` (end of turn)
    pub eot_token_id: Option<u32>,
    /// `tokenizer.ggml.eom_token_id` (end of message)
    pub eom_token_id: Option<u32>,
    /// `tokenizer.ggml.unknown_token_id`
    pub unknown_token_id: Option<u32>,
    /// `tokenizer.ggml.padding_token_id`
    pub padding_token_id: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`, defaulted when absent: true for the `"llama"`
    /// (SentencePiece) model and for Gemma 3, false otherwise.
    pub add_bos_token: bool,
    /// `tokenizer.ggml.add_eos_token` (default false).
    pub add_eos_token: bool,
    /// `tokenizer.ggml.add_space_prefix` (SentencePiece's "▁" prefix), if stated.
    pub add_space_prefix: Option<bool>,
}

impl GgufTokenizerData {
    /// A stand-in vocabulary for synthetic files that carry no real tokenizer but must satisfy
    /// llama.cpp (which wants as many tokens as embedding rows): SentencePiece model `"llama"`,
    /// tokens `<t0>`..`<tN>`, the first four control tokens (pad 0, eos 1, bos 2, unk 3).
    pub fn placeholder(vocab: usize) -> Self {
        GgufTokenizerData {
            model: "llama".into(),
            pre: Some("default".into()),
            tokens: (0..vocab).map(|i| format!("<t{i}>")).collect(),
            scores: vec![0.0; vocab],
            token_types: (0..vocab).map(|i| if i < 4 { 3 } else { 1 }).collect(),
            padding_token_id: Some(0),
            eos_token_id: Some(1),
            bos_token_id: Some(2),
            unknown_token_id: Some(3),
            add_bos_token: true,
            ..Default::default()
        }
    }

    /// The id of a token string, by linear search.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.tokens.iter().position(|t| t == token).map(|i| i as u32)
    }
}

// ---------------------------------------------------------------------------------------------
// Checkpoint
// ---------------------------------------------------------------------------------------------

/// Token strings that end a turn in the chat templates of the supported families; their ids
/// (when in the vocabulary) join `eos_token_ids`.
pub(crate) const END_OF_TURN_TOKENS: [&str; 4] = ["<|im_end|>", "<|endoftext|>", "<end_of_turn>", "<|eot_id|>"];

/// Opens a GGUF checkpoint: parses and validates the file, builds the [`ModelConfig`] from the
/// metadata and registers the tensors under their GGUF names.
pub fn open(path: &Path) -> Result<Checkpoint> {
    let (file, len) = open_regular(path)?;
    let g = GgufFile::parse_from(std::io::BufReader::with_capacity(1 << 20, &file), len, path)?;
    match g.get("general.architecture").and_then(GgufValue::as_str) {
        Some("qwen35moe") => return open_qwen35moe(&g, DataFile::file(path, file, len), path),
        Some("gemma4") => return open_gemma4(&g, DataFile::file(path, file, len), path),
        _ => {}
    }
    let (config, tok) = build_config(&g, path)?;
    let tensors: HashMap<String, StoredTensor> = g.tensors.iter().map(|t| (t.name.clone(), t.stored())).collect();
    check_tensors(&config, &tensors, path)?;

    let mut fixups = HashMap::new();
    if arch::gguf_permuted_qk(config.arch) {
        // llama.cpp's converter interleaves the rotary halves of Q and K rows (`permute`).
        for (i, spec) in config.layers.iter().enumerate() {
            if let Mixer::Attention(a) = spec.mixer {
                fixups.insert(format!("blk.{i}.attn_q.weight"), Fixup::UnpermuteRope { heads: a.heads });
                fixups.insert(format!("blk.{i}.attn_k.weight"), Fixup::UnpermuteRope { heads: a.kv_heads });
            }
        }
    }

    let token_str = |id: Option<u32>| id.and_then(|i| tok.tokens.get(i as usize)).cloned();
    let bos_token = token_str(tok.bos_token_id);
    let eos_token = token_str(tok.eos_token_id);
    let m = Meta { g: &g, path, arch: "" };
    let chat_template = m.opt_str("tokenizer.chat_template")?.map(str::to_string);

    Ok(Checkpoint {
        path: path.to_path_buf(),
        config,
        tokenizer: TokenizerSource::Gguf(tok),
        chat_template,
        bos_token,
        eos_token,
        tensors,
        files: vec![DataFile::file(path, file, len)],
        fixups,
    })
}

/// A `qwen35moe` GGUF (llama.cpp's Qwen3.5-MoE layout): the config from its metadata, its
/// tensors under the engine's names. llama.cpp's converter stores the `(1 + w)` norms with the 1
/// added, `ssm_a = -exp(A_log)` (undone by [`Fixup::LnNeg`]), q and its output gate fused per
/// head in `attn_q` (split as transformers' `q_proj` is), and the linear layers' value heads
/// tiled over the key heads ([`DeltaNetSpec::kv_tiled`](crate::model::config::DeltaNetSpec)),
/// which the engine runs as stored.
fn open_qwen35moe(g: &GgufFile, data: DataFile, path: &Path) -> Result<Checkpoint> {
    use crate::model::qwen3_5_moe::Qwen35MoeConfig;
    let m = Meta { g, path, arch: "qwen35moe" };
    let mismatch = |msg: String| Error::Mismatch(format!("{}: {msg}", path.display()));
    let layers_key = m.key("block_count");
    let num_layers = m.req_capped(&layers_key, cfg_limits::LAYERS)?;
    check_layer_count(g.tensors.iter().map(|t| t.name.as_str()), num_layers, &layers_key, path)?;
    let heads = m.req_capped(&m.key("attention.head_count"), cfg_limits::HEADS)?;
    let head_dim = m.req_capped(&m.key("attention.key_length"), cfg_limits::HEAD_DIM)?;
    if let Some(vd) = m.opt_usize(&m.key("attention.value_length"))? {
        if vd != head_dim {
            return Err(mismatch(format!("attention.value_length {vd} differs from attention.key_length {head_dim}")));
        }
    }
    let rot = m.opt_usize(&m.key("rope.dimension_count"))?.unwrap_or(head_dim / 4);
    // Full attention layers: those `attention.recurrent_layers` marks false, else every
    // `full_attention_interval`-th (default 4).
    let full_attention: Vec<bool> = match m.opt_array(&m.key("attention.recurrent_layers"))? {
        Some(a) => {
            if a.len() != num_layers {
                return Err(mismatch(format!(
                    "attention.recurrent_layers has {} entries for {num_layers} layers",
                    a.len()
                )));
            }
            a.iter()
                .map(|v| v.as_bool().map(|r| !r).ok_or_else(|| m.wrong("attention.recurrent_layers", "bools", v)))
                .collect::<Result<_>>()?
        }
        None => {
            let interval = m.opt_usize(&m.key("full_attention_interval"))?.unwrap_or(4).max(1);
            (0..num_layers).map(|i| (i + 1) % interval == 0).collect()
        }
    };
    let req = |k: &str, limit| m.req_capped(&m.key(k), limit);
    let v_heads = req("ssm.time_step_rank", cfg_limits::HEADS)?;
    let inner = req("ssm.inner_size", cfg_limits::INTERMEDIATE)?;
    if v_heads == 0 || inner % v_heads != 0 {
        return Err(mismatch(format!("ssm.inner_size {inner} is not a multiple of ssm.time_step_rank {v_heads}")));
    }
    let no_vocab = m.opt_str("tokenizer.ggml.model")? == Some("none");
    let tok = if no_vocab { None } else { Some(tokenizer_data(&m, Arch::Qwen35Moe)?) };
    let vocab_size = vocab_rows(g, tok.as_ref(), path)?;
    let q = Qwen35MoeConfig {
        vocab_size,
        hidden_size: req("embedding_length", cfg_limits::HIDDEN)?,
        rms_norm_eps: m.opt_f32(&m.key("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-6),
        max_position_embeddings: req("context_length", cfg_limits::CONTEXT)?,
        tie_word_embeddings: g.tensor("output.weight").is_none(),
        num_attention_heads: heads,
        num_key_value_heads: m.opt_usize(&m.key("attention.head_count_kv"))?.unwrap_or(heads),
        head_dim,
        rope_theta: m.opt_f32(&m.key("rope.freq_base"))?.unwrap_or(10_000_000.0),
        partial_rotary_factor: rot as f32 / head_dim.max(1) as f32,
        full_attention,
        linear_num_key_heads: req("ssm.group_count", cfg_limits::HEADS)?,
        linear_num_value_heads: v_heads,
        linear_key_head_dim: req("ssm.state_size", cfg_limits::HEAD_DIM)?,
        linear_value_head_dim: inner / v_heads,
        linear_conv_kernel_dim: m.req_capped(&m.key("ssm.conv_kernel"), 64)?,
        num_experts: req("expert_count", cfg_limits::EXPERTS)?,
        num_experts_per_tok: req("expert_used_count", cfg_limits::EXPERTS)?,
        moe_intermediate_size: req("expert_feed_forward_length", cfg_limits::INTERMEDIATE)?,
        shared_expert_intermediate_size: m
            .opt_usize(&m.key("expert_shared_feed_forward_length"))?
            .map(|v| capped(path, "expert_shared_feed_forward_length", v, cfg_limits::INTERMEDIATE))
            .transpose()?
            .unwrap_or(0),
        attention_bias: false,
        value_heads_tiled: true,
    };
    if q.rotary_dim() != rot || rot < 2 || rot % 2 != 0 || rot > head_dim {
        return Err(mismatch(format!("rope.dimension_count {rot} of head dimension {head_dim}")));
    }

    let mut config = q.model_config();
    if let Some(t) = &tok {
        config.bos_token_id = t.bos_token_id;
        config.eos_token_ids = stop_ids(t);
        config.add_bos = t.add_bos_token;
    }
    // llama.cpp's names -> the engine's; `a|b` names are split into halves below.
    let mut tensors = HashMap::new();
    let mut fixups = HashMap::new();
    for t in &g.tensors {
        let st = t.stored();
        let (layer, rest) = match t.name.strip_prefix("blk.").and_then(|r| r.split_once('.')) {
            Some((l, rest)) => (Some(l), rest),
            None => (None, t.name.as_str()),
        };
        let full = layer.and_then(|l| l.parse::<usize>().ok()).is_some_and(|l| q.full_attention.get(l) == Some(&true));
        let canonical = match rest {
            "post_attention_norm.weight" => "ffn_norm.weight",
            "attn_q.weight" if full => "attn_q.weight|attn_out_gate.weight",
            "attn_qkv.weight" => "ssm_in_qkv.weight",
            "attn_gate.weight" => "ssm_in_z.weight",
            "ssm_dt.bias" => "ssm_dt_bias.weight",
            "ssm_a" => "ssm_a_log.weight",
            other => other,
        };
        let name = match layer {
            Some(l) => format!("blk.{l}.{canonical}"),
            None => canonical.to_string(),
        };
        let st = if rest == "ffn_gate_inp_shexp.weight" && st.shape.len() == 1 {
            StoredTensor { shape: vec![1, st.shape[0]], ..st }
        } else {
            st
        };
        if rest == "ssm_a" {
            fixups.insert(name.clone(), Fixup::LnNeg);
        }
        tensors.insert(name, st);
    }
    super::hf::split_halves(&mut tensors, &config, path)?;
    check_tensors(&config, &tensors, path)?;
    validate_config(&config, path)?;
    let token_str = |id: Option<u32>| tok.as_ref().and_then(|t| id.and_then(|i| t.tokens.get(i as usize)).cloned());
    let (bos_token, eos_token) = (token_str(config.bos_token_id), token_str(config.eos_token_ids.first().copied()));
    let chat_template = m.opt_str("tokenizer.chat_template")?.map(str::to_string);
    Ok(Checkpoint {
        path: path.to_path_buf(),
        config,
        tokenizer: tok.map_or(TokenizerSource::None, TokenizerSource::Gguf),
        chat_template,
        bos_token,
        eos_token,
        tensors,
        files: vec![data],
        fixups,
    })
}

/// A `gemma4` GGUF (llama.cpp's Gemma 4 layout): the config from its metadata (sliding and full
/// layers by `attention.sliding_window_pattern`, their head dims by `attention.key_length_swa` /
/// `key_length`, their KV heads by the per-layer `attention.head_count_kv`), keys as values on the
/// full layers where they have no `attn_v`, and the full layers' proportional RoPE from the
/// `rope_freqs` factors (1 for the pairs that turn, ~1e30 for those that do not). Tensor names are
/// the engine's own; norms are stored as they are used (plain w).
fn open_gemma4(g: &GgufFile, data: DataFile, path: &Path) -> Result<Checkpoint> {
    use crate::model::gemma4::{Gemma4Config, Gemma4Rope};
    let m = Meta { g, path, arch: "gemma4" };
    let mismatch = |msg: String| Error::Mismatch(format!("{}: {msg}", path.display()));
    let layers_key = m.key("block_count");
    let num_layers = m.req_capped(&layers_key, cfg_limits::LAYERS)?;
    check_layer_count(g.tensors.iter().map(|t| t.name.as_str()), num_layers, &layers_key, path)?;
    if num_layers == 0 {
        return Err(mismatch(format!("{layers_key} is 0")));
    }
    let req = |k: &str, limit| m.req_capped(&m.key(k), limit);
    if m.opt_usize(&m.key("expert_count"))?.unwrap_or(0) > 0 {
        return Err(Error::Unsupported(format!("gemma4 mixture-of-experts blocks ({})", m.key("expert_count"))));
    }
    let ple_dim = m.opt_usize(&m.key("embedding_length_per_layer_input"))?.unwrap_or(0);
    let ple_dim = capped(path, &m.key("embedding_length_per_layer_input"), ple_dim, cfg_limits::HIDDEN)?;
    let shared = m.opt_usize(&m.key("attention.shared_kv_layers"))?.unwrap_or(0);
    if shared > num_layers {
        return Err(mismatch(format!("attention.shared_kv_layers {shared} of {num_layers} layers")));
    }
    let pattern_key = m.key("attention.sliding_window_pattern");
    let pattern = m.opt_array(&pattern_key)?.ok_or_else(|| m.missing(&pattern_key))?;
    if pattern.len() != num_layers {
        return Err(mismatch(format!("{pattern_key} has {} entries for {num_layers} layers", pattern.len())));
    }
    let full_attention: Vec<bool> = pattern
        .iter()
        .map(|v| match (v.as_bool(), v.as_u64()) {
            (Some(b), _) => Ok(!b),
            (None, Some(n)) => Ok(n == 0),
            _ => Err(m.wrong(&pattern_key, "bools", v)),
        })
        .collect::<Result<_>>()?;
    let heads = req("attention.head_count", cfg_limits::HEADS)?;
    let kv_key = m.key("attention.head_count_kv");
    let kv_per_layer = m.per_layer(&kv_key, num_layers)?.unwrap_or_else(|| vec![heads; num_layers]);
    // One KV head count per layer kind.
    let kind_kv = |full: bool| -> Result<usize> {
        let mut v = kv_per_layer.iter().zip(&full_attention).filter(|(_, &f)| f == full).map(|(&k, _)| k);
        let first = v.next().unwrap_or(heads);
        match v.find(|&k| k != first) {
            Some(other) => Err(Error::Unsupported(format!("{kv_key}: {first} and {other} KV heads in one layer kind"))),
            None => Ok(capped(path, &kv_key, first, cfg_limits::HEADS)?),
        }
    };
    let (sliding_kv, full_kv) = (kind_kv(false)?, kind_kv(true)?);
    let head_dim = req("attention.key_length_swa", cfg_limits::HEAD_DIM)?;
    let global_head_dim = req("attention.key_length", cfg_limits::HEAD_DIM)?;
    for (k, want) in [("attention.value_length_swa", head_dim), ("attention.value_length", global_head_dim)] {
        if let Some(v) = m.opt_usize(&m.key(k))?.filter(|&v| v != want) {
            return Err(Error::Unsupported(format!("{} {v} different from the key length {want}", m.key(k))));
        }
    }
    for (k, want) in [("rope.dimension_count_swa", head_dim), ("rope.dimension_count", global_head_dim)] {
        if let Some(v) = m.opt_usize(&m.key(k))?.filter(|&v| v != want) {
            return Err(Error::Unsupported(format!("{} {v} of head dimension {want} (partial rotary)", m.key(k))));
        }
    }
    // Keys as values: the full layers that project their own KV have no attn_v.
    let k_eq_v =
        (0..num_layers - shared).any(|l| full_attention[l] && g.tensor(&format!("blk.{l}.attn_v.weight")).is_none());
    if !k_eq_v && full_kv != sliding_kv {
        return Err(Error::Unsupported(format!(
            "{kv_key}: {full_kv} KV heads on full layers, {sliding_kv} on sliding ones, with a v projection"
        )));
    }
    let tok = tokenizer_data(&m, Arch::Gemma4)?;
    let vocab_size = vocab_rows(g, Some(&tok), path)?;
    let ffn_key = m.key("feed_forward_length");
    let ffn = m.per_layer(&ffn_key, num_layers)?.ok_or_else(|| m.missing(&ffn_key))?;
    let double_wide = ffn.iter().any(|&f| f != ffn[0]);
    let want_ffn = |l: usize| if double_wide && l >= num_layers - shared { 2 * ffn[0] } else { ffn[0] };
    if let Some(l) = (0..num_layers).find(|&l| ffn[l] != want_ffn(l)) {
        return Err(Error::Unsupported(format!(
            "{ffn_key}: layer {l} is {} wide (one width, or twice it on the shared KV layers)",
            ffn[l]
        )));
    }
    let ple_vocab =
        g.tensor("per_layer_token_embd.weight").and_then(|t| t.shape.first().copied()).unwrap_or(vocab_size);
    // llama.cpp caps at 30 when the key is absent; 0 turns it off.
    let cap = m.opt_f32(&m.key("final_logit_softcapping"))?.unwrap_or(30.0);
    let window =
        m.opt_u32(&m.key("attention.sliding_window"))?.ok_or_else(|| m.missing(&m.key("attention.sliding_window")))?;
    let mut gc = Gemma4Config {
        vocab_size,
        hidden_size: req("embedding_length", cfg_limits::HIDDEN)?,
        // One width, or per layer with the shared-KV layers' twice the others' (double-wide MLPs).
        intermediate_size: capped(path, &ffn_key, ffn[0], cfg_limits::INTERMEDIATE)?,
        num_attention_heads: heads,
        num_key_value_heads: sliding_kv,
        num_global_key_value_heads: Some(full_kv),
        head_dim,
        global_head_dim,
        attention_k_eq_v: k_eq_v,
        attention_bias: false,
        full_attention,
        sliding_window: window,
        rope_sliding: Gemma4Rope {
            theta: m.opt_f32(&m.key("rope.freq_base_swa"))?.unwrap_or(10_000.0),
            proportional: false,
            partial_rotary_factor: 1.0,
        },
        // Set from rope_freqs below.
        rope_full: Gemma4Rope {
            theta: m.opt_f32(&m.key("rope.freq_base"))?.unwrap_or(10_000.0),
            proportional: false,
            partial_rotary_factor: 1.0,
        },
        final_logit_softcapping: (cap != 0.0).then_some(cap),
        rms_norm_eps: m
            .opt_f32(&m.key("attention.layer_norm_rms_epsilon"))?
            .ok_or_else(|| m.missing(&m.key("attention.layer_norm_rms_epsilon")))?,
        max_position_embeddings: req("context_length", cfg_limits::CONTEXT)?,
        tie_word_embeddings: g.tensor("output.weight").is_none(),
        bos_token_id: tok.bos_token_id,
        eos_token_ids: stop_ids(&tok),
        hidden_size_per_layer_input: ple_dim,
        vocab_size_per_layer_input: ple_vocab,
        num_kv_shared_layers: shared,
        use_double_wide_mlp: double_wide,
    };
    let tensors: HashMap<String, StoredTensor> = g.tensors.iter().map(|t| (t.name.clone(), t.stored())).collect();
    // The config is set below, once rope_freqs (read through the checkpoint) has said the RoPE.
    let mut ck = Checkpoint {
        path: path.to_path_buf(),
        config: gc.model_config(),
        tokenizer: TokenizerSource::None,
        chat_template: m.opt_str("tokenizer.chat_template")?.map(str::to_string),
        bos_token: gc.bos_token_id.and_then(|i| tok.tokens.get(i as usize)).cloned(),
        eos_token: gc.eos_token_ids.first().and_then(|&i| tok.tokens.get(i as usize)).cloned(),
        tensors,
        files: vec![data],
        fixups: HashMap::new(),
    };
    if ck.has("rope_freqs.weight") {
        // Proportional RoPE: a run of factor 1 (the pairs that turn), then factors that stop the
        // rest (llama.cpp: angle / factor; 1e30 makes it 0 to f32 precision).
        let factors = ck.raw("rope_freqs.weight")?.to_f32()?;
        ck.tensors.remove("rope_freqs.weight");
        let turning = factors.iter().take_while(|&&x| x == 1.0).count();
        if factors.len() != global_head_dim / 2
            || factors[turning..].iter().any(|&x| x.is_nan() || x < 1e20)
            || turning == 0
        {
            return Err(Error::Unsupported(format!(
                "rope_freqs factors other than a run of 1 then >= 1e20 ({} factors for head dimension {global_head_dim})",
                factors.len()
            )));
        }
        gc.rope_full.proportional = true;
        // Halfway between `turning` and `turning + 1` pairs: Gemma4Config::full_rotary_dim's
        // floor gives `turning` whatever the f32 rounding of the fraction.
        gc.rope_full.partial_rotary_factor = (2 * turning + 1) as f32 / global_head_dim as f32;
    }
    gc.validate().map_err(mismatch)?;
    ck.config = gc.model_config();
    ck.config.add_bos = tok.add_bos_token;
    super::drop_shared_kv_tensors(&ck.config, &mut ck.tensors);
    ck.tokenizer = if tok.tokens.is_empty() { TokenizerSource::None } else { TokenizerSource::Gguf(tok) };
    check_tensors(&ck.config, &ck.tensors, path)?;
    validate_config(&ck.config, path)?;
    Ok(ck)
}

/// The vocabulary size: `token_embd.weight`'s rows, which must equal the tokenizer's tokens.
fn vocab_rows(g: &GgufFile, tok: Option<&GgufTokenizerData>, path: &Path) -> Result<usize> {
    let mismatch = |msg: String| Error::Mismatch(format!("{}: {msg}", path.display()));
    let rows = match g.tensor("token_embd.weight") {
        Some(t) => t.shape.first().copied().unwrap_or(0),
        None => return Err(mismatch("tensor token_embd.weight is missing".into())),
    };
    if let Some(tok) = tok.filter(|t| !t.tokens.is_empty() && t.tokens.len() != rows) {
        return Err(mismatch(format!(
            "the vocabulary has {} tokens but token_embd.weight has {rows} rows (they must be equal)",
            tok.tokens.len()
        )));
    }
    let rows = capped(path, "token_embd.weight rows (vocabulary size)", rows, cfg_limits::VOCAB)?;
    if rows == 0 {
        return Err(mismatch("the vocabulary is empty (token_embd.weight has no rows)".into()));
    }
    Ok(rows)
}

/// The ids that end generation: eos, eot and eom, and the end-of-turn tokens of
/// [`END_OF_TURN_TOKENS`] in the vocabulary.
fn stop_ids(tok: &GgufTokenizerData) -> Vec<u32> {
    let mut ids = Vec::new();
    let ends = [tok.eos_token_id, tok.eot_token_id, tok.eom_token_id];
    let named = END_OF_TURN_TOKENS.iter().map(|t| tok.token_id(t));
    for id in ends.into_iter().chain(named).flatten() {
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    ids
}

/// Typed metadata lookups with errors naming the key.
struct Meta<'a> {
    g: &'a GgufFile,
    path: &'a Path,
    arch: &'a str,
}

impl Meta<'_> {
    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }
    fn wrong(&self, key: &str, want: &str, v: &GgufValue) -> Error {
        Error::corrupt(self.path, format!("metadata {} should be {want}, is {}", shown(key), v.describe()))
    }
    fn missing(&self, key: &str) -> Error {
        Error::corrupt(self.path, format!("required metadata {} is missing", shown(key)))
    }
    fn opt_u64(&self, key: &str) -> Result<Option<u64>> {
        match self.g.get(key) {
            None => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| self.wrong(key, "a non-negative integer", v)),
        }
    }
    fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        match self.opt_u64(key)? {
            None => Ok(None),
            Some(v) => usize::try_from(v)
                .map(Some)
                .map_err(|_| Error::corrupt(self.path, format!("metadata {} = {v} is too large", shown(key)))),
        }
    }
    /// A required count, at most `limit`.
    fn req_capped(&self, key: &str, limit: usize) -> Result<usize> {
        let v = self.opt_usize(key)?.ok_or_else(|| self.missing(key))?;
        capped(self.path, key, v, limit)
    }
    fn opt_u32(&self, key: &str) -> Result<Option<u32>> {
        match self.opt_u64(key)? {
            None => Ok(None),
            Some(v) => u32::try_from(v)
                .map(Some)
                .map_err(|_| Error::corrupt(self.path, format!("metadata {} = {v} is too large", shown(key)))),
        }
    }
    fn opt_f32(&self, key: &str) -> Result<Option<f32>> {
        match self.g.get(key) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) if x.is_finite() => Ok(Some(x as f32)),
                _ => Err(self.wrong(key, "a finite number", v)),
            },
        }
    }
    fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.g.get(key) {
            None => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| self.wrong(key, "a bool", v)),
        }
    }
    fn opt_str(&self, key: &str) -> Result<Option<&str>> {
        match self.g.get(key) {
            None => Ok(None),
            Some(v) => v.as_str().map(Some).ok_or_else(|| self.wrong(key, "a string", v)),
        }
    }
    fn opt_array(&self, key: &str) -> Result<Option<&[GgufValue]>> {
        match self.g.get(key) {
            None => Ok(None),
            Some(v) => v.as_array().map(Some).ok_or_else(|| self.wrong(key, "an array", v)),
        }
    }
    /// A count llama.cpp takes per layer: an array of `layers` integers, or one for every layer;
    /// `None` when absent.
    fn per_layer(&self, key: &str, layers: usize) -> Result<Option<Vec<usize>>> {
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
    fn uniform_usize(&self, key: &str) -> Result<Option<usize>> {
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

fn build_config(g: &GgufFile, path: &Path) -> Result<(ModelConfig, GgufTokenizerData)> {
    let arch_name = match g.get("general.architecture") {
        None => return Err(Error::corrupt(path, "required metadata general.architecture is missing")),
        Some(v) => {
            v.as_str().ok_or_else(|| Error::corrupt(path, format!("general.architecture is {}", v.describe())))?
        }
    };
    let arch = match Arch::parse(arch_name) {
        // Its own builder: `open_qwen35moe`.
        Some(Arch::Qwen35Moe) => {
            return Err(Error::Unsupported(format!(
                "architecture {} spelled other than llama.cpp's qwen35moe (in {})",
                shown(arch_name),
                path.display()
            )))
        }
        Some(Arch::Gemma4) => return Err(Error::Unsupported("gemma4 GGUF files".into())),
        Some(a) => a,
        None => return Err(Error::Unsupported(format!("architecture {} (in {})", shown(arch_name), path.display()))),
    };
    let m = Meta { g, path, arch: arch_name };
    let mismatch = |msg: String| Error::Mismatch(format!("{}: {msg}", path.display()));

    // The layer count first, against its limit and the tensors present, before anything is
    // sized by it.
    let layers_key = m.key("block_count");
    let num_layers = m.req_capped(&layers_key, cfg_limits::LAYERS)?;
    check_layer_count(g.tensors.iter().map(|t| t.name.as_str()), num_layers, &layers_key, path)?;
    let hidden = m.req_capped(&m.key("embedding_length"), cfg_limits::HIDDEN)?;
    let ffn_key = m.key("feed_forward_length");
    let intermediate = m.uniform_usize(&ffn_key)?.ok_or_else(|| m.missing(&ffn_key))?;
    let intermediate = capped(path, &ffn_key, intermediate, cfg_limits::INTERMEDIATE)?;
    let heads_key = m.key("attention.head_count");
    let num_heads = m.uniform_usize(&heads_key)?.ok_or_else(|| m.missing(&heads_key))?;
    let num_heads = capped(path, &heads_key, num_heads, cfg_limits::HEADS)?;
    let kv_key = m.key("attention.head_count_kv");
    let num_kv_heads = m.uniform_usize(&kv_key)?.unwrap_or(num_heads);
    let num_kv_heads = capped(path, &kv_key, num_kv_heads, cfg_limits::HEADS)?;
    let max_pos = m.req_capped(&m.key("context_length"), cfg_limits::CONTEXT)?;
    for (what, v) in [
        ("embedding_length", hidden),
        ("block_count", num_layers),
        ("feed_forward_length", intermediate),
        ("attention.head_count", num_heads),
        ("attention.head_count_kv", num_kv_heads),
        ("context_length", max_pos),
    ] {
        if v == 0 {
            return Err(mismatch(format!("{arch_name}.{what} is 0")));
        }
    }
    if num_heads % num_kv_heads != 0 {
        return Err(mismatch(format!(
            "attention.head_count {num_heads} is not a multiple of attention.head_count_kv {num_kv_heads}"
        )));
    }
    let head_dim = match m.opt_usize(&m.key("attention.key_length"))? {
        Some(d) => capped(path, &m.key("attention.key_length"), d, cfg_limits::HEAD_DIM)?,
        None => {
            if hidden % num_heads != 0 {
                return Err(mismatch(format!(
                    "embedding_length {hidden} is not a multiple of attention.head_count {num_heads} \
                     (and attention.key_length is absent)"
                )));
            }
            hidden / num_heads
        }
    };
    if let Some(vd) = m.opt_usize(&m.key("attention.value_length"))? {
        if vd != head_dim {
            return Err(Error::Unsupported(format!(
                "attention.value_length {vd} different from attention.key_length {head_dim}"
            )));
        }
    }
    if head_dim == 0 || head_dim % 2 != 0 {
        return Err(mismatch(format!("head dimension {head_dim} must be even and non-zero (RoPE)")));
    }
    // llama.cpp rotates the first `rope.dimension_count` dimensions of each head (default: all).
    // The engine rotates all of them: anything else would run and give wrong text.
    let rot_key = m.key("rope.dimension_count");
    if let Some(n) = m.opt_u64(&rot_key)? {
        if n != head_dim as u64 {
            return Err(Error::Unsupported(format!(
                "{}: {rot_key} = {n}: rotary embeddings on part of a head (the head dimension is {head_dim}; \
                 this engine rotates all of it)",
                path.display()
            )));
        }
    }
    if num_heads.checked_mul(head_dim).is_none() {
        return Err(mismatch(format!("{num_heads} heads × {head_dim} overflows")));
    }
    let eps_key = m.key("attention.layer_norm_rms_epsilon");
    let rms_norm_eps = m.opt_f32(&eps_key)?.ok_or_else(|| m.missing(&eps_key))?;
    if rms_norm_eps.is_nan() || rms_norm_eps < 0.0 {
        return Err(mismatch(format!("{eps_key} = {rms_norm_eps}")));
    }
    let rope_theta = m.opt_f32(&m.key("rope.freq_base"))?.unwrap_or(10_000.0);
    if rope_theta <= 0.0 {
        return Err(mismatch(format!("rope.freq_base = {rope_theta}")));
    }
    // RoPE scaling: llama.cpp reads `rope.scaling.factor`, else the older `rope.scale_linear`;
    // the type defaults to linear.
    let factor = match m.opt_f32(&m.key("rope.scaling.factor"))? {
        Some(f) => Some(f),
        None => m.opt_f32(&m.key("rope.scale_linear"))?,
    };
    let factor = factor.filter(|&f| f != 0.0 && f != 1.0);
    let rope_scaling_factor = match (m.opt_str(&m.key("rope.scaling.type"))?, factor) {
        (_, None) | (Some("none"), _) => 1.0,
        (None | Some("linear"), Some(f)) if f > 0.0 => f,
        (None | Some("linear"), Some(f)) => return Err(mismatch(format!("rope.scaling.factor = {f}"))),
        (Some(other), Some(f)) => {
            return Err(Error::Unsupported(format!("RoPE scaling type {} (factor {f})", shown(other))));
        }
    };
    if g.tensor("rope_freqs.weight").is_some() {
        return Err(Error::Unsupported(
            "per-dimension RoPE frequency factors (rope_freqs.weight, Llama 3.1-style scaling)".into(),
        ));
    }
    let final_logit_softcapping = m.opt_f32(&m.key("final_logit_softcapping"))?.filter(|&c| c > 0.0);

    // Tokenizer.
    let tok = tokenizer_data(&m, arch)?;

    let vocab_size = vocab_rows(g, Some(&tok), path)?;
    let eos_token_ids = stop_ids(&tok);

    // Gemma 3: llama.cpp's fixed pattern of sliding layers, its window from the metadata.
    let layer_types = match arch::defaults(arch).sliding_window_pattern {
        None => vec![LayerAttention::Full; num_layers],
        Some(pattern) => {
            let sw_key = m.key("attention.sliding_window");
            let window = m.opt_u32(&sw_key)?.ok_or_else(|| m.missing(&sw_key))?;
            if window == 0 {
                return Err(mismatch(format!("{sw_key} is 0")));
            }
            (0..num_layers)
                .map(|i| if (i + 1) % pattern == 0 { LayerAttention::Full } else { LayerAttention::Sliding { window } })
                .collect()
        }
    };
    let mut config = arch::model_config(&Hyperparams {
        arch,
        vocab_size,
        hidden_size: hidden,
        intermediate_size: intermediate,
        num_attention_heads: num_heads,
        num_key_value_heads: num_kv_heads,
        head_dim,
        rms_norm_eps,
        rope_theta,
        rope_local_theta: None,
        rope_scaling_factor,
        max_position_embeddings: max_pos,
        layer_types,
        tie_word_embeddings: g.tensor("output.weight").is_none(),
        attention_bias: g.tensor("blk.0.attn_q.bias").is_some(),
        activation: arch::activation(arch::defaults(arch).activation).expect("a known default activation"),
        query_pre_attn_scalar: None,
        final_logit_softcapping,
    });
    config.bos_token_id = tok.bos_token_id;
    config.eos_token_ids = eos_token_ids;
    config.add_bos = tok.add_bos_token;
    validate_config(&config, path)?;
    Ok((config, tok))
}

/// Checks that a config is self-consistent (both loaders call this).
pub(crate) fn validate_config(c: &ModelConfig, path: &Path) -> Result<()> {
    let bad = |msg: String| Err(Error::Mismatch(format!("{}: {msg}", path.display())));
    for (what, v) in [
        ("vocab size", c.vocab_size),
        ("hidden size", c.hidden_size),
        ("layer count", c.num_layers()),
        ("context length", c.max_position_embeddings),
    ] {
        if v == 0 {
            return bad(format!("{what} is 0"));
        }
    }
    use cfg_limits as l;
    for (what, v, limit) in [
        ("vocab size", c.vocab_size, l::VOCAB),
        ("hidden size", c.hidden_size, l::HIDDEN),
        ("layer count", c.num_layers(), l::LAYERS),
        ("context length", c.max_position_embeddings, l::CONTEXT),
    ] {
        if v > limit {
            return bad(format!("{what} {v} is above the limit of {limit}"));
        }
    }
    if c.vocab_size.checked_mul(c.hidden_size).is_none() {
        return bad("dimensions overflow".into());
    }
    if !(c.rms_norm_eps >= 0.0 && c.rms_norm_eps.is_finite()) {
        return bad(format!("rms norm epsilon {}", c.rms_norm_eps));
    }
    for (what, v) in [
        ("embedding scale", c.embedding_scale),
        ("final logit softcapping", c.final_logit_softcapping.unwrap_or(1.0)),
    ] {
        if !(v > 0.0 && v.is_finite()) {
            return bad(format!("{what} is {v}"));
        }
    }
    let mut kv_width = 0u64;
    for (i, spec) in c.layers.iter().enumerate() {
        let intermediate = match spec.mlp {
            crate::model::config::MlpSpec::Dense { intermediate, .. } => intermediate,
            crate::model::config::MlpSpec::Moe { intermediate, .. } => intermediate,
        };
        if intermediate == 0 {
            return bad(format!("layer {i}: intermediate size is 0"));
        }
        if intermediate > l::INTERMEDIATE {
            return bad(format!("layer {i}: intermediate size {intermediate} is above the limit of {}", l::INTERMEDIATE));
        }
        let Mixer::Attention(a) = spec.mixer else {
            continue;
        };
        for (what, v, limit) in [
            ("head count", a.heads, l::HEADS),
            ("kv head count", a.kv_heads, l::HEADS),
            ("head dimension", a.head_dim, l::HEAD_DIM),
        ] {
            if v == 0 {
                return bad(format!("layer {i}: {what} is 0"));
            }
            if v > limit {
                return bad(format!("layer {i}: {what} {v} is above the limit of {limit}"));
            }
        }
        if a.heads % a.kv_heads != 0 {
            return bad(format!("{} attention heads are not a multiple of {} kv heads", a.heads, a.kv_heads));
        }
        if a.head_dim % 2 != 0 {
            return bad(format!("head dimension {} is odd (RoPE needs pairs)", a.head_dim));
        }
        if a.heads.checked_mul(a.head_dim).is_none() {
            return bad("dimensions overflow".into());
        }
        for (what, v) in [
            ("rope theta", a.rope.theta),
            ("rope scaling factor", a.rope.scaling),
            ("attention scale", a.scale),
        ] {
            if !(v > 0.0 && v.is_finite()) {
                return bad(format!("{what} is {v}"));
            }
        }
        if a.window == Some(0) {
            return bad("sliding window of 0".into());
        }
        kv_width = kv_width.max(a.kv_dim() as u64);
    }
    // The KV cache for the whole context, in f32 bytes, must be a representable size (the
    // limits above guarantee it; this keeps the guarantee next to the use).
    let kv_bytes = [2, c.num_layers() as u64, c.max_position_embeddings as u64, kv_width, 4]
        .into_iter()
        .try_fold(1u64, |a, b| a.checked_mul(b));
    if kv_bytes.is_none() {
        return bad("the KV cache size for the full context overflows".into());
    }
    for id in c.bos_token_id.iter().chain(&c.eos_token_ids) {
        if *id as usize >= c.vocab_size {
            return bad(format!("special token id {id} is outside the vocabulary of {}", c.vocab_size));
        }
    }
    Ok(())
}

fn tokenizer_data(m: &Meta, arch: Arch) -> Result<GgufTokenizerData> {
    let path = m.path;
    let strings = |key: &str| -> Result<Vec<String>> {
        let Some(a) = m.opt_array(key)? else {
            return Ok(Vec::new());
        };
        a.iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| Error::corrupt(path, format!("metadata {key} should be an array of strings")))
    };
    let tokens = strings("tokenizer.ggml.tokens")?;
    if m.g.get("tokenizer.ggml.tokens").is_some() && tokens.is_empty() {
        return Err(Error::corrupt(path, "tokenizer.ggml.tokens is empty: the file has no vocabulary"));
    }
    let merges = strings("tokenizer.ggml.merges")?;
    let scores = match m.opt_array("tokenizer.ggml.scores")? {
        None => Vec::new(),
        Some(a) => a
            .iter()
            .map(|v| v.as_f64().map(|x| x as f32))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| Error::corrupt(path, "metadata tokenizer.ggml.scores should be numbers"))?,
    };
    let token_types = match m.opt_array("tokenizer.ggml.token_type")? {
        None => Vec::new(),
        Some(a) => a
            .iter()
            .map(|v| v.as_i64().and_then(|x| i32::try_from(x).ok()))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| Error::corrupt(path, "metadata tokenizer.ggml.token_type should be integers"))?,
    };
    for (what, n) in [("scores", scores.len()), ("token_type", token_types.len())] {
        if n != 0 && n != tokens.len() {
            return Err(Error::Mismatch(format!(
                "{}: tokenizer.ggml.{what} has {n} entries for {} tokens",
                path.display(),
                tokens.len()
            )));
        }
    }
    let model = m.opt_str("tokenizer.ggml.model")?.unwrap_or_default().to_string();
    let pre = m.opt_str("tokenizer.ggml.pre")?.map(str::to_string);
    let n = tokens.len();
    let id = |name: &str, strict: bool| -> Result<Option<u32>> {
        let key = format!("tokenizer.ggml.{name}_token_id");
        match m.opt_u32(&key)? {
            Some(i) if n != 0 && i as usize >= n => {
                if strict {
                    Err(Error::Mismatch(format!("{}: {key} = {i} is outside the {n}-token vocabulary", path.display())))
                } else {
                    Ok(None)
                }
            }
            other => Ok(other),
        }
    };
    let default_add_bos = model == "llama" || matches!(arch, Arch::Gemma3 | Arch::Gemma4);
    Ok(GgufTokenizerData {
        bos_token_id: id("bos", true)?,
        eos_token_id: id("eos", true)?,
        eot_token_id: id("eot", true)?,
        eom_token_id: id("eom", true)?,
        unknown_token_id: id("unknown", false)?,
        padding_token_id: id("padding", false)?,
        add_bos_token: m.opt_bool("tokenizer.ggml.add_bos_token")?.unwrap_or(default_add_bos),
        add_eos_token: m.opt_bool("tokenizer.ggml.add_eos_token")?.unwrap_or(false),
        add_space_prefix: m.opt_bool("tokenizer.ggml.add_space_prefix")?,
        model,
        pre,
        tokens,
        scores,
        token_types,
        merges,
    })
}

// ---------------------------------------------------------------------------------------------
// Writer
// ---------------------------------------------------------------------------------------------

/// Builds a GGUF v3 file in memory: metadata, then tensors (row-major shapes, outermost first,
/// as everywhere in this crate).
///
/// ```no_run
/// use wgpu_llm::loader::gguf::GgufWriter;
/// # fn main() -> wgpu_llm::error::Result<()> {
/// let mut w = GgufWriter::new();
/// w.add_metadata("general.architecture", "qwen2");
/// w.add_metadata("qwen2.block_count", 1u32);
/// w.add_f32("output_norm.weight", &[8], &[1.0; 8])?;
/// w.add_f32_as_f16("token_embd.weight", &[16, 8], &vec![0.5; 128])?;
/// w.write(std::path::Path::new("/tmp/tiny.gguf"))?;
/// # Ok(()) }
/// ```
/// [`GgufWriter::add_model_config`] writes all the `{arch}.*` keys that [`open`] reads from a
/// [`ModelConfig`], so a synthetic model needs only that plus its tensors.
#[derive(Clone, Debug)]
pub struct GgufWriter {
    alignment: usize,
    metadata: Vec<(String, GgufValue)>,
    tensors: Vec<(String, DType, Vec<usize>, Vec<u8>)>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        GgufWriter::new()
    }
}

impl GgufWriter {
    pub fn new() -> GgufWriter {
        GgufWriter { alignment: DEFAULT_ALIGNMENT, metadata: Vec::new(), tensors: Vec::new() }
    }

    /// Data alignment (a power of two); written as `general.alignment` when not 32.
    pub fn set_alignment(&mut self, alignment: usize) -> Result<&mut Self> {
        if alignment < 8 || !alignment.is_power_of_two() || alignment as u64 > limits::MAX_ALIGNMENT {
            return Err(Error::InvalidArgument(format!(
                "GGUF alignment {alignment}: a power of two from 8 to {} is needed",
                limits::MAX_ALIGNMENT
            )));
        }
        self.alignment = alignment;
        if alignment != DEFAULT_ALIGNMENT {
            self.add_metadata("general.alignment", alignment as u32);
        }
        Ok(self)
    }

    /// Sets a metadata key (replacing an earlier value of the same key).
    pub fn add_metadata(&mut self, key: impl Into<String>, value: impl Into<GgufValue>) -> &mut Self {
        let (key, value) = (key.into(), value.into());
        match self.metadata.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.metadata.push((key, value)),
        }
        self
    }

    /// Removes a metadata key, if set.
    pub fn remove_metadata(&mut self, key: &str) -> &mut Self {
        self.metadata.retain(|(k, _)| k != key);
        self
    }

    /// Adds a tensor from its stored bytes (any [`DType`], quantized blocks included).
    /// `shape` is row-major, outermost first; its last dimension must be a whole number of blocks.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        dtype: DType,
        shape: &[usize],
        bytes: impl Into<Vec<u8>>,
    ) -> Result<&mut Self> {
        let (name, bytes) = (name.into(), bytes.into());
        if shape.len() > MAX_DIMS {
            return Err(Error::InvalidArgument(format!("tensor {name}: {} dimensions", shape.len())));
        }
        if dtype.ggml_type().is_none() {
            return Err(Error::InvalidArgument(format!("tensor {name}: GGUF has no type {dtype}")));
        }
        let row = shape.last().copied().unwrap_or(1);
        if row % dtype.block_size() != 0 {
            return Err(Error::InvalidArgument(format!(
                "tensor {name}: row length {row} is not a multiple of the {dtype} block size {}",
                dtype.block_size()
            )));
        }
        let numel = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        match numel.and_then(|n| dtype.byte_size(n)) {
            Some(want) if want == bytes.len() => {}
            Some(want) => {
                return Err(Error::InvalidArgument(format!(
                    "tensor {name}: shape {} of {dtype} needs {want} bytes, got {}",
                    fmt_shape(shape),
                    bytes.len()
                )))
            }
            None => return Err(Error::InvalidArgument(format!("tensor {name}: shape {} overflows", fmt_shape(shape)))),
        }
        if self.tensors.iter().any(|t| t.0 == name) {
            return Err(Error::InvalidArgument(format!("tensor {name} added twice")));
        }
        self.tensors.push((name, dtype, shape.to_vec(), bytes));
        Ok(self)
    }

    /// Adds an f32 tensor.
    pub fn add_f32(&mut self, name: impl Into<String>, shape: &[usize], data: &[f32]) -> Result<&mut Self> {
        let bytes: Vec<u8> = data.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.add_tensor(name, DType::F32, shape, bytes)
    }

    /// Adds an f16 tensor.
    pub fn add_f16(&mut self, name: impl Into<String>, shape: &[usize], data: &[half::f16]) -> Result<&mut Self> {
        let bytes: Vec<u8> = data.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.add_tensor(name, DType::F16, shape, bytes)
    }

    /// Adds f32 data stored as f16.
    pub fn add_f32_as_f16(&mut self, name: impl Into<String>, shape: &[usize], data: &[f32]) -> Result<&mut Self> {
        let bytes: Vec<u8> = data.iter().flat_map(|&x| half::f16::from_f32(x).to_le_bytes()).collect();
        self.add_tensor(name, DType::F16, shape, bytes)
    }

    /// Adds f32 data quantized to `dtype` with [`super::dtype::quantize`] (F32, F16, BF16,
    /// Q8_0, Q4_0, Q4_1, Q5_0, Q5_1).
    pub fn add_quantized(
        &mut self,
        name: impl Into<String>,
        dtype: DType,
        shape: &[usize],
        data: &[f32],
    ) -> Result<&mut Self> {
        let name = name.into();
        let numel = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        if numel != Some(data.len()) {
            return Err(Error::InvalidArgument(format!(
                "tensor {name}: shape {} does not hold {} values",
                fmt_shape(shape),
                data.len()
            )));
        }
        let bytes = super::dtype::quantize(dtype, data)?;
        self.add_tensor(name, dtype, shape, bytes)
    }

    /// Writes `general.architecture` and every `{arch}.*` key [`open`] reads, from `cfg`.
    /// Token ids (`bos_token_id`, the first of `eos_token_ids`) and `add_bos` go to the
    /// `tokenizer.ggml.*` keys. Things GGUF cannot express are implied by the architecture
    /// on reading (Gemma 3's layer pattern, scales, norms), so `open` reproduces `cfg` only when
    /// `cfg` follows them. Note that `open` un-permutes Llama Q/K rows (see [`Fixup`]).
    pub fn add_model_config(&mut self, cfg: &ModelConfig) -> &mut Self {
        let a = cfg.arch.name();
        let k = |s: &str| format!("{a}.{s}");
        // A dense model's layers share their shape: the first full-attention layer says it.
        let attn: Vec<_> = (0..cfg.num_layers()).filter_map(|l| cfg.attention(l).copied()).collect();
        let full = attn.iter().find(|a| a.window.is_none()).or(attn.first()).copied();
        let intermediate = cfg.layers.first().map_or(0, |s| match s.mlp {
            MlpSpec::Dense { intermediate, .. } | MlpSpec::Moe { intermediate, .. } => intermediate,
        });
        self.add_metadata("general.architecture", a);
        self.add_metadata(k("context_length"), cfg.max_position_embeddings as u32);
        self.add_metadata(k("embedding_length"), cfg.hidden_size as u32);
        self.add_metadata(k("block_count"), cfg.num_layers() as u32);
        self.add_metadata(k("feed_forward_length"), intermediate as u32);
        if let Some(f) = full {
            self.add_metadata(k("attention.head_count"), f.heads as u32);
            self.add_metadata(k("attention.head_count_kv"), f.kv_heads as u32);
            self.add_metadata(k("attention.key_length"), f.head_dim as u32);
            self.add_metadata(k("attention.value_length"), f.head_dim as u32);
        }
        self.add_metadata(k("attention.layer_norm_rms_epsilon"), cfg.rms_norm_eps);
        if let Some(f) = full {
            self.add_metadata(k("rope.freq_base"), f.rope.theta);
            if f.rope.scaling != 1.0 {
                self.add_metadata(k("rope.scaling.type"), "linear");
                self.add_metadata(k("rope.scaling.factor"), f.rope.scaling);
            }
        }
        if let Some(w) = attn.iter().find_map(|a| a.window) {
            self.add_metadata(k("attention.sliding_window"), w);
        }
        if let Some(c) = cfg.final_logit_softcapping {
            self.add_metadata(k("final_logit_softcapping"), c);
        }
        if let Some(b) = cfg.bos_token_id {
            self.add_metadata("tokenizer.ggml.bos_token_id", b);
        }
        if let Some(&e) = cfg.eos_token_ids.first() {
            self.add_metadata("tokenizer.ggml.eos_token_id", e);
        }
        self.add_metadata("tokenizer.ggml.add_bos_token", cfg.add_bos);
        self
    }

    /// Writes the `qwen35moe.*` keys of llama.cpp's Qwen3.5-MoE that [`open`] reads back into
    /// `cfg` (a Qwen3.5-MoE config: [`crate::model::qwen3_5_moe::Qwen35MoeConfig::model_config`]):
    /// the layer pattern as `full_attention_interval` when it is every n-th layer, else as
    /// `attention.recurrent_layers`; `vocab_size` for files without a tokenizer.
    pub fn add_qwen35moe_config(&mut self, cfg: &ModelConfig) -> Result<&mut Self> {
        use crate::model::config::{Mixer, MlpSpec};
        let bad = || Error::InvalidArgument("add_qwen35moe_config: not a Qwen3.5-MoE config".into());
        let specs: Vec<_> = (0..cfg.num_layers()).map(|l| cfg.layer(l)).collect();
        let full: Vec<bool> = specs.iter().map(|s| matches!(s.mixer, Mixer::Attention(_))).collect();
        let att = specs.iter().find_map(|s| match s.mixer {
            Mixer::Attention(a) => Some(a),
            Mixer::DeltaNet(_) => None,
        });
        let dn = specs.iter().find_map(|s| match s.mixer {
            Mixer::DeltaNet(d) => Some(d),
            Mixer::Attention(_) => None,
        });
        let (Some(a), Some(d), Some(MlpSpec::Moe { experts, top_k, intermediate, shared_intermediate, .. })) =
            (att, dn, specs.first().map(|s| s.mlp))
        else {
            return Err(bad());
        };
        let k = |s: &str| format!("qwen35moe.{s}");
        let u = |v: usize| GgufValue::U32(v as u32);
        self.add_metadata("general.architecture", "qwen35moe");
        self.add_metadata(k("block_count"), u(cfg.num_layers()));
        self.add_metadata(k("context_length"), u(cfg.max_position_embeddings));
        self.add_metadata(k("embedding_length"), u(cfg.hidden_size));
        self.add_metadata(k("vocab_size"), u(cfg.vocab_size));
        self.add_metadata(k("attention.head_count"), u(a.heads));
        self.add_metadata(k("attention.head_count_kv"), u(a.kv_heads));
        self.add_metadata(k("attention.key_length"), u(a.head_dim));
        self.add_metadata(k("attention.value_length"), u(a.head_dim));
        self.add_metadata(k("attention.layer_norm_rms_epsilon"), cfg.rms_norm_eps);
        self.add_metadata(k("rope.freq_base"), a.rope.theta);
        self.add_metadata(k("rope.dimension_count"), u(a.rope.rotary_dim));
        // Qwen3.5's interleaved M-RoPE sections (11, 11, 10 of 32 pairs at the 35B-A3B's 64
        // rotary dims); text positions make it the plain rotary embedding.
        let pairs = (a.rope.rotary_dim / 2) as i32;
        let (s0, s1) = (pairs * 11 / 32, pairs * 11 / 32);
        self.add_metadata(k("rope.dimension_sections"), vec![s0, s1, pairs - s0 - s1, 0]);
        match (1..=cfg.num_layers()).find(|&n| full.iter().enumerate().all(|(i, &f)| f == ((i + 1) % n == 0))) {
            Some(n) => self.add_metadata(k("full_attention_interval"), u(n)),
            None => self.add_metadata(
                k("attention.recurrent_layers"),
                GgufValue::Array(full.iter().map(|&f| GgufValue::Bool(!f)).collect()),
            ),
        };
        self.add_metadata(k("expert_count"), u(experts));
        self.add_metadata(k("expert_used_count"), u(top_k));
        self.add_metadata(k("expert_feed_forward_length"), u(intermediate));
        if shared_intermediate > 0 {
            self.add_metadata(k("expert_shared_feed_forward_length"), u(shared_intermediate));
        }
        self.add_metadata(k("ssm.conv_kernel"), u(d.conv_kernel));
        self.add_metadata(k("ssm.state_size"), u(d.k_dim));
        self.add_metadata(k("ssm.group_count"), u(d.k_heads));
        self.add_metadata(k("ssm.time_step_rank"), u(d.v_heads));
        self.add_metadata(k("ssm.inner_size"), u(d.value_dim()));
        Ok(self)
    }

    /// Writes the `gemma4.*` keys of llama.cpp's Gemma 4 that [`open`] reads back into `cfg` (a
    /// Gemma 4 config: [`crate::model::gemma4::Gemma4Config::model_config`]), and returns the
    /// `rope_freqs.weight` factors its full layers need (proportional RoPE: 1 for the pairs that
    /// turn, 1e30 for the rest; `None` for full rotary), for the caller to add as an F32 tensor.
    pub fn add_gemma4_config(&mut self, cfg: &ModelConfig) -> Result<Option<Vec<f32>>> {
        use crate::model::config::{AttentionSpec, Mixer, MlpSpec};
        let bad = |what: &str| Error::InvalidArgument(format!("add_gemma4_config: {what}"));
        let att: Vec<AttentionSpec> = (0..cfg.num_layers())
            .map(|l| match cfg.layer(l) {
                spec if spec.output_scale && spec.sandwich_norm => match (spec.mixer, spec.mlp) {
                    (Mixer::Attention(a), MlpSpec::Dense { .. }) => Ok(a),
                    _ => Err(bad("not a Gemma 4 layer")),
                },
                _ => Err(bad("not a Gemma 4 layer")),
            })
            .collect::<Result<_>>()?;
        let sliding = att.iter().find(|a| a.window.is_some()).ok_or_else(|| bad("no sliding layer"))?;
        let full = att.iter().find(|a| a.window.is_none()).ok_or_else(|| bad("no full layer"))?;
        let k = |s: &str| format!("gemma4.{s}");
        let u = |v: usize| GgufValue::U32(v as u32);
        self.add_metadata("general.architecture", "gemma4");
        self.add_metadata(k("block_count"), u(cfg.num_layers()));
        self.add_metadata(k("context_length"), u(cfg.max_position_embeddings));
        self.add_metadata(k("embedding_length"), u(cfg.hidden_size));
        let ffn: Vec<usize> = (0..cfg.num_layers())
            .map(|l| match cfg.layer(l).mlp {
                MlpSpec::Dense { intermediate, .. } => intermediate,
                MlpSpec::Moe { .. } => 0,
            })
            .collect();
        if ffn.iter().all(|&f| f == ffn[0]) {
            self.add_metadata(k("feed_forward_length"), u(ffn[0]));
        } else {
            self.add_metadata(k("feed_forward_length"), GgufValue::Array(ffn.iter().map(|&f| u(f)).collect()));
        }
        self.add_metadata(k("embedding_length_per_layer_input"), u(cfg.per_layer_input.map_or(0, |p| p.dim)));
        self.add_metadata(k("attention.head_count"), u(sliding.heads));
        self.add_metadata(k("attention.head_count_kv"), GgufValue::Array(att.iter().map(|a| u(a.kv_heads)).collect()));
        self.add_metadata(k("attention.key_length"), u(full.head_dim));
        self.add_metadata(k("attention.value_length"), u(full.head_dim));
        self.add_metadata(k("attention.key_length_swa"), u(sliding.head_dim));
        self.add_metadata(k("attention.value_length_swa"), u(sliding.head_dim));
        self.add_metadata(k("attention.sliding_window"), u(sliding.window.unwrap_or(0) as usize));
        self.add_metadata(
            k("attention.sliding_window_pattern"),
            GgufValue::Array(att.iter().map(|a| GgufValue::Bool(a.window.is_some())).collect()),
        );
        self.add_metadata(k("attention.layer_norm_rms_epsilon"), cfg.rms_norm_eps);
        let shared = att.iter().filter(|a| a.kv_from.is_some()).count();
        self.add_metadata(k("attention.shared_kv_layers"), u(shared));
        self.add_metadata(k("rope.freq_base"), full.rope.theta);
        self.add_metadata(k("rope.freq_base_swa"), sliding.rope.theta);
        // llama.cpp rotates every dim (NEOX pairs over the head); partial rotation is in rope_freqs.
        self.add_metadata(k("rope.dimension_count"), u(full.head_dim));
        self.add_metadata(k("rope.dimension_count_swa"), u(sliding.head_dim));
        self.add_metadata(k("final_logit_softcapping"), cfg.final_logit_softcapping.unwrap_or(0.0));
        if sliding.rope.rotary_dim != sliding.head_dim
            || (!full.rope.proportional && full.rope.rotary_dim != full.head_dim)
        {
            return Err(bad("partial rotary other than proportional RoPE on full layers"));
        }
        Ok(full
            .rope
            .proportional
            .then(|| (0..full.head_dim / 2).map(|i| if i < full.rope.rotary_dim / 2 { 1.0 } else { 1e30 }).collect()))
    }

    /// Writes the `tokenizer.ggml.*` keys of `t` (empty vectors and `None`s are left out).
    pub fn add_tokenizer(&mut self, t: &GgufTokenizerData) -> &mut Self {
        let p = |s: &str| format!("tokenizer.ggml.{s}");
        if !t.model.is_empty() {
            self.add_metadata(p("model"), t.model.as_str());
        }
        if let Some(pre) = &t.pre {
            self.add_metadata(p("pre"), pre.as_str());
        }
        if !t.tokens.is_empty() {
            self.add_metadata(p("tokens"), t.tokens.clone());
        }
        if !t.scores.is_empty() {
            self.add_metadata(p("scores"), t.scores.clone());
        }
        if !t.token_types.is_empty() {
            self.add_metadata(p("token_type"), t.token_types.clone());
        }
        if !t.merges.is_empty() {
            self.add_metadata(p("merges"), t.merges.clone());
        }
        for (name, id) in [
            ("bos", t.bos_token_id),
            ("eos", t.eos_token_id),
            ("eot", t.eot_token_id),
            ("eom", t.eom_token_id),
            ("unknown", t.unknown_token_id),
            ("padding", t.padding_token_id),
        ] {
            match id {
                Some(id) => self.add_metadata(p(&format!("{name}_token_id")), id),
                None => self.remove_metadata(&p(&format!("{name}_token_id"))),
            };
        }
        self.add_metadata(p("add_bos_token"), t.add_bos_token);
        self.add_metadata(p("add_eos_token"), t.add_eos_token);
        if let Some(s) = t.add_space_prefix {
            self.add_metadata(p("add_space_prefix"), s);
        }
        self
    }

    /// The whole file.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&GGUF_MAGIC);
        out.extend_from_slice(&GGUF_VERSION.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            write_string(&mut out, k);
            out.extend_from_slice(&v.type_id().to_le_bytes());
            write_value(&mut out, v);
        }
        let align = |n: usize| n.div_ceil(self.alignment) * self.alignment;
        let mut offset = 0usize;
        for (name, dtype, shape, bytes) in &self.tensors {
            write_string(&mut out, name);
            out.extend_from_slice(&(shape.len() as u32).to_le_bytes());
            for &d in shape.iter().rev() {
                out.extend_from_slice(&(d as u64).to_le_bytes());
            }
            out.extend_from_slice(&dtype.ggml_type().expect("add_tensor checks the type").to_le_bytes());
            out.extend_from_slice(&(offset as u64).to_le_bytes());
            offset = align(offset + bytes.len());
        }
        out.resize(align(out.len()), 0);
        for (_, _, _, bytes) in &self.tensors {
            out.extend_from_slice(bytes);
            out.resize(align(out.len()), 0);
        }
        out
    }

    /// Writes the file.
    pub fn write(&self, path: &Path) -> Result<()> {
        std::fs::write(path, self.to_bytes()).map_err(|e| Error::io(PathBuf::from(path), e))
    }
}

fn write_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn write_value(out: &mut Vec<u8>, v: &GgufValue) {
    match v {
        GgufValue::U8(x) => out.push(*x),
        GgufValue::I8(x) => out.push(*x as u8),
        GgufValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::Bool(x) => out.push(*x as u8),
        GgufValue::String(s) => write_string(out, s),
        GgufValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::Array(a) => {
            // An empty array has no element to take the type from: call it u8.
            let elem = a.first().map_or(value_type::U8, |e| e.type_id());
            out.extend_from_slice(&elem.to_le_bytes());
            out.extend_from_slice(&(a.len() as u64).to_le_bytes());
            for e in a {
                assert_eq!(e.type_id(), elem, "GGUF arrays hold elements of one type");
                write_value(out, e);
            }
        }
    }
}
