#!/usr/bin/env python3
"""Reference logits for an MLX quantized checkpoint from mlx-lm's own forward (CPU).

  tools/make_mlx_reference.py MLX_DIR --prompt-from tests/fixtures/reference/smollm2_chat.json \
      --out tests/fixtures/reference/smollm2_mlx4

The model is loaded with mlx_lm.load, then every floating-point parameter (norms, and the
quantized layers' scales and biases: bf16 -> f32 is exact) is cast to float32, so the forward runs
in f32 over exactly the quantized weights the folder stores. The prompt's token ids are taken
from an existing fixture (the same chat prompt as the transformers references). Writes OUT.json
(prompt ids, last-position top-5, 16 greedy tokens teacher-forced by mlx-lm's own argmax, each
step's top-5 logits) and OUT.logits.f32 (the prompt's last-position logits, little-endian f32),
the format tests/reference.rs reads. With --step-logits also OUT.steps.f32: every greedy step's
full logits ([steps, vocab] little-endian f32; row i the logits greedy_tokens[i] is the argmax of,
row 0 the prompt's).
"""
import argparse
import json
import sys

import mlx.core as mx
import numpy as np
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache
from fixture_common import top5


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mlx_dir")
    ap.add_argument("--prompt-from", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--name", default="SmolLM2-135M-Instruct, MLX quantized by mlx_lm.convert")
    ap.add_argument("--step-logits", action="store_true", help="also write OUT.steps.f32")
    a = ap.parse_args()

    model, _tok = load(a.mlx_dir)
    model.set_dtype(mx.float32)
    src = json.load(open(a.prompt_from))
    ids = [int(i) for i in src["prompt_ids"]]
    cache = make_prompt_cache(model)
    logits = model(mx.array([ids]), cache=cache)[0, -1].astype(mx.float32)
    first = np.array(logits)
    greedy, step_top5, step_vals, rows = [], [], [], []
    cur = first
    for _ in range(a.steps):
        rows.append(cur)
        t5, v5 = top5(cur)
        step_top5.append(t5)
        step_vals.append(v5)
        tok = int(np.argmax(cur))
        greedy.append(tok)
        cur = np.array(model(mx.array([[tok]]), cache=cache)[0, -1].astype(mx.float32))
    t5, v5 = top5(first)
    cfg = json.load(open(f"{a.mlx_dir}/config.json"))
    meta = {
        "model": a.name,
        "quantization": cfg.get("quantization"),
        "prompt_from": a.prompt_from,
        "prompt_ids": ids,
        "n_prompt": len(ids),
        "top5": t5,
        "top5_logits": v5,
        "greedy_tokens": greedy,
        "step_logits_top5": step_top5,
        "step_logits_top5_values": step_vals,
        "logits_file": a.out.split("/")[-1] + ".logits.f32",
        "logits_format": "little-endian f32, vocab entries, last prompt position",
        **(
            {
                "step_logits_file": a.out.split("/")[-1] + ".steps.f32",
                "step_logits_format": f"little-endian f32, [{a.steps}, vocab]: row i is the logits greedy_tokens[i] "
                "is the argmax of (row 0 the prompt's, row i after feeding greedy_tokens[:i] with the cache)",
            }
            if a.step_logits
            else {}
        ),
        "precision": "mlx-lm forward on CPU with every floating-point parameter cast to float32",
        "versions": {"mlx": mx.__version__, "mlx_lm": __import__("mlx_lm").__version__, "python": sys.version.split()[0]},
        "command": " ".join(sys.argv),
    }
    json.dump(meta, open(a.out + ".json", "w"), indent=1)
    first.astype("<f4").tofile(a.out + ".logits.f32")
    if a.step_logits:
        np.stack(rows).astype("<f4").tofile(a.out + ".steps.f32")
    print(f"top5 {t5} greedy {greedy}")


if __name__ == "__main__":
    main()
