"""One real K/V range pass per input in a test session (CI time, issue 42).

The fake-engine runs of test_fake_engine, test_search_fake and test_search_refused_fake each diagnose the same
planted model (K×128 in layers 3 and 17) on the same scoring documents: the pass is transformers on the CPU,
about 70 s of CPU each on the 2-core machine, and it is deterministic (its file differs only in its `seconds`
and the model's path). The first run that needs a pass runs it for real (kveval.run.diagnosis.run_diagnosis, in
the fork server as always); a later run whose inputs are byte for byte the same (the weights and config, the
scoring documents, the scales and the other arguments) gets that file, with its own model path, in its run
directory, where run_diagnosis would read it on a resume. Shared by the pytest-xdist workers of one session
(a file under a lock in the session's temp root): a worker that needs a pass another is running waits for it.
A pass that failed is not kept."""
from __future__ import annotations

import fcntl
import hashlib
import json
from pathlib import Path

from kveval.files.rundir import read_json, write_json_atomic
from kveval.run import diagnosis

_MODEL_FILES = ("config.json", "model.safetensors")


def _key(run_dir, source, scales) -> str | None:
    """The pass's inputs as one digest, or None where the model is not a local directory of known files."""
    model = Path(source.path)
    if not model.is_dir() or not all((model / name).is_file() for name in _MODEL_FILES):
        return None
    digest = hashlib.sha256()
    for name in _MODEL_FILES:
        with open(model / name, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 22), b""):
                digest.update(block)
    digest.update(Path(run_dir.scoring_path).read_bytes())
    digest.update(json.dumps([source.revision, source.trust_remote_code, repr(scales)], default=str).encode())
    return digest.hexdigest()


def memoized(root: Path, real=diagnosis.run_diagnosis):
    """run_diagnosis, with one real pass per distinct input under `root` (created here)."""
    root.mkdir(parents=True, exist_ok=True)

    def run_diagnosis(run_dir, source, scales, show, fork=None):
        path = run_dir.kv_ranges_path
        key = None if path.is_file() else _key(run_dir, source, scales)
        if key is None:
            return real(run_dir, source, scales, show, fork)
        with open(root / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            kept = root / f"{key}.json"
            if kept.is_file():
                ranges = read_json(kept)
                ranges["model"]["path"] = source.path   # as the pass writes it (--model source.path)
                show.note("Measuring per-layer K/V ranges with transformers (once per run)")
                write_json_atomic(path, ranges)
                return read_json(path)
            ranges = real(run_dir, source, scales, show, fork)
            if "error" not in ranges:
                write_json_atomic(kept, ranges)
            return ranges

    return run_diagnosis
