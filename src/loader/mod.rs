//! Checkpoint loaders. Both formats end in the same place: a [`Checkpoint`] holding a
//! [`ModelConfig`], memory-mapped tensors under canonical (GGUF-style) names, and what the
//! tokenizer needs.
//!
//! Canonical tensor names (the GGUF ones; the Hugging Face loader maps onto them):
//! `token_embd.weight`, `output_norm.weight`, `output.weight` (absent when tied),
//! `blk.{i}.attn_norm.weight`, `blk.{i}.attn_{q,k,v}.{weight,bias}`, `blk.{i}.attn_output.weight`,
//! `blk.{i}.attn_{q,k}_norm.weight`, `blk.{i}.post_attention_norm.weight`, `blk.{i}.ffn_norm.weight`,
//! `blk.{i}.post_ffw_norm.weight`, `blk.{i}.ffn_{gate,up,down}.weight`.
//!
//! Shapes are row-major, outermost first: a linear weight is `[out_features, in_features]`.
//! Every tensor here is in the layout the engine computes with: llama.cpp's Q/K row permutation
//! is already undone and Gemma's RMSNorm `(1 + w)` is already folded into the weights.

/// The stored types, at the crate root ([`crate::dtype`]); here for the loaders' paths.
pub use crate::dtype;
pub mod gguf;
pub mod hf;
pub mod synthetic;

pub use dtype::DType;

use crate::error::{shown, Error, Result};
use crate::model::config::ModelConfig;
use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};

/// A tensor's bytes, still in its stored type (read from the file by [`Checkpoint::raw`]).
#[derive(Clone, Debug)]
pub struct TensorView<'a> {
    pub name: &'a str,
    pub dtype: DType,
    /// Row-major, outermost first.
    pub shape: Vec<usize>,
    pub bytes: Vec<u8>,
}

impl TensorView<'_> {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    /// Dequantizes or converts to f32.
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        dtype::to_f32(self.dtype, &self.bytes, self.numel())
    }
    /// Dequantizes or converts to f16 (what the GPU weights are today).
    pub fn to_f16(&self) -> Result<Vec<half::f16>> {
        dtype::to_f16(self.dtype, &self.bytes, self.numel())
    }
}

/// Where the tokenizer comes from.
#[derive(Clone, Debug)]
pub enum TokenizerSource {
    /// A tokenizer.json file.
    Json(PathBuf),
    /// GGUF `tokenizer.ggml.*` metadata (owned copies).
    Gguf(gguf::GgufTokenizerData),
    /// None: a synthetic checkpoint ([`synthetic`]) runs on token ids alone.
    None,
}

/// A loaded checkpoint: config, tensor locations (validated against the files) and tokenizer
/// source.
///
/// Opening reads and validates only headers and metadata: every size in checked arithmetic
/// under a named limit, the config against the tensors present (every declared layer complete,
/// no tensor left over, each tensor's shape and type what its name implies), and each tensor's
/// byte range inside its file. Tensor data is read on demand ([`Checkpoint::raw`],
/// [`Checkpoint::f16`], [`Checkpoint::f32`]) with positioned reads, not a memory map: a file
/// that shrinks while it is being loaded then gives an error instead of `SIGBUS`, which no
/// length check before touching a map can rule out (the file can shrink between the check and
/// the access).
pub struct Checkpoint {
    pub path: PathBuf,
    pub config: ModelConfig,
    pub tokenizer: TokenizerSource,
    /// The model's chat template (Jinja), if it ships one.
    pub chat_template: Option<String>,
    /// Strings of special tokens used by templates (`bos_token`, `eos_token`).
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub(crate) tensors: HashMap<String, StoredTensor>,
    pub(crate) files: Vec<DataFile>,
    /// Row permutations / offsets applied on conversion (see module docs).
    pub(crate) fixups: HashMap<String, Fixup>,
}

/// A conversion step applied when a tensor is read out of the file.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fixup {
    /// Undo llama.cpp's interleaved-RoPE row permutation of a Q or K projection with this many heads.
    UnpermuteRope { heads: usize },
    /// Add a constant to every element (Gemma's `(1 + w)` RMSNorm in a Hugging Face checkpoint).
    AddConstant(f32),
    /// `x -> ln(-x)`: llama.cpp stores a Gated DeltaNet's `ssm_a = -exp(A_log)`; the engine reads
    /// `A_log`.
    LnNeg,
}

