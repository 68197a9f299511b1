//! A benchmark helper: writes Qwen3.5-35B-A3B's shape with synthetic weights as a GGUF file in
//! llama.cpp's `qwen35moe` layout (its tensor names, shapes and metadata; no tokenizer, so
//! `tokenizer.ggml.model = "none"` and `qwen35moe.vocab_size`), for llama.cpp to run beside
//! `wgpu-llm bench --synthetic qwen3.5-35b-a3b:RECIPE` with the same shapes and tensor types.
//!
//! With `--tokenizer-from DONOR.gguf` the file carries the donor's tokenizer instead (its
//! `tokenizer.ggml.*` metadata; Qwen2.5's byte-level BPE for this shape), padded to the
//! shape's 248,320 rows with control tokens `<|extra_N|>` that no text spells: both engines
//! can then tokenize a prompt and hold the output to a grammar (structured-output benchmarks).
//!
//! The weights are those of [`wgpu_llm::loader::synthetic`] (random, scaled like trained ones),
//! mapped to llama.cpp's names: the fused `attn_q` of q and gate rows per head, `attn_qkv` /
//! `attn_gate` for the Gated DeltaNet's input projections, `ssm_a = -exp(A_log)`, `ssm_dt.bias`,
//! `post_attention_norm`; routers and the shared expert's gate in F32 (as llama.cpp's quantizer
//! leaves them). Random weights make the value-head order of the linear layers immaterial, so it
//! is not permuted.
//!
//! ```sh
//! cargo run --release --example qwen35moe_gguf -- q4_k_m OUT.gguf [LAYERS] [--tokenizer-from DONOR.gguf]
//! ```

use wgpu_llm::loader::gguf::GgufWriter;
use wgpu_llm::loader::synthetic;
use wgpu_llm::loader::{Checkpoint, TokenizerSource};
use wgpu_llm::model::config::{Mixer, MlpSpec};
use wgpu_llm::model::qwen3_5_moe::Qwen35MoeConfig;

