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

mod file;
mod meta;
mod open;
mod tokenizer;
mod value;
mod writer;

pub use file::{limits, GgufFile, GgufTensorInfo, DEFAULT_ALIGNMENT, GGUF_MAGIC, GGUF_VERSION};
pub use open::open;
pub use tokenizer::{token_type, GgufTokenizerData};
pub use value::{GgufType, GgufValue};
pub use writer::GgufWriter;
