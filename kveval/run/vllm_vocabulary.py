"""What the installed vLLM accepts — its engine argument names and KV-cache dtypes — so a typo is
refused before any engine starts (`--kv fp9`, `--engine-arg notakey=1`).

The parent never imports vLLM: a short child process (`python -m kveval.worker.probe`) reads both
from vLLM itself, and the answer is cached in $KVEVAL_HOME keyed by where vLLM is installed and
when, so only the first run after an install pays the import (~10 s on a CPU). When the probe
cannot run, nothing is refused here and vLLM's own start-up message stays the judge.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from kveval.errors import KvevalError
from kveval.inputs.models import kveval_home

PROBE_TIMEOUT_S = 180


def _vllm_key() -> str | None:
    spec = importlib.util.find_spec("vllm")  # finds the package without importing it
    if spec is None or not spec.origin:
        return None
    origin = Path(spec.origin)
    stamp = f"{origin.resolve()}:{origin.stat().st_mtime_ns}:{sys.executable}"
    return hashlib.sha256(stamp.encode()).hexdigest()[:16]


def vllm_vocabulary() -> dict | None:
    """{vllm_version, engine_args, kv_cache_dtypes}, or None when vLLM is absent or the probe failed."""
    key = _vllm_key()
    if key is None:
        return None
    cache = kveval_home() / f"vllm-vocabulary-{key}.json"
    try:
        return json.loads(cache.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        pass
    try:
        done = subprocess.run([sys.executable, "-m", "kveval.worker.probe"], capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT_S)
        vocabulary = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        vocabulary = None
    if not vocabulary or not vocabulary.get("engine_args"):
        return None
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(vocabulary), encoding="utf-8")
    except OSError:
        pass  # an unwritable cache only costs the probe next time
    return vocabulary


def check_against_vllm(kv_dtypes: list[str], engine_args: dict, vocabulary: dict | None) -> None:
    """Refuse a KV dtype or an engine argument the installed vLLM does not know, naming what it knows."""
    if not vocabulary:
        return
    version = vocabulary.get("vllm_version") or "?"
    known_dtypes = vocabulary.get("kv_cache_dtypes") or []
    for dtype in kv_dtypes:
        if known_dtypes and dtype not in known_dtypes:
            raise KvevalError(f"--kv {dtype}: not a KV-cache dtype of vLLM {version}; it knows "
                              f"{', '.join(known_dtypes)}")
    known_args = set(vocabulary.get("engine_args") or [])
    for key in engine_args:
        name = str(key).replace("-", "_")
        if known_args and name not in known_args:
            close = sorted(a for a in known_args if _close(name, a))[:3]
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise KvevalError(f"--engine-arg {key}=...: vLLM {version} has no engine argument {name!r}{hint}")


def _close(a: str, b: str) -> bool:
    from rapidfuzz.distance import Levenshtein

    return Levenshtein.normalized_similarity(a, b) >= 0.75
