#!/usr/bin/env bash
# Installs everything `cargo test --release` needs besides Rust (Debian/Ubuntu, as root or with sudo):
# - Mesa's lavapipe (software Vulkan) and the Vulkan loader, for machines without a GPU;
# - curl, which drives tests/serve.rs's raw HTTP checks;
# - mlx-lm on the CPU (`mlx[cpu]`, which brings numpy and safetensors): it converts SmolLM2 and the tiny
#   Qwen3.5-MoE / Gemma 4 fixtures for the MLX reference tests (tests/common/mlx.rs);
# - the `openai` Python client, which talks to `wgpu-llm serve` in tests/serve.rs (tests/serve_client.py) and
#   tests/tools.rs (tests/serve_tools/openai_roundtrip.py: tool calls round-tripped).
# What is already there is left alone. .ci/run calls this first.
set -euo pipefail
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"
need=()
ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1 || need+=(mesa-vulkan-drivers libvulkan1)
command -v curl >/dev/null || need+=(curl)
if [ ${#need[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi
py=${PYTHON:-python3}
pips=()
"$py" -c "import mlx_lm" 2>/dev/null || pips+=("mlx[cpu]==0.32.4" "mlx-lm==0.32.2")
"$py" -c "import openai" 2>/dev/null || pips+=("openai==3.57.0")
if [ ${#pips[@]} -gt 0 ]; then
  "$py" -m pip install -q "${pips[@]}"
fi
