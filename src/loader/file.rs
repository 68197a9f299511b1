//! The files a checkpoint reads: opened only if regular, read with positioned reads against
//! the length they had when validated.

use crate::error::{Error, Result};
use std::fs::File;
use std::path::{Path, PathBuf};

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
    pub(crate) fn read(&self, offset: u64, len: usize) -> Result<Vec<u8>> {
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
