//! A benchmark helper: copies a GGUF file (metadata, tokenizer, norms and biases as they are)
//! with every weight matrix replaced by random blocks of another type, scaled like trained
//! weights (standard deviation 1/√K; the embedding 0.02, the output 2/√K). Both engines then run
//! the same file of a real layout in a type its real checkpoint was not published in (the GPU
//! machine rebuilds the Qwen2.5-1.5B Q4_K_M layout from a shape recipe, then retypes it to Q8_0
//! or Q4_0 for the side-by-side figures of BENCHMARKS.md).
//!
//! ```sh
//! cargo run --release --example gguf_retype -- IN.gguf OUT.gguf q8_0|q4_0|q4_1|q5_0|q5_1
//! ```

use wgpu_llm::loader::dtype::quantize;
use wgpu_llm::loader::gguf::{GgufFile, GgufValue, GgufWriter};
use wgpu_llm::loader::DType;

/// xorshift64* and Box-Muller.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn unit(&mut self) -> f32 {
        ((self.next() >> 40) as f32 + 0.5) / (1u64 << 24) as f32
    }
    fn normal(&mut self) -> f32 {
        (-2.0 * self.unit().ln()).sqrt() * (std::f32::consts::TAU * self.unit()).cos()
    }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [src, dst, ty] = &args[..] else {
        anyhow::bail!("usage: gguf_retype IN.gguf OUT.gguf q8_0|q4_0|q4_1|q5_0|q5_1");
    };
    let to = DType::ALL
        .into_iter()
        .find(|t| t.name() == ty && t.block_size() == 32)
        .ok_or_else(|| anyhow::anyhow!("{ty}: choose q8_0, q4_0, q4_1, q5_0 or q5_1"))?;
    let g = GgufFile::read(src.as_ref())?;
    let data = std::fs::read(src)?;
    let mut w = GgufWriter::new();
    w.set_alignment(g.alignment)?;
    for (k, v) in &g.metadata {
        if k != "general.alignment" {
            w.add_metadata(k.clone(), v.clone());
        }
    }
    // llama.cpp's file type ids: the "mostly" type of the file (display only).
    let ftype = match to {
        DType::Q4_0 => 2,
        DType::Q4_1 => 3,
        DType::Q8_0 => 7,
        DType::Q5_0 => 8,
        _ => 9,
    };
    w.add_metadata("general.file_type", GgufValue::U32(ftype));
    let mut rng = Rng(0x5EED_1234_ABCD_0001);
    let mut pools = std::collections::HashMap::new();
    for t in &g.tensors {
        let cols = *t.shape.last().unwrap_or(&1);
        if t.shape.len() == 2 && cols % 32 == 0 {
            let std = match t.name.as_str() {
                "token_embd.weight" => 0.02,
                "output.weight" => 2.0 / (cols as f32).sqrt(),
                _ => 1.0 / (cols as f32).sqrt(),
            };
            // 1024 random blocks of the type and scale, tiled at random.
            let pool = pools.entry(std.to_bits()).or_insert_with(|| {
                let v: Vec<f32> = (0..1024 * 32).map(|_| rng.normal() * std).collect();
                quantize(to, &v).expect("whole blocks")
            });
            let bb = to.block_bytes();
            let blocks = t.shape.iter().product::<usize>() / 32;
            let mut bytes = Vec::with_capacity(blocks * bb);
            for _ in 0..blocks {
                let i = (rng.next() % 1024) as usize;
                bytes.extend_from_slice(&pool[i * bb..(i + 1) * bb]);
            }
            w.add_tensor(t.name.clone(), to, &t.shape, bytes)?;
        } else {
            let o = t.offset as usize;
            w.add_tensor(t.name.clone(), t.dtype, &t.shape, data[o..o + t.len].to_vec())?;
        }
    }
    w.write(dst.as_ref())?;
    eprintln!("wrote {dst}: {} tensors, weights in {to}", g.tensors.len());
    Ok(())
}
