#!/usr/bin/env bash
# On the GPU machine, inside a device call: pack /tmp/runs into $OUT/runs.tgz so the call brings it back.
# Files over 3 MB (a run's results.json, the cells' result files, big logs) are gzipped beside themselves first
# (a results.json of 1,080 task samples is over 3 MB; without this it stayed behind, reports/h100-gemma3-270m-8192-budget1200);
# model weights never travel. Here: cat runs.tgz.* | tar xzf -, then gunzip -k the *.json.gz a run needs for `kveval report`.
#   bash scripts/gpu_collect.sh [OUT_DIR]     (default $OUT)
set -uo pipefail
out=${1:-${OUT:?give OUT_DIR or run inside a device call}}
cd /tmp/runs 2>/dev/null || exit 0
find . -type f -size +3M ! -name '*.gz' ! -name '*.gguf' ! -name '*.safetensors' -exec gzip -kf {} \;
find . -type f ! -name '*.gguf' ! -name '*.safetensors' \( -size -3M -o -name '*.gz' \) -print | tar czf /tmp/runs.tgz -T -
# A device call brings back files of at most 16 MB each: pieces of 15 MB (here: cat runs.tgz.* | tar xzf -).
split -b 15M -d /tmp/runs.tgz "$out/runs.tgz."
