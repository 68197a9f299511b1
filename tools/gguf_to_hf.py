#!/usr/bin/env python3
"""Convert a GGUF checkpoint into a Hugging Face model folder (safetensors), for testing the
engine's safetensors loader on real weights.

  tools/gguf_to_hf.py MODEL.gguf OUTDIR [--dtype f16|bf16|f32] [--verify]

transformers loads the GGUF (gguf-py dequantizes every tensor to float32, undoes llama.cpp's Q/K row
permutation for llama-family models, and for Gemma subtracts the +1 that llama.cpp folds into the
RMSNorm weights), the weights are cast to --dtype and written with save_pretrained as
model.safetensors, next to config.json and generation_config.json. The tokenizer built from the
GGUF metadata (with the same pre-tokenizer fixes as tools/make_reference.py: SmolLM2's digit split,
Qwen2's NFC) is written as tokenizer.json + tokenizer_config.json, with the GGUF's chat template
(if any) stored inside tokenizer_config.json under "chat_template" (no separate .jinja file).
config.json also gets the transformers-4 keys rope_theta (gemma3: + rope_local_base_freq) and
torch_dtype next to transformers 5's rope_parameters and dtype.

So the folder holds the standard Hugging Face layout: Q/K rows in HF order (rotate-half RoPE),
Gemma norms as w (applied as 1+w), tied embeddings stored once (config tie_word_embeddings).

--verify reloads the folder with transformers and checks, on a short chat prompt, that
  * the reloaded tokenizer gives the same ids and the same rendered chat template,
  * reloaded logits equal those of the in-memory model with its weights rounded to --dtype
    (up to float32 summation noise), and
  * reloaded logits are within the dtype's tolerance of the float32 GGUF model (same argmax).
Run with the reference venv, e.g. /work/refenv/bin/python.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_reference import fix_tokenizer, gguf_metadata  # noqa: E402

DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}
# max |logit difference| against the float32 GGUF model accepted by --verify
TOLERANCE = {"f32": 1e-4, "f16": 0.1, "bf16": 1.0}


def add_legacy_config_keys(path: str, dtype_name: str) -> None:
    """transformers 5 writes rope settings only as `rope_parameters` and the dtype as `dtype`. Add the
    transformers 4 spellings (`rope_theta`, gemma3's `rope_local_base_freq`, `torch_dtype`) too, so
    readers of either layout find them; transformers 5 reads the file back unchanged."""
    with open(path, encoding="utf-8") as f:
        cfg = json.load(f)
    rp = cfg.get("rope_parameters")
    if isinstance(rp, dict):
        if "rope_theta" in rp:
            cfg.setdefault("rope_theta", rp["rope_theta"])
        elif isinstance(rp.get("full_attention"), dict):
            cfg.setdefault("rope_theta", rp["full_attention"].get("rope_theta"))
            if isinstance(rp.get("sliding_attention"), dict):
                cfg.setdefault("rope_local_base_freq", rp["sliding_attention"].get("rope_theta"))
    cfg.setdefault("torch_dtype", {"f16": "float16", "bf16": "bfloat16", "f32": "float32"}[dtype_name])
    with open(path, "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def chat_ids(tok, text="What is 2+3? Answer briefly."):
    if tok.chat_template:
        s = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
        return s, tok(s, add_special_tokens=False).input_ids
    return text, tok(text).input_ids


@torch.inference_mode()
def last_logits(model, ids):
    x = torch.tensor([ids])
    return model(input_ids=x, attention_mask=torch.ones_like(x), use_cache=False).logits[0, -1].float()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gguf")
    ap.add_argument("outdir")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--verify", action="store_true", help="reload the folder and compare logits/tokenizer")
    ap.add_argument("--force", action="store_true", help="replace OUTDIR if it exists")
    args = ap.parse_args()

    gguf = os.path.abspath(args.gguf)
    gdir, gname = os.path.split(gguf)
    out = os.path.abspath(args.outdir)
    if os.path.exists(out):
        if not args.force and os.listdir(out):
            raise SystemExit(f"{out} exists and is not empty (use --force)")
        shutil.rmtree(out)
    dtype = DTYPES[args.dtype]

    tok = AutoTokenizer.from_pretrained(gdir, gguf_file=gname)
    meta, _ = gguf_metadata(gguf)
    fix_tokenizer(tok, meta)  # same pre-tokenizer/normalizer fixes as the reference fixtures
    model = AutoModelForCausalLM.from_pretrained(gdir, gguf_file=gname, dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()
    ref_logits = None
    if args.verify:
        text, ids = chat_ids(tok)
        ref_logits = last_logits(model, ids)

    # A model loaded from a GGUF is flagged as quantized (hf_quantizer) and refuses save_pretrained,
    # although its weights are plain float32 tensors by now. Build an unflagged model from the same
    # config and copy the weights over in the target dtype.
    cfg = copy.deepcopy(model.config)
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    plain = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="eager")
    missing, unexpected = plain.load_state_dict(model.state_dict(), strict=False)
    missing = [k for k in missing if not (cfg.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise SystemExit(f"weight copy failed: missing {missing}, unexpected {unexpected}")
    plain.tie_weights()
    plain.eval()
    plain.config.dtype = dtype
    plain.save_pretrained(out, safe_serialization=True)
    model = plain
    tok.save_pretrained(out, save_jinja_files=False)

    # tokenizer_config.json: make sure the chat template is inside it (engines read it from there)
    tc_path = os.path.join(out, "tokenizer_config.json")
    with open(tc_path, encoding="utf-8") as f:
        tc = json.load(f)
    if tok.chat_template:
        tc["chat_template"] = tok.chat_template
    for k in ("is_local", "local_files_only"):  # loader bookkeeping, not tokenizer settings
        tc.pop(k, None)
    with open(tc_path, "w", encoding="utf-8") as f:
        json.dump(tc, f, indent=2, ensure_ascii=False)
        f.write("\n")
    add_legacy_config_keys(os.path.join(out, "config.json"), args.dtype)
    for name in sorted(os.listdir(out)):
        print(f"  {name:28s} {os.path.getsize(os.path.join(out, name)):>12,d} bytes")
    print(f"wrote {out} ({args.dtype}; chat_template: {'yes' if tok.chat_template else 'none in GGUF'})")

    if not args.verify:
        return

    # ---- verify
    ok = True
    tok2 = AutoTokenizer.from_pretrained(out)
    text2, ids2 = chat_ids(tok2)
    samples = ["Hello, world!", "In 2024, 12345 people paid $3.50 each; x=100+23*7", "  leading spaces\tand\ttabs\n\nnew lines", "naïve café 日本語 🙂",
               "def f(x):\n    return x**2 + 1  # comment"]
    same_tok = (text2 == text and ids2 == ids
                and all(tok(s).input_ids == tok2(s).input_ids for s in samples))
    print(f"tokenizer round trip identical: {same_tok}  ({len(ids)} prompt ids)")
    ok &= same_tok

    rounded = model.float()  # the in-memory model, weights rounded to dtype, computed in float32
    rounded_logits = last_logits(rounded, ids)
    del rounded, model
    re32 = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager").eval()
    re_logits = last_logits(re32, ids)
    d_round = float((re_logits - rounded_logits).abs().max())
    d_ref = float((re_logits - ref_logits).abs().max())
    same_top = int(re_logits.argmax()) == int(ref_logits.argmax())
    print(f"reloaded (as f32) vs in-memory weights rounded to {args.dtype}: max|diff| = {d_round:.3g}")
    print(f"reloaded vs float32 GGUF model: max|diff| = {d_ref:.4g} (tolerance {TOLERANCE[args.dtype]}), "
          f"logit range {float(ref_logits.min()):.2f}..{float(ref_logits.max()):.2f}, same argmax: {same_top}")
    print(f"  top5 GGUF f32 : {torch.topk(ref_logits, 5).indices.tolist()}")
    print(f"  top5 reloaded : {torch.topk(re_logits, 5).indices.tolist()}")
    ok &= d_round < 1e-3 and d_ref < TOLERANCE[args.dtype] and same_top
    if args.dtype != "f32":
        re_native = AutoModelForCausalLM.from_pretrained(out, dtype=dtype, attn_implementation="eager").eval()
        nat = last_logits(re_native, ids)
        d_nat = float((nat - ref_logits).abs().max())
        print(f"reloaded, computed in {args.dtype}: max|diff| vs float32 GGUF = {d_nat:.4g}, "
              f"same argmax: {int(nat.argmax()) == int(ref_logits.argmax())}")
    print("VERIFY OK" if ok else "VERIFY FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
