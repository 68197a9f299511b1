#!/usr/bin/env python3
"""Quantize a Hugging Face folder with mlx-lm's own converter (as mlx-community checkpoints are
made): packed u32 `weight`, `scales`, `biases` per linear layer and embedding, config.json
`quantization`.

  tools/make_mlx_model.py HF_DIR OUT_DIR [--bits 4|8] [--group 32|64|128]

Needs: pip install "mlx[cpu]==0.32.4" "mlx-lm==0.32.2" (the CPU backend runs on Linux). Used by
the tests (tests/common/mlx.rs), which write HF_DIR from the real SmolLM2 GGUF first.
"""
import argparse
import os
import shutil

from mlx_lm import convert


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("hf_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--group", type=int, default=64)
    a = ap.parse_args()
    tmp = a.out_dir.rstrip("/") + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    convert(hf_path=a.hf_dir, mlx_path=tmp, quantize=True, q_bits=a.bits, q_group_size=a.group)
    shutil.rmtree(a.out_dir, ignore_errors=True)
    os.rename(tmp, a.out_dir)
    print(a.out_dir)


if __name__ == "__main__":
    main()
