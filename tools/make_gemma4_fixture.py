#!/usr/bin/env python3
"""A tiny random Gemma 4 text checkpoint and transformers' reference forward on it.

  tools/make_gemma4_fixture.py --model tests/fixtures/models/gemma4_tiny \
      --out tests/fixtures/reference/gemma4_tiny --step-logits
  tools/make_gemma4_fixture.py --model tests/fixtures/models/gemma4_tiny \
      --out tests/fixtures/reference/gemma4_tiny_long --reference-only --prompt-len 40 --step-logits
  tools/make_gemma4_fixture.py --variant ple --model tests/fixtures/models/gemma4_tiny_ple \
      --out tests/fixtures/reference/gemma4_tiny_ple --step-logits

Builds transformers' Gemma4ForCausalLM (model_type gemma4_text) from a small config with the
features of a published Gemma 4 text model, with random weights scaled like trained ones (linear
weights and the embeddings N(0, 1/fan_in), the per-layer-input embedding N(0, 1/P) (both scaled by
the square root of their width in the forward), every RMSNorm weight 1 + 0.1·N(0, 1) (Gemma 4's
norms multiply by w, not 1 + w) except the final norm's, 2 + 0.2·N(0, 1) (logits of std about 2,
so the soft-cap bends the largest by a few tenths), and q_norm's and k_norm's, head_dim^-1/4 ·
(1 + 0.1·N(0, 1)) (Gemma 4's attention scale is 1: these carry the 1/sqrt(head_dim) temperature;
at w ~ 1 the random model is chaotic, f16 rounding moving its logits by tenths),
each layer's `layer_scalar` U(0.5, 1.5)), in float32 with f16-representable matrices (the engine's
weight type: both sides compute with the same weights) and f16-representable layer scalars, seed
fixed. --variant:

* dense31b (default): Gemma-4-31B's features: 8 layers, sliding and full attention
  (s s f s s f s f: several full layers, the last one full), sliding layers head_dim 16 with 2 KV
  heads, full layers global_head_dim 32 with 1 KV head and K = V (attention_k_eq_v: no v_proj, the
  values are k_proj's output through the scale-less v_norm, the keys through k_norm and RoPE),
  window 8 (a 24-token prompt crosses it), RoPE default theta 1e4 (sliding) and proportional
  theta 1e6 with partial_rotary_factor 0.25 (full), final logit soft-capping 30, GeGLU
  (gelu_pytorch_tanh) MLP of 128, tied embeddings, no per-layer inputs, no KV sharing, no MoE.
* ple: Gemma-4-E2B's features: per-layer inputs (hidden_size_per_layer_input 8,
  vocab_size_per_layer_input = vocab), the last 2 layers reusing the KV of the last earlier layer of
  their type (num_kv_shared_layers 2; layers s s s f s s s f: layer 6 reads layer 5's, layer 7
  layer 3's), the shared layers' MLP twice as wide (use_double_wide_mlp), separate v_proj
  (attention_k_eq_v False: full layers have global_head_dim 32 and num_key_value_heads 2).

Writes the folder (config.json and model.safetensors as save_pretrained writes them, plus
`global_head_dim` / `num_global_key_value_heads` at the top level of config.json, as Google's
published configs have them: transformers 5.24 itself serialises them only as a `per_layer_config`
table, which it also keeps; and a word-level tokenizer.json whose tokens are "t0".."tN" so the
engine can open the folder) and, for a fixed prompt of random token ids (the one of 16 candidates
whose smallest top-1 - top-2 logit gap over the 16 greedy steps is largest, `min_top2_gap`, among
those with at least 10 distinct greedy tokens),
transformers' f32 CPU forward (eager attention): OUT.logits.f32 (last prompt position) and OUT.json
(prompt ids, 16 greedy tokens generated with the cache (sliding layers keep window - 1 past keys),
each step's top-5 logits; the format tests/common/reference.rs reads); with --step-logits also
OUT.steps.f32, every greedy step's full logits ([16, vocab] little-endian f32, row i the logits
greedy_tokens[i] is the argmax of: row 0 is the prompt's, row i > 0 comes after feeding
greedy_tokens[:i] through the cache). As a check it recomputes prompt + greedy tokens in one pass
without a cache and records the largest logit difference (`cache_vs_recompute_max_abs`), and
the same with every sliding layer's window widened past the sequence (`wide_window_max_abs`: how
far off an engine that ignores the window would be).
Needs torch and a transformers with gemma4 (checked with 5.24).
"""
import argparse
import json
import os