#[derive(Clone, Debug)]
pub(crate) struct StoredTensor {
    /// Index into [`Checkpoint::files`].
    pub file: usize,
    /// Absolute byte offset in the file.
    pub offset: u64,
    /// Bytes of the tensor as [`Checkpoint::raw`] returns it (`dtype`'s size for `shape`).
    pub len: usize,
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// An MLX affine tensor ([`DType::Affine`]) is three stored tensors, gathered into blocks by
    /// [`Checkpoint::raw`]; `file`/`offset` are then its packed `weight`'s.
    pub affine: Option<Box<AffineParts>>,
    /// This tensor is some of a stored tensor's rows ([`RowPick`]); `len`, `shape` are the
    /// picked ones.
    pub pick: Option<RowPick>,
    /// This tensor is these stored tensors stacked (one per expert, transformers' per-expert
    /// `experts.{e}.*_proj`): `shape` = [E, ..their shape], `len` their sum.
    pub stack: Option<Vec<StoredTensor>>,
}

/// Rows picked out of a stored tensor of `src_rows` rows (`src_len` bytes as [`Checkpoint::raw`]
/// reads it): in each group of `period` consecutive rows, rows `start .. start + take` (Qwen3.5's
/// `q_proj` = [q_h | gate_h] per head; transformers' fused `gate_up_proj` = [gate_e | up_e] per
/// expert).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RowPick {
    pub src_rows: usize,
    pub src_len: usize,
    pub period: usize,
    pub start: usize,
    pub take: usize,
}

impl RowPick {
    fn apply(&self, src: &[u8]) -> Vec<u8> {
        let row = src.len() / self.src_rows;
        src.chunks(self.period * row)
            .flat_map(|g| &g[self.start * row..(self.start + self.take) * row])
            .copied()
            .collect()
    }
}

/// Where the `weight` (packed u32), `scales` and `biases` of an MLX quantized tensor are stored:
/// (file, absolute offset, bytes) each.
#[derive(Clone, Debug)]
pub(crate) struct AffineParts {
    pub weight: (usize, u64, usize),
    pub scales: (usize, u64, usize),
    pub biases: (usize, u64, usize),
}

/// An open model file and the length it had when its header was validated, or the bytes of a
/// checkpoint built in memory ([`synthetic`]).
pub(crate) struct DataFile {
    pub path: PathBuf,
    pub source: DataSource,
    pub len: u64,
}

pub(crate) enum DataSource {
    File(File),
    Memory(Vec<u8>),
}

impl DataFile {
    pub(crate) fn file(path: &Path, file: File, len: u64) -> DataFile {
        DataFile { path: path.to_path_buf(), source: DataSource::File(file), len }
    }

    /// Reads `len` bytes at `offset` (a range validated against `self.len` at open), after
    /// checking that the file still has the length it was validated with.
    fn read(&self, offset: u64, len: usize) -> Result<Vec<u8>> {
        let file = match &self.source {
            DataSource::Memory(bytes) => return Ok(bytes[offset as usize..offset as usize + len].to_vec()),
            DataSource::File(file) => file,
        };
        let now = file.metadata().map_err(|e| Error::io(&self.path, e))?.len();
        if now != self.len {
            return Err(self.changed(now));
        }
        let mut buf = vec![0u8; len];
        read_exact_at(file, &mut buf, offset).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => {
                let now = file.metadata().map(|m| m.len()).unwrap_or(0);
                self.changed(now)
            }
            _ => Error::io(&self.path, e),
        })?;
        Ok(buf)
    }

    fn changed(&self, now: u64) -> Error {
        Error::corrupt(
            &self.path,
            format!("the file changed while it was being loaded (it had {} bytes, now {now})", self.len),
        )
    }
}

#[cfg(unix)]
fn read_exact_at(f: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(f, buf, offset)
}

