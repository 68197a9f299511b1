"""Pieces the fixture tools share (tools/make_*_fixture.py, tools/make_*_mlx.py,
tools/make_mlx_reference.py): the word-level test tokenizer, a fixture's top-5 with its tie rule,
and mlx-lm's conversion of a checkpoint folder with that tokenizer kept as it was."""
import json
import os
import shutil


def tokenizer_json(vocab: int) -> dict:
    """A word-level tokenizer.json whose tokens are "t0".."t{vocab-1}" (ids as in the name)."""
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": {f"t{i}": i for i in range(vocab)}, "unk_token": "t0"},
    }


def top5(v):
    """The five largest entries of `v` (ties to the lower id) and their values."""
    idx = sorted(range(len(v)), key=lambda i: (-float(v[i]), i))[:5]
    return idx, [float(v[i]) for i in idx]


def mlx_convert(src: str, tokenizer_dir: str, out_dir: str, float_: bool, bits: int, group: int, dtype: str) -> None:
    """mlx-lm's own converter on the folder `src` into `out_dir` (float in `dtype`, or quantized at
    `bits` / `group`), with `tokenizer_dir`'s tokenizer.json copied as it was (transformers' round
    trip through AutoTokenizer may add tokens past the vocabulary)."""
    from mlx_lm import convert

    tmp = out_dir.rstrip("/") + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    if float_:
        convert(hf_path=src, mlx_path=tmp, dtype=dtype)
    else:
        convert(hf_path=src, mlx_path=tmp, quantize=True, q_bits=bits, q_group_size=group, dtype=dtype)
    shutil.copy(os.path.join(tokenizer_dir, "tokenizer.json"), tmp)
    with open(os.path.join(tmp, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast"}, f)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.rename(tmp, out_dir)