import numpy as np
import torch
from transformers import Gemma4ForCausalLM, Gemma4TextConfig
from fixture_common import greedy_steps, tokenizer_json, write_reference

SEED = 1234
PROMPT_LEN = 24
STEPS = 16
S, F = "sliding_attention", "full_attention"


def config(vocab: int, variant: str) -> Gemma4TextConfig:
    common = dict(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        global_head_dim=32,
        hidden_activation="gelu_pytorch_tanh",
        sliding_window=8,
        final_logit_softcapping=30.0,
        rms_norm_eps=1e-6,
        max_position_embeddings=4096,
        rope_parameters={
            S: {"rope_type": "default", "rope_theta": 10_000.0},
            F: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
        },
        enable_moe_block=False,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,  # no padding row in the embeddings (nothing zeroed)
    )
    if variant == "dense31b":
        return Gemma4TextConfig(
            **common,
            layer_types=[S, S, F, S, S, F, S, F],
            num_global_key_value_heads=1,
            attention_k_eq_v=True,
            hidden_size_per_layer_input=0,
            vocab_size_per_layer_input=vocab,
            num_kv_shared_layers=0,
            use_double_wide_mlp=False,
        )
    if variant == "ple":
        return Gemma4TextConfig(
            **common,
            layer_types=[S, S, S, F, S, S, S, F],
            attention_k_eq_v=False,
            hidden_size_per_layer_input=8,
            vocab_size_per_layer_input=vocab,
            num_kv_shared_layers=2,
            use_double_wide_mlp=True,
        )
    raise ValueError(variant)


def published_keys(variant: str) -> dict:
    """The keys Google's Gemma 4 configs carry that transformers 5.24 folds into per_layer_config."""
    if variant == "dense31b":
        return {"global_head_dim": 32, "num_global_key_value_heads": 1}
    return {"global_head_dim": 32, "num_global_key_value_heads": None}


