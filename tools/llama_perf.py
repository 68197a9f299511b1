#!/usr/bin/env python3
"""llama.cpp's per-op GPU times for decode (its Vulkan backend's GGML_VK_PERF_LOGGER), to set beside
`wgpu-llm bench --profile`: a 64-token prompt, then N greedy steps; prints the last complete step's ops by total time.

Usage (on the GPU machine, llama.cpp unpacked as in ../shared/gpu/anchor/README.md):
    python3 tools/llama_perf.py /tmp/anchor MODEL.gguf [STEPS]
The logger times each op alone (a timestamp pair around it), as `--profile` does ours: compare op with op, not the sums
with a step's time."""
import os, re, subprocess, sys

if os.environ.get("LLAMA_PERF_CHILD") != "1":
    env = dict(os.environ, GGML_VK_PERF_LOGGER="1", LLAMA_PERF_CHILD="1")
    r = subprocess.run([sys.executable] + sys.argv, env=env, capture_output=True, text=True)
    lines = r.stderr.splitlines()
    blocks, cur = [], []
    for l in lines:
        m = re.match(r"^(?P<name>.+?):\s+(?P<count>\d+)\s+x\s+(?P<us>[\d.eE+-]+)\s*us", l.strip())
        if m:
            cur.append((m["name"], int(m["count"]), float(m["us"])))
        elif cur:
            blocks.append(cur)
            cur = []
    if cur:
        blocks.append(cur)
    if r.returncode != 0 or len(blocks) < 2:
        sys.exit("llama.cpp run failed or logged no step:\n" + "\n".join(lines[-20:]))
    b = blocks[-2]  # the last block may be cut short
    print("step total (ops timed alone) %.0f us" % sum(c * u for _, c, u in b))
    for name, c, u in sorted(b, key=lambda r: -r[1] * r[2]):
        print("  %-72s n=%4d each %8.2f us  total %8.1f us" % (name[:72], c, u, c * u))
    sys.exit(0)

sys.path.insert(0, sys.argv[1])
from cyllama.llama import llama_cpp as cy  # noqa: E402

cy.ggml_backend_load_all()
mp = cy.LlamaModelParams()
mp.n_gpu_layers = 99
model = cy.LlamaModel(sys.argv[2], mp)
nv = model.get_vocab().n_vocab
cp = cy.LlamaContextParams()
cp.n_ctx, cp.n_batch, cp.n_ubatch = 1024, 512, 512
cp.flash_attn_type = 1
ctx = cy.LlamaContext(model, cp)
toks = [(i * 7919 + 13) % nv for i in range(64)]
ctx.decode(cy.llama_batch_get_one(toks, 0))
ctx.synchronize()
s = cy.LlamaSampler(cy.LlamaSamplerChainParams())
s.add_greedy()
tok = s.sample(ctx, -1)
for i in range(int(sys.argv[3]) if len(sys.argv) > 3 else 8):
    ctx.decode(cy.llama_batch_get_one([tok], 64 + i))
    tok = s.sample(ctx, -1)
