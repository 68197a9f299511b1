#!/usr/bin/env python3
"""Checks the tiny Qwen3.5-MoE references against each other: transformers and mlx-lm, two
independent implementations, on the same weights.

  tools/check_qwen35moe_references.py [--fixture qwen35moe_tiny] [--model DIR] [--variants]

For the model folder (default tests/fixtures/models/FIXTURE) and the prompt of
tests/fixtures/reference/FIXTURE.json:

* transformers (f32, CPU, eager): the prompt logits (must equal FIXTURE.logits.f32 bit for bit),
  the logits of every greedy step teacher-forced with the fixture's greedy tokens through the
  cache (chunked delta rule for the prompt, recurrent rule + conv update for each decode step),
  and the same positions recomputed without a cache in one pass; the router's smallest top-k
  margin (k-th minus (k+1)-th, as logits and as softmax probabilities) over prompt and decode;
  the top-1/top-2 margin at each greedy step.
* mlx-lm (CPU, every parameter cast to f32 after loading): the folder converted by mlx_lm.convert
  at float32 (tools/make_qwen35moe_mlx.py --mlx --float --dtype float32), so both sides hold the
  same numbers, then the same teacher-forced steps and its own greedy tokens. With --variants also
  the bf16, f16 and 4-bit (group 64) conversions (their differences are the weights' rounding).
  Where FIXTURE_mlx / FIXTURE_mlx4 references exist, the bf16 / 4-bit runs must reproduce their
  prompt logits bit for bit.

Prints one JSON summary (also written to --summary). Needs torch, transformers >= 5, mlx-lm.
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def margins_of(vals: np.ndarray, k: int):
    """Smallest (k-th largest - (k+1)-th largest) over the rows of vals [N, E]."""
    s = np.sort(vals, axis=-1)
    return float((s[:, -k] - s[:, -k - 1]).min())


def transformers_side(model_dir, ids, feed):
    import torch
    from transformers import Qwen3_5MoeForCausalLM

    model = Qwen3_5MoeForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").eval()
    router = []

    def hook(mod, inp, out):
        router.append(out[0].detach().float().numpy().reshape(-1, mod.num_experts))

    hooks = [l.mlp.gate.register_forward_hook(hook) for l in model.model.layers]
    k = model.config.num_experts_per_tok
    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=True)
        rows = [out.logits[0, -1].numpy().copy()]
        cache = out.past_key_values
        for t in feed:
            out = model(torch.tensor([[t]]), past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            rows.append(out.logits[0, -1].numpy().copy())
        for h in hooks:
            h.remove()
        full = model(torch.tensor([ids + feed]), use_cache=False).logits[0, len(ids) - 1 :].numpy()
    logits = np.concatenate(router)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return np.stack(rows), full, margins_of(logits, k), margins_of(probs, k)


def mlx_side(mlx_dir, ids, feed, steps):
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.models.cache import make_prompt_cache

    mx.set_default_device(mx.cpu)
    model, _ = load(mlx_dir)
    model.set_dtype(mx.float32)

    def run(toks, cache):
        return np.array(model(mx.array([toks]), cache=cache)[0, -1].astype(mx.float32))

    cache = make_prompt_cache(model)
    rows = [run(ids, cache)] + [run([t], cache) for t in feed]
    cache = make_prompt_cache(model)
    cur, greedy = run(ids, cache), []
    for _ in range(steps):
        greedy.append(int(np.argmax(cur)))
        cur = run([greedy[-1]], cache)
    return np.stack(rows), greedy


def build(hf_dir, out, args):
    if os.path.isfile(os.path.join(out, "config.json")):
        return out
    cmd = [sys.executable, os.path.join(ROOT, "tools/make_qwen35moe_mlx.py"), hf_dir, out, "--mlx"] + args
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixture", default="qwen35moe_tiny")
    ap.add_argument("--model", help="the HF folder (default tests/fixtures/models/FIXTURE)")
    ap.add_argument("--work", default="/tmp/qwen35moe-check", help="where the MLX folders are built")
    ap.add_argument("--variants", action="store_true", help="also bf16, f16 and 4-bit MLX conversions")
    ap.add_argument("--summary", help="write the JSON summary here too")
    a = ap.parse_args()

    ref_dir = os.path.join(ROOT, "tests/fixtures/reference")
    hf_dir = a.model or os.path.join(ROOT, "tests/fixtures/models", a.fixture)
    model_name = os.path.basename(hf_dir.rstrip("/"))
    meta = json.load(open(os.path.join(ref_dir, a.fixture + ".json")))
    ids, greedy = meta["prompt_ids"], meta["greedy_tokens"]
    feed = greedy[:-1]
    committed = np.fromfile(os.path.join(ref_dir, a.fixture + ".logits.f32"), "<f4")

    T, full, router_logit_margin, router_prob_margin = transformers_side(hf_dir, ids, feed)
    srt = np.sort(T, axis=1)
    res = {
        "fixture": a.fixture,
        "prompt_ids": ids,
        "transformers": {
            "prompt_logits_equal_committed": bool(np.array_equal(T[0], committed)),
            "greedy_from_teacher_forced_argmax_equal_committed": [int(i) for i in T.argmax(1)] == greedy,
            "cache_vs_no_cache_max_abs": float(np.abs(T - full).max()),
            "logits_std": float(T[0].std()),
            "step_top1_minus_top2": [round(float(x), 5) for x in srt[:, -1] - srt[:, -2]],
            "router_min_topk_margin_logit": router_logit_margin,
            "router_min_topk_margin_prob": router_prob_margin,
        },
        "mlx": {},
    }
    os.makedirs(a.work, exist_ok=True)
    variants = [("f32", ["--float", "--dtype", "float32"], None)]
    if a.variants:
        variants += [
            ("f16", ["--float", "--dtype", "float16"], None),
            ("bf16", ["--float"], a.fixture + "_mlx"),
            ("q4g64", ["--bits", "4", "--group", "64"], a.fixture + "_mlx4"),
        ]
    for name, args, ref in variants:
        d = build(hf_dir, os.path.join(a.work, f"{model_name}-mlx-{name}"), args)
        S, g = mlx_side(d, ids, feed, len(greedy))
        diff = np.abs(S - T).max(axis=1)
        r = {
            "folder": d,
            "max_abs_vs_transformers_prompt": float(diff[0]),
            "max_abs_vs_transformers_all_steps": float(diff.max()),
            "greedy": g,
            "greedy_agrees_with_transformers_for": next((i for i, (x, y) in enumerate(zip(g, greedy)) if x != y), len(g)),
        }
        if ref and os.path.isfile(os.path.join(ref_dir, ref + ".logits.f32")):
            want = np.fromfile(os.path.join(ref_dir, ref + ".logits.f32"), "<f4")
            r["prompt_logits_equal_" + ref] = bool(np.array_equal(S[0], want))
            r["greedy_equal_" + ref] = g == json.load(open(os.path.join(ref_dir, ref + ".json")))["greedy_tokens"]
        res["mlx"][name] = r
    out = json.dumps(res, indent=1)
    print(out)
    if a.summary:
        open(a.summary, "w").write(out + "\n")


if __name__ == "__main__":
    main()
