//! A GGUF header walker and writer of its own (not the crate's parser: the corpus must not depend
//! on the code it tests to find the fields it corrupts), and the GGUF mutation recipes.
//!
//! [`Layout`] records the byte offset of every structural field of the real file's header: the
//! counts, each key's length, type and value, each array's element type and count, each string's
//! length, each tensor info's name, dimension count, dimensions, type and offset. Mutations either
//! patch those bytes in place (the header keeps its length, the tensor data stays where it was) or
//! re-emit the header from an editable [`Header`] (the data section then starts at the re-aligned
//! end of the new header, with every tensor's relative offset unchanged).
//!
//! The tensor data of a mutated file is a hole (a sparse file of the real length): opening a
//! checkpoint reads headers only, so the data's bytes matter only to the cases that write some.

use super::{Content, Edit, Rng, Sink, ABSURD};
use std::path::Path;

pub const ALIGN: u64 = 32;

// GGUF value types.
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

/// One key/value pair's fields (absolute offsets in the header).
#[derive(Clone, Debug)]
pub struct Kv {
    /// The key's u64 length.
    pub at: usize,
    pub key: String,
    pub ty_at: usize,
    pub ty: u32,
    /// The value (for an array: its element type, then count, then elements).
    pub val_at: usize,
    pub end: usize,
    /// Arrays: (element type, count).
    pub array: Option<(u32, u64)>,
}

impl Kv {
    pub fn raw<'a>(&self, header: &'a [u8]) -> &'a [u8] {
        &header[self.val_at..self.end]
    }
}

/// One tensor info's fields.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub at: usize,
    pub name: String,
    pub ndims_at: usize,
    /// ggml `ne`, innermost first.
    pub dims: Vec<u64>,
    pub ty_at: usize,
    pub ty: u32,
    pub off_at: usize,
    /// Relative to the data section.
    pub off: u64,
}

impl TensorInfo {
    pub fn dim_at(&self, i: usize) -> usize {
        self.ndims_at + 4 + 8 * i
    }
}

#[derive(Clone, Debug)]
pub struct Layout {
    pub version: u32,
    pub kvs: Vec<Kv>,
    pub tensors: Vec<TensorInfo>,
    /// End of the tensor infos.
    pub header_len: usize,
    pub data_offset: u64,
}

impl Layout {
    pub fn kv(&self, key: &str) -> &Kv {
        self.kvs.iter().find(|k| k.key == key).unwrap_or_else(|| panic!("the base file has no key {key}"))
    }
    pub fn tensor(&self, name: &str) -> &TensorInfo {
        self.tensors.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("the base file has no tensor {name}"))
    }
}

struct Walk<'a> {
    b: &'a [u8],
    pos: usize,
}

impl Walk<'_> {
    fn take(&mut self, n: usize) -> &[u8] {
        let s = &self.b[self.pos..self.pos + n];
        self.pos += n;
        s
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take(4).try_into().unwrap())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take(8).try_into().unwrap())
    }
    fn string(&mut self) -> String {
        let n = self.u64() as usize;
        String::from_utf8_lossy(self.take(n)).into_owned()
    }
    fn skip_value(&mut self, ty: u32) {
        match ty {
            U8 | I8 | BOOL => self.pos += 1,
            U16 | I16 => self.pos += 2,
            U32 | I32 | F32 => self.pos += 4,
            U64 | I64 | F64 => self.pos += 8,
            STRING => {
                let n = self.u64() as usize;
                self.pos += n;
            }
            ARRAY => {
                let elem = self.u32();
                let n = self.u64();
                for _ in 0..n {
                    self.skip_value(elem);
                }
            }
            other => panic!("the base file has value type {other}"),
        }
    }
}

/// Walks a valid GGUF file's header (panics on anything unexpected: it is only run on the real
/// checkpoint).
pub fn layout(file: &[u8]) -> Layout {
    let mut w = Walk { b: file, pos: 0 };
    assert_eq!(w.take(4), b"GGUF");
    let version = w.u32();
    let n_tensors = w.u64();
    let n_kv = w.u64();
    let mut kvs = Vec::new();
    let mut alignment = ALIGN;
    for _ in 0..n_kv {
        let at = w.pos;
        let key = w.string();
        let ty_at = w.pos;
        let ty = w.u32();
        let val_at = w.pos;
        let array = (ty == ARRAY).then(|| {
            let e = u32::from_le_bytes(file[val_at..val_at + 4].try_into().unwrap());
            let n = u64::from_le_bytes(file[val_at + 4..val_at + 12].try_into().unwrap());
            (e, n)
        });
        w.skip_value(ty);
        if key == "general.alignment" {
            alignment = u32::from_le_bytes(file[val_at..val_at + 4].try_into().unwrap()) as u64;
        }
        kvs.push(Kv { at, key, ty_at, ty, val_at, end: w.pos, array });
    }
    let mut tensors = Vec::new();
    for _ in 0..n_tensors {
        let at = w.pos;
        let name = w.string();
        let ndims_at = w.pos;
        let nd = w.u32();
        let dims = (0..nd).map(|_| w.u64()).collect();
        let ty_at = w.pos;
        let ty = w.u32();
        let off_at = w.pos;
        let off = w.u64();
        tensors.push(TensorInfo { at, name, ndims_at, dims, ty_at, ty, off_at, off });
    }
    let header_len = w.pos;
    let data_offset = (header_len as u64).div_ceil(alignment) * alignment;
    Layout { version, kvs, tensors, header_len, data_offset }
}

