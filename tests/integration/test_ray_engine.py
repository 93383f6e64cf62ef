"""--executor ray on a local Ray (this machine's CPUs) with real CPU cells: a run stopped while its
cells start records them as interrupted, as a local run does; its resume finishes every cell with
the same greedy tokens a sequential local run produced, through the path that copies files to and
from the node (KVEVAL_RAY_COPY_FILES=1), and leaves no scratch copy or cell process behind."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.integration.test_faults_engine import ARGS, CELLS, _events, _generated, _processes_mentioning

pytest.importorskip("ray", reason="the ray extra is not installed (make test installs it)")
pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[2]


def _command(prompts: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "tests.support.tiny_compare", "compare", *ARGS, "--max-model-len", "512", "1024",
            "--prompts", str(prompts), "--out", str(out), *extra]


def _env() -> dict[str, str]:
    # The copy path: every file a cell reads goes to the node and every file it writes comes back.
    # No RAY_ADDRESS: a Ray of its own on this machine, never a cluster the tester happens to have.
    return {**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, "KVEVAL_RAY_COPY_FILES": "1"}


def _scratch_dirs() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("kveval-ray-cell-*")}


@pytest.fixture()
def prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"id": "count", "prompt": "Count from one to twenty in words.", "max_tokens": 24}) + "\n")
    return path


def _wait_until_both_start(out: Path, run: subprocess.Popen, timeout: float = 300) -> None:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(any(e.get("phase") == "engine_start" for e in _events_anywhere(out, cell)) for cell in CELLS):
            return
        assert run.poll() is None, run.stdout.read()
        time.sleep(0.2)
    raise AssertionError("the Ray cells never reached engine_start")


def _events_anywhere(out: Path, cell: str) -> list[dict]:
    # With files copied, a running cell's events are in its node's scratch copy until it ends.
    found = _events(out, cell)
    for scratch in Path(tempfile.gettempdir()).glob("kveval-ray-cell-*"):
        found += _events(scratch, cell)
    return found


def test_cells_as_ray_tasks_match_a_local_run_and_stop_and_resume_like_one(tmp_path, prompts, default_model_dir):
    local = subprocess.run(_command(prompts, tmp_path / "local"), capture_output=True, text=True, cwd=ROOT)
    assert local.returncode in (0, 1, 3), local.stdout + local.stderr
    scratch_before = _scratch_dirs()

    # 1. Stopped (SIGTERM, the path Ctrl-C takes) while both cells start at once on the two CPUs.
    out = tmp_path / "ray"
    run = subprocess.Popen(_command(prompts, out, "--executor", "ray"), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=_env())
    _wait_until_both_start(out, run)
    run.send_signal(signal.SIGTERM)
    output, _ = run.communicate(timeout=180)
    assert run.returncode == 130, output
    assert "Ray: 1 node(s)" in output and "(Ray task)" in output
    for cell in CELLS:
        stopped = json.loads((out / "cells" / f"{cell}.json").read_text())
        assert stopped["failure"]["reason"] == "interrupted" and stopped["process"]["interrupted"] is True
    assert "interrupted" in (out / "review.md").read_text()

    # 2. The resume on Ray redoes both and reads as the local run did.
    done = subprocess.run(_command(prompts, out, "--executor", "ray"), capture_output=True, text=True, cwd=ROOT,
                          env=_env())
    assert done.returncode == local.returncode, done.stdout + done.stderr
    assert _generated(out) == _generated(tmp_path / "local")
    for cell in CELLS:
        facts = json.loads((out / "cells" / f"{cell}.json").read_text())
        assert facts["process"]["node"] and (out / "cells" / f"{cell}.log").stat().st_size > 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["options"]["executor"] == "ray" and [c["id"] for c in manifest["cells"]] == list(CELLS)
    assert (out / "review.md").is_file()
    assert _scratch_dirs() <= scratch_before, "a node's scratch copy of the run was left behind"
    assert not _processes_mentioning(str(out)) and not _processes_mentioning("kveval-ray-cell-")
