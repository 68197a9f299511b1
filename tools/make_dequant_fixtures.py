#!/usr/bin/env python3
"""Writes the dequantization fixtures under tests/fixtures/dequant/.

The expected values come from gguf-py's numpy implementation (`gguf.quants`), which is
independent of the Rust code in src/loader/dtype.rs. For every type:

  <type>.bin  raw stored bytes (ggml block layout, little endian)
  <type>.f32  expected dequantized values, little-endian f32 (gguf.quants.dequantize)
  <type>.f16  the same rounded to f16 (numpy astype, round to nearest even)
  <type>.src  for the types gguf-py quantizes: the f32 input it quantized (<type>.bin)

Types gguf-py can quantize (BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) are quantized from random
data with varied per-block scales and offsets; the k-quants (Q4_K, Q5_K, Q6_K), which gguf-py
can only dequantize, are random valid blocks: random bytes with sane f16 scales patched in.

Usage: /work/refenv/bin/python tools/make_dequant_fixtures.py  [output dir]
Deterministic: a fixed seed, so re-running rewrites identical files.
"""

import os
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "dequant")

rng = np.random.default_rng(20240611)


def varied_data(n_blocks: int, block: int) -> np.ndarray:
    """Random rows whose blocks have very different magnitudes and offsets."""
    out = []
    for i in range(n_blocks):
        scale = 10.0 ** rng.uniform(-4, 2)
        x = rng.standard_normal(block) * scale
        kind = i % 5
        if kind == 1:
            x = np.abs(x) + scale * rng.uniform(0, 3)  # all positive (non-zero min)
        elif kind == 2:
            x = -np.abs(x) - scale * rng.uniform(0, 3)  # all negative
        elif kind == 3:
            x[rng.integers(block)] *= 20.0  # an outlier
        elif kind == 4:
            x = rng.uniform(-scale, scale, block)
        out.append(x)
    return np.concatenate(out).astype(np.float32)


def f16_bytes(vals) -> np.ndarray:
    return np.asarray(vals, dtype=np.float16).view(np.uint8)


def random_f16(n: int, lo: float, hi: float, signed: bool = False) -> np.ndarray:
    v = 10.0 ** rng.uniform(np.log10(lo), np.log10(hi), n)
    if signed:
        v *= rng.choice([-1.0, 1.0], n)
    return v.astype(np.float16)


def random_kquant_blocks(qtype: T, n_blocks: int) -> np.ndarray:
    block, size = GGML_QUANT_SIZES[qtype]
    b = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    d = random_f16(n_blocks, 1e-5, 1e-1)
    d[0] = np.float16(3.0e-6)  # an f16 subnormal scale
    if qtype in (T.Q4_K, T.Q5_K):
        # d: f16, dmin: f16, scales[12], (qh[32],) qs[128]
        b[:, 0:2] = f16_bytes(d).reshape(n_blocks, 2)
        b[:, 2:4] = f16_bytes(random_f16(n_blocks, 1e-5, 1e-1, signed=True)).reshape(n_blocks, 2)
    elif qtype == T.Q6_K:
        # ql[128], qh[64], scales[16] (i8), d: f16
        b[:, 208:210] = f16_bytes(d).reshape(n_blocks, 2)
    else:
        raise ValueError(qtype)
    return b


def write(name: str, raw: np.ndarray, expected: np.ndarray, src: np.ndarray | None = None) -> None:
    raw = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
    expected = np.ascontiguousarray(expected, dtype=np.float32).reshape(-1)
    assert np.all(np.isfinite(expected)), name
    with open(os.path.join(OUT, f"{name}.bin"), "wb") as f:
        f.write(raw.tobytes())
    with open(os.path.join(OUT, f"{name}.f32"), "wb") as f:
        f.write(expected.astype("<f4").tobytes())
    with open(os.path.join(OUT, f"{name}.f16"), "wb") as f:
        f.write(expected.astype("<f2").tobytes())
    if src is not None:
        with open(os.path.join(OUT, f"{name}.src"), "wb") as f:
            f.write(np.ascontiguousarray(src, dtype="<f4").tobytes())
    print(f"{name}: {raw.size} bytes -> {expected.size} values")


def main() -> None:
    os.makedirs(OUT, exist_ok=True)

    # Plain float types.
    x = varied_data(8, 32)
    write("f32", x, quants.dequantize(x.view(np.uint8), T.F32))
    h = x.astype(np.float16)
    write("f16", h, quants.dequantize(h.view(np.uint8), T.F16), src=x)
    bf = quants.quantize(x, T.BF16)
    write("bf16", bf, quants.dequantize(bf, T.BF16), src=x)

    # Types gguf-py quantizes.
    for qtype, name in [(T.Q8_0, "q8_0"), (T.Q4_0, "q4_0"), (T.Q4_1, "q4_1"),
                        (T.Q5_0, "q5_0"), (T.Q5_1, "q5_1")]:
        block, _ = GGML_QUANT_SIZES[qtype]
        data = varied_data(24, block).reshape(3, 8 * block)  # 3 rows of 8 blocks
        q = quants.quantize(data, qtype)
        deq = quants.dequantize(q, qtype)
        # Sanity: the quantization is close to the data (so the fixture is not degenerate).
        err = np.abs(deq - data).max(axis=-1) / np.abs(data).max(axis=-1)
        assert np.all(err < 0.2), (name, err)
        write(name, q, deq, src=data)

    # k-quants: gguf-py only dequantizes them, so random valid blocks.
    for qtype, name in [(T.Q4_K, "q4_k"), (T.Q5_K, "q5_k"), (T.Q6_K, "q6_k")]:
        q = random_kquant_blocks(qtype, 6)
        write(name, q, quants.dequantize(q, qtype))


if __name__ == "__main__":
    main()
