#!/usr/bin/env python3
"""The tiny Gemma 4 checkpoint in Google's published (multimodal) layout, and mlx-lm's.

  tools/make_gemma4_mlx.py HF_DIR MM_DIR                  # Google's layout, same weights
  tools/make_gemma4_mlx.py HF_DIR OUT_DIR --mlx [--bits 4 --group 64 | --float] [--dtype float32] [--text]

HF_DIR is tests/fixtures/models/gemma4_tiny (tools/make_gemma4_fixture.py: save_pretrained of a
Gemma4ForCausalLM, `model_type` gemma4_text, names `model.layers.L...`). The first form writes the
same tensors as Google's Gemma 4 checkpoints (Gemma4ForConditionalGeneration) store a text model:
`model.language_model.layers.L...`, `model.language_model.embed_tokens.weight`,
`model.language_model.norm.weight` (tied: no lm_head), under the multimodal config (`model_type`
gemma4, the text config under `text_config`, no vision or audio tower; the top-level `vocab_size`,
which mlx-lm's gemma4 reads in place of text_config's). With --mlx it then runs mlx-lm's own
converter on that folder (mlx_lm.convert, bf16 like mlx-community's, or --dtype float16/float32:
float, or quantized with --bits/--group) into OUT_DIR; --text converts HF_DIR itself instead
(mlx-lm's gemma4_text: names `model.layers.L...` rather than `language_model.model.layers.L...`).
mlx-lm's converter renames `model.language_model.` to `language_model.model.`, keeps every other
name and shape (norm weights as they are: Gemma 4's norms are plain w; `layer_scalar` [1] is a
parameter, cast to --dtype like the rest), drops k_proj / v_proj / k_norm of KV-shared layers
(none here). Quantized: every Linear and the embedding whose input width is a multiple of the
group (here all: 64, 128, 256 inputs) at --bits; the norms and layer scalars stay float.
Needs numpy and safetensors; --mlx needs mlx-lm (pip install "mlx[cpu]==0.32.4" "mlx-lm==0.32.2").
"""
import argparse
import json
import os
import shutil

from safetensors.numpy import load_file, save_file

from fixture_common import mlx_convert


def multimodal(hf_dir: str, out_dir: str) -> None:
    w = load_file(os.path.join(hf_dir, "model.safetensors"))
    out = {}
    for name, v in w.items():
        assert name.startswith("model."), name  # tied: no lm_head
        out["model.language_model." + name.removeprefix("model.")] = v
    tmp = out_dir.rstrip("/") + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    save_file(out, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    text = json.load(open(os.path.join(hf_dir, "config.json")))
    text.pop("architectures", None)
    text["model_type"] = "gemma4_text"
    cfg = {
        "architectures": ["Gemma4ForConditionalGeneration"],
        "model_type": "gemma4",
        "text_config": text,
        "vision_config": None,
        "audio_config": None,
        "vocab_size": text["vocab_size"],
        "tie_word_embeddings": text.get("tie_word_embeddings", True),
        "dtype": text.get("dtype", "float32"),
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
    ap.add_argument("--text", action="store_true", help="convert HF_DIR (gemma4_text) itself")
    a = ap.parse_args()
    if not a.mlx:
        multimodal(a.hf_dir, a.out_dir)
        print(a.out_dir)
        return
    if a.text:
        src = a.hf_dir
    else:
        src = a.out_dir.rstrip("/") + ".multimodal"
        multimodal(a.hf_dir, src)
    mlx_convert(src, a.hf_dir, a.out_dir, a.float, a.bits, a.group, a.dtype)
    if not a.text:
        shutil.rmtree(src, ignore_errors=True)
    print(a.out_dir)


if __name__ == "__main__":
    main()
