#!/usr/bin/env python3
"""The tiny Qwen3.5-MoE checkpoint in the two other layouts the engine reads, and mlx-lm's.

  tools/make_qwen35moe_mlx.py HF_DIR FUSED_DIR            # transformers names, fused experts
  tools/make_qwen35moe_mlx.py HF_DIR OUT_DIR --mlx [--bits 4 --group 64 | --float] [--dtype float32]

HF_DIR is tests/fixtures/models/qwen35moe_tiny (save_pretrained: per-expert tensors
`mlp.experts.{e}.gate_proj.weight`, a text-only config). The first form writes the same weights
with the experts fused as Qwen3.5's published checkpoints store them (`mlp.experts.gate_up_proj`
[E, 2I, H] = [gate; up] per expert, `mlp.experts.down_proj` [E, H, I]) under the multimodal
config (`model_type` qwen3_5_moe, the text config under `text_config`): what mlx-lm's qwen3_5_moe
converter reads. With --mlx it then runs mlx-lm's own converter on that folder (mlx_lm.convert,
bf16 like mlx-community's, or --dtype float16/float32: float, or quantized with --bits/--group;
mlx-lm keeps the routers at 8 bits) into OUT_DIR. mlx-lm's converter renames (language_model.
prefix, experts.gate_up_proj -> switch_mlp.{gate,up}_proj), moves the conv taps to [C, K, 1] and
adds the 1 to the (1 + w) norms; A_log stays float32 whatever --dtype says.
Needs numpy and safetensors; --mlx needs mlx-lm (pip install "mlx[cpu]==0.32.4" "mlx-lm==0.32.2").
"""
import argparse
import json
import os
import re
import shutil

import numpy as np
from safetensors.numpy import load_file, save_file

from fixture_common import mlx_convert


def fuse(hf_dir: str, out_dir: str) -> None:
    w = load_file(os.path.join(hf_dir, "model.safetensors"))
    out, experts = {}, {}
    for name, v in w.items():
        m = re.match(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight$", name)
        if m:
            experts.setdefault(int(m[1]), {}).setdefault(m[3], {})[int(m[2])] = v
        else:
            out[name] = v
    for layer, parts in experts.items():
        n = len(parts["gate"])
        gate_up = [np.concatenate([parts["gate"][e], parts["up"][e]], axis=0) for e in range(n)]
        out[f"model.layers.{layer}.mlp.experts.gate_up_proj"] = np.stack(gate_up)
        out[f"model.layers.{layer}.mlp.experts.down_proj"] = np.stack([parts["down"][e] for e in range(n)])
    tmp = out_dir.rstrip("/") + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    save_file(out, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    text = json.load(open(os.path.join(hf_dir, "config.json")))
    text["model_type"] = "qwen3_5_moe_text"
    cfg = {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
        "text_config": text,
        "tie_word_embeddings": text.get("tie_word_embeddings", False),
    }
    json.dump(cfg, open(os.path.join(tmp, "config.json"), "w"), indent=1)
    shutil.copy(os.path.join(hf_dir, "tokenizer.json"), tmp)
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast"}, open(os.path.join(tmp, "tokenizer_config.json"), "w"))
    shutil.rmtree(out_dir, ignore_errors=True)
    os.rename(tmp, out_dir)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("hf_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--mlx", action="store_true")
    ap.add_argument("--float", action="store_true")
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--group", type=int, default=64)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    a = ap.parse_args()
    if not a.mlx:
        fuse(a.hf_dir, a.out_dir)
        print(a.out_dir)
        return
    fused = a.out_dir.rstrip("/") + ".fused"
    fuse(a.hf_dir, fused)
    mlx_convert(fused, a.hf_dir, a.out_dir, a.float, a.bits, a.group, a.dtype)
    shutil.rmtree(fused, ignore_errors=True)
    print(a.out_dir)


if __name__ == "__main__":
    main()
