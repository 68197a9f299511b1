//! Opening a checkpoint: a GGUF file or a Hugging Face folder, by what the path is.

use super::checkpoint::Checkpoint;
use super::file::not_a_file;
use super::{gguf, hf};
use crate::error::{Error, Result};
use std::path::Path;

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
}