fn main() -> anyhow::Result<()> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let donor = match args.iter().position(|a| a == "--tokenizer-from") {
        Some(i) if i + 1 < args.len() => Some(args.drain(i..i + 2).nth(1).expect("two drained")),
        Some(_) => anyhow::bail!("--tokenizer-from needs a GGUF file"),
        None => None,
    };
    let (recipe, out) = match &args[..] {
        [r, o] | [r, o, _] => (r.as_str(), o.as_str()),
        _ => anyhow::bail!("usage: qwen35moe_gguf RECIPE OUT.gguf [LAYERS] [--tokenizer-from DONOR.gguf]"),
    };
    let mut q = Qwen35MoeConfig::qwen3_5_35b_a3b();
    if let Some(n) = args.get(2) {
        let n: usize = n.parse()?;
        q.full_attention.truncate(n);
    }
    let c = q.model_config();
    let ck = synthetic::build(&c, recipe, &format!("synthetic:qwen3.5-35b-a3b:{recipe}"), 0x5EED)?;
    let mut w = GgufWriter::new();
    w.add_qwen35moe_config(&c)?;
    w.add_metadata("general.name", format!("synthetic Qwen3.5-35B-A3B shape, {recipe}"));
    match donor {
        Some(path) => {
            let ck = Checkpoint::open(std::path::Path::new(&path))?;
            let TokenizerSource::Gguf(mut t) = ck.tokenizer else {
                anyhow::bail!("{path}: no GGUF tokenizer to copy");
            };
            anyhow::ensure!(t.tokens.len() <= c.vocab_size, "{path}: more tokens than the shape's vocabulary");
            for i in t.tokens.len()..c.vocab_size {
                t.tokens.push(format!("<|extra_{i}|>"));
                if !t.token_types.is_empty() {
                    t.token_types.push(wgpu_llm::loader::gguf::token_type::CONTROL);
                }
                if !t.scores.is_empty() {
                    t.scores.push(0.0);
                }
            }
            w.add_tokenizer(&t);
        }
        None => {
            w.add_metadata("tokenizer.ggml.model", "none");
        }
    }

    let raw = |name: &str| ck.raw(name).map(|t| (t.dtype, t.shape, t.bytes));
    let f32_of = |name: &str| -> anyhow::Result<Vec<f32>> { Ok(ck.raw(name)?.to_f32()?) };
    let copy = |w: &mut GgufWriter, from: &str, to: &str| -> anyhow::Result<()> {
        let (dt, shape, bytes) = raw(from)?;
        w.add_tensor(to, dt, &shape, bytes)?;
        Ok(())
    };
    copy(&mut w, "token_embd.weight", "token_embd.weight")?;
    copy(&mut w, "output_norm.weight", "output_norm.weight")?;
    copy(&mut w, "output.weight", "output.weight")?;
    for l in 0..c.num_layers() {
        let b = |s: &str| format!("blk.{l}.{s}");
        let spec = c.layer(l);
        copy(&mut w, &b("attn_norm.weight"), &b("attn_norm.weight"))?;
        copy(&mut w, &b("ffn_norm.weight"), &b("post_attention_norm.weight"))?;
        match spec.mixer {
            Mixer::Attention(at) => {
                // llama.cpp's attn_q: per head, its q rows then its gate rows.
                let (dq, sq, q_rows) = raw(&b("attn_q.weight"))?;
                let (dg, _, g_rows) = raw(&b("attn_out_gate.weight"))?;
                anyhow::ensure!(dq == dg, "q and gate rows of layer {l} differ in type");
                let row = q_rows.len() / sq[0];
                let head = row * at.head_dim;
                let mut fused = Vec::with_capacity(2 * q_rows.len());
                for h in 0..at.heads {
                    fused.extend_from_slice(&q_rows[h * head..(h + 1) * head]);
                    fused.extend_from_slice(&g_rows[h * head..(h + 1) * head]);
                }
                w.add_tensor(b("attn_q.weight"), dq, &[2 * sq[0], sq[1]], fused)?;
                for s in
                    ["attn_k.weight", "attn_v.weight", "attn_output.weight", "attn_q_norm.weight", "attn_k_norm.weight"]
                {
                    copy(&mut w, &b(s), &b(s))?;
                }
            }
            Mixer::DeltaNet(_) => {
                copy(&mut w, &b("ssm_in_qkv.weight"), &b("attn_qkv.weight"))?;
                copy(&mut w, &b("ssm_in_z.weight"), &b("attn_gate.weight"))?;
                for s in
                    ["ssm_beta.weight", "ssm_alpha.weight", "ssm_conv1d.weight", "ssm_norm.weight", "ssm_out.weight"]
                {
                    copy(&mut w, &b(s), &b(s))?;
                }
                copy(&mut w, &b("ssm_dt_bias.weight"), &b("ssm_dt.bias"))?;
                let a_log = f32_of(&b("ssm_a_log.weight"))?;
                let a: Vec<f32> = a_log.iter().map(|x| -x.exp()).collect();
                w.add_f32(b("ssm_a"), &[a.len()], &a)?;
            }
        }
        let MlpSpec::Moe { shared_intermediate, .. } = spec.mlp else { anyhow::bail!("layer {l} is not MoE") };
        let router = f32_of(&b("ffn_gate_inp.weight"))?;
        w.add_f32(b("ffn_gate_inp.weight"), &[q.num_experts, c.hidden_size], &router)?;
        for s in ["ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"] {
            copy(&mut w, &b(s), &b(s))?;
        }
        if shared_intermediate > 0 {
            let g = f32_of(&b("ffn_gate_inp_shexp.weight"))?;
            w.add_f32(b("ffn_gate_inp_shexp.weight"), &[c.hidden_size], &g)?;
            for s in ["ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight"] {
                copy(&mut w, &b(s), &b(s))?;
            }
        }
    }
    drop(ck);
    w.write(out.as_ref())?;
    eprintln!("wrote {out}: qwen35moe, {} layers, {recipe}", c.num_layers());
    Ok(())
}
