#!/usr/bin/env bash
# Issue 23 part 5: what produced the KL 13.8 keep-layers run (reports/h200-qwen2.5-coder-1.5b/keep-layers,
# made at fefec6c with --enforce-eager --gpu-memory-utilization 0.5 on FLASH_ATTN)? Runs on the offline
# GPU machine after shared/gpu's install.sh, with the Qwen2.5-Coder-1.5B GGUF pieces in /tmp/stage, like
# scripts/gpu_queue.sh, as a background queue from /tmp (progress in /tmp/runs/queue.log).
#   bash scripts/gpu_bisect_keep.sh [old] [now-fa-old] [now-fa-default] [now-triton-old]
# old:            kveval at fefec6c (a git archive in /tmp/stage/kveval-fefec6c.tgz), that run's settings
# now-fa-old:     today's kveval, the same settings, kept layers forced onto FLASH_ATTN (FA3)
# now-fa-default: today's kveval, FLASH_ATTN forced, every other setting default (CUDA graphs, memory)
# now-triton-old: today's kveval with its own choice for kept layers (TRITON_ATTN), that run's settings
# now-fa-graphs-half: FLASH_ATTN, CUDA graphs, --gpu-memory-utilization 0.5, fp8:keep=0 and auto, scoring
#                 only: is the smaller memory share alone the trigger, or only with --enforce-eager?
# qwen-layer0:    issue 23 part 4 on the engine: fp8, fp8 with every layer but 0 kept in bf16 (only layer 0's
#                 cache in FP8) and auto, all on TRITON_ATTN (no Q quantization, unlike FA3), defaults
#                 otherwise, with the K/V/Q range pass: does layer 0's cache alone collapse the model?
# Every job: fp8:keep=0 fp8:keep=0,1 auto at 8192, generation and scoring only (the divergence that
# showed KL 13.8), no remedy, no diagnosis; --cell-timeout bounds a hung cell.
set -uo pipefail
src=/tmp/kveval-src
rm -rf "$src" && mkdir -p "$src" /tmp/runs && cp -r kveval scripts tests pyproject.toml "$src"/
what=${*:-old now-fa-old now-fa-default}
cat > /tmp/runs/queue.sh <<QUEUE
set -uo pipefail
while [ -n "${WAIT_FOR:-}" ] && [ ! -f "${WAIT_FOR:-}" ]; do sleep 3; done
cd $src
source scripts/gpu_env.sh
gguf=/tmp/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
while [ ! -f /tmp/stage/qwen.ready ] && [ ! -f "\$gguf" ]; do sleep 3; done
[ -f "\$gguf" ] || cat /tmp/stage/qwen.gguf.part* > "\$gguf"
echo "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046  \$gguf" | sha256sum -c - >> /tmp/runs/queue.log 2>&1 || exit 1
old_settings="--gpu-memory-utilization 0.5 --enforce-eager"
common="--kv fp8:keep=0 fp8:keep=0,1 auto --max-model-len 8192 --suite quick --phases generation scoring --tasks none --remedy off --no-diagnose --cell-timeout 420"
for job in $what; do
  start=\$(date +%s)
  echo "\$(date -u +%T) \$job: start" >> /tmp/runs/queue.log
  case \$job in
    old)
      rm -rf /tmp/kveval-old && mkdir -p /tmp/kveval-old && tar xzf /tmp/stage/kveval-fefec6c.tgz -C /tmp/kveval-old
      (cd /tmp/kveval-old && PYTHONPATH=/tmp/site:/tmp/kveval-old python3 -m kveval compare --model "\$gguf" \$common \$old_settings \
        --out /tmp/runs/old > /tmp/runs/old.log 2>&1) ;;
    now-fa-old)
      python3 -m kveval compare --model "\$gguf" \$common \$old_settings --engine-arg attention_backend=FLASH_ATTN \
        --stall-timeout 90 --out /tmp/runs/now-fa-old > /tmp/runs/now-fa-old.log 2>&1 ;;
    now-fa-default)
      python3 -m kveval compare --model "\$gguf" \$common --engine-arg attention_backend=FLASH_ATTN \
        --stall-timeout 90 --out /tmp/runs/now-fa-default > /tmp/runs/now-fa-default.log 2>&1 ;;
    now-fa-graphs-half)
      python3 -m kveval compare --model "\$gguf" --kv fp8:keep=0 auto --max-model-len 8192 --suite quick --phases scoring \
        --tasks none --remedy off --no-diagnose --cell-timeout 420 --gpu-memory-utilization 0.5 \
        --engine-arg attention_backend=FLASH_ATTN --stall-timeout 90 --out /tmp/runs/now-fa-graphs-half \
        > /tmp/runs/now-fa-graphs-half.log 2>&1 ;;
    qwen-layer0)
      keep=\$(seq -s, 1 27)
      python3 -m kveval compare --model "\$gguf" --kv fp8 fp8:keep=\$keep auto --max-model-len 8192 --suite quick \
        --phases generation scoring --tasks none --remedy off --engine-arg attention_backend=TRITON_ATTN \
        --stall-timeout 90 --cell-timeout 420 --out /tmp/runs/qwen-layer0 > /tmp/runs/qwen-layer0.log 2>&1 ;;
    now-triton-old)
      python3 -m kveval compare --model "\$gguf" \$common \$old_settings \
        --stall-timeout 90 --out /tmp/runs/now-triton-old > /tmp/runs/now-triton-old.log 2>&1 ;;
  esac
  echo "\$(date -u +%T) \$job: exit \$? after \$(( \$(date +%s) - start )) s" >> /tmp/runs/queue.log
done
echo "\$(date -u +%T) queue done" >> /tmp/runs/queue.log
QUEUE
[ -n "${DRY:-}" ] && { cat /tmp/runs/queue.sh; exit 0; }
cd /tmp && setsid nohup bash /tmp/runs/queue.sh > /tmp/runs/queue.out 2>&1 < /dev/null &
echo "queue started: $what"
