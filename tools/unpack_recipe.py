#!/usr/bin/env python3
"""Rebuild a real-layout GGUF from a shape recipe (../shared/gpu/shape-recipes/NAME), tiling WHOLE blocks.

Usage: unpack_recipe.py RECIPE_DIR OUT.gguf            (stdlib only; runs on the GPU machine)

The shared unpack.py tiles each quantized tensor with its type's sample bytes as they are. Several
samples are not a whole number of blocks (SmolLM2's Q8_0 sample ends 32 bytes into a block, Qwen's
Q5_0, Q4_K and Q6_K samples too), so from the second copy on every block is read at a shifted
offset: its scale field is made of quant bytes, and ~5 % of those blocks get a NaN or infinite
scale (and ~40 % a scale above 1). Any engine's logits are then NaN wherever such a block is read.
This tiler drops the partial block at the end of each sample, so every tiled block is a real one.
"""
import json
import sys

BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24, "Q8_0": 34, "Q4_K": 144, "Q5_K": 176, "Q6_K": 210,
               "F16": 2, "BF16": 2, "F32": 4}

d, dst = sys.argv[1], sys.argv[2]
meta = json.load(open(f"{d}/table.json"))
exact = open(f"{d}/exact.bin", "rb").read()
samples = {}
with open(dst, "wb") as f:
    f.write(open(f"{d}/header.bin", "rb").read())
    f.truncate(meta["total"])
    for t in meta["table"]:
        f.seek(t["off"])
        if "exact_at" in t:
            f.write(exact[t["exact_at"]:t["exact_at"] + t["n"]])
            continue
        ty = t["type"]
        if ty not in samples:
            s = open(f"{d}/sample_{ty}.bin", "rb").read()
            samples[ty] = s[: len(s) // BLOCK_BYTES[ty] * BLOCK_BYTES[ty]]
        s, left = samples[ty], t["n"]
        while left > 0:
            k = min(left, len(s))
            f.write(s[:k])
            left -= k
print("wrote", dst, meta["total"], "bytes")
