#!/usr/bin/env python3
"""llama.cpp (Vulkan, b11669 via the cyllama-vulkan wheel) measured like llama-bench: pp512 and tg128 per model,
plus tg128 with llama.cpp's own top-p 0.9 sampling chain. Usage: llama_anchor.py LIBDIR MODEL.gguf [...]
(wgpu-llm's copy of ../shared/gpu/anchor/llama_anchor.py, which adds "logits_finite": whether llama.cpp's logits after
the prompt and after the last greedy decode step are all finite, so a figure on a corrupt file is recognisable.)
Env: FA=0|1 (flash attention), REPS (default 5). Prints one JSON line per model."""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
from cyllama.llama import llama_cpp as cy

def now():
    return time.perf_counter()

def run(path, fa, reps, pp=512, tg=128):
    mp = cy.LlamaModelParams(); mp.n_gpu_layers = 99
    model = cy.LlamaModel(path, mp)
    vocab = model.get_vocab()
    cp = cy.LlamaContextParams()
    cp.n_ctx = pp + tg + 64; cp.n_batch = pp; cp.n_ubatch = pp; cp.no_perf = False
    try:
        cp.flash_attn_type = fa
    except Exception as e:
        print("flash_attn_type not set:", e, file=sys.stderr)
    ctx = cy.LlamaContext(model, cp)
    nv = vocab.n_vocab
    toks = [(i * 7919 + 13) % nv for i in range(pp)]
    def sampler(kind):
        sp = cy.LlamaSamplerChainParams(); s = cy.LlamaSampler(sp)
        if kind == "greedy":
            s.add_greedy()
        elif kind == "topp":
            s.add_top_p(0.9, 1); s.add_temp(0.8); s.add_dist(1234)
        else:  # llama.cpp's default chain
            s.add_top_k(40); s.add_top_p(0.95, 1); s.add_min_p(0.05, 1); s.add_temp(0.8); s.add_dist(1234)
        return s
    def clear():
        try: ctx.memory_clear()
        except Exception: ctx.kv_cache_clear()
    def prefill():
        clear(); t = now(); ctx.decode(cy.llama_batch_get_one(toks, 0)); ctx.synchronize(); return now() - t
    def decode(kind):
        clear(); s = sampler(kind)
        ctx.decode(cy.llama_batch_get_one(toks[:1], 0)); ctx.synchronize()
        tok = s.sample(ctx, -1); t = now()
        for i in range(tg):
            ctx.decode(cy.llama_batch_get_one([tok], 1 + i)); tok = s.sample(ctx, -1)
        return now() - t
    import math
    def finite():
        try:
            return all(math.isfinite(x) for x in ctx.get_logits_ith(-1))
        except Exception as e:
            print("logits not readable:", e, file=sys.stderr); return None
    prefill(); finite_prompt = finite()
    decode("greedy"); finite_decode = finite()
    for _ in range(2): prefill(); decode("greedy")  # warm clocks and pipelines
    pps = sorted(pp / prefill() for _ in range(reps))
    tgg = sorted(tg / decode("greedy") for _ in range(reps))
    tgp = sorted(tg / decode("topp") for _ in range(reps))
    tgd = sorted(tg / decode("default") for _ in range(reps))
    med = lambda v: v[len(v) // 2]
    return {"model": os.path.basename(path), "fa": fa, "pp512": round(med(pps), 1), "tg128_greedy": round(med(tgg), 1),
            "tg128_topp": round(med(tgp), 1), "tg128_default_chain": round(med(tgd), 1),
            "logits_finite": finite_prompt and finite_decode, "pp_all": [round(x) for x in pps], "tg_all": [round(x, 1) for x in tgg]}

cy.disable_logging(); cy.ggml_backend_load_all()
fa = int(os.environ.get("FA", "1")); reps = int(os.environ.get("REPS", "5"))
for p in sys.argv[2:]:
    try:
        print(json.dumps(run(p, fa, reps)), flush=True)
    except Exception as e:
        print(json.dumps({"model": os.path.basename(p), "error": repr(e)}), flush=True)
