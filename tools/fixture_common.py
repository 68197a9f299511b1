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


def greedy_steps(model, ids, steps: int, cache_arg: str):
    """transformers' forward over the prompt `ids`, then `steps` greedy tokens fed through the
    cache (`cache_arg`: the keyword and output field the model's class names it by, `cache` or
    `past_key_values`): (prompt logits, greedy tokens, each step's top-5 ids and values, the
    [steps, vocab] logits each greedy token is the argmax of)."""
    import numpy as np
    import torch

    out = model(torch.tensor([ids]), use_cache=True)
    first = out.logits[0, -1].float().numpy()
    cur = first
    greedy, step_top5, step_vals, rows = [], [], [], []
    for _ in range(steps):
        rows.append(cur)
        t5, v5 = top5(cur)
        step_top5.append(t5)
        step_vals.append(v5)
        tok = int(np.argmax(cur))
        greedy.append(tok)
        out = model(torch.tensor([[tok]]), use_cache=True, **{cache_arg: getattr(out, cache_arg)})
        cur = out.logits[0, -1].float().numpy()
    return first, greedy, step_top5, step_vals, np.stack(rows)


def write_reference(out: str, description: str, model, ids, result, extra: dict, step_logits: bool, command: str):
    """Writes the fixture tests/common/reference.rs reads: OUT.logits.f32 (the prompt's last
    position), with `step_logits` OUT.steps.f32, and OUT.json (prompt, greedy steps, top-5s, the
    `extra` facts of the script, versions and the command). `result` is greedy_steps'."""
    import sys

    import torch
    import transformers

    first, greedy, step_top5, step_vals, rows = result
    first.astype("<f4").tofile(out + ".logits.f32")
    if step_logits:
        rows.astype("<f4").tofile(out + ".steps.f32")
    t5, v5 = top5(first)
    meta = {
        "model": description,
        "config": {k: v for k, v in model.config.to_dict().items() if not k.startswith("_")},
        "prompt_ids": ids,
        "n_prompt": len(ids),
        "top5": t5,
        "top5_logits": v5,
        "greedy_tokens": greedy,
        "step_logits_top5": step_top5,
        "step_logits_top5_values": step_vals,
        **extra,
        "logits_file": os.path.basename(out) + ".logits.f32",
        "logits_format": "little-endian f32, vocab entries, last prompt position",
        **(
            {
                "step_logits_file": os.path.basename(out) + ".steps.f32",
                "step_logits_format": "little-endian f32, [16, vocab]: row i is the logits greedy_tokens[i] "
                "is the argmax of (row 0 the prompt's, row i after feeding greedy_tokens[:i] with the cache)",
            }
            if step_logits
            else {}
        ),
        "precision": "transformers forward in float32 on the CPU, eager attention; decode with the cache",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "python": sys.version.split()[0]},
        "command": " ".join([command] + sys.argv[1:]),
    }
    with open(out + ".json", "w") as f:
        json.dump(meta, f, indent=1)
    return t5
