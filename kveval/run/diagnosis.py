"""Run the per-layer K/V range pass (kveval.worker.kv_ranges) once per run, in its own process."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from kveval.files import schema
from kveval.files.rundir import RunDir, read_json, write_json_atomic
from kveval.inputs.model_config import ModelSource
from kveval.run.fork_server import ForkServer


DIAGNOSIS_TIMEOUT_S = 1800


def run_diagnosis(run_dir: RunDir, source: ModelSource, scales: schema.KvScales | None, show,
                  fork: tuple[ForkServer, dict[str, str]] | None = None) -> dict:
    """The per-layer K/V range pass (transformers, in its own process so its memory is gone before
    the engines start), stored as RUN_DIR/kv_ranges.json; reused when present. A failure is stored
    as {"error": ...}: the run goes on without a diagnosis. `fork`: the run's fork server and the
    environment it was started with; the pass's process is then forked from it (torch and
    transformers imported already: ~6 s less on the 2-core CPU), else started afresh."""
    path = run_dir.kv_ranges_path
    if path.is_file():
        return read_json(path)
    show.note("Measuring per-layer K/V ranges with transformers (once per run)")
    argv = ["--model", source.path, "--documents", str(run_dir.scoring_path), "--out", str(path)]
    argv += ["--revision", source.revision] if source.revision else []
    argv += ["--trust-remote-code"] if source.trust_remote_code else []
    if scales is not None and (scales.k_scale or scales.v_scale):
        write_json_atomic(run_dir.kv_scales_path, schema.dump(scales))
        argv += ["--scales", str(run_dir.kv_scales_path)]
    try:
        code, output = _forked(fork, argv) if fork is not None else (None, "")
        if code is None:
            done = subprocess.run([sys.executable, "-m", MODULE, *argv], capture_output=True, text=True,
                                  timeout=DIAGNOSIS_TIMEOUT_S)
            code, output = done.returncode, done.stderr or done.stdout
        failed = code != 0 or not path.is_file()
        why = " ".join((output or f"exit code {code}").strip().splitlines()[-3:])
    except subprocess.TimeoutExpired:
        failed, why = True, f"timed out after {DIAGNOSIS_TIMEOUT_S} s"
    if failed:
        write_json_atomic(path, {"error": f"the K/V range pass failed: {why[-400:]}"})
        show.note(f"Per-layer diagnosis failed: {why[-200:]}")
    return read_json(path)


MODULE = "kveval.worker.kv_ranges"


def skip_diagnosis(run_dir: RunDir, why: str) -> None:
    """Record, as the pass's failure, that it was not tried because it cannot run here (`why`)."""
    if not run_dir.kv_ranges_path.is_file():
        write_json_atomic(run_dir.kv_ranges_path, {"error": why})


def _forked(fork: tuple[ForkServer, dict[str, str]], argv: list[str]) -> tuple[int | None, str]:
    """The pass forked from the fork server: (exit code, its output), or (None, "") where it cannot fork."""
    server, env = fork
    log = Path(server.directory) / f".kv-ranges-{os.getpid()}.log"
    try:
        code = server.run_job(env, MODULE, argv, log, DIAGNOSIS_TIMEOUT_S)
        return code, log.read_text(encoding="utf-8", errors="replace") if code is not None and log.is_file() else ""
    finally:
        log.unlink(missing_ok=True)