/// An editable header: what [`Header::emit`] writes.
#[derive(Clone, Debug)]
pub struct Header {
    pub magic: [u8; 4],
    pub version: u32,
    /// `None`: the number of entries.
    pub n_tensors: Option<u64>,
    pub n_kv: Option<u64>,
    /// (key bytes, value type, raw value bytes).
    pub kvs: Vec<(Vec<u8>, u32, Vec<u8>)>,
    pub tensors: Vec<EditTensor>,
    /// Alignment of the data section (the writer's; a `general.alignment` key is separate).
    pub align: u64,
}

#[derive(Clone, Debug)]
pub struct EditTensor {
    pub name: Vec<u8>,
    /// Innermost first.
    pub dims: Vec<u64>,
    pub ty: u32,
    pub off: u64,
}

impl Header {
    pub fn from_layout(l: &Layout, header: &[u8]) -> Header {
        Header {
            magic: *b"GGUF",
            version: l.version,
            n_tensors: None,
            n_kv: None,
            kvs: l.kvs.iter().map(|k| (k.key.as_bytes().to_vec(), k.ty, k.raw(header).to_vec())).collect(),
            tensors: l
                .tensors
                .iter()
                .map(|t| EditTensor { name: t.name.as_bytes().to_vec(), dims: t.dims.clone(), ty: t.ty, off: t.off })
                .collect(),
            align: ALIGN,
        }
    }

    pub fn kv_mut(&mut self, key: &str) -> &mut (Vec<u8>, u32, Vec<u8>) {
        self.kvs.iter_mut().find(|k| k.0 == key.as_bytes()).unwrap_or_else(|| panic!("no key {key}"))
    }

    /// Replaces (or appends) a key's value.
    pub fn set(&mut self, key: &str, ty: u32, raw: Vec<u8>) -> &mut Self {
        match self.kvs.iter_mut().find(|k| k.0 == key.as_bytes()) {
            Some(k) => {
                k.1 = ty;
                k.2 = raw;
            }
            None => self.kvs.push((key.as_bytes().to_vec(), ty, raw)),
        }
        self
    }

    pub fn remove(&mut self, key: &str) -> &mut Self {
        self.kvs.retain(|k| k.0 != key.as_bytes());
        self
    }

    pub fn tensor_mut(&mut self, name: &str) -> &mut EditTensor {
        self.tensors.iter_mut().find(|t| t.name == name.as_bytes()).unwrap_or_else(|| panic!("no tensor {name}"))
    }

    /// The length of the header before padding.
    pub fn unpadded_len(&self) -> usize {
        let kvs: usize = self.kvs.iter().map(|(k, _, raw)| 8 + k.len() + 4 + raw.len()).sum();
        let tensors: usize = self.tensors.iter().map(|t| 8 + t.name.len() + 4 + 8 * t.dims.len() + 4 + 8).sum();
        24 + kvs + tensors
    }

    /// The header bytes, padded with zeros to the alignment.
    pub fn emit(&self) -> Vec<u8> {
        let mut o = Vec::with_capacity(2 << 20);
        o.extend_from_slice(&self.magic);
        o.extend_from_slice(&self.version.to_le_bytes());
        o.extend_from_slice(&self.n_tensors.unwrap_or(self.tensors.len() as u64).to_le_bytes());
        o.extend_from_slice(&self.n_kv.unwrap_or(self.kvs.len() as u64).to_le_bytes());
        for (k, ty, raw) in &self.kvs {
            o.extend_from_slice(&(k.len() as u64).to_le_bytes());
            o.extend_from_slice(k);
            o.extend_from_slice(&ty.to_le_bytes());
            o.extend_from_slice(raw);
        }
        for t in &self.tensors {
            o.extend_from_slice(&(t.name.len() as u64).to_le_bytes());
            o.extend_from_slice(&t.name);
            o.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                o.extend_from_slice(&d.to_le_bytes());
            }
            o.extend_from_slice(&t.ty.to_le_bytes());
            o.extend_from_slice(&t.off.to_le_bytes());
        }
        let padded = (o.len() as u64).div_ceil(self.align) * self.align;
        o.resize(padded as usize, 0);
        o
    }
}