#[cfg(windows)]
fn read_exact_at(f: &File, mut buf: &mut [u8], mut offset: u64) -> std::io::Result<()> {
    use std::os::windows::fs::FileExt;
    while !buf.is_empty() {
        match f.seek_read(buf, offset) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                buf = &mut buf[n..];
                offset += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// What a path is when it is not a regular file, for messages.
fn file_kind(meta: &std::fs::Metadata) -> &'static str {
    let ft = meta.file_type();
    if ft.is_dir() {
        return "a directory";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if ft.is_fifo() {
            return "a FIFO (named pipe)";
        }
        if ft.is_socket() {
            return "a socket";
        }
        if ft.is_block_device() {
            return "a block device";
        }
        if ft.is_char_device() {
            return "a character device";
        }
    }
    "not a regular file"
}

/// The error for a path that exists but is not a regular file.
pub(crate) fn not_a_file(path: &Path, meta: &std::fs::Metadata) -> Error {
    let kind = file_kind(meta);
    let text = if kind == "not a regular file" { kind.to_string() } else { format!("is {kind}, not a regular file") };
    Error::io(path, std::io::Error::new(std::io::ErrorKind::InvalidInput, text))
}

/// Opens a regular file for reading without ever blocking: the path's type is checked before
/// `open` (a FIFO would block there until a writer appears) and again on the open handle, which
/// is opened with `O_NONBLOCK` in case the path was swapped in between. Returns the file and
/// its length.
pub(crate) fn open_regular(path: &Path) -> Result<(File, u64)> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    if !meta.is_file() {
        return Err(not_a_file(path, &meta));
    }
    let mut opts = std::fs::OpenOptions::new();
    opts.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.custom_flags(libc::O_NONBLOCK);
    }
    let file = opts.open(path).map_err(|e| Error::io(path, e))?;
    let meta = file.metadata().map_err(|e| Error::io(path, e))?;
    if !meta.is_file() {
        return Err(not_a_file(path, &meta));
    }
    Ok((file, meta.len()))
}

/// Reads a whole regular file of at most `max` bytes (JSON side files, templates).
pub(crate) fn read_small_file(path: &Path, max: u64) -> Result<Vec<u8>> {
    use std::io::Read;
    let (file, len) = open_regular(path)?;
    if len > max {
        return Err(Error::corrupt(path, format!("{len} bytes is more than the limit of {max} for this file")));
    }
    let mut out = Vec::with_capacity(len as usize);
    file.take(max + 1).read_to_end(&mut out).map_err(|e| Error::io(path, e))?;
    if out.len() as u64 > max {
        return Err(Error::corrupt(path, format!("more than the limit of {max} bytes for this file")));
    }
    Ok(out)
}

/// Whether a side file exists: `Ok(false)` when the path does not exist, an error when it exists
/// but is not a regular file (a directory named `tokenizer.json` is not a missing tokenizer).
pub(crate) fn side_file_exists(path: &Path) -> Result<bool> {
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(Error::io(path, e)),
        Ok(m) if m.is_file() => Ok(true),
        Ok(m) => Err(not_a_file(path, &m)),
    }
}

impl Checkpoint {
    /// Opens a GGUF file or a Hugging Face folder, by what `path` is. Anything else (a FIFO, a
    /// device, a socket) is refused without opening it.
    pub fn open(path: &Path) -> Result<Checkpoint> {
        let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
        if meta.is_dir() {
            hf::open(path)
        } else if meta.is_file() {
            gguf::open(path)
        } else {
            Err(not_a_file(path, &meta))
        }
    }

