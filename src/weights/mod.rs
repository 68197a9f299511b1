//! Weights as the kernels read them, apart from the ops that read them: the quantized layouts
//! ([`QuantWeight`]: GGUF blocks and MLX affine groups repacked into planes) and the row chunks
//! that split a matrix too large for one storage binding ([`upload_row_chunks`],
//! [`QuantWeight::row_chunks`]). `ops` read these types; this module imports no op.

mod chunks;
mod quant;

pub use chunks::{plan_row_chunks, upload_row_chunks, upload_row_chunks_max, CHUNK_ROW_ALIGN};
#[doc(hidden)]
pub use quant::test_util;
pub use quant::{is_supported, repack, unpack, unpermute_rope_rows_raw, QuantWeight};
pub(crate) use quant::{kernel_block, type_flag, type_macros, unit_elems};