// Raw value encoders.
pub fn v_u32(x: u32) -> Vec<u8> {
    x.to_le_bytes().to_vec()
}
pub fn v_u64(x: u64) -> Vec<u8> {
    x.to_le_bytes().to_vec()
}
pub fn v_i32(x: i32) -> Vec<u8> {
    x.to_le_bytes().to_vec()
}
pub fn v_f32(x: f32) -> Vec<u8> {
    x.to_le_bytes().to_vec()
}
pub fn v_str(s: &str) -> Vec<u8> {
    let mut o = (s.len() as u64).to_le_bytes().to_vec();
    o.extend_from_slice(s.as_bytes());
    o
}
/// An array of `elem`-typed values, each already encoded.
pub fn v_array(elem: u32, items: &[Vec<u8>]) -> Vec<u8> {
    let mut o = elem.to_le_bytes().to_vec();
    o.extend_from_slice(&(items.len() as u64).to_le_bytes());
    for i in items {
        o.extend_from_slice(i);
    }
    o
}

/// The real checkpoint, as the recipes see it.
pub struct Base {
    /// The header up to the data section (tensor infos and padding included).
    pub header: Vec<u8>,
    pub layout: Layout,
    pub file_len: u64,
    pub data_len: u64,
}

impl Base {
    pub fn new(path: &Path) -> Base {
        use std::io::Read;
        let file_len = std::fs::metadata(path).unwrap().len();
        // The header of the real file is under 2 MB; read 8 MB (or all) to walk it.
        let mut head = Vec::new();
        std::fs::File::open(path).unwrap().take(8 << 20).read_to_end(&mut head).unwrap();
        let layout = layout(&head);
        head.truncate(layout.data_offset as usize);
        Base { data_len: file_len - layout.data_offset, header: head, layout, file_len }
    }

    /// The file with `header` (same length as the original) patched in place.
    pub fn patched(&self, patch: impl FnOnce(&mut Vec<u8>)) -> Content {
        let mut h = self.header.clone();
        patch(&mut h);
        Content::Sparse { parts: vec![(0, h)], len: self.file_len }
    }

    /// The file with a re-emitted header; the data section follows it, as long as before.
    pub fn emitted(&self, edit: impl FnOnce(&mut Header)) -> Content {
        let mut h = Header::from_layout(&self.layout, &self.header);
        edit(&mut h);
        let bytes = h.emit();
        let len = bytes.len() as u64 + self.data_len;
        Content::Sparse { parts: vec![(0, bytes)], len }
    }
}