    pub fn tensor_names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(|s| s.as_str())
    }

    pub fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// The stored shape of `name`, without reading it.
    pub fn raw_shape(&self, name: &str) -> Result<Vec<usize>> {
        self.tensors
            .get(name)
            .map(|t| t.shape.clone())
            .ok_or_else(|| Error::Mismatch(format!("tensor {} is missing from {}", shown(name), self.path.display())))
    }

    /// The raw stored tensor (no fixups applied), read from its file.
    pub fn raw<'a>(&'a self, name: &'a str) -> Result<TensorView<'a>> {
        let t = self.tensors.get(name).ok_or_else(|| {
            Error::Mismatch(format!("tensor {} is missing from {}", shown(name), self.path.display()))
        })?;
        Ok(TensorView { name, dtype: t.dtype, shape: t.shape.clone(), bytes: self.read_stored(t)? })
    }

    /// The bytes of a stored (or picked, or stacked) tensor.
    fn read_stored(&self, t: &StoredTensor) -> Result<Vec<u8>> {
        if let Some(parts) = &t.stack {
            let mut out = Vec::with_capacity(t.len);
            for p in parts {
                out.extend(self.read_stored(p)?);
            }
            return Ok(out);
        }
        let src_len = t.pick.map_or(t.len, |p| p.src_len);
        let bytes = match &t.affine {
            None => self.files[t.file].read(t.offset, src_len)?,
            Some(parts) => {
                let read = |(f, o, l): (usize, u64, usize)| self.files[f].read(o, l);
                let (w, sc, b) = (read(parts.weight)?, read(parts.scales)?, read(parts.biases)?);
                let rows = t.pick.map_or(t.shape[..t.shape.len() - 1].iter().product(), |p| p.src_rows);
                let mut out = Vec::with_capacity(src_len);
                let (wr, sr) = (w.len() / rows, sc.len() / rows);
                for r in 0..rows {
                    let (wr, sr) = (r * wr..(r + 1) * wr, r * sr..(r + 1) * sr);
                    dtype::mlx_affine_blocks(t.dtype, &w[wr], &sc[sr.clone()], &b[sr], &mut out);
                }
                debug_assert_eq!(out.len(), src_len);
                out
            }
        };
        Ok(match t.pick {
            None => bytes,
            Some(p) => p.apply(&bytes),
        })
    }

    /// The tensor as f32 with fixups applied, after checking its shape. Non-finite values are an
    /// error.
    pub fn f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let v = self.raw(name)?;
        check_shape(&v, shape)?;
        let mut data = v.to_f32()?;
        self.apply_fixup(name, &v.shape, &mut data);
        self.check_finite(name, data.iter().map(|x| x.is_finite()))?;
        Ok(data)
    }

    /// The tensor as f16 with fixups applied, after checking its shape. Values that are not
    /// finite (or overflow f16) are an error.
    pub fn f16(&self, name: &str, shape: &[usize]) -> Result<Vec<half::f16>> {
        let v = self.raw(name)?;
        check_shape(&v, shape)?;
        let out = match self.fixups.get(name) {
            None => v.to_f16()?,
            Some(_) => {
                let mut data = v.to_f32()?;
                self.apply_fixup(name, &v.shape, &mut data);
                data.into_iter().map(half::f16::from_f32).collect()
            }
        };
        self.check_finite(name, out.iter().map(|x| x.is_finite()))?;
        Ok(out)
    }

    fn check_finite(&self, name: &str, mut finite: impl Iterator<Item = bool>) -> Result<()> {
        match finite.position(|ok| !ok) {
            None => Ok(()),
            Some(i) => Err(Error::corrupt(
                &self.path,
                format!("tensor {} has a value that is not finite (or out of f16 range) at element {i}", shown(name)),
            )),
        }
    }

    fn apply_fixup(&self, name: &str, shape: &[usize], data: &mut Vec<f32>) {
        match self.fixups.get(name) {
            None => {}
            Some(Fixup::AddConstant(c)) => data.iter_mut().for_each(|x| *x += c),
            Some(Fixup::LnNeg) => data.iter_mut().for_each(|x| *x = (-*x).ln()),
            Some(Fixup::UnpermuteRope { heads }) => {
                *data = unpermute_rope_rows(data, shape[0], shape[1], *heads);
            }
        }
    }
}

impl crate::model::TensorSource for Checkpoint {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn has(&self, name: &str) -> bool {
        Checkpoint::has(self, name)
    }

    fn shape(&self, name: &str) -> Result<Vec<usize>> {
        self.raw_shape(name)
    }

    /// The stored bytes; llama.cpp's interleaved-RoPE row order undone on the raw rows (a
    /// permutation of whole rows, any block type); `None` for a value-changing fixup (Gemma's and
    /// Qwen3.5's `1 + w` norms).
    fn stored(&self, name: &str) -> Result<Option<(DType, Vec<u8>)>> {
        let v = self.raw(name)?;
        Ok(match self.fixups.get(name) {
            None => Some((v.dtype, v.bytes)),
            Some(Fixup::UnpermuteRope { heads }) => {
                let n: usize = v.shape[..v.shape.len() - 1].iter().product();
                let bytes = crate::ops::matmul::gguf::unpermute_rope_rows_raw(&v.bytes, n, v.bytes.len() / n, *heads);
                Some((v.dtype, bytes))
            }
            Some(Fixup::AddConstant(_) | Fixup::LnNeg) => None,
        })
    }

    fn f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        Checkpoint::f32(self, name, shape)
    }

    fn f16(&self, name: &str, shape: &[usize]) -> Result<Vec<half::f16>> {
        Checkpoint::f16(self, name, shape)
    }
}

fn check_shape(v: &TensorView, want: &[usize]) -> Result<()> {
    if v.shape != want {
        return Err(Error::Mismatch(format!(
            "tensor {} has shape {}, the config implies {}",
            shown(v.name),
            fmt_shape(&v.shape),
            fmt_shape(want)
        )));
    }
    Ok(())
}

