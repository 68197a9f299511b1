#!/usr/bin/env bash
# Two builds of wgpu-llm on the five shapes of BENCHMARKS in one device call, interleaved (BENCHMARKS session 19,
# runs 72-73: the refactor against 7935e03). Here, first: ../shared/gpu/prepare-carry.sh, then put both binaries
# stripped and xz-packed into .bin/wgpu-llm-old.xz and .bin/wgpu-llm-new.xz, the writers examples/gemma4_gguf and
# examples/qwen35moe_gguf as .bin/*.xz, and ../shared/gpu/shape-recipes as .bin/recipes; carry [".gl", ".bin"].
# BIG=0 skips the two synthetic 31B/35B GGUFs. Results: $OUT/s19.jsonl.
set -u
. .bin/gpu-env.sh
out=${OUT:-/tmp/s19}; mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$out/gpu.txt" 2>&1
for b in old new; do xz -dc .bin/wgpu-llm-$b.xz > /tmp/wgpu-llm-$b; chmod +x /tmp/wgpu-llm-$b; done
xz -dc .bin/gemma4_gguf.xz > /tmp/gemma4_gguf; xz -dc .bin/qwen35moe_gguf.xz > /tmp/qwen35moe_gguf; chmod +x /tmp/gemma4_gguf /tmp/qwen35moe_gguf
for m in smollm2 qwen05 qwen15; do python3 .bin/unpack.py .bin/recipes/$m /tmp/$m.gguf > /dev/null; done
/tmp/wgpu-llm-new devices > "$out/devices.txt" 2>&1
run() { # label binary args...
  local label=$1 bin=$2; shift 2
  echo "{\"run\":\"$label\",\"build\":\"$bin\",\"result\":" >> "$out/s19.jsonl"
  timeout 200 /tmp/wgpu-llm-$bin bench --json --seed 1 --temperature 0 "$@" >> "$out/s19.jsonl" 2>> "$out/err.txt" || echo "{\"error\":$?}" >> "$out/s19.jsonl"
  echo "}" >> "$out/s19.jsonl"
}
for m in smollm2 qwen05 qwen15; do
  for b in old new old new; do run $m $b --model /tmp/$m.gguf --reps 3; done
done
[ "${BIG:-1}" = 1 ] || exit 0
/tmp/gemma4_gguf q4_k_m /tmp/g4.gguf > "$out/g4.txt" 2>&1
for b in old new; do run gemma4 $b --model /tmp/g4.gguf --reps 2 --gen-tokens 64; done
rm -f /tmp/g4.gguf
/tmp/qwen35moe_gguf q4_k_m /tmp/q35.gguf > "$out/q35.txt" 2>&1
for b in old new; do run qwen35 $b --model /tmp/q35.gguf --reps 2 --gen-tokens 64; done
