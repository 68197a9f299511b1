#!/usr/bin/env bash
# A long decode with host RSS and GPU memory sampled once a second (issue: memory stays flat after
# warm-up). Run on the GPU machine inside a device call (after `. .bin/gpu-env.sh`):
#   bash tools/gpu_memory.sh [SYNTH] [TOKENS]        (default qwen2.5-0.5b:q4_k_m, 10000)
# Writes $OUT/memory.csv (seconds, rss_kb, gpu_mib) and $OUT/memory.json (the bench's own result).
set -u
out=${OUT:-/tmp/gpu-memory}; mkdir -p "$out"
synth=${1:-qwen2.5-0.5b:q4_k_m}
tokens=${2:-10000}
B=${B:-.bin/wgpu-llm}
$B bench --synthetic "$synth" --prompt-tokens 16 --gen-tokens "$tokens" --reps 1 --temperature 0.8 --seed 1 --json \
  > "$out/memory.json" 2> "$out/memory.err" &
pid=$!
echo "seconds,rss_kb,gpu_mib" > "$out/memory.csv"
t0=$(date +%s.%N)
while kill -0 "$pid" 2>/dev/null; do
  rss=$(awk '/VmRSS/ {print $2}' "/proc/$pid/status" 2>/dev/null)
  # The device's memory in use (the bench is the only process on it).
  gpu=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -1)
  now=$(date +%s.%N)
  [ -n "$rss" ] && echo "$(awk "BEGIN {printf \"%.1f\", $now - $t0}"),$rss,${gpu:-}" >> "$out/memory.csv"
  sleep 1
done
wait "$pid"; echo "bench exit $?" >> "$out/memory.err"
