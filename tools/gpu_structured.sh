#!/usr/bin/env bash
# Run on the GPU machine from the project root (carry .gl and .bin: ../shared/gpu/prepare-carry.sh, the
# structured bench binary as .bin/structured.xz, examples/qwen35moe_gguf as .bin/qwen35moe_gguf.xz, cuda.sh from
# ../shared/gpu/anchor/prepare-cuda.sh). MODELS="qwen15 q35" picks the shapes (q35 is written on the machine).
# structured output's cost (issue 28). llama.cpp CUDA (built in the call, with llama-completion)
# greedy decode with the same JSON schema (-jf) and without; ours: benches/structured.rs (device and host sampler,
# constrained and free). Shapes: Qwen2.5-1.5B Q4_K_M recipe; Qwen3.5-35B-A3B Q4_K_M synthetic with Qwen2.5's tokenizer.
set -u
. .bin/gpu-env.sh
out=${OUT:-/tmp/s21}; mkdir -p "$out"
xz -dc .bin/structured.xz > /tmp/structured; chmod +x /tmp/structured
xz -dc .bin/qwen35moe_gguf.xz > /tmp/q35w; chmod +x /tmp/q35w
[ -f /tmp/qwen15.gguf ] || python3 .bin/unpack.py .bin/recipes/qwen15 /tmp/qwen15.gguf > /dev/null
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > "$out/gpu.txt" 2>&1
( [ -f /tmp/q35.gguf ] || /tmp/q35w q4_k_m /tmp/q35.gguf --tokenizer-from /tmp/qwen15.gguf ) > "$out/q35w.txt" 2>&1 &
wpid=$!
( time bash .bin/cuda.sh build && cmake --build /tmp/lc/build --target llama-completion -j "$(nproc)" ) > "$out/cuda-build.txt" 2>&1
wait $wpid
cp benches/structured_schema.json /tmp/schema.json   # the schema benches/structured.rs holds the output to
P="Invent a software engineer and describe them as JSON with their name, city, age, skills, level and address. Make every field long and detailed."
for m in ${MODELS:-qwen15}; do
  timeout 200 /tmp/structured /tmp/$m.gguf --tokens 128 --reps ${REPS:-3} --json > "$out/$m-ours.json" 2> "$out/$m-ours.err"
  for r in 1 2 3; do
    timeout 100 /tmp/lc/build/bin/llama-completion -m /tmp/$m.gguf -p "$P" -n 128 -no-cnv --temp 0 -ngl 99 -fa on -jf /tmp/schema.json > "$out/$m-lc-json-$r.txt" 2>&1
    timeout 100 /tmp/lc/build/bin/llama-completion -m /tmp/$m.gguf -p "$P" -n 128 -no-cnv --temp 0 -ngl 99 -fa on --ignore-eos > "$out/$m-lc-free-$r.txt" 2>&1
  done
done
grep -h "eval time" "$out"/*-lc-*.txt | head -40
cat "$out"/*-ours.json