fn put_u32(h: &mut [u8], at: usize, v: u32) {
    h[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn put_u64(h: &mut [u8], at: usize, v: u64) {
    h[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Byte size of a value of a fixed-size type (0 for strings and arrays).
fn fixed_size(ty: u32) -> usize {
    match ty {
        U8 | I8 | BOOL => 1,
        U16 | I16 => 2,
        U32 | I32 | F32 => 4,
        U64 | I64 | F64 => 8,
        _ => 0,
    }
}

/// A valid type id whose encoded size differs from `ty`'s (so the stream after it is misread).
fn other_size_type(ty: u32, rng: &mut Rng) -> u32 {
    let all = [U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64];
    loop {
        let t = all[rng.below(all.len() as u64) as usize];
        if t != ty && (fixed_size(t) != fixed_size(ty) || fixed_size(t) == 0) && !(t == STRING && ty == ARRAY) {
            return t;
        }
    }
}

/// All GGUF recipes. `sink.gguf(category, name, build)` registers one.
pub fn recipes(b: &Base, s: &mut Sink, rng: &mut Rng) {
    let l = &b.layout;
    let file_len = b.file_len;
    let data_offset = l.data_offset;

    // --- Truncations -------------------------------------------------------------------------
    let mut cuts: Vec<u64> = vec![0, 1, 2, 3, 4, 5, 7, 8, 12, 16, 20, 23, 24, 25];
    for k in l.kvs.iter().take(8) {
        cuts.extend([k.at as u64, k.at as u64 + 3, k.ty_at as u64, k.val_at as u64, k.end as u64 - 1]);
    }
    for key in
        ["tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.chat_template"]
    {
        let k = l.kv(key);
        cuts.extend([k.val_at as u64 + 4, k.val_at as u64 + 12, (k.val_at + k.end) as u64 / 2, k.end as u64 - 1]);
    }
    for t in l.tensors.iter().step_by(68).chain(l.tensors.last()) {
        cuts.extend([t.at as u64, t.at as u64 + 9, t.ndims_at as u64 + 2, t.ty_at as u64, t.off_at as u64 + 7]);
    }
    cuts.extend([l.header_len as u64 - 1, l.header_len as u64, data_offset - 1, data_offset, data_offset + 1]);
    for _ in 0..5 {
        cuts.push(data_offset + 2 + rng.below(file_len - data_offset - 3));
    }
    for _ in 0..8 {
        cuts.push(24 + rng.below(l.header_len as u64 - 24));
    }
    cuts.extend([file_len - 2304, file_len - 33, file_len - 32, file_len - 31, file_len - 1]);
    cuts.sort_unstable();
    cuts.dedup();
    for c in cuts {
        s.gguf("gguf: truncated", format!("cut at byte {c} of {file_len}"), move |b| {
            if c <= b.layout.data_offset {
                Content::Bytes(b.header[..c as usize].to_vec())
            } else {
                Content::Sparse { parts: vec![(0, b.header.clone())], len: c }
            }
        });
    }

    // --- Fixed header fields -----------------------------------------------------------------
    for magic in [*b"GGML", *b"ggjt", *b"FUGG", [0; 4], *b"GGUf"] {
        s.gguf("gguf: header fields", format!("magic {magic:?}"), move |b| {
            b.patched(|h| h[..4].copy_from_slice(&magic))
        });
    }
    for v in [0u32, 1, 4, 0x8000_0000, u32::MAX, 3u32.swap_bytes()] {
        s.gguf("gguf: header fields", format!("version {v}"), move |b| b.patched(|h| put_u32(h, 4, v)));
    }
    let nt = l.tensors.len() as u64;
    let nk = l.kvs.len() as u64;
    for (what, at, n) in [("tensor count", 8usize, nt), ("metadata count", 16, nk)] {
        for v in [0, n - 1, n + 1, 2 * n].into_iter().chain(ABSURD) {
            s.gguf("gguf: header fields", format!("{what} {v} (file: {n})"), move |b| b.patched(|h| put_u64(h, at, v)));
        }
    }

    // --- Key/value structure (in place) ------------------------------------------------------
    for (i, k) in l.kvs.iter().enumerate() {
        let (at, ty_at, val_at, ty, key_len) = (k.at, k.ty_at, k.val_at, k.ty, k.key.len() as u64);
        let absurd = ABSURD[i % ABSURD.len()];
        let cat = "gguf: metadata structure";
        // One key length per key: absurd, one more or one less, in turn.
        let len = [absurd, key_len + 1, absurd, key_len - 1][i % 4];
        s.gguf(cat, format!("{}: key length {len} (is {key_len})", k.key), move |b| b.patched(|h| put_u64(h, at, len)));
        let bad_ty = [13u32, 14, 255, 0x0100_0008, u32::MAX][i % 5];
        s.gguf(cat, format!("{}: value type {bad_ty}", k.key), move |b| b.patched(|h| put_u32(h, ty_at, bad_ty)));
        let other = other_size_type(ty, rng);
        s.gguf(cat, format!("{}: value type {ty} -> {other}", k.key), move |b| b.patched(|h| put_u32(h, ty_at, other)));
        if ty == STRING {
            let len = u64::from_le_bytes(b.header[val_at..val_at + 8].try_into().unwrap());
            let v = ABSURD[(i + 1) % ABSURD.len()];
            s.gguf(cat, format!("{}: string length {v} (is {len})", k.key), move |b| {
                b.patched(|h| put_u64(h, val_at, v))
            });
            s.gguf(cat, format!("{}: string length {} (is {len})", k.key, len + 9), move |b| {
                b.patched(|h| put_u64(h, val_at, len + 9))
            });
        }
        if let Some((elem, n)) = k.array {
            let v = ABSURD[(i + 2) % ABSURD.len()];
            s.gguf(cat, format!("{}: array count {v} (is {n})", k.key), move |b| {
                b.patched(|h| put_u64(h, val_at + 4, v))
            });
            s.gguf(cat, format!("{}: array count {} (is {n})", k.key, n + 1), move |b| {
                b.patched(|h| put_u64(h, val_at + 4, n + 1))
            });
            for e in [13u32, ARRAY, other_size_type(elem, rng)] {
                s.gguf(cat, format!("{}: array element type {elem} -> {e}", k.key), move |b| {
                    b.patched(|h| put_u32(h, val_at, e))
                });
            }
        }
    }

    // --- Model config values (re-emitted with any type) --------------------------------------
    let cat = "gguf: config values";
    let counts = [
        ("llama.block_count", 30u64),
        ("llama.context_length", 8192),
        ("llama.embedding_length", 576),
        ("llama.feed_forward_length", 1536),
        ("llama.attention.head_count", 9),
        ("llama.attention.head_count_kv", 3),
    ];
    for (key, real) in counts {
        let mut vals: Vec<(String, u32, Vec<u8>)> = vec![
            ("0".into(), U32, v_u32(0)),
            ("-1 (i32)".into(), I32, v_i32(-1)),
            (format!("{real} as f32"), F32, v_f32(real as f32)),
            (format!("{real} as a string"), STRING, v_str(&real.to_string())),
            ("an array of strings".into(), ARRAY, v_array(STRING, &[v_str("9"), v_str("9")])),
            (format!("{} (u32::MAX)", u32::MAX), U32, v_u32(u32::MAX)),
        ];
        vals.extend(ABSURD.iter().map(|&v| (format!("{v} (u64)"), U64, v_u64(v))));
        vals.push(("1e9 (u64)".into(), U64, v_u64(1_000_000_000)));
        if key != "llama.context_length" {
            vals.push((format!("{} (one more)", real + 1), U32, v_u32(real as u32 + 1)));
            vals.push((format!("{} (one less)", real - 1), U32, v_u32(real as u32 - 1)));
        }
        if key.contains("head_count") || key.contains("feed_forward") {
            // llama.cpp allows per-layer arrays; these are not uniform.
            let mut items: Vec<Vec<u8>> = (0..30).map(|_| v_u32(real as u32)).collect();
            items[17] = v_u32(real as u32 * 2);
            vals.push(("a per-layer array that is not uniform".into(), ARRAY, v_array(U32, &items)));
        }
        for (what, ty, raw) in vals {
            s.gguf(cat, format!("{key} = {what}"), move |b| {
                b.emitted(|h| {
                    h.set(key, ty, raw.clone());
                })
            });
        }
        s.gguf(cat, format!("{key} missing"), move |b| {
            b.emitted(|h| {
                h.remove(key);
            })
        });
    }
    // Context length past the engine's limit.
    for v in [1u64 << 27, 1 << 40] {
        s.gguf(cat, format!("llama.context_length = {v}"), move |b| {
            b.emitted(|h| {
                h.set("llama.context_length", U64, v_u64(v));
            })
        });
    }
    for (key, vals) in [
        ("llama.attention.layer_norm_rms_epsilon", vec![f32::NAN, -1e-5, f32::INFINITY]),
        ("llama.rope.freq_base", vec![0.0, -10000.0, f32::NAN, f32::INFINITY]),
        ("llama.rope.scaling.factor", vec![-2.0, f32::NAN]),
    ] {
        for v in vals {
            s.gguf(cat, format!("{key} = {v}"), move |b| {
                b.emitted(|h| {
                    h.set(key, F32, v_f32(v));
                })
            });
        }
    }
    s.gguf(cat, "llama.attention.layer_norm_rms_epsilon as a string", |b| {
        b.emitted(|h| {
            h.set("llama.attention.layer_norm_rms_epsilon", STRING, v_str("1e-5"));
        })
    });
    s.gguf(cat, "llama.attention.layer_norm_rms_epsilon missing", |b| {
        b.emitted(|h| {
            h.remove("llama.attention.layer_norm_rms_epsilon");
        })
    });
    // RoPE: partial rotary dimensions, unsupported scaling kinds.
    for v in [0u32, 32, 63, 128] {
        s.gguf(cat, format!("llama.rope.dimension_count = {v} (head dim 64)"), move |b| {
            b.emitted(|h| {
                h.set("llama.rope.dimension_count", U32, v_u32(v));
            })
        });
    }
    for ty in ["yarn", "longrope", "su"] {
        s.gguf(cat, format!("llama.rope.scaling.type = {ty}, factor 4"), move |b| {
            b.emitted(|h| {
                h.set("llama.rope.scaling.type", STRING, v_str(ty));
                h.set("llama.rope.scaling.factor", F32, v_f32(4.0));
            })
        });
    }
    for v in [32u32, 256] {
        s.gguf(cat, format!("llama.attention.key_length = {v} (head dim 64)"), move |b| {
            b.emitted(|h| {
                h.set("llama.attention.key_length", U32, v_u32(v));
            })
        });
    }
    s.gguf(cat, "llama.attention.value_length = 32", |b| {
        b.emitted(|h| {
            h.set("llama.attention.value_length", U32, v_u32(32));
        })
    });
    for (what, ty, raw) in [
        ("mamba", STRING, v_str("mamba")),
        ("empty", STRING, v_str("")),
        ("LLAMA", STRING, v_str("LLAMA")),
        ("llama with a NUL", STRING, v_str("llama\0")),
        ("5 (u32)", U32, v_u32(5)),
    ] {
        s.gguf(cat, format!("general.architecture = {what}"), move |b| {
            b.emitted(|h| {
                h.set("general.architecture", ty, raw.clone());
            })
        });
    }
    s.gguf(cat, "general.architecture missing", |b| {
        b.emitted(|h| {
            h.remove("general.architecture");
        })
    });
    for (key, vals) in [
        ("tokenizer.ggml.bos_token_id", vec![49152u64, u32::MAX as u64, 1 << 40]),
        ("tokenizer.ggml.eos_token_id", vec![49152, 1 << 32, u64::MAX]),
    ] {
        for v in vals {
            s.gguf(cat, format!("{key} = {v}"), move |b| {
                b.emitted(|h| {
                    h.set(key, U64, v_u64(v));
                })
            });
        }
    }
    s.gguf(cat, "tokenizer.ggml.eot_token_id = 50000", |b| {
        b.emitted(|h| {
            h.set("tokenizer.ggml.eot_token_id", U32, v_u32(50000));
        })
    });
    s.gguf(cat, "tokenizer.ggml.add_bos_token = 2 (u8)", |b| {
        b.emitted(|h| {
            h.set("tokenizer.ggml.add_bos_token", U8, vec![2]);
        })
    });
    s.gguf(cat, "tokenizer.ggml.add_bos_token: bool byte 2", |b| {
        b.emitted(|h| {
            h.set("tokenizer.ggml.add_bos_token", BOOL, vec![2]);
        })
    });
    // A key twice.
    s.gguf(cat, "llama.block_count twice", |b| {
        b.emitted(|h| {
            let k = h.kv_mut("llama.block_count").clone();
            h.kvs.push(k);
        })
    });

    // --- general.alignment -------------------------------------------------------------------
    // Keys that disagree with where the data is. The header is padded so that its length is one
    // more than a multiple of 32: any other alignment then moves the start of the data section.
    for (what, ty, raw) in [
        ("0", U32, v_u32(0)),
        ("1", U32, v_u32(1)),
        ("4", U32, v_u32(4)),
        ("8", U32, v_u32(8)),
        ("16", U32, v_u32(16)),
        ("48", U32, v_u32(48)),
        ("64", U32, v_u32(64)),
        ("2^31", U32, v_u32(1 << 31)),
        ("2^63 (u64)", U64, v_u64(1 << 63)),
        ("-32 (i32)", I32, v_i32(-32)),
        ("32.0 (f32)", F32, v_f32(32.0)),
    ] {
        s.gguf("gguf: alignment", format!("general.alignment = {what}, data aligned to 32"), move |b| {
            b.emitted(|h| {
                h.set("general.alignment", ty, raw.clone());
                h.set("zz.pad", STRING, v_str(""));
                let pad = (33 - h.unpadded_len() % 32) % 32;
                h.set("zz.pad", STRING, v_str(&"x".repeat(pad)));
                assert_eq!(h.unpadded_len() % 32, 1);
            })
        });
    }

    // --- Tokenizer metadata ------------------------------------------------------------------
    let cat = "gguf: tokenizer metadata";
    let tok_items = |b: &Base| -> Vec<Vec<u8>> {
        let k = b.layout.kv("tokenizer.ggml.tokens");
        let mut w = Walk { b: &b.header, pos: k.val_at + 12 };
        (0..k.array.unwrap().1).map(|_| v_str(&w.string())).collect()
    };
    s.gguf(cat, "tokens: the last one dropped", move |b| {
        let mut items = tok_items(b);
        items.pop();
        b.emitted(|h| {
            h.set("tokenizer.ggml.tokens", ARRAY, v_array(STRING, &items));
        })
    });
    s.gguf(cat, "tokens: one added", move |b| {
        let mut items = tok_items(b);
        items.push(v_str("<extra>"));
        b.emitted(|h| {
            h.set("tokenizer.ggml.tokens", ARRAY, v_array(STRING, &items));
        })
    });
    s.gguf(cat, "tokens: empty", |b| {
        b.emitted(|h| {
            h.set("tokenizer.ggml.tokens", ARRAY, v_array(STRING, &[]));
        })
    });
    s.gguf(cat, "tokens: u32 ids instead of strings", |b| {
        b.emitted(|h| {
            let items: Vec<Vec<u8>> = (0..49152).map(v_u32).collect();
            h.set("tokenizer.ggml.tokens", ARRAY, v_array(U32, &items));
        })
    });
    s.gguf(cat, "tokens: a string", |b| {
        b.emitted(|h| {
            h.set("tokenizer.ggml.tokens", STRING, v_str("a b c"));
        })
    });
    s.gguf(cat, "token_type: f32", |b| {
        b.emitted(|h| {
            let items: Vec<Vec<u8>> = (0..49152).map(|_| v_f32(1.5)).collect();
            h.set("tokenizer.ggml.token_type", ARRAY, v_array(F32, &items));
        })
    });
    s.gguf(cat, "token_type: one short", |b| {
        b.emitted(|h| {
            let items: Vec<Vec<u8>> = (0..49151).map(|_| v_i32(1)).collect();
            h.set("tokenizer.ggml.token_type", ARRAY, v_array(I32, &items));
        })
    });
    s.gguf(cat, "token_type: 2^40 (i64)", |b| {
        b.emitted(|h| {
            let items: Vec<Vec<u8>> = (0..49152).map(|_| (1i64 << 40).to_le_bytes().to_vec()).collect();
            h.set("tokenizer.ggml.token_type", ARRAY, v_array(I64, &items));
        })
    });
    s.gguf(cat, "scores: 3 entries for 49152 tokens", |b| {
        b.emitted(|h| {
            h.set("tokenizer.ggml.scores", ARRAY, v_array(F32, &[v_f32(0.0), v_f32(1.0), v_f32(2.0)]));
        })
    });
    s.gguf(cat, "scores: strings", |b| {
        b.emitted(|h| {
            let items: Vec<Vec<u8>> = (0..49152).map(|_| v_str("0")).collect();
            h.set("tokenizer.ggml.scores", ARRAY, v_array(STRING, &items));
        })
    });
    s.gguf(cat, "merges: u32", |b| {
        b.emitted(|h| {
            h.set("tokenizer.ggml.merges", ARRAY, v_array(U32, &[v_u32(1), v_u32(2)]));
        })
    });
    s.gguf(cat, "merges: not pairs", |b| {
        b.emitted(|h| {
            h.set("tokenizer.ggml.merges", ARRAY, v_array(STRING, &[v_str("a"), v_str("a b c"), v_str("")]));
        })
    });
    s.gguf(cat, "merges: tokens that are not in the vocabulary", |b| {
        b.emitted(|h| {
            h.set("tokenizer.ggml.merges", ARRAY, v_array(STRING, &[v_str("\u{1}zz\u{2} \u{3}qq")]));
        })
    });
    for m in ["bert", "", "rwkv"] {
        s.gguf(cat, format!("tokenizer.ggml.model = {m:?}"), move |b| {
            b.emitted(|h| {
                h.set("tokenizer.ggml.model", STRING, v_str(m));
            })
        });
    }
    s.gguf(cat, "tokenizer.ggml.pre = an unknown pre-tokenizer", |b| {
        b.emitted(|h| {
            h.set("tokenizer.ggml.pre", STRING, v_str("no-such-pre"));
        })
    });
    s.gguf(cat, "tokenizer.ggml.tokens nested 9 deep", |b| {
        b.emitted(|h| {
            let mut v = v_array(U8, &[vec![1]]);
            for _ in 0..8 {
                v = v_array(ARRAY, &[v]);
            }
            h.set("tokenizer.ggml.tokens", ARRAY, v);
        })
    });
    for (what, t) in [
        ("unclosed for", "{% for m in messages %}{{ m.content }}"),
        ("unknown filter", "{{ messages | no_such_filter }}"),
        ("raise_exception", "{{ raise_exception('no system role') }}"),
        ("undefined call", "{{ messages[0].content.nosuchmethod() }}"),
    ] {
        s.gguf(cat, format!("chat template: {what}"), move |b| {
            b.emitted(|h| {
                h.set("tokenizer.chat_template", STRING, v_str(t));
            })
        });
    }
    s.gguf(cat, "chat template: a u32", |b| {
        b.emitted(|h| {
            h.set("tokenizer.chat_template", U32, v_u32(7));
        })
    });

    // --- Tensor infos ------------------------------------------------------------------------
    let cat = "gguf: tensor infos";
    let picks = [
        "token_embd.weight",
        "output_norm.weight",
        "blk.0.attn_q.weight",
        "blk.0.attn_k.weight",
        "blk.0.attn_norm.weight",
        "blk.7.ffn_down.weight",
        "blk.13.ffn_gate.weight",
        "blk.21.attn_v.weight",
        "blk.29.attn_output.weight",
        "blk.29.ffn_up.weight",
        "blk.29.ffn_norm.weight",
    ];
    for name in picks {
        let t = l.tensor(name).clone();
        let two_d = t.dims.len() == 2;
        // In place: name length, dimension count, dimensions, type, offset.
        let mut menu: Vec<(String, Edit<Vec<u8>>)> = Vec::new();
        let (at, nd_at, ty_at, off_at) = (t.at, t.ndims_at, t.ty_at, t.off_at);
        for v in [0u64, 64, 1 << 32, u64::MAX] {
            menu.push((format!("name length {v}"), Box::new(move |h| put_u64(h, at, v))));
        }
        for v in [0u32, 3, 5, u32::MAX].into_iter().chain(two_d.then_some(1)) {
            menu.push((format!("{v} dimensions"), Box::new(move |h| put_u32(h, nd_at, v))));
        }
        for i in 0..t.dims.len() {
            let d = t.dims[i];
            let dat = t.dim_at(i);
            for v in [0, d - 1, d + 1, d + 32, d * 2].into_iter().chain(ABSURD) {
                menu.push((format!("dimension {i} = {v} (is {d})"), Box::new(move |h| put_u64(h, dat, v))));
            }
        }
        if two_d && t.dims[0] != t.dims[1] {
            let (a, c) = (t.dims[0], t.dims[1]);
            let d0 = t.dim_at(0);
            menu.push((
                format!("dimensions swapped ({a}, {c})"),
                Box::new(move |h| {
                    put_u64(h, d0, c);
                    put_u64(h, d0 + 8, a);
                }),
            ));
        }
        for v in [0u32, 1, 2, 3, 6, 7, 8, 12, 13, 14, 30, 4, 9, 16, 26, 39, 42, 1000, u32::MAX] {
            if v != t.ty {
                menu.push((format!("type {} -> {v}", t.ty), Box::new(move |h| put_u32(h, ty_at, v))));
            }
        }
        let off = t.off;
        for v in [off + 32, off.wrapping_sub(32), off + 1, off + 8, 1 << 40, u64::MAX - 31, u64::MAX / 32 * 32] {
            if v != off {
                menu.push((format!("offset {v} (is {off})"), Box::new(move |h| put_u64(h, off_at, v))));
            }
        }
        // A sample of the menu per tensor (all of it for the first three).
        let keep = if name == picks[0] { menu.len() } else { 6 };
        let mut order: Vec<usize> = (0..menu.len()).collect();
        rng.shuffle(&mut order);
        order.truncate(keep);
        order.sort_unstable();
        let menu: Vec<_> = menu.into_iter().enumerate().filter(|(i, _)| order.contains(i)).map(|(_, m)| m).collect();
        for (what, patch) in menu {
            s.gguf(cat, format!("{name}: {what}"), move |b| b.patched(|h| patch(h)));
        }
        // Re-emitted: renamed, removed, duplicated.
        let renames = [
            name.replace("weight", "weights"),
            name.replace("blk.", "blk.0"),
            format!("{name}\0"),
            "blk.30.attn_norm.weight".to_string(),
            "blk.x.attn_norm.weight".to_string(),
            "a".repeat(64),
            String::new(),
        ];
        for new in [renames[rng.below(3) as usize].clone(), renames[3 + rng.below(4) as usize].clone()] {
            if new == name {
                continue;
            }
            s.gguf(cat, format!("{name} renamed {}", new.escape_debug()), move |b| {
                b.emitted(|h| {
                    h.tensor_mut(name).name = new.clone().into_bytes();
                })
            });
        }
        s.gguf(cat, format!("{name}: info removed"), move |b| {
            b.emitted(|h| {
                h.tensors.retain(|t| t.name != name.as_bytes());
            })
        });
        s.gguf(cat, format!("{name}: info twice"), move |b| {
            b.emitted(|h| {
                let t = h.tensor_mut(name).clone();
                h.tensors.push(t);
            })
        });
    }
    // Another tensor's name.
    s.gguf(cat, "blk.0.ffn_up.weight renamed blk.0.ffn_gate.weight", |b| {
        b.emitted(|h| {
            h.tensor_mut("blk.0.ffn_up.weight").name = b"blk.0.ffn_gate.weight".to_vec();
        })
    });
    s.gguf(cat, "an extra tensor blk.29.attn_q.bias (data past the end)", |b| {
        b.emitted(|h| {
            h.tensors.push(EditTensor {
                name: b"blk.29.attn_q.bias".to_vec(),
                dims: vec![576],
                ty: 0,
                off: b.data_len,
            });
        })
    });
    s.gguf(cat, "rope_freqs.weight added (Llama 3.1 scaling)", |b| {
        b.emitted(|h| {
            h.tensors.push(EditTensor { name: b"rope_freqs.weight".to_vec(), dims: vec![32], ty: 0, off: b.data_len });
        })
    });

    // --- Overlapping and misplaced tensor data -----------------------------------------------
    let cat = "gguf: overlapping tensors";
    let pairs = [
        ("blk.0.ffn_up.weight", "blk.0.ffn_gate.weight"),
        ("blk.3.attn_k.weight", "blk.3.attn_v.weight"),
        ("blk.12.attn_q.weight", "blk.12.attn_output.weight"),
        ("blk.29.ffn_norm.weight", "blk.29.attn_norm.weight"),
        ("output_norm.weight", "blk.0.attn_norm.weight"),
        ("blk.5.ffn_down.weight", "token_embd.weight"),
    ];
    for (a, c) in pairs {
        let (ta, tc) = (l.tensor(a).clone(), l.tensor(c).clone());
        let (off_at, to) = (ta.off_at, tc.off);
        s.gguf(cat, format!("{a} at the data of {c}"), move |b| b.patched(|h| put_u64(h, off_at, to)));
        // Halfway into the other tensor (aligned).
        let len = ta.dims.iter().product::<u64>(); // elements: enough to place it inside
        let mid = to + (len / 4).min(1 << 12) / 32 * 32 + 32;
        s.gguf(cat, format!("{a} inside the data of {c}"), move |b| b.patched(|h| put_u64(h, off_at, mid)));
        let (tc_at, ta_off) = (tc.off_at, ta.off);
        if ta.dims != tc.dims || ta.ty != tc.ty {
            // Swapped places: different sizes break the tiling.
            s.gguf(cat, format!("{a} and {c} swap offsets"), move |b| {
                b.patched(|h| {
                    put_u64(h, off_at, to);
                    put_u64(h, tc_at, ta_off);
                })
            });
        }
    }
    s.gguf(cat, "every offset 0", |b| {
        b.patched(|h| {
            for t in &b.layout.tensors {
                put_u64(h, t.off_at, 0);
            }
        })
    });
    s.gguf(cat, "the file 32 bytes longer than its data", |b| Content::Sparse {
        parts: vec![(0, b.header.clone())],
        len: b.file_len + 32,
    });
    s.gguf(cat, "the file 1 MiB longer than its data", |b| Content::Sparse {
        parts: vec![(0, b.header.clone())],
        len: b.file_len + (1 << 20),
    });

    // --- Tensor values -----------------------------------------------------------------------
    // Non-finite values in float tensors: found when the tensor is read (the load path reads
    // every norm as floats).
    for (name, v) in [
        ("output_norm.weight", f32::NAN),
        ("blk.0.attn_norm.weight", f32::INFINITY),
        ("blk.29.ffn_norm.weight", -f32::INFINITY),
    ] {
        let t = l.tensor(name).clone();
        s.gguf("gguf: tensor values", format!("{name}[5] = {v}"), move |b| Content::Sparse {
            parts: vec![(0, b.header.clone()), (b.layout.data_offset + t.off + 20, v.to_le_bytes().to_vec())],
            len: b.file_len,
        });
    }
}
