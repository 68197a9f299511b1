#!/usr/bin/env python3
"""Markdown tables from tools/gpu_bench.sh's results: bench_table.py OUTDIR."""
import json
import os
import sys


def records(path):
    """The file holds objects spread over lines; read them one after another."""
    if not os.path.exists(path):
        return []
    text, dec, out, i = open(path).read(), json.JSONDecoder(), [], 0
    while i < len(text):
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            break
        obj, i = dec.raw_decode(text, i)
        out.append(obj)
    return out


d = sys.argv[1]
print("commit:", open(f"{d}/commit.txt").read().strip() if os.path.exists(f"{d}/commit.txt") else "?")
print("gpu:", open(f"{d}/gpu.txt").read().strip().replace("\n", " | ") if os.path.exists(f"{d}/gpu.txt") else "?")
print()
anchor = {r["model"].removesuffix(".gguf"): r for r in records(f"{d}/anchor.jsonl")}
if anchor:
    print("| llama.cpp (FA on) | pp512 | tg128 greedy | tg128 default chain | tg128 top-p 0.9 | logits finite |")
    print("|---|---|---|---|---|---|")
    for m, r in anchor.items():
        print(f"| {m} | {r.get('pp512')} | {r.get('tg128_greedy')} | {r.get('tg128_default_chain')} | {r.get('tg128_topp')} "
              f"| {r.get('logits_finite', r.get('error'))} |")
    print()
rows = records(f"{d}/wgpu.jsonl")
if rows:
    print("| model | sampling | loop | pp512 | tg128 | x llama.cpp | dispatches | submits | waits | encode us | submit us "
          "| wait us | GPU us | weights MB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        res = r["result"]
        if "error" in res:
            print(f"| {r['model']} | {r['chain']} | {r['loop']} | error {res['error']} |")
            continue
        a = anchor.get(r["model"], {})
        ref = a.get("tg128_greedy" if r["chain"] == "greedy" else "tg128_default_chain")
        ratio = f"{res['decode_tok_s'] / ref:.2f}" if ref else "-"
        st, med = res["decode_step"], res["decode_step"]["median"]
        f = lambda k: "-" if med.get(k) is None else f"{med[k]:.0f}"
        print(f"| {r['model']} | {r['chain']} | {r['loop']} | {res['prefill_tok_s']:.0f} | {res['decode_tok_s']:.1f} | {ratio} "
              f"| {st['dispatches']} | {st['submits']} | {st['blocking_waits']} | {f('host_encode_us')} | {f('submit_us')} "
              f"| {f('wait_us')} | {f('gpu_us')} | {res['weights_bytes'] / 1e6:.0f} |")
    print()
for r in records(f"{d}/synth.jsonl"):
    res = r["result"]
    if "error" in res:
        print(f"synthetic {r['synthetic']} {r.get('loop', '')}: error {res['error']}")
    else:
        st = res['decode_step']['median']
        print(f"synthetic {r['synthetic']} {r.get('loop', '')}: pp{res.get('prompt_tokens', '')} {res['prefill_tok_s']:.0f} tok/s, "
              f"tg {res['decode_tok_s']:.1f} tok/s, GPU {st.get('gpu_us')} us/step, {st.get('dispatches')} dispatches, "
              f"weights {res['weights_bytes'] / 1e6:.0f} MB")
# Concurrent streams (bench --streams) beside llama.cpp with as many parallel sequences.
streams = records(f"{d}/streams.jsonl")
if streams:
    anc = {}
    for a in records(f"{d}/anchor_streams.jsonl"):
        if "error" not in a:
            anc[(a["model"].removesuffix(".gguf"), a["streams"], a["chain"])] = a
    print("| model | streams | sampling | sampler | decode tok/s total | per stream | llama.cpp total | x llama.cpp "
          "| TTFT ms median (max) | inter-token ms | llama.cpp TTFT / ITL ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in streams:
        res = r["result"]
        chain = "greedy" if r["chain"] == "greedy" else "default"
        a = anc.get((r["model"], r["streams"], chain), {})
        if "error" in res:
            print(f"| {r['model']} | {r['streams']} | {r['chain']} | {r['sampler']} | error {res['error']} |")
            continue
        ref = a.get("decode_tok_s_total")
        ratio = f"{res['decode_tok_s_total'] / ref:.2f}" if ref else "-"
        print(f"| {r['model']} | {r['streams']} | {r['chain']} | {r['sampler']} | {res['decode_tok_s_total']:.0f} "
              f"| {res['decode_tok_s_per_stream']:.1f} | {ref or '-'} | {ratio} | {res['ttft_ms_median']:.0f} "
              f"({res['ttft_ms_max']:.0f}) | {res['inter_token_ms_median']:.2f} "
              f"| {a.get('ttft_ms', '-')} / {a.get('inter_token_ms', '-')} |")
    for a in records(f"{d}/anchor_streams.jsonl"):
        if "error" in a:
            print(f"llama.cpp streams {a['model']}: error {a['error']}")