/// `[a, b, c]`, at most 8 dimensions shown.
pub(crate) fn fmt_shape<T: std::fmt::Display>(dims: &[T]) -> String {
    let mut s = String::from("[");
    for (i, d) in dims.iter().enumerate() {
        if i == 8 {
            s.push_str(&format!(", … ({} dimensions)", dims.len()));
            break;
        }
        if i > 0 {
            s.push_str(", ");
        }
        s.push_str(&d.to_string());
    }
    s.push(']');
    s
}

// ---------------------------------------------------------------------------------------------
// Validation shared by both loaders
// ---------------------------------------------------------------------------------------------

/// Token strings that end a turn in the chat templates of the supported families; their ids
/// (when in the vocabulary) join `eos_token_ids`.
pub(crate) const END_OF_TURN_TOKENS: [&str; 4] = ["<|im_end|>", "<|endoftext|>", "<end_of_turn>", "<|eot_id|>"];

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
    use crate::model::config::{Mixer, MlpSpec};
    use limits as l;
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
    for (what, v) in
        [("embedding scale", c.embedding_scale), ("final logit softcapping", c.final_logit_softcapping.unwrap_or(1.0))]
    {
        if !(v > 0.0 && v.is_finite()) {
            return bad(format!("{what} is {v}"));
        }
    }
    let mut kv_width = 0u64;
    for (i, spec) in c.layers.iter().enumerate() {
        let intermediate = match spec.mlp {
            MlpSpec::Dense { intermediate, .. } => intermediate,
            MlpSpec::Moe { intermediate, .. } => intermediate,
        };
        if intermediate == 0 {
            return bad(format!("layer {i}: intermediate size is 0"));
        }
        if intermediate > l::INTERMEDIATE {
            return bad(format!(
                "layer {i}: intermediate size {intermediate} is above the limit of {}",
                l::INTERMEDIATE
            ));
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
        for (what, v) in
            [("rope theta", a.rope.theta), ("rope scaling factor", a.rope.scaling), ("attention scale", a.scale)]
        {
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

/// Limits on config values, far above any real model, that keep every size computed from them
/// (KV cache, activations, weights) well inside `u64` and refuse absurd values before anything
/// is allocated. Each error names the field and the limit.
pub mod limits {
    /// Vocabulary size (real models: up to 262,144).
    pub const VOCAB: usize = 1 << 24;
    /// Hidden size (real models: up to 16,384).
    pub const HIDDEN: usize = 1 << 17;
    /// MLP intermediate size (real models: up to 53,248).
    pub const INTERMEDIATE: usize = 1 << 20;
    /// Layers (real models: up to 126). The layer count must also match the tensors present.
    pub const LAYERS: usize = 4096;
    /// Experts of a mixture-of-experts block.
    pub const EXPERTS: usize = 4096;
    /// Attention heads, query or key/value (real models: up to 128).
    pub const HEADS: usize = 4096;
    /// Head dimension (real models: up to 256).
    pub const HEAD_DIM: usize = 4096;
    /// Context length (real models: up to ~10^7 with scaling).
    pub const CONTEXT: usize = 1 << 26;
}

/// A config value checked against its limit: `field` is named as the file names it.
pub(crate) fn capped(path: &Path, field: &str, value: usize, limit: usize) -> Result<usize> {
    if value > limit {
        return Err(Error::corrupt(path, format!("{} = {value} is above the limit of {limit}", shown(field))));
    }
    Ok(value)
}

/// The number of layers the tensors describe (`blk.{i}.*`, highest `i` + 1), before anything is
/// sized by a layer count: a layer index that is not canonical decimal is an error, and so is a
/// declared count (`field`) that differs from it, in either direction.
pub(crate) fn check_layer_count<'a>(
    names: impl Iterator<Item = &'a str>,
    declared: usize,
    field: &str,
    path: &Path,
) -> Result<()> {
    let mut layers = BTreeSet::new();
    for name in names {
        if let Some(i) = layer_index(name, path)? {
            layers.insert(i);
        }
    }
    let present = layers.last().map_or(0, |&i| i + 1);
    if present != declared {
        let what = match layers.last() {
            None => "no layer tensors".to_string(),
            Some(&last) => format!("tensors for {present} (blk.0 to blk.{last})"),
        };
        return Err(Error::Mismatch(format!(
            "{}: {} says {declared} layers, the file has {what}",
            path.display(),
            shown(field)
        )));
    }
    if let Some(missing) = (0..present).find(|i| !layers.contains(i)) {
        return Err(Error::Mismatch(format!("{}: layer {missing} has no tensors", path.display())));
    }
    Ok(())
}

/// The layer index of a canonical `blk.{i}.…` name.
fn layer_index(name: &str, path: &Path) -> Result<Option<usize>> {
    let Some(rest) = name.strip_prefix("blk.") else {
        return Ok(None);
    };
    let digits = rest.split('.').next().unwrap_or("");
    let canonical = !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && (digits == "0" || !digits.starts_with('0'))
        && digits.len() <= 9;
    if !canonical || rest.len() == digits.len() {
        return Err(Error::corrupt(path, format!("tensor {} has no valid layer index", shown(name))));
    }
    Ok(digits.parse().ok())
}

/// What a tensor of a model is, for its type check.
#[derive(Clone, Copy, PartialEq, Debug)]
pub(crate) enum Role {
    /// A matrix: any supported type.
    Matrix,
    /// A norm weight or a bias: stored as floats (F32, F16 or BF16).
    Vector,
    /// Depthwise conv taps [C, K]: floats, stored [C, 1, K] (transformers) or [C, K, 1] (mlx-lm).
    Conv,
}

/// Every tensor `c` implies, with its shape (stacked experts: `[E, rows, cols]`) and role.
pub(crate) fn expected_tensors(c: &ModelConfig) -> Vec<(String, Vec<usize>, Role)> {
    use crate::model::config::{Mixer, MlpSpec};
    let (h, v) = (c.hidden_size, c.vocab_size);
    let mut out = vec![
        ("token_embd.weight".to_string(), vec![v, h], Role::Matrix),
        ("output_norm.weight".to_string(), vec![h], Role::Vector),
    ];
    if !c.tie_word_embeddings {
        out.push(("output.weight".into(), vec![v, h], Role::Matrix));
    }
    if let Some(ple) = c.per_layer_input {
        let all = c.num_layers() * ple.dim;
        out.push(("per_layer_token_embd.weight".into(), vec![ple.vocab, all], Role::Matrix));
        out.push(("per_layer_model_proj.weight".into(), vec![all, h], Role::Matrix));
        out.push(("per_layer_proj_norm.weight".into(), vec![ple.dim], Role::Vector));
    }
    for i in 0..c.num_layers() {
        let spec = c.layer(i);
        let mut add = |s: &str, shape: Vec<usize>, role| out.push((format!("blk.{i}.{s}"), shape, role));
        add("attn_norm.weight", vec![h], Role::Vector);
        add("ffn_norm.weight", vec![h], Role::Vector);
        match spec.mixer {
            Mixer::Attention(a) => {
                let (d, q, kv) = (a.head_dim, a.q_dim(), a.kv_dim());
                // A layer reading another's KV cache has only q.
                let own_kv = a.kv_from.is_none();
                add("attn_q.weight", vec![q, h], Role::Matrix);
                if own_kv {
                    add("attn_k.weight", vec![kv, h], Role::Matrix);
                }
                if own_kv && !a.k_eq_v {
                    add("attn_v.weight", vec![kv, h], Role::Matrix);
                }
                add("attn_output.weight", vec![h, q], Role::Matrix);
                if a.output_gate {
                    add("attn_out_gate.weight", vec![q, h], Role::Matrix);
                }
                if a.bias {
                    add("attn_q.bias", vec![q], Role::Vector);
                    if own_kv {
                        add("attn_k.bias", vec![kv], Role::Vector);
                    }
                    if own_kv && !a.k_eq_v {
                        add("attn_v.bias", vec![kv], Role::Vector);
                    }
                }
                if a.qk_norm {
                    add("attn_q_norm.weight", vec![d], Role::Vector);
                    if own_kv {
                        add("attn_k_norm.weight", vec![d], Role::Vector);
                    }
                }
            }
            Mixer::DeltaNet(d) => {
                let hv = d.v_heads;
                add("ssm_in_qkv.weight", vec![d.conv_dim(), h], Role::Matrix);
                add("ssm_in_z.weight", vec![d.value_dim(), h], Role::Matrix);
                add("ssm_beta.weight", vec![hv, h], Role::Matrix);
                add("ssm_alpha.weight", vec![hv, h], Role::Matrix);
                add("ssm_conv1d.weight", vec![d.conv_dim(), d.conv_kernel], Role::Conv);
                add("ssm_dt_bias.weight", vec![hv], Role::Vector);
                add("ssm_a_log.weight", vec![hv], Role::Vector);
                add("ssm_norm.weight", vec![d.v_dim], Role::Vector);
                add("ssm_out.weight", vec![h, d.value_dim()], Role::Matrix);
            }
        }
        match spec.mlp {
            MlpSpec::Dense { intermediate: f, .. } => {
                add("ffn_gate.weight", vec![f, h], Role::Matrix);
                add("ffn_up.weight", vec![f, h], Role::Matrix);
                add("ffn_down.weight", vec![h, f], Role::Matrix);
            }
            MlpSpec::Moe { experts: e, intermediate: f, shared_intermediate: fs, .. } => {
                add("ffn_gate_inp.weight", vec![e, h], Role::Matrix);
                add("ffn_gate_exps.weight", vec![e, f, h], Role::Matrix);
                add("ffn_up_exps.weight", vec![e, f, h], Role::Matrix);
                add("ffn_down_exps.weight", vec![e, h, f], Role::Matrix);
                if fs > 0 {
                    add("ffn_gate_inp_shexp.weight", vec![1, h], Role::Matrix);
                    add("ffn_gate_shexp.weight", vec![fs, h], Role::Matrix);
                    add("ffn_up_shexp.weight", vec![fs, h], Role::Matrix);
                    add("ffn_down_shexp.weight", vec![h, fs], Role::Matrix);
                }
            }
        }
        if spec.sandwich_norm {
            add("post_attention_norm.weight", vec![h], Role::Vector);
            add("post_ffw_norm.weight", vec![h], Role::Vector);
        }
        if spec.output_scale {
            add("layer_output_scale.weight", vec![1], Role::Vector);
        }
        if let Some(ple) = c.per_layer_input {
            add("inp_gate.weight", vec![ple.dim, h], Role::Matrix);
            add("proj.weight", vec![h, ple.dim], Role::Matrix);
            add("post_norm.weight", vec![h], Role::Vector);
        }
    }
    out
}

/// Splits each tensor named `a|b` (a [`TensorName::Halves`]) into `a` and `b`: row groups of
/// `2n`, n = the experts' intermediate rows for a stacked [E, 2I, K] tensor, else the attention
/// head dim (q_proj's [q_h | gate_h]).
pub(crate) fn split_halves(
    tensors: &mut HashMap<String, StoredTensor>,
    config: &ModelConfig,
    path: &Path,
) -> Result<()> {
    let joined: Vec<String> = tensors.keys().filter(|k| k.contains('|')).cloned().collect();
    // The attention layers' head dim (one for the model).
    let head_dim = (0..config.num_layers()).find_map(|l| config.attention(l)).map_or(0, |a| a.head_dim);
    for name in joined {
        let t = tensors.remove(&name).expect("listed");
        // `blk.{i}.` then `a|b`.
        let layer_end = name.strip_prefix("blk.").and_then(|r| r.find('.')).map_or(0, |i| "blk.".len() + i + 1);
        let (prefix, pair) = name.split_at(layer_end);
        let (a, b) = pair.split_once('|').expect("joined name");
        let rows: usize = t.shape[..t.shape.len() - 1].iter().product();
        let (n, lead) = match t.shape.as_slice() {
            [e, two_i, k] => (two_i / 2, vec![*e, two_i / 2, *k]),
            [r, k] => (head_dim, vec![r / 2, *k]),
            _ => return Err(Error::Mismatch(format!("{}: tensor {name} has shape {:?}", path.display(), t.shape))),
        };
        if n == 0 || rows % (2 * n) != 0 {
            return Err(Error::Mismatch(format!(
                "{}: tensor {} has {rows} rows, not groups of 2 x {n}",
                path.display(),
                shown(&name)
            )));
        }
        let len = t.len / 2;
        for (half, start) in [(a, 0), (b, n)] {
            let pick = RowPick { src_rows: rows, src_len: t.len, period: 2 * n, start, take: n };
            let st = StoredTensor { len, shape: lead.clone(), pick: Some(pick), ..t.clone() };
            tensors.insert(format!("{prefix}{half}"), st);
        }
    }
    Ok(())
}

/// Drops the k and v projections (and k norms) of layers that read another layer's KV cache
/// ([`crate::model::config::AttentionSpec::kv_from`]): Google's Gemma 4 E2B/E4B checkpoints ship
/// them for every layer, and transformers ignores those of the shared layers
/// (`_keys_to_ignore_on_load_unexpected`), as this does.
pub(crate) fn drop_shared_kv_tensors(c: &ModelConfig, tensors: &mut HashMap<String, StoredTensor>) {
    use crate::model::config::Mixer;
    for l in 0..c.num_layers() {
        if let Mixer::Attention(a) = c.layer(l).mixer {
            if a.kv_from.is_some() {
                for t in ["attn_k.weight", "attn_v.weight", "attn_k_norm.weight", "attn_k.bias", "attn_v.bias"] {
                    tensors.remove(&format!("blk.{l}.{t}"));
                }
            }
        }
    }
}

/// Checks the tensors against the config: every tensor the config implies is present with the
/// shape it implies and a type that fits its role, and no other tensor is there (a tensor the
/// engine would silently ignore means the file and the config disagree). Call after
/// [`check_layer_count`], so the layer loop here is bounded by the tensors present.
pub(crate) fn check_tensors(c: &ModelConfig, tensors: &HashMap<String, StoredTensor>, path: &Path) -> Result<()> {
    let expected = expected_tensors(c);
    let mismatch = |msg: String| Err(Error::Mismatch(format!("{}: {msg}", path.display())));
    for (name, shape, role) in &expected {
        let Some(t) = tensors.get(name) else {
            return mismatch(format!("tensor {name} is missing"));
        };
        let conv_ok = *role == Role::Conv
            && t.shape.len() == 3
            && t.shape[0] == shape[0]
            && t.shape[1] * t.shape[2] == shape[1]
            && (t.shape[1] == 1 || t.shape[2] == 1);
        if t.shape != *shape && !conv_ok {
            return mismatch(format!(
                "tensor {name} has shape {}, the config implies {}",
                fmt_shape(&t.shape),
                fmt_shape(shape)
            ));
        }
        if *role != Role::Matrix && t.dtype.is_quantized() {
            return mismatch(format!(
                "tensor {name} is stored as {}, a norm or bias should be f32, f16 or bf16",
                t.dtype
            ));
        }
    }
    if tensors.len() != expected.len() {
        let known: std::collections::HashSet<&str> = expected.iter().map(|(n, ..)| n.as_str()).collect();
        let mut extra: Vec<&str> = tensors.keys().map(String::as_str).filter(|n| !known.contains(n)).collect();
        extra.sort_unstable();
        if let Some(first) = extra.first() {
            return mismatch(format!(
                "{} tensor(s) the config does not use, such as {} (a {} model with these settings has no such tensor)",
                extra.len(),
                shown(first),
                c.arch.name()
            ));
        }
    }
    Ok(())
}

/// Undoes llama.cpp's `permute` of Q/K rows: within each head of `rows / heads` rows, llama.cpp
/// stores row `2*i + j` (j in {0,1}) of the interleaved layout at HF row `j * half + i`;
/// this returns the Hugging Face (rotate-half) row order.
pub fn unpermute_rope_rows(data: &[f32], rows: usize, cols: usize, heads: usize) -> Vec<f32> {
    let per_head = rows / heads;
    let half = per_head / 2;
    let mut out = vec![0f32; data.len()];
    for h in 0..heads {
        for i in 0..half {
            for j in 0..2 {
                // GGUF row (interleaved) -> HF row (halves)
                let src = h * per_head + 2 * i + j;
                let dst = h * per_head + j * half + i;
                out[dst * cols..(dst + 1) * cols].copy_from_slice(&data[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// llama.cpp's converter: `w.reshape(heads, 2, half, cols).swapaxes(1, 2).reshape(rows, cols)`.
    fn permute_like_llama_cpp(w: &[f32], rows: usize, cols: usize, heads: usize) -> Vec<f32> {
        let half = rows / heads / 2;
        let mut out = vec![0f32; w.len()];
        for h in 0..heads {
            for a in 0..2 {
                for b in 0..half {
                    // source index (h, a, b) -> destination index (h, b, a)
                    let src = h * 2 * half + a * half + b;
                    let dst = h * 2 * half + b * 2 + a;
                    out[dst * cols..(dst + 1) * cols].copy_from_slice(&w[src * cols..(src + 1) * cols]);
                }
            }
        }
        out
    }

    #[test]
    fn unpermute_inverts_llama_cpp_permute() {
        let (rows, cols, heads) = (24, 5, 3);
        let w: Vec<f32> = (0..rows * cols).map(|i| (i as f32 * 0.37).sin()).collect();
        let p = permute_like_llama_cpp(&w, rows, cols, heads);
        assert_ne!(p, w);
        assert_eq!(unpermute_rope_rows(&p, rows, cols, heads), w);
    }
}
