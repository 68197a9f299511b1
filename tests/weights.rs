//! Quantized weights' storage on the CPU side (no GPU): llama.cpp's Q/K row permutation undone on
//! a quantized tensor's file bytes ([`wgpu_llm::weights::unpermute_rope_rows_raw`]) is the f32
//! un-permutation ([`wgpu_llm::loader::unpermute_rope_rows`]) of its dequantized rows.

use half::f16;
use wgpu_llm::dtype::{to_f32, DType};

/// `rows` rows of `k` elements of Q4_1 or Q8_0 whose values differ from row to row.
fn blocks(ty: DType, rows: usize, k: usize) -> Vec<u8> {
    let mut raw = vec![];
    for b in 0..rows * k / 32 {
        raw.extend(f16::from_f32(0.5 + b as f32 / 64.0).to_le_bytes());
        match ty {
            DType::Q4_1 => {
                raw.extend(f16::from_f32(b as f32 * 0.25 - 3.0).to_le_bytes());
                raw.extend((0..16).map(|i| ((b * 7 + i * 3) % 256) as u8));
            }
            _ => raw.extend((0..32).map(|i| ((b * 5 + i * 11) % 256) as u8)),
        }
    }
    raw
}

#[test]
fn unpermute_raw_rows_matches_f32() {
    let (rows, k, heads) = (24usize, 64usize, 3usize);
    for ty in [DType::Q4_1, DType::Q8_0] {
        let raw = blocks(ty, rows, k);
        assert_eq!(raw.len(), rows * ty.byte_size(k).unwrap());
        let got = wgpu_llm::weights::unpermute_rope_rows_raw(&raw, rows, ty.byte_size(k).unwrap(), heads);
        let want = wgpu_llm::loader::unpermute_rope_rows(&to_f32(ty, &raw, rows * k).unwrap(), rows, k, heads);
        assert_eq!(to_f32(ty, &got, rows * k).unwrap(), want, "{ty}");
        assert_ne!(got, raw, "{ty}: the rows moved");
    }
}
