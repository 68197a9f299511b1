#!/usr/bin/env python3
"""Checks the tiny Gemma 4 references against each other: transformers and mlx-lm, two
independent implementations, on the same weights.

  tools/check_gemma4_references.py [--fixture gemma4_tiny] [--model DIR] [--variants]

For the model folder (default tests/fixtures/models/gemma4_tiny) and the prompt and greedy tokens
of tests/fixtures/reference/FIXTURE.json (FIXTURE.steps.f32: transformers' logits of every step
through the cache), mlx-lm (CPU, every parameter cast to f32 after loading) runs the folder its
converter writes at float32 (tools/make_gemma4_mlx.py --mlx --float --dtype float32: the same
numbers) teacher-forced through its cache (rotating window caches, KV sharing), and the same
positions in one pass without a cache; prints the largest logit differences and how many of its
argmaxes agree. With --variants also the float16, bfloat16 and 4-bit (group 64) conversions
(their differences are the conversions' rounding). --text converts the gemma4_text folder as it
is instead of Google's multimodal layout (the same numbers either way).
Needs numpy, mlx-lm and, through tools/make_gemma4_mlx.py, safetensors.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def mlx_side(mlx_dir, ids, feed):
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.models.cache import make_prompt_cache

    mx.set_default_device(mx.cpu)
    model, _ = load(mlx_dir)
    model.set_dtype(mx.float32)
    cache = make_prompt_cache(model)
    rows = [np.array(model(mx.array([ids]), cache=cache)[0, -1].astype(mx.float32))]
    for t in feed:
        rows.append(np.array(model(mx.array([[t]]), cache=cache)[0, -1].astype(mx.float32)))
    full = np.array(model(mx.array([ids + feed]))[0, len(ids) - 1 :].astype(mx.float32))
    return np.stack(rows), full


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixture", default="gemma4_tiny")
    ap.add_argument("--model", default=None)
    ap.add_argument("--variants", action="store_true")
    ap.add_argument("--text", action="store_true")
    a = ap.parse_args()
    model = a.model or os.path.join(ROOT, "tests/fixtures/models", a.fixture.removesuffix("_long"))
    ref = os.path.join(ROOT, "tests/fixtures/reference", a.fixture)
    meta = json.load(open(ref + ".json"))
    ids, greedy = meta["prompt_ids"], meta["greedy_tokens"]
    want = np.fromfile(ref + ".steps.f32", "<f4").reshape(len(greedy), -1)
    runs = [("float32", ["--float", "--dtype", "float32"])]
    if a.variants:
        runs += [
            ("float16", ["--float", "--dtype", "float16"]),
            ("bfloat16", ["--float"]),
            ("4-bit g64", ["--bits", "4", "--group", "64"]),
        ]
    summary = {"fixture": a.fixture, "model": model}
    with tempfile.TemporaryDirectory() as tmp:
        for name, args in runs:
            out = os.path.join(tmp, name.replace(" ", "_"))
            cmd = [sys.executable, os.path.join(ROOT, "tools/make_gemma4_mlx.py"), model, out, "--mlx", *args]
            subprocess.run(cmd + (["--text"] if a.text else []), check=True, capture_output=True)
            rows, full = mlx_side(out, ids, greedy[:-1])
            own = [int(np.argmax(r)) for r in rows]
            summary[name] = {
                "prompt_max_abs": float(np.abs(rows[0] - want[0]).max()),
                "steps_max_abs": float(np.abs(rows - want).max()),
                "argmax_agrees": sum(x == y for x, y in zip(own, greedy)),
                "mlx_cache_vs_no_cache": float(np.abs(full - rows).max()),
            }
            print(name, summary[name], flush=True)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