def randomize(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Weights like a trained model's: unit-scale activations, nothing zero."""
    cfg = model.config
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name == "model.norm.weight":
                # The final norm twice the others: logits (the tied head) of std about 2, so the
                # soft-cap at 30 bends the largest by a few tenths.
                p.copy_(2.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith(("q_norm.weight", "k_norm.weight")):
                # Gemma 4 scales attention scores by 1: the q/k norms carry the temperature. At
                # w ~ 1 the scores of unit-RMS q and k have std sqrt(head_dim), the softmax is all
                # but one-hot and the model chaotic (rounding the norm vectors to f16 moved its
                # logits by 0.56); at head_dim^-1/4 each, the usual 1/sqrt(d) temperature.
                p.copy_(p.shape[-1] ** -0.25 * (1.0 + 0.1 * torch.randn(p.shape, generator=gen)))
            elif "norm" in name:  # Gemma 4 RMSNorm: x̂ · w
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith("embed_tokens_per_layer.weight"):
                # Scaled by sqrt(P) in the forward: unit-scale per-layer inputs.
                p.copy_(torch.randn(p.shape, generator=gen) / cfg.hidden_size_per_layer_input**0.5)
            else:  # linear weights [out, in], embed_tokens [vocab, H] (× sqrt(H) in the forward)
                fan_in = p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=gen) / fan_in**0.5)
            if p.ndim >= 2:
                # Matrices f16-representable (stored as f32): the engine holds them as f16, so
                # both sides compute with the same weights and the comparison measures the
                # arithmetic, not f16 rounding.
                p.copy_(p.half().float())
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                # Persistent buffer [1] (saved as model.layers.L.layer_scalar): scales the whole
                # residual stream after the layer. f16-representable as well.
                b.copy_((0.5 + torch.rand(b.shape, generator=gen)).half().float())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="folder to write the checkpoint to")
    ap.add_argument("--out", required=True, help="fixture path without extension")
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--variant", default="dense31b", choices=["dense31b", "ple"])
    ap.add_argument("--step-logits", action="store_true", help="also write OUT.steps.f32")
    ap.add_argument("--prompt-len", type=int, default=PROMPT_LEN)
    ap.add_argument("--reference-only", action="store_true", help="reuse the model folder, write only the fixture")
    a = ap.parse_args()

    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    if not a.reference_only:
        cfg = config(a.vocab, a.variant)
        made = Gemma4ForCausalLM(cfg).to(torch.float32).eval()
        randomize(made, gen)
        os.makedirs(a.model, exist_ok=True)
        made.save_pretrained(a.model, safe_serialization=True)
        path = os.path.join(a.model, "config.json")
        saved = json.load(open(path))
        saved.update(published_keys(a.variant))
        with open(path, "w") as f:
            json.dump(saved, f, indent=2, sort_keys=True)
            f.write("\n")
        with open(os.path.join(a.model, "tokenizer.json"), "w") as f:
            json.dump(tokenizer_json(a.vocab), f)

    # Reload from disk: the reference runs on exactly the saved tensors.
    model = Gemma4ForCausalLM.from_pretrained(a.model, dtype=torch.float32, attn_implementation="eager").eval()
    if not a.reference_only:
        # The reload holds exactly the randomized weights and buffers (layer_scalar included).
        made = made.state_dict()
        for k, v in model.state_dict().items():
            assert torch.equal(v, made[k]), f"{k} differs after save_pretrained / from_pretrained"
    scalars = [float(l.layer_scalar) for l in model.model.layers]
    assert all(s != 1.0 for s in scalars), f"layer_scalar not restored from the file: {scalars}"
    # The prompt (of a few candidates) whose greedy steps are furthest from a tie, among those
    # whose greedy tokens are not mostly repeats (at least 10 distinct of 16, where any is).
    cands = []
    for cand in range(16):
        rng = np.random.default_rng(SEED + cand)
        ids = [int(i) for i in rng.integers(0, a.vocab, a.prompt_len)]
        with torch.no_grad():
            res = greedy_steps(model, ids, STEPS, "cache")
        cands.append((min(v[0] - v[1] for v in res[3]), len(set(res[1])) >= 10, ids, res))
    pool = [c for c in cands if c[1]] or cands
    gap, _, ids, (first, greedy, step_top5, step_vals, rows) = max(pool, key=lambda c: c[0])
    # Check: the cached decode against one pass over prompt + greedy tokens without a cache.
    with torch.no_grad():
        full = model(torch.tensor([ids + greedy[:-1]]), use_cache=False).logits[0, len(ids) - 1 :].numpy()
    recompute = float(np.abs(full - rows).max())
    # The window matters: the same tokens with every sliding layer's window past the sequence.
    wide = Gemma4ForCausalLM.from_pretrained(
        a.model, dtype=torch.float32, attn_implementation="eager", sliding_window=4096
    ).eval()
    with torch.no_grad():
        wide = wide(torch.tensor([ids + greedy[:-1]]), use_cache=False).logits[0, len(ids) - 1 :].numpy()
    window = float(np.abs(wide - rows).max())
    extra = {
        "min_top2_gap": gap,
        "distinct_greedy_tokens": len(set(greedy)),
        "cache_vs_recompute_max_abs": recompute,
        "wide_window_max_abs": window,
        "layer_scalars": [float(l.layer_scalar) for l in model.model.layers],
    }
    description = f"tiny random Gemma4ForCausalLM, variant {a.variant} (tools/make_gemma4_fixture.py)"
    result = (first, greedy, step_top5, step_vals, rows)
    t5 = write_reference(a.out, description, model, ids, result, extra, a.step_logits, "tools/make_gemma4_fixture.py")
    print(
        f"logits std {first.std():.3f} (max |logit| {np.abs(rows).max():.2f}), top5 {t5}, greedy {greedy}, "
        f"min top-2 gap {gap:.4f}, cache vs recompute {recompute:.2e}, window 4096 instead: {window:.3f}"
    )


if __name__ == "__main__":
    main()
