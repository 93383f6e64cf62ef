#!/usr/bin/env bash
# Re-render every published report (each directory under reports/ with a manifest.json, archive/ left out) with this checkout's
# kveval: each is copied to a scratch directory, re-judged from its stored evidence by `kveval report`, and its
# review.md, results.json.gz and the tables it already published are copied back; figures are kept as they were
# (KVEVAL_NO_PLOTS=1). Then tests/unit/test_golden_reports.py must pass. Usage: bash scripts/rerender_reports.sh
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
kveval=${KVEVAL:-.venv/bin/kveval}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
find reports -name manifest.json -not -path 'reports/archive/*' | sort | while read -r manifest; do
  dir=$(dirname "$manifest"); name=${dir#reports/}; copy="$scratch/${name//\//__}"
  cp -r "$dir" "$copy"; rm -f "$copy/review.md"
  rc=0; KVEVAL_NO_PLOTS=1 "$kveval" report "$copy" > /dev/null 2> "$copy.err" || rc=$?
  case $rc in 0|1|3|4) ;; *) echo "$name: kveval report exit $rc"; cat "$copy.err"; exit 1;; esac
  cp "$copy/review.md" "$dir/review.md"
  if [ -f "$copy/results.json" ]; then gzip -n -9 -c "$copy/results.json" > "$dir/results.json.gz"
  else cp "$copy/results.json.gz" "$dir/results.json.gz"; fi   # kveval keeps a published results.json.gz packed
  for table in "$dir"/tables/*.csv; do [ -f "$copy/tables/$(basename "$table")" ] && cp "$copy/tables/$(basename "$table")" "$table"; done
  echo "$name: exit $rc"
done
