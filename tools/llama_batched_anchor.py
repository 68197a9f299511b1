#!/usr/bin/env python3
"""llama.cpp (Vulkan, b11669 via the cyllama-vulkan wheel of ../shared/gpu/anchor) decoding N sequences at once, measured
like `wgpu-llm bench --streams N`: N requests of PROMPT tokens each (distinct prompts) are prefilled together, then
decoded GEN tokens each, one llama_decode of N tokens per step (one sequence id per request), every row sampled by its
own sampler chain (llama.cpp's CPU samplers, seeded per request).

usage: llama_batched_anchor.py LIBDIR MODEL.gguf [...]
env: STREAMS ("1 8 32"), PROMPT (128), GEN (128), REPS (3), FA (1), CHAINS ("greedy default")
Prints one JSON line per model, chain and stream count: decode_tok_s_total (tokens after the last first token over
the time after it, as bench --streams), ttft_ms (prefill of all N prompts and their first tokens), inter_token_ms."""
import json
import os
import sys
import time

sys.path.insert(0, sys.argv[1])
from cyllama.llama import llama_cpp as cy  # noqa: E402


def sampler(kind, seed):
    s = cy.LlamaSampler(cy.LlamaSamplerChainParams())
    if kind == "greedy":
        s.add_greedy()
    else:  # llama-cli's default chain
        s.add_top_k(40)
        s.add_top_p(0.95, 1)
        s.add_min_p(0.05, 1)
        s.add_temp(0.8)
        s.add_dist(seed)
    return s


def run(path, streams, prompt, gen, reps, fa, chains):
    mp = cy.LlamaModelParams()
    mp.n_gpu_layers = 99
    model = cy.LlamaModel(path, mp)
    nv = model.get_vocab().n_vocab
    out = []
    for n in streams:
        cp = cy.LlamaContextParams()
        cp.n_ctx = n * (prompt + gen + 16)
        cp.n_seq_max = n
        cp.n_batch = cp.n_ubatch = min(n * prompt, 2048)
        cp.no_perf = True
        try:
            cp.flash_attn_type = fa
        except Exception as e:  # noqa: BLE001
            print("flash_attn_type not set:", e, file=sys.stderr)
        ctx = cy.LlamaContext(model, cp)
        prompts = [[(i * 7919 + 13 + 104729 * s) % nv for i in range(prompt)] for s in range(n)]
        batch = cy.LlamaBatch(n_tokens=max(cp.n_batch, n), embd=0, n_seq_max=n)

        def clear():
            try:
                ctx.memory_clear()
            except Exception:  # noqa: BLE001
                ctx.kv_cache_clear()

        def once(kind):
            clear()
            samplers = [sampler(kind, 1 + s) for s in range(n)]
            t0 = time.perf_counter()
            # Prefill every prompt (in batches of n_batch tokens), logits at each prompt's last token.
            flat = [(tok, i, s, i == prompt - 1) for s in range(n) for i, tok in enumerate(prompts[s])]
            cur = {}
            for start in range(0, len(flat), cp.n_batch):
                batch.clear()
                last = {}
                for j, (tok, pos, s, lg) in enumerate(flat[start:start + cp.n_batch]):
                    batch.add(tok, pos, [s], lg)
                    if lg:
                        last[s] = j
                ctx.decode(batch)
                cur.update({s: samplers[s].sample(ctx, j) for s, j in last.items()})
            t_first = time.perf_counter()
            for step in range(gen - 1):
                batch.clear()
                for s in range(n):
                    batch.add(cur[s], prompt + step, [s], True)
                ctx.decode(batch)
                cur = {s: samplers[s].sample(ctx, s) for s in range(n)}
            t_end = time.perf_counter()
            return t_first - t0, t_end - t_first

        for kind in chains:
            once(kind)  # warm-up
            runs = sorted((once(kind) for _ in range(reps)), key=lambda r: r[1])
            ttft, dec = runs[len(runs) // 2]
            out.append({
                "model": os.path.basename(path), "streams": n, "chain": kind, "fa": fa,
                "prompt_tokens": prompt, "gen_tokens": gen,
                "decode_tok_s_total": round(n * (gen - 1) / dec, 1),
                "decode_tok_s_per_stream": round((gen - 1) / dec, 1),
                "ttft_ms": round(1e3 * ttft, 1),
                "inter_token_ms": round(1e3 * dec / (gen - 1), 3),
                "decode_tok_s_all": [round(n * (gen - 1) / r[1], 1) for r in runs],
            })
            print(json.dumps(out[-1]), flush=True)
        del ctx
    return out


cy.disable_logging()
cy.ggml_backend_load_all()
env = os.environ.get
streams = [int(x) for x in env("STREAMS", "1 8 32").split()]
chains = env("CHAINS", "greedy default").split()
for p in sys.argv[2:]:
    try:
        run(p, streams, int(env("PROMPT", "128")), int(env("GEN", "128")), int(env("REPS", "3")), int(env("FA", "1")),
            chains)
    except Exception as e:  # noqa: BLE001
        print(json.dumps({"model": os.path.basename(p), "error": repr(e)}), flush=True)
