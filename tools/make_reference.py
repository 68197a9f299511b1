#!/usr/bin/env python3
"""Reference outputs from an independent implementation (Hugging Face transformers, CPU, float32).

Loads a GGUF checkpoint with transformers (which dequantizes with gguf-py and undoes llama.cpp's
Q/K row permutation itself), builds the tokenizer from the same GGUF, runs the prompt in float32 with
eager attention, and writes

  OUT_PREFIX.json        model, GGUF sha256, prompt text/ids, top-5 of the last prompt position,
                         N greedy tokens (argmax, no sampling, no repetition penalty, EOS does not
                         stop), the top-5 at every greedy step, versions, the exact command
  OUT_PREFIX.logits.f32  logits of the last prompt position: `vocab_size` little-endian float32

Usage (run with the reference venv, e.g. /work/refenv/bin/python):

  tools/make_reference.py MODEL.gguf OUT_PREFIX --prompt "What is 2+3? Answer briefly." --chat
  tools/make_reference.py MODEL.gguf OUT_PREFIX --prompt "The capital of France is"
  tools/make_reference.py MODEL.gguf OUT_PREFIX --prompt-file long.txt [--check-full-attention]
  tools/make_reference.py MODEL.gguf OUT_PREFIX --prompt-ids 1 2 3

Prompt tokenization: --chat applies the GGUF's chat template to a single user message with
add_generation_prompt=True, then encodes the templated text without adding special tokens (the
template carries them). A plain prompt is encoded the way the tokenizer does by default (Gemma
prepends <bos>; SmolLM2 and Qwen add nothing). --prompt-file reads UTF-8 text and strips trailing
newlines.

Greedy decoding is done by hand: every step re-runs the whole sequence (no KV cache, so the
reference does not depend on transformers' cache code) and takes the argmax of the last position.
Ties are broken by the lowest token id (torch.argmax).

--check-full-attention (sliding-window models) also runs the prompt with every layer switched to
full attention and prints/records both top-5s and the max |logit difference|; it fails if the two
runs give identical logits, i.e. if the prompt does not exercise the sliding window.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import sys

import numpy as np
import torch
import transformers
from gguf import GGUFReader
from transformers import AutoModelForCausalLM, AutoTokenizer


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def gguf_metadata(path: str) -> tuple[dict, set[str]]:
    """Scalar metadata of the GGUF (arrays left out) and the set of tensor names."""
    r = GGUFReader(path)
    meta = {}
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or len(f.data) != 1:
            continue
        try:
            meta[k] = f.contents()
        except Exception:  # noqa: BLE001 - metadata we cannot parse is not needed
            pass
    return meta, {t.name for t in r.tensors}


def fix_tokenizer(tok, meta: dict) -> list[str]:
    """transformers builds the tokenizer from GGUF metadata but knows only some of llama.cpp's
    pre-tokenizer names. SmolLM2 ("smollm") splits every digit on its own before the GPT-2 byte-level
    regex (its tokenizer.json: Digits(individual_digits) + ByteLevel; llama.cpp: "\\p{N}" then the
    GPT-2 regex), while transformers falls back to plain GPT-2 byte-level. Set the real one."""
    pre = meta.get("tokenizer.ggml.pre")
    if pre == "smollm":
        from tokenizers import pre_tokenizers
        tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ])
        print("tokenizer: pre-tokenizer 'smollm' -> Digits(individual) + ByteLevel (transformers' GGUF "
              "tokenizer falls back to GPT-2 ByteLevel without the digit split)")
        return ["tokenizer.ggml.pre 'smollm': pre-tokenizer set to Digits(individual_digits) + ByteLevel "
                "as in SmolLM2's tokenizer.json (transformers' GGUF tokenizer lacks the digit split)"]
    if pre == "qwen2":
        from tokenizers import normalizers
        tok.backend_tokenizer.normalizer = normalizers.NFC()
        print("tokenizer: pre 'qwen2' -> NFC normalizer added (as in Qwen2's tokenizer.json)")
        return ["tokenizer.ggml.pre 'qwen2': NFC normalizer added as in Qwen2's tokenizer.json "
                "(transformers' GGUF tokenizer has none; no effect on ASCII prompts)"]
    return []


def sentencepiece_ids(gguf_path: str, text: str) -> list[int] | None:
    """Cross-check for sentencepiece-vocabulary GGUFs (Gemma): rebuild a sentencepiece BPE model from
    the GGUF pieces/scores/types and encode `text` (no BOS; control tokens split out first). Returns
    None if sentencepiece is not installed."""
    try:
        import sentencepiece as spm
        import sentencepiece.sentencepiece_model_pb2 as pb
    except ImportError:
        return None
    r = GGUFReader(gguf_path)

    def arr(key):
        f = r.fields[key]
        return [f.parts[i] for i in f.data]

    tokens = [bytes(x).decode("utf-8") for x in arr("tokenizer.ggml.tokens")]
    scores = [float(x[0]) for x in arr("tokenizer.ggml.scores")]
    types = [int(x[0]) for x in arr("tokenizer.ggml.token_type")]
    m = pb.ModelProto()
    m.trainer_spec.model_type = pb.TrainerSpec.BPE
    m.trainer_spec.byte_fallback = True
    m.trainer_spec.unk_id = types.index(2) if 2 in types else 3
    m.normalizer_spec.name = "identity"
    m.normalizer_spec.add_dummy_prefix = False
    m.normalizer_spec.remove_extra_whitespaces = False
    m.normalizer_spec.escape_whitespaces = True
    for t, sc, ty in zip(tokens, scores, types):
        piece = m.pieces.add()
        piece.piece = t.replace(" ", "\u2581") if ty == 4 else t  # llama.cpp spells space runs with " "
        piece.score = sc
        piece.type = ty
    sp = spm.SentencePieceProcessor(model_proto=m.SerializeToString())
    control = sorted({t for t, ty in zip(tokens, types) if ty == 3 and t}, key=len, reverse=True)
    index = {t: i for i, t in enumerate(tokens)}
    ids, i, start = [], 0, 0
    while i < len(text):
        hit = next((c for c in control if text.startswith(c, i)), None)
        if hit:
            if start < i:
                ids += sp.encode(text[start:i])
            ids.append(index[hit])
            i += len(hit)
            start = i
        else:
            i += 1
    if start < len(text):
        ids += sp.encode(text[start:])
    return ids


def rope_theta_of(config, layer_type: str | None = None):
    """rope theta from a transformers 5 config (rope_parameters) or an older one (rope_theta)."""
    rp = getattr(config, "rope_parameters", None)
    if isinstance(rp, dict):
        if layer_type is not None and isinstance(rp.get(layer_type), dict):
            return rp[layer_type].get("rope_theta")
        if "rope_theta" in rp:
            return rp["rope_theta"]
    if layer_type == "sliding_attention" and hasattr(config, "rope_local_base_freq"):
        return config.rope_local_base_freq
    return getattr(config, "rope_theta", None)


def check_config(config, meta: dict, tensor_names: set[str]) -> list[str]:
    """Compare the transformers config with the GGUF metadata. Returns a list of notes; raises on a
    mismatch that cannot be explained."""
    arch = meta["general.architecture"]
    notes = []

    def want(key, attr, value, tol=0.0):
        got = getattr(config, attr, None)
        ok = got == value if tol == 0.0 else (got is not None and abs(got - value) <= tol * abs(value))
        print(f"  {attr:28s} = {got!r:24}  (GGUF {key} = {value!r})  {'ok' if ok else 'MISMATCH'}")
        if not ok:
            raise SystemExit(f"config mismatch: {attr}={got!r}, GGUF {key}={value!r}")

    print(f"config check ({config.model_type}, GGUF arch {arch}):")
    pairs = [
        ("block_count", "num_hidden_layers"),
        ("embedding_length", "hidden_size"),
        ("feed_forward_length", "intermediate_size"),
        ("attention.head_count", "num_attention_heads"),
        ("attention.head_count_kv", "num_key_value_heads"),
        ("context_length", "max_position_embeddings"),
    ]
    for k, attr in pairs:
        if f"{arch}.{k}" in meta:
            want(f"{arch}.{k}", attr, int(meta[f"{arch}.{k}"]))
    if f"{arch}.attention.layer_norm_rms_epsilon" in meta:
        want(f"{arch}.attention.layer_norm_rms_epsilon", "rms_norm_eps",
             float(meta[f"{arch}.attention.layer_norm_rms_epsilon"]), tol=1e-6)
    if f"{arch}.attention.key_length" in meta:
        want(f"{arch}.attention.key_length", "head_dim", int(meta[f"{arch}.attention.key_length"]))
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if f"{arch}.rope.dimension_count" in meta:
        rd = int(meta[f"{arch}.rope.dimension_count"])
        print(f"  {'rope dims':28s} = {head_dim!r:24}  (GGUF rope.dimension_count = {rd})")
        if rd != head_dim:
            raise SystemExit("partial rotary not expected for these models")

    full_theta = rope_theta_of(config, "full_attention")
    gguf_theta = float(meta.get(f"{arch}.rope.freq_base", 10000.0))
    print(f"  {'rope_theta (full attention)':28s} = {full_theta!r:24}  (GGUF rope.freq_base = {gguf_theta})")
    if full_theta != gguf_theta:
        raise SystemExit("rope theta mismatch")

    tied = "output.weight" not in tensor_names
    print(f"  {'tie_word_embeddings':28s} = {config.tie_word_embeddings!r:24}  (GGUF has output.weight: {not tied})")
    if bool(config.tie_word_embeddings) != tied:
        raise SystemExit("tie_word_embeddings mismatch")
    n_vocab = meta.get(f"{arch}.vocab_size")
    print(f"  {'vocab_size':28s} = {config.vocab_size!r:24}  (GGUF {arch}.vocab_size = {n_vocab})")

    if config.model_type == "gemma3_text":
        # The GGUF has no key for the local/global layer pattern, the local rope base, the query
        # scale or soft-capping: llama.cpp hard-codes them for gemma3 (pattern 6, local base 10000,
        # scale 1/sqrt(head_dim), no final soft-capping). Check transformers' defaults agree.
        print("  gemma3:")
        lt = list(config.layer_types)
        expect_lt = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                     for i in range(config.num_hidden_layers)]
        local_theta = rope_theta_of(config, "sliding_attention")
        fields = {
            "sliding_window": (config.sliding_window, int(meta[f"{arch}.attention.sliding_window"])),
            "layer_types (full at i%6==5)": ("".join("F" if t == "full_attention" else "s" for t in lt),
                                             "".join("F" if t == "full_attention" else "s" for t in expect_lt)),
            "rope_theta (full attention)": (full_theta, 1e6),
            "rope_local_base_freq": (local_theta, 10000.0),
            "query_pre_attn_scalar": (config.query_pre_attn_scalar, 256),
            "final_logit_softcapping": (config.final_logit_softcapping, None),
            "attn_logit_softcapping": (config.attn_logit_softcapping, None),
            "hidden_activation": (config.hidden_activation, "gelu_pytorch_tanh"),
            "rope scaling type (full)": (
                (config.rope_parameters or {}).get("full_attention", {}).get("rope_type", "default"), "default"),
        }
        for name, (got, exp) in fields.items():
            print(f"    {name:30s} = {got!r}  (expected {exp!r})  {'ok' if got == exp else 'MISMATCH'}")
            if got != exp:
                raise SystemExit(f"gemma3 config mismatch: {name}")
        notes.append("gemma3 config from transformers' GGUF mapping checked: sliding_window 512, "
                     "layer_types full every 6th layer, rope 1e6 global / 1e4 local, "
                     "query_pre_attn_scalar 256, no soft-capping; no fix-ups needed")
    return notes


def topk(logits: torch.Tensor, k: int = 5):
    v, i = torch.topk(logits, k)
    return [int(x) for x in i], [float(x) for x in v]


@torch.inference_mode()
def last_logits(model, ids: list[int]) -> torch.Tensor:
    x = torch.tensor([ids], dtype=torch.long)
    out = model(input_ids=x, attention_mask=torch.ones_like(x), use_cache=False, logits_to_keep=1)
    return out.logits[0, -1].float()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gguf")
    ap.add_argument("out_prefix")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--prompt-ids", type=int, nargs="+")
    g.add_argument("--prompt")
    g.add_argument("--prompt-file")
    ap.add_argument("--chat", action="store_true", help="wrap the prompt as one user message in the chat template")
    ap.add_argument("--n-new", type=int, default=16, help="greedy tokens to generate (default 16)")
    ap.add_argument("--model-name", help="name recorded in the JSON (default: GGUF file name)")
    ap.add_argument("--check-full-attention", action="store_true",
                    help="also run with full attention in every layer; fail if logits are unchanged")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    args = ap.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    gguf = os.path.abspath(args.gguf)
    gdir, gname = os.path.split(gguf)
    meta, tensor_names = gguf_metadata(gguf)
    sha = sha256_file(gguf)
    print(f"GGUF {gguf}\n  sha256 {sha}")

    tok = AutoTokenizer.from_pretrained(gdir, gguf_file=gname)
    notes_tok = fix_tokenizer(tok, meta)
    model = AutoModelForCausalLM.from_pretrained(gdir, gguf_file=gname, dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()
    notes = notes_tok + check_config(model.config, meta, tensor_names)
    if model.config.tie_word_embeddings:
        same = torch.equal(model.get_input_embeddings().weight, model.get_output_embeddings().weight)
        print(f"  lm_head tied to token embedding: {same}")
        if not same:
            raise SystemExit("lm_head is not the token embedding although the GGUF has no output.weight")

    # ---- prompt
    prompt_text = None
    templated = None
    if args.prompt_ids:
        ids = list(args.prompt_ids)
        if args.chat:
            raise SystemExit("--chat needs --prompt/--prompt-file")
    else:
        if args.prompt_file:
            with open(args.prompt_file, encoding="utf-8") as f:
                prompt_text = f.read().rstrip("\n")
        else:
            prompt_text = args.prompt
        if args.chat:
            if not tok.chat_template:
                raise SystemExit("the GGUF has no chat template")
            templated = tok.apply_chat_template([{"role": "user", "content": prompt_text}],
                                                add_generation_prompt=True, tokenize=False)
            ids = tok(templated, add_special_tokens=False).input_ids
        else:
            ids = tok(prompt_text).input_ids
        if meta.get("tokenizer.ggml.model") == "llama":
            # a plain prompt gets BOS from the tokenizer; a templated one carries it as text
            body = ids[1:] if templated is None and ids[:1] == [tok.bos_token_id] else ids
            spm_ids = sentencepiece_ids(gguf, templated if templated is not None else prompt_text)
            if spm_ids is None:
                print("tokenizer: sentencepiece not installed, cross-check skipped")
            elif spm_ids != body:
                raise SystemExit("transformers and sentencepiece tokenize the prompt differently")
            else:
                print("tokenizer: sentencepiece rebuilt from the GGUF gives the same prompt ids")
                notes.append("prompt ids cross-checked with sentencepiece (BPE model rebuilt from the GGUF)")
    print(f"prompt: {len(ids)} tokens; first ids {ids[:12]}{' ...' if len(ids) > 12 else ''}")
    if templated is not None:
        print("templated prompt:\n" + templated)

    # ---- last prompt position + greedy steps
    logits = last_logits(model, ids)
    vocab = logits.shape[0]
    top5_ids, top5_vals = topk(logits)
    print(f"last-position top5: {top5_ids} {[round(v, 4) for v in top5_vals]}  "
          f"{[tok.decode([i]) for i in top5_ids]}")

    seq = list(ids)
    greedy, step_top5, step_top5_vals = [], [], []
    step_logits = logits
    for step in range(args.n_new):
        if step > 0:
            step_logits = last_logits(model, seq)
        t_ids, t_vals = topk(step_logits)
        nxt = int(torch.argmax(step_logits))
        assert nxt == t_ids[0]
        step_top5.append(t_ids)
        step_top5_vals.append([round(v, 5) for v in t_vals])
        greedy.append(nxt)
        seq.append(nxt)
    greedy_text = tok.decode(greedy)
    print(f"greedy ids: {greedy}\ngreedy text: {greedy_text!r}")

    record = {
        "model": args.model_name or gname,
        "gguf_file": gname,
        "gguf_sha256": sha,
        "architecture": meta["general.architecture"],
        "hf_model_type": model.config.model_type,
        "vocab_size": vocab,
        "prompt_text": prompt_text,
        "chat_template_applied": bool(args.chat),
        "templated_prompt": templated,
        "prompt_ids": ids,
        "n_prompt": len(ids),
        "top5": top5_ids,
        "top5_logits": [round(v, 5) for v in top5_vals],
        "greedy_tokens": greedy,
        "greedy_text": greedy_text,
        "step_logits_top5": step_top5,
        "step_logits_top5_values": step_top5_vals,
        "logits_file": os.path.basename(args.out_prefix) + ".logits.f32",
        "logits_format": "last prompt position, vocab_size little-endian float32",
        "decoding": "greedy argmax (lowest id on ties), no sampling, no repetition penalty, EOS does not stop; "
                    "step_logits_top5[0] is the last prompt position, step i>0 is after feeding greedy_tokens[:i]; "
                    "no KV cache (full recompute each step)",
        "precision": "float32 weights (dequantized from GGUF by gguf-py) and activations, eager attention, CPU",
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__,
                     "gguf": getattr(sys.modules["gguf"], "__version__", None) or _pkg_version("gguf"),
                     "numpy": np.__version__, "python": sys.version.split()[0]},
        "notes": notes,
        "command": shlex.join([sys.executable] + sys.argv),
    }
    if model.config.model_type == "gemma3_text":
        record["gemma3_config"] = {
            "sliding_window": model.config.sliding_window,
            "layer_types": list(model.config.layer_types),
            "rope_theta_full": rope_theta_of(model.config, "full_attention"),
            "rope_theta_sliding": rope_theta_of(model.config, "sliding_attention"),
            "query_pre_attn_scalar": model.config.query_pre_attn_scalar,
            "final_logit_softcapping": model.config.final_logit_softcapping,
            "sliding_window_semantics": "a query at position i attends keys j with i-512 < j <= i "
                                        "(512 keys including itself), as llama.cpp's LLAMA_SWA_TYPE_STANDARD",
        }

    if args.check_full_attention:
        if getattr(model.config, "sliding_window", None) is None:
            raise SystemExit("--check-full-attention needs a model with layer_types")
        f_logits = run_without_window(model, ids)
        f_ids, f_vals = topk(f_logits)
        diff = float((f_logits - logits).abs().max())
        print(f"full-attention-everywhere top5: {f_ids} {[round(v, 4) for v in f_vals]} "
              f"{[tok.decode([i]) for i in f_ids]}")
        print(f"sliding-window top5:            {top5_ids} {[round(v, 4) for v in top5_vals]}")
        print(f"max |logit diff| sliding vs full: {diff:.5f}")
        record["full_attention_check"] = {
            "what": "same weights and per-layer rope, sliding layers with the window widened past the prompt "
                    "(i.e. full causal attention everywhere)",
            "top5": f_ids, "top5_logits": [round(v, 5) for v in f_vals],
            "max_abs_logit_diff": round(diff, 6),
            "argmax_differs": f_ids[0] != top5_ids[0],
        }
        if diff < 1e-3:
            raise SystemExit("full attention gives the same logits: the prompt does not exercise the window")

    out_dir = os.path.dirname(os.path.abspath(args.out_prefix))
    os.makedirs(out_dir, exist_ok=True)
    logits.numpy().astype("<f4").tofile(args.out_prefix + ".logits.f32")
    with open(args.out_prefix + ".json", "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {args.out_prefix}.json and {args.out_prefix}.logits.f32 ({vocab} x f32)")


def _pkg_version(name: str):
    from importlib.metadata import version
    try:
        return version(name)
    except Exception:  # noqa: BLE001
        return None


def run_without_window(model, ids: list[int]) -> torch.Tensor:
    """Last-position logits with the sliding window widened past the prompt in every sliding layer.
    The layer types are left alone, so each layer keeps its own rope table (local base 10000 for the
    former sliding layers): only the attention mask changes."""
    cfg = model.config
    big = 1 << 30
    saved = cfg.sliding_window
    attns = [m for m in model.modules() if hasattr(m, "sliding_window") and m is not cfg]
    saved_attn = [m.sliding_window for m in attns]
    try:
        cfg.sliding_window = big
        for m in attns:
            if m.sliding_window is not None:
                m.sliding_window = big
        return last_logits(model, ids)
    finally:
        cfg.sliding_window = saved
        for m, w in zip(attns, saved_attn):
            m.sliding_window = w


if __name__ == "__main__":
    main()
