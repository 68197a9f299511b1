#!/usr/bin/env bash
# The decode/prefill measurements of BENCHMARKS.md, run on the GPU machine in ONE device call, with llama.cpp's Vulkan
# backend measured in the same call (the anchor). Here, first:
#   ../shared/gpu/prepare-carry.sh && ../shared/gpu/anchor/prepare.sh && cp -r ../shared/gpu/shape-recipes .bin/recipes
# then a device run with carry [".gl", ".bin"] and the command `bash tools/gpu_bench.sh`. Results: $OUT/*.jsonl.
# Models: the real-layout GGUFs of the shape recipes, rebuilt with whole blocks (tools/unpack_recipe.py), and
# synthetic-weight models (`bench --synthetic`). MODELS / CONFIGS / REPS narrow a run. RETYPE="qwen15:q8_0 ..." adds
# copies of unpacked models with their weight matrices retyped (examples/gguf_retype, carried as .bin/gguf_retype),
# run by both engines. The commit measured: .bin/commit.txt (written here before carrying).
set -u
. .bin/gpu-env.sh
out=${OUT:-/tmp/gpu-bench}; mkdir -p "$out"
models=${MODELS:-smollm2 qwen05 qwen15}
reps=${REPS:-5}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv > "$out/gpu.txt" 2>&1
cp .bin/commit.txt "$out/commit.txt" 2>/dev/null || git log -1 --format='%H %s' > "$out/commit.txt" 2>/dev/null || true
for m in $models; do python3 tools/unpack_recipe.py ".bin/recipes/$m" "/tmp/$m.gguf" >/dev/null; done
for r in ${RETYPE:-}; do
  base=${r%%:*}; ty=${r#*:}
  .bin/gguf_retype "/tmp/$base.gguf" "/tmp/${base}_$ty.gguf" "$ty" 2>> "$out/wgpu.err" && models="$models ${base}_$ty"
done
mkdir -p /tmp/anchor && tar -xJf .bin/anchor.tar.xz -C /tmp/anchor
# SINGLE=0 skips the one-sequence runs (llama.cpp's and ours), e.g. to measure only STREAMS.
if [ -z "${NO_ANCHOR:-}" ] && [ "${SINGLE:-1}" = 1 ]; then
  FA=1 REPS=$reps timeout 300 python3 tools/llama_anchor.py /tmp/anchor $(for m in $models; do echo /tmp/$m.gguf; done) \
    > "$out/anchor.jsonl" 2> "$out/anchor.err"
fi
B=.bin/wgpu-llm
# name:flags (flags joined by +): the default loop (2 submissions of 4 steps in flight), one step a submission with
# 3 in flight (the loop before session 17), one step at a time, the readback loop, the host sampler.
loops=${LOOPS:-"d2k4:--pipeline=2 d3k1:--pipeline=3+--submit-steps=1 d1:--pipeline=1+--submit-steps=1 readback:--pipeline=0 host:--sampler=host"}
chains=${CHAINS:-"greedy:--temperature=0 chain:--temperature=0.8"}
[ "${SINGLE:-1}" = 1 ] || loops=""
for m in $models; do
  for c in $chains; do
    for l in $loops; do
      echo "{\"model\":\"$m\",\"chain\":\"${c%%:*}\",\"loop\":\"${l%%:*}\",\"result\":" >> "$out/wgpu.jsonl"
      timeout 120 $B bench --model "/tmp/$m.gguf" --json --reps "$reps" --seed 1 ${c#*:} $(echo "${l#*:}" | tr + " ") >> "$out/wgpu.jsonl" 2>> "$out/wgpu.err" \
        || echo "{\"error\":$?}" >> "$out/wgpu.jsonl"
      echo "}" >> "$out/wgpu.jsonl"
    done
  done
done
# Synthetic models: SYNTH="preset:recipe ...", each with the loops of SYNTH_LOOPS (name:flags; default the pipelined
# device sampler, greedy); SYNTH_ARGS adds flags to every run (e.g. --profile 20, --prompt-tokens 1505).
for s in ${SYNTH:-}; do
  for l in ${SYNTH_LOOPS:-"d2k4:--pipeline=2"}; do
    echo "{\"synthetic\":\"$s\",\"loop\":\"${l%%:*}\",\"result\":" >> "$out/synth.jsonl"
    timeout ${SYNTH_TIMEOUT:-240} $B bench --synthetic "$s" --json --reps "$reps" --seed 1 --temperature 0 $(echo "${l#*:}" | tr + " ") ${SYNTH_ARGS:-} \
      >> "$out/synth.jsonl" 2>> "$out/wgpu.err" || echo "{\"error\":$?}" >> "$out/synth.jsonl"
    echo "}" >> "$out/synth.jsonl"
  done
done
# Concurrent requests (batched decoding): STREAMS="1 8 32" runs `bench --streams N` on each model with each sampler of
# STREAM_SAMPLERS and the chains of STREAM_CHAINS, STREAM_ARGS setting the request shape (default: 128-token prompts,
# 128 tokens each); llama.cpp with as many parallel sequences on the same files (tools/llama_batched_anchor.py).
sargs=${STREAM_ARGS:-"--prompt-tokens=128 --gen-tokens=128"}
for m in $models; do
  for n in ${STREAMS:-}; do
    for c in ${STREAM_CHAINS:-"greedy:--temperature=0"}; do
      for smp in ${STREAM_SAMPLERS:-device host}; do
        echo "{\"model\":\"$m\",\"streams\":$n,\"chain\":\"${c%%:*}\",\"sampler\":\"$smp\",\"result\":" >> "$out/streams.jsonl"
        timeout ${STREAM_TIMEOUT:-180} $B bench --model "/tmp/$m.gguf" --json --reps "$reps" --seed 1 --streams "$n" \
          --sampler "$smp" ${c#*:} $sargs >> "$out/streams.jsonl" 2>> "$out/wgpu.err" \
          || echo "{\"error\":$?}" >> "$out/streams.jsonl"
        echo "}" >> "$out/streams.jsonl"
      done
    done
  done
done
if [ -n "${STREAMS:-}" ] && [ -z "${NO_ANCHOR:-}" ] && [ -f tools/llama_batched_anchor.py ]; then
  STREAMS="$STREAMS" REPS=$reps timeout ${BATCH_ANCHOR_TIMEOUT:-300} python3 tools/llama_batched_anchor.py /tmp/anchor \
    $(for m in $models; do echo /tmp/$m.gguf; done) > "$out/anchor_streams.jsonl" 2> "$out/anchor_streams.err"
fi
python3 tools/bench_table.py "$out" | tee "$out/table.md"
