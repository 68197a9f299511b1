//! The mutation corpus generator (used by tests/corpus.rs), and the loading path it judges cases by (`load`, shared with the fuzz targets under fuzz/).
//!
//! Deterministic: every case is derived from the real SmolLM2-135M-Instruct Q4_1 checkpoint
//! (`tools/fetch-model.sh smollm2`) and from a Hugging Face folder built from it in memory
//! ([`hf::Base`]), by recipes listed in a fixed order, with the choices that are sampled made by
//! a seeded [`Rng`]. The same seed gives the same cases on every machine. Each case is one
//! corruption of a valid input (the controls, loaded first, prove the bases are valid), so that
//! every case must end in an error.

#![allow(dead_code)]

pub mod gguf;
pub mod hf;
pub mod load;

use std::path::Path;

/// The seed of the corpus (change it to draw other samples; every value must pass).
pub const SEED: u64 = 0x5eed_c0de_2025_0010;

/// Absurd counts and sizes, each far beyond any file: 2^32, 2^40, 2^63, u64::MAX.
pub const ABSURD: [u64; 4] = [1 << 32, 1 << 40, 1 << 63, u64::MAX];

/// SplitMix64.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            v.swap(i, j);
        }
    }
}

/// One file (or directory entry) of a case.
#[derive(Clone, Debug)]
pub enum Content {
    Bytes(Vec<u8>),
    /// A file of `len` bytes: the given parts at their offsets, holes (zeros, no disk) elsewhere.
    Sparse {
        parts: Vec<(u64, Vec<u8>)>,
        len: u64,
    },
    /// An empty directory where a file is expected.
    Dir,
    /// A named pipe where a file is expected (opening it for reading would block).
    Fifo,
    /// A symbolic link to this target.
    Symlink(String),
}

impl Content {
    /// Bytes the case holds in memory (what writing it costs).
    pub fn written_bytes(&self) -> u64 {
        match self {
            Content::Bytes(b) => b.len() as u64,
            Content::Sparse { parts, .. } => parts.iter().map(|(_, p)| p.len() as u64).sum(),
            _ => 0,
        }
    }
}

/// A case's files: (name inside the case directory, content).
pub type Files = Vec<(String, Content)>;

/// An edit applied to a copy of part of a base.
pub type Edit<T> = Box<dyn Fn(&mut T) + Send + Sync>;

/// What a case loads: a GGUF file or a Hugging Face folder.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Kind {
    Gguf,
    Hf,
}

/// A recipe: builds a case's files from the bases.
pub struct Recipe {
    pub category: &'static str,
    pub name: String,
    pub kind: Kind,
    build: Box<dyn Fn(&Bases) -> Files + Send + Sync>,
}

impl Recipe {
    pub fn files(&self, bases: &Bases) -> Files {
        (self.build)(bases)
    }
}

pub struct Bases {
    pub gguf: gguf::Base,
    pub hf: hf::Base,
}

/// The GGUF file's name inside a case directory.
pub const GGUF_NAME: &str = "model.gguf";

/// Collects recipes.
#[derive(Default)]
pub struct Sink {
    pub recipes: Vec<Recipe>,
}

impl Sink {
    pub fn gguf(
        &mut self,
        category: &'static str,
        name: impl Into<String>,
        build: impl Fn(&gguf::Base) -> Content + Send + Sync + 'static,
    ) {
        self.recipes.push(Recipe {
            category,
            name: name.into(),
            kind: Kind::Gguf,
            build: Box::new(move |b| vec![(GGUF_NAME.to_string(), build(&b.gguf))]),
        });
    }

    pub fn hf(
        &mut self,
        category: &'static str,
        name: impl Into<String>,
        build: impl Fn(&hf::Base) -> Files + Send + Sync + 'static,
    ) {
        self.recipes.push(Recipe {
            category,
            name: name.into(),
            kind: Kind::Hf,
            build: Box::new(move |b| build(&b.hf)),
        });
    }
}

/// Every recipe, in a fixed order.
pub fn recipes(bases: &Bases) -> Vec<Recipe> {
    let mut sink = Sink::default();
    let mut rng = Rng::new(SEED);
    gguf::recipes(&bases.gguf, &mut sink, &mut rng);
    hf::recipes(&bases.hf, &mut sink, &mut rng);
    sink.recipes
}

/// Writes a case's files into `dir` (emptied first). Returns the path to open: the GGUF file,
/// or the folder itself.
pub fn materialize(dir: &Path, kind: Kind, files: &[(String, Content)]) -> std::path::PathBuf {
    use std::io::{Seek, SeekFrom, Write};
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    for (name, content) in files {
        let p = dir.join(name);
        match content {
            Content::Bytes(b) => std::fs::write(&p, b).unwrap(),
            Content::Sparse { parts, len } => {
                let mut f = std::fs::File::create(&p).unwrap();
                for (at, bytes) in parts {
                    f.seek(SeekFrom::Start(*at)).unwrap();
                    f.write_all(bytes).unwrap();
                }
                f.set_len(*len).unwrap();
            }
            Content::Dir => std::fs::create_dir(&p).unwrap(),
            Content::Fifo => {
                #[cfg(unix)]
                {
                    let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
                    // SAFETY: a valid NUL-terminated path.
                    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo {}", p.display());
                }
                #[cfg(not(unix))]
                std::fs::create_dir(&p).unwrap();
            }
            Content::Symlink(target) => {
                #[cfg(unix)]
                std::os::unix::fs::symlink(target, &p).unwrap();
                #[cfg(not(unix))]
                let _ = target;
            }
        }
    }
    match kind {
        Kind::Gguf => dir.join(GGUF_NAME),
        Kind::Hf => dir.to_path_buf(),
    }
}
