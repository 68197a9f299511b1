//! Embeds every `wgsl/**/*.wgsl` file: generates `$OUT_DIR/shaders.rs` with a table of
//! (name without extension, source), so adding a kernel is adding a file.
use std::path::Path;

fn collect(dir: &Path, root: &Path, out: &mut Vec<(String, String)>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            collect(&p, root, out);
        } else if p.extension().is_some_and(|e| e == "wgsl") {
            let rel = p.strip_prefix(root).unwrap().with_extension("");
            let name = rel.to_string_lossy().replace('\\', "/");
            out.push((name, p.canonicalize().unwrap().to_string_lossy().into_owned()));
        }
    }
}

fn main() {
    // The manifest folder of this build, read when the script runs: `env!` would bake in the folder where the
    // script was first compiled, and a build script is reused across checkouts that share a target folder
    // (worktrees, a moved checkout), which then embedded another tree's shaders.
    let root = Path::new(&std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("wgsl");
    println!("cargo:rerun-if-changed={}", root.display());
    let mut files = Vec::new();
    collect(&root, &root, &mut files);
    let mut src =
        String::from("/// (name, WGSL source) of every file under wgsl/.\npub static SOURCES: &[(&str, &str)] = &[\n");
    for (name, path) in &files {
        println!("cargo:rerun-if-changed={path}");
        src.push_str(&format!("    ({name:?}, include_str!({path:?})),\n"));
    }
    src.push_str("];\n");
    let out = Path::new(&std::env::var("OUT_DIR").unwrap()).join("shaders.rs");
    std::fs::write(out, src).unwrap();
}
