"""Run the per-layer K/V range pass (kveval.worker.kv_ranges) once per run, in its own process."""
from __future__ import annotations

import subprocess
import sys

from kveval.files import schema
from kveval.files.rundir import RunDir, read_json, write_json_atomic
from kveval.inputs.model_config import ModelSource


DIAGNOSIS_TIMEOUT_S = 1800


def run_diagnosis(run_dir: RunDir, source: ModelSource, scales: schema.KvScales | None, show) -> dict:
    """The per-layer K/V range pass (transformers, in its own process so its memory is gone before
    the engines start), stored as RUN_DIR/kv_ranges.json; reused when present. A failure is stored
    as {"error": ...}: the run goes on without a diagnosis."""
    path = run_dir.kv_ranges_path
    if path.is_file():
        return read_json(path)
    show.note("Measuring per-layer K/V ranges with transformers (once per run)")
    command = [sys.executable, "-m", "kveval.worker.kv_ranges", "--model", source.path,
               "--documents", str(run_dir.scoring_path), "--out", str(path)]
    command += ["--revision", source.revision] if source.revision else []
    command += ["--trust-remote-code"] if source.trust_remote_code else []
    if scales is not None and (scales.k_scale or scales.v_scale):
        write_json_atomic(run_dir.kv_scales_path, schema.dump(scales))
        command += ["--scales", str(run_dir.kv_scales_path)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=DIAGNOSIS_TIMEOUT_S)
        failed = done.returncode != 0 or not path.is_file()
        why = " ".join((done.stderr or done.stdout or f"exit code {done.returncode}").strip().splitlines()[-3:])
    except subprocess.TimeoutExpired:
        failed, why = True, f"timed out after {DIAGNOSIS_TIMEOUT_S} s"
    if failed:
        write_json_atomic(path, {"error": f"the K/V range pass failed: {why[-400:]}"})
        show.note(f"Per-layer diagnosis failed: {why[-200:]}")
    return read_json(path)
