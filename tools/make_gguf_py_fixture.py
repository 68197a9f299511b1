#!/usr/bin/env python3
"""Write tests/fixtures/gguf/gguf_py.gguf with gguf-py (llama.cpp's own Python GGUF writer, `gguf` on
PyPI), so that tests/loader.rs can check our GgufWriter's bytes and our reader against a writer
that is not ours.

  python3 -m venv /tmp/gguf-env && /tmp/gguf-env/bin/pip install gguf==0.19.0
  /tmp/gguf-env/bin/python tools/make_gguf_py_fixture.py

The content (mirrored exactly by `gguf_py_fixture_content` in tests/loader.rs): every metadata value
type (u8 ... f64, bool, string, arrays of numbers, strings, bools and of arrays), a custom alignment
of 64, and tensors of the float types and of two block types (raw Q8_0 and Q4_K blocks), with
values given by formulas here, not by our code.
"""
from __future__ import annotations

import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as T

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "gguf", "gguf_py.gguf")


def main() -> None:
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    w = gguf.GGUFWriter(OUT, "llama")  # writes general.architecture first
    w.add_uint8("t.u8", 7)
    w.add_int8("t.i8", -7)
    w.add_uint16("t.u16", 700)
    w.add_int16("t.i16", -700)
    w.add_uint32("t.u32", 70000)
    w.add_int32("t.i32", -70000)
    w.add_float32("t.f32", 1.5)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo ▁ world")
    w.add_uint64("t.u64", 1 << 40)
    w.add_int64("t.i64", -(1 << 40))
    w.add_float64("t.f64", 2.25)
    w.add_key_value("t.strs", ["x", "", "zz"], T.ARRAY, sub_type=T.STRING)
    w.add_key_value("t.f32s", [1.0, -2.0, 0.1], T.ARRAY, sub_type=T.FLOAT32)
    w.add_key_value("t.u8s", [0, 255, 7], T.ARRAY, sub_type=T.UINT8)
    w.add_key_value("t.i64s", [-1, 1 << 50], T.ARRAY, sub_type=T.INT64)
    w.add_key_value("t.bools", [True, False], T.ARRAY, sub_type=T.BOOL)
    w.add_key_value("t.nested", [[1, 2], [3]], T.ARRAY, sub_type=T.ARRAY)  # inner: i32
    w.add_custom_alignment(64)
    w.add_string("tokenizer.chat_template", "{% for m in messages %}{{ m.content }}{% endfor %}")

    # Float tensors (shapes are numpy's: outermost first).
    w.add_tensor("f32", np.array([1.0, -2.5, 3.25], dtype=np.float32))
    w.add_tensor("f16", (np.arange(6, dtype=np.float32) * 0.5 - 1.0).astype(np.float16).reshape(2, 3))
    bf16_bits = np.array([0x3F80, 0xC000, 0x3F00, 0x4040], dtype=np.uint16)  # 1, -2, 0.5, 3
    w.add_tensor("bf16", bf16_bits.view(np.uint8), raw_dtype=Q.BF16)
    # Q8_0 [2, 32]: per block f16 scale 0.25 (0x3400), then quants (i - 16) for block b, position i.
    q8 = bytearray()
    for b in range(2):
        q8 += bytes([0x00, 0x34])
        q8 += bytes(((i - 16 + b) & 0xFF) for i in range(32))
    w.add_tensor("q8_0", np.frombuffer(bytes(q8), dtype=np.uint8).reshape(2, 34), raw_dtype=Q.Q8_0)
    # Q4_K [1, 256]: one block of 144 bytes, byte j = (7 * j + 3) mod 256.
    q4k = bytes(((7 * j + 3) % 256) for j in range(144))
    w.add_tensor("q4_k", np.frombuffer(q4k, dtype=np.uint8).reshape(1, 144), raw_dtype=Q.Q4_K)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {os.path.relpath(OUT)} ({os.path.getsize(OUT)} bytes) with gguf {gguf.__version__ if hasattr(gguf, '__version__') else '(version unknown)'}", file=sys.stderr)


if __name__ == "__main__":
    main()
