//! The crate's error type: every failure a user can cause ends here, with a message that names
//! what was wrong (a path, a tensor, a parameter) so the CLI can print it and exit non-zero.
//!
//! Every message is one line of at most [`MAX_MESSAGE_BYTES`] bytes without control characters,
//! however corrupt the input that caused it: text taken from files (keys, tensor names, values)
//! goes through [`shown`], and [`Display`](std::fmt::Display) escapes and truncates what is left
//! as a last resort. An error never returns another error as its [`source`](std::error::Error::source)
//! whose text it already contains, so printing the chain (`{e:#}` in anyhow) says each cause once.

use std::fmt;
use std::path::PathBuf;

/// The longest message [`Error`]'s `Display` writes, in bytes.
pub const MAX_MESSAGE_BYTES: usize = 900;

#[derive(Debug)]
pub enum Error {
    /// A file could not be opened or read (or is not a regular file). The OS error's text is part
    /// of the message, so it is not also returned as `source()`.
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    /// A model file is malformed: truncated, bad magic, out-of-bounds tensor data, bad JSON.
    Corrupt {
        path: PathBuf,
        msg: String,
    },
    /// A well-formed model that this engine does not run (architecture, tensor type).
    Unsupported(String),
    /// The checkpoint disagrees with its own config (tensor shape, missing tensor).
    Mismatch(String),
    /// A user-supplied parameter out of range (sampling parameters, context length, ...).
    InvalidArgument(String),
    Tokenizer(String),
    Template(String),
    /// No adapter, device creation failed, out of GPU memory, validation errors.
    Gpu(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn corrupt(path: impl Into<PathBuf>, msg: impl Into<String>) -> Self {
        Error::Corrupt { path: path.into(), msg: msg.into() }
    }
    pub fn io(path: impl Into<PathBuf>, error: std::io::Error) -> Self {
        Error::Io { path: path.into(), error }
    }

    /// The message before escaping and truncation.
    fn raw_message(&self) -> String {
        match self {
            Error::Io { path, error } => format!("{}: {}", path.display(), io_text(error)),
            Error::Corrupt { path, msg } => format!("corrupt model file {}: {msg}", path.display()),
            Error::Unsupported(m) => format!("unsupported: {m}"),
            Error::Mismatch(m) => format!("model mismatch: {m}"),
            Error::InvalidArgument(m) => format!("invalid argument: {m}"),
            Error::Tokenizer(m) => format!("tokenizer: {m}"),
            Error::Template(m) => format!("chat template: {m}"),
            Error::Gpu(m) => format!("gpu: {m}"),
        }
    }
}

/// An I/O error's text with its own chain, each cause once (std's `Display` of an error made
/// with `io::Error::new(kind, inner)` is the inner error's text already).
fn io_text(e: &std::io::Error) -> String {
    let mut text = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        let t = s.to_string();
        if !text.contains(&t) {
            text.push_str(": ");
            text.push_str(&t);
        }
        src = s.source();
    }
    text
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&one_line(&self.raw_message(), MAX_MESSAGE_BYTES))
    }
}

impl std::error::Error for Error {}

impl From<std::convert::Infallible> for Error {
    fn from(x: std::convert::Infallible) -> Self {
        match x {}
    }
}

/// `s` as one line of at most `max` bytes: control characters (and Unicode line/paragraph
/// separators) escaped as `\n`, `\t`, `\r` or `\u{..}`; a longer text is cut at a character
/// boundary and ends with `…`.
pub fn one_line(s: &str, max: usize) -> String {
    let mut out = String::with_capacity(s.len().min(max));
    for c in s.chars() {
        let esc;
        let piece: &str = match c {
            '\n' => "\\n",
            '\r' => "\\r",
            '\t' => "\\t",
            c if c.is_control() || c == '\u{2028}' || c == '\u{2029}' => {
                esc = format!("\\u{{{:x}}}", c as u32);
                &esc
            }
            c => {
                let mut buf = [0u8; 4];
                let n = c.encode_utf8(&mut buf).len();
                if out.len() + n > max.saturating_sub('…'.len_utf8()) {
                    out.push('…');
                    return out;
                }
                out.push(c);
                continue;
            }
        };
        if out.len() + piece.len() > max.saturating_sub('…'.len_utf8()) {
            out.push('…');
            return out;
        }
        out.push_str(piece);
    }
    out
}

/// A string taken from a file (a key, a tensor name, a value) as it should appear inside an error
/// message: quoted when it is not a plain identifier, control characters escaped, and when longer
/// than 80 characters cut to its first 60 with its length in bytes.
pub fn shown(s: &str) -> String {
    const KEEP: usize = 60;
    let plain = !s.is_empty()
        && s.len() <= 80
        && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/' | ':' | '+'));
    if plain {
        return s.to_string();
    }
    if s.chars().count() <= 80 {
        return format!("\"{}\"", one_line(s, 4 * 80 + 8));
    }
    let head: String = s.chars().take(KEEP).collect();
    format!("\"{}…\" ({} bytes)", one_line(&head, 4 * KEEP + 8), s.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_one_short_line() {
        let long = "k\0ey\n".repeat(5_000_000);
        let e = Error::corrupt("/m/x.gguf", format!("metadata {} is bad", shown(&long)));
        let m = e.to_string();
        assert!(m.len() < 300, "{m}");
        assert!(!m.chars().any(|c| c.is_control()), "{m}");
        assert!(m.contains("25000000 bytes"), "{m}");
        // The Display safety net, for text that did not go through `shown`.
        let e = Error::Mismatch(long.clone());
        let m = e.to_string();
        assert!(m.len() <= MAX_MESSAGE_BYTES && m.ends_with('…'), "{}", m.len());
        assert!(!m.chars().any(|c| c.is_control()));
        assert_eq!(shown("blk.0.attn_q.weight"), "blk.0.attn_q.weight");
        assert_eq!(shown("a b\u{1}"), "\"a b\\u{1}\"");
        assert_eq!(one_line("é\u{2028}x", 100), "é\\u{2028}x");
    }

    #[test]
    fn io_error_text_appears_once() {
        let e = Error::io("/nope", std::io::Error::from(std::io::ErrorKind::NotFound));
        assert!(std::error::Error::source(&e).is_none());
        let inner = std::io::Error::other("inner cause");
        let e = Error::io("/x", std::io::Error::new(std::io::ErrorKind::InvalidData, inner));
        assert_eq!(e.to_string(), "/x: inner cause");
        let any = anyhow::Error::from(e);
        assert_eq!(format!("{any:#}"), "/x: inner cause");
    }
}
