#!/usr/bin/env python3
"""Writes tests/fixtures/tokenizer/{model}.json: token ids for a set of strings and a chat-template
rendering, computed by an implementation independent of ours (Hugging Face transformers/tokenizers,
cross-checked against sentencepiece for Gemma).

    WGPU_LLM_MODELS=/work/models/cache /work/refenv/bin/python tools/make_tokenizer_fixtures.py

Needs transformers (>= 5), tokenizers, gguf, sentencepiece, protobuf. Models whose GGUF is missing
are skipped.

The tokenizer is built by transformers from the GGUF metadata (`AutoTokenizer.from_pretrained(dir,
gguf_file=...)`), then corrected where that conversion departs from the model's official
tokenizer.json (the script prints every string on which the correction changes the ids):

- SmolLM2 (`pre = "smollm"`): transformers knows no split for "smollm" and keeps GPT-2's
  ByteLevel regex, which groups digits ("12345" -> one pre-token). The official tokenizer.json
  pre-tokenizes with Sequence[Digits(individual_digits=true), ByteLevel(add_prefix_space=false)].
- Qwen2.5 (`pre = "qwen2"`): transformers builds a GPT2Tokenizer plus the Qwen2 split regex but
  without Qwen2's NFC normalizer (official tokenizer.json has "normalizer": {"type": "NFC"}).
- Gemma 3 (`model = "llama"`, no merges): transformers rebuilds the merges from token positions
  and keeps runs of spaces as BPE tokens. Gemma's tokenizer is a sentencepiece BPE model; we
  rebuild that model (a ModelProto from the GGUF pieces, scores and types) and check that
  sentencepiece gives the same ids as transformers on every string.
"""

import json
import os
import sys

MODELS = {
    "smollm2": "smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    "qwen05": "qwen05/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "gemma3": "gemma3/gemma-3-270m-q4_k_m.gguf",
}

COMMON = [
    "",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    'def add(a, b):\n    """Adds."""\n    return a + b\n\n\nif __name__ == "__main__":\n\tprint(add(1, 2))\n',
    "12345 and 3.14159 and 1,000,000 and 2024-06-30",
    "  two leading spaces, trailing spaces   ",
    " a  b   c    d     e",
    "line one\nline two\n\n\nline five\r\nend",
    "Unicode: café, naïve, Straße, Ελληνικά, русский, עברית",
    "CJK: 你好，世界！日本語のテキストです。한국어 텍스트",
    "Emoji: 😀👍🏽 🇫🇷 👨\u200d👩\u200d👧 ✨",
    "Decomposed: cafe\u0301 and A\u030a",
    "I'm sure you've seen it; they'll say DON'T and WE'RE.",
    "<table><tr><td>x</td></tr></table> <b>bold</b>",
    "math ∑∫√≠≤ 𝔸𝔹ℂ and tabs\t\tend",
]

SPECIAL = {
    "smollm2": ["<|im_start|>user\nhi<|im_end|>\n", "<|endoftext|>a<|im_start|><|im_end|>"],
    "qwen05": ["<|im_start|>user\nhi<|im_end|>\n", "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>"],
    "gemma3": ["<start_of_turn>user\nhi<end_of_turn>\n", "<bos>text<eos> <start_of_image>"],
}

CHATS = [
    {
        "messages": [
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "2 + 2 = 4."},
        ],
        "add_generation_prompt": True,
    },
    {
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "  Say hi.  "},
        ],
        "add_generation_prompt": True,
    },
]


def official_fix(name, tok):
    """Adjusts the transformers-from-GGUF tokenizer to the official tokenizer.json behaviour."""
    from tokenizers import normalizers, pre_tokenizers

    backend = tok.backend_tokenizer
    if name == "smollm2":
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    elif name == "qwen05":
        backend.normalizer = normalizers.NFC()


def sentencepiece_from_gguf(path):
    """A sentencepiece BPE processor rebuilt from a `llama`-model GGUF's pieces."""
    import sentencepiece as spm
    import sentencepiece.sentencepiece_model_pb2 as pb
    from gguf import GGUFReader

    r = GGUFReader(path)

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
    for t, s, ty in zip(tokens, scores, types):
        p = m.pieces.add()
        # llama.cpp stores user-defined whitespace runs with real spaces; sentencepiece spells them "▁".
        p.piece = t.replace(" ", "\u2581") if ty == 4 else t
        p.score = s
        p.type = ty
    return spm.SentencePieceProcessor(model_proto=m.SerializeToString()), tokens, types


def spm_encode(sp, tokens, types, text):
    """sentencepiece does not parse control tokens in text; split them out first like llama.cpp."""
    control = sorted({t for t, ty in zip(tokens, types) if ty == 3 and t}, key=len, reverse=True)
    ids, i, start = [], 0, 0
    while i < len(text):
        hit = next((c for c in control if text.startswith(c, i)), None)
        if hit:
            if start < i:
                ids += sp.encode(text[start:i])
            ids.append(tokens.index(hit))
            i += len(hit)
            start = i
        else:
            i += 1
    if start < len(text):
        ids += sp.encode(text[start:])
    return ids


def main():
    from transformers import AutoTokenizer

    root = os.environ.get("WGPU_LLM_MODELS", os.path.expanduser("~/.cache/wgpu-llm/models"))
    out_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "tokenizer")
    os.makedirs(out_dir, exist_ok=True)
    only = sys.argv[1:]
    for name, rel in MODELS.items():
        if only and name not in only:
            continue
        path = os.path.join(root, rel)
        if not os.path.exists(path):
            print(f"skipped {name}: {path} not found")
            continue
        d, f = os.path.split(path)
        tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
        texts = COMMON + SPECIAL[name]
        as_converted = [tok.encode(t, add_special_tokens=False) for t in texts]
        official_fix(name, tok)
        cases, notes = [], []
        for t, before in zip(texts, as_converted):
            ids = tok.encode(t, add_special_tokens=False)
            if ids != before:
                notes.append(f"transformers' GGUF conversion differs from official on {t!r}: {before} vs {ids}")
            cases.append({"text": t, "ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False)})
        if name == "gemma3":
            sp, tokens, types = sentencepiece_from_gguf(path)
            for c in cases:
                want = spm_encode(sp, tokens, types, c["text"])
                if want != c["ids"]:
                    notes.append(f"sentencepiece differs on {c['text']!r}: spm {want} vs transformers {c['ids']}")
        chats = []
        if tok.chat_template:
            for chat in CHATS:
                rendered = tok.apply_chat_template(
                    chat["messages"], tokenize=False, add_generation_prompt=chat["add_generation_prompt"]
                )
                chats.append(dict(chat, rendered=rendered))
        fixture = {
            "model": name,
            "gguf": rel,
            "reference": "transformers AutoTokenizer(gguf_file) + official tokenizer.json fixes; see tools/make_tokenizer_fixtures.py",
            "bos_token": tok.bos_token,
            "eos_token": tok.eos_token,
            "add_bos_token": bool(getattr(tok, "add_bos_token", False)),
            "bos_token_id": tok.bos_token_id,
            "has_chat_template": bool(tok.chat_template),
            "cases": cases,
            "chats": chats,
        }
        with open(os.path.join(out_dir, f"{name}.json"), "w", encoding="utf-8") as fh:
            json.dump(fixture, fh, ensure_ascii=False, indent=1)
            fh.write("\n")
        print(f"{name}: {len(cases)} cases, {len(chats)} chats")
        for n in notes:
            print(f"  note: {n}")


if __name__ == "__main__":
    main()
