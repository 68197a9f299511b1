#!/usr/bin/env python3
"""A tiny random Qwen3.5-MoE checkpoint and transformers' reference forward on it.

  tools/make_qwen35moe_fixture.py --model tests/fixtures/models/qwen35moe_tiny \
      --out tests/fixtures/reference/qwen35moe_tiny

Builds transformers' Qwen3_5MoeForCausalLM from a small config that has every layer kind (three
Gated DeltaNet layers and a gated full-attention layer, --cycles times), a few experts with a
shared expert (of the experts' size, as in Qwen3.5-35B-A3B, or --shared), partial rotary and GQA, with random weights scaled like trained ones (linear weights
N(0, 1/fan_in), the (1 + w) norms' w ~ N(0, 0.1), A_log = ln U(1, 16), dt_bias ~ 1, routers
spread so that no top-k choice is a near-tie), in float32 with f16-representable matrices (the
engine's weight type: both sides compute with the same weights), seed fixed. Writes the folder
(config.json, model.safetensors as save_pretrained writes it, and a word-level tokenizer.json
whose tokens are "t0".."tN" so the engine can open the folder) and, for a fixed prompt of random
token ids, transformers' f32 CPU forward (eager attention): OUT.logits.f32 (last prompt position)
and OUT.json (prompt ids, 16 greedy tokens generated with the cache: the recurrent decode path,
each step's top-5 logits; the format tests/common/reference.rs reads); with --step-logits also
OUT.steps.f32, every greedy step's full logits ([16, vocab] little-endian f32, row i the logits
greedy_tokens[i] is the argmax of: row 0 is the prompt's, row i > 0 comes after feeding
greedy_tokens[:i] through the cache). Needs torch and transformers >= 5 (qwen3_5_moe).
"""
import argparse
import json
import os

import numpy as np
import torch
from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig
from fixture_common import greedy_steps, tokenizer_json, write_reference

SEED = 1234
PROMPT_LEN = 24
STEPS = 16


def config(vocab: int, cycles: int, shared: int) -> Qwen3_5MoeTextConfig:
    return Qwen3_5MoeTextConfig(
        vocab_size=vocab,
        hidden_size=64,
        num_hidden_layers=4 * cycles,
        layer_types=(["linear_attention"] * 3 + ["full_attention"]) * cycles,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=shared,
        rms_norm_eps=1e-6,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25},
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )


def randomize(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Weights like a trained model's: unit-scale activations, nothing zero."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.log(1.0 + 15.0 * torch.rand(p.shape, generator=gen)))
            elif name.endswith("dt_bias"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith("linear_attn.norm.weight"):  # plain w
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif "norm" in name:  # (1 + w) norms
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith("conv1d.weight"):
                p.copy_(0.4 * torch.randn(p.shape, generator=gen))
            elif name.endswith("embed_tokens.weight"):
                p.copy_(torch.randn(p.shape, generator=gen))
            elif name.endswith("mlp.gate.weight"):
                # Router logits of spread ~3: clear top-k choices.
                p.copy_(3.0 * torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
            else:
                fan_in = p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=gen) / fan_in**0.5)
            if p.ndim >= 2 and not name.endswith("conv1d.weight"):
                # Matrices f16-representable (stored as f32): the engine holds them as f16, so
                # both sides compute with the same weights and the comparison measures the
                # arithmetic, not f16 rounding (which moves these random logits by up to 0.16).
                p.copy_(p.half().float())


class RouterMargins:
    """Records, for every router call, the smallest gap between the k-th and (k+1)-th router
    logit: a near-tie could flip the expert choice when the engine's f16 weights move a logit."""

    def __init__(self, model):
        self.gaps = []
        self.hooks = [l.mlp.gate.register_forward_hook(self.hook) for l in model.model.layers]

    def hook(self, mod, inp, out):
        logits = out[0] if isinstance(out, tuple) else out
        top = torch.topk(logits.float(), mod.top_k + 1, dim=-1).values
        self.gaps.append(float((top[:, -2] - top[:, -1]).min()))

    def close(self) -> float:
        for h in self.hooks:
            h.remove()
        return min(self.gaps)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="folder to write the checkpoint to")
    ap.add_argument("--out", required=True, help="fixture path without extension")
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--cycles", type=int, default=2, help="(3 DeltaNet + 1 attention) layer cycles")
    ap.add_argument("--shared", type=int, default=32, help="shared expert size (the experts': 32)")
    ap.add_argument("--step-logits", action="store_true", help="also write OUT.steps.f32")
    ap.add_argument("--prompt-len", type=int, default=PROMPT_LEN)
    ap.add_argument("--reference-only", action="store_true", help="reuse the model folder, write only the fixture")
    a = ap.parse_args()

    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    cfg = config(a.vocab, a.cycles, a.shared)
    if not a.reference_only:
        model = Qwen3_5MoeForCausalLM(cfg).to(torch.float32).eval()
        randomize(model, gen)
        os.makedirs(a.model, exist_ok=True)
        model.save_pretrained(a.model, safe_serialization=True)
        with open(os.path.join(a.model, "tokenizer.json"), "w") as f:
            json.dump(tokenizer_json(a.vocab), f)

    # Reload from disk: the reference runs on exactly the saved tensors.
    model = Qwen3_5MoeForCausalLM.from_pretrained(a.model, dtype=torch.float32, attn_implementation="eager").eval()
    # The prompt (of a few candidates) whose routing is furthest from a tie, prompt and decode.
    best = None
    for cand in range(16):
        rng = np.random.default_rng(SEED + cand)
        ids = [int(i) for i in rng.integers(0, a.vocab, a.prompt_len)]
        margins = RouterMargins(model)
        with torch.no_grad():
            res = greedy_steps(model, ids, STEPS, "past_key_values")
        margin = margins.close()
        if best is None or margin > best[0]:
            best = (margin, ids, res)
    margin, ids, (first, greedy, step_top5, step_vals, rows) = best
    description = "tiny random Qwen3_5MoeForCausalLM (tools/make_qwen35moe_fixture.py)"
    result = (first, greedy, step_top5, step_vals, rows)
    extra = {"min_router_logit_margin": margin}
    t5 = write_reference(a.out, description, model, ids, result, extra, a.step_logits, "tools/make_qwen35moe_fixture.py")
    print(f"logits std {first.std():.3f}, top5 {t5}, greedy {greedy}, min router margin {margin:.4f}")


if __name__ == "__main__":
    main()
