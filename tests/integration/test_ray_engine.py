"""--executor ray on a local Ray (this machine's CPUs), one cell at a time (a CPU cell takes every core
of its node): a run stopped while its first cell's engine starts records that cell as interrupted and
the queued one not at all, as a local run does; its resume finishes every cell with the same greedy
tokens as the same matrix run locally, one cell after the other (TWO_AUTO_CELLS,
tests/integration/conftest.py), through the path that copies files to and from the node
(KVEVAL_RAY_COPY_FILES=1), and leaves no scratch copy or cell process behind.

What is tested is kveval's Ray orchestration, not the engine, so the cells run the fake engine
(worker/fake_engine.py, KVEVAL_ENGINE=fake), here and in the local run compared with: the Ray task's
cell process gets the driver's environment (checked: KVEVAL_ENGINE, and OMP_NUM_THREADS as a local
cell has it, the thread set-up vLLM's CPU greedy tokens depend on). The fake engine starts at once, so
the stopped run holds it at start (tests/support/held_fake_start) as a real engine's start would.
Real engines, started and stopped, are tested locally (test_faults_engine.py)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import kveval
from kveval.files import schema
from tests.integration.conftest import TWO_AUTO_CELLS
from tests.integration.test_faults_engine import _events, _generated, _processes_mentioning
from tests.support.quiet import Quiet

# A Ray cluster's start and shutdown (~45 s of both cores) belong to the slow part, beside real engines.
pytestmark = pytest.mark.engine

pytest.importorskip("ray", reason="the ray extra is not installed (make test installs it)")

ROOT = Path(__file__).resolve().parents[2]
CELLS = ("auto-512", "auto-1024")
HELD_FAKE_START = ROOT / "tests" / "support" / "held_fake_start"


@pytest.fixture(scope="module")
def two_auto_cells_fake(tmp_path_factory, default_model_dir):
    """TWO_AUTO_CELLS run locally, one cell after the other, on the fake engine (default_model_dir: on a
    fresh machine the model is converted once, under the fixture's lock, before any run here)."""
    patch = pytest.MonkeyPatch()
    patch.setenv("KVEVAL_ENGINE", "fake")
    patch.delenv("KVEVAL_FAKE_DAMAGE", raising=False)
    patch.setenv("KVEVAL_NO_PLOTS", "1")   # cells and verdicts are compared here, no figure (CPU time)
    try:
        yield kveval.compare(out=tmp_path_factory.mktemp("two-auto-fake") / "r", progress=Quiet(), **TWO_AUTO_CELLS)
    finally:
        patch.undo()


def _command(out: Path) -> list[str]:
    # The CLI spelling of TWO_AUTO_CELLS (its counts travel in KVEVAL_TEST_COUNTS).
    return [sys.executable, "-m", "tests.support.tiny_compare", "compare", "--kv", *TWO_AUTO_CELLS["kv"],
            "--max-model-len", *map(str, TWO_AUTO_CELLS["max_model_len"]), "--enforce-eager",
            "--suite", TWO_AUTO_CELLS["suite"], "--phases", *TWO_AUTO_CELLS["phases"], "--out", str(out),
            "--executor", "ray"]


def _env(hold_start_s: float = 0) -> dict[str, str]:
    # The copy path: every file a cell reads goes to the node and every file it writes comes back.
    # No RAY_ADDRESS: a Ray of its own on this machine, never a cluster the tester happens to have.
    # The fake engine in every cell: the driver's environment reaches the Ray workers of its own local Ray.
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "KVEVAL_FAKE_DAMAGE")}
    env.update(KVEVAL_RAY_COPY_FILES="1", KVEVAL_TEST_COUNTS=json.dumps(TWO_AUTO_CELLS["counts"]), KVEVAL_ENGINE="fake",
               KVEVAL_NO_PLOTS="1")   # no figures: what is compared are cells and verdicts (CPU time)
    if hold_start_s:
        env["KVEVAL_TEST_HOLD_FAKE_START_S"] = str(hold_start_s)
        env["PYTHONPATH"] = os.pathsep.join([str(HELD_FAKE_START), *filter(None, [env.get("PYTHONPATH")])])
    return env


def _scratch_dirs() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("kveval-ray-cell-*")}


def _events_anywhere(out: Path, cell: str, earlier: set[str]) -> list[dict]:
    # With files copied, a running cell's events are in its node's scratch copy until it ends
    # (only this run's copies: one left by a process killed outright elsewhere is not this cell).
    found = _events(out, cell)
    for scratch in Path(tempfile.gettempdir()).glob("kveval-ray-cell-*"):
        if scratch.name not in earlier:
            found += _events(scratch, cell)
    return found


def _wait_until_started(cell: str, out: Path, run: subprocess.Popen, earlier: set[str], timeout: float = 300) -> int:
    """The pid of the cell's process, once it has begun starting its engine."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        started = [e for e in _events_anywhere(out, cell, earlier) if e.get("phase") == "engine_start"]
        if started:
            return started[0]["pid"]
        assert run.poll() is None, run.stdout.read()
        time.sleep(0.2)
    raise AssertionError(f"the Ray cell {cell} never reached engine_start")


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


def test_cells_as_ray_tasks_match_a_local_run_and_stop_and_resume_like_one(tmp_path, two_auto_cells_fake):
    two_auto_cells = two_auto_cells_fake
    scratch_before = _scratch_dirs()

    # 1. Stopped (SIGTERM, the path Ctrl-C takes) while the first cell's engine starts (held there:
    # the stop always finds it starting, never done).
    out = tmp_path / "ray"
    run = subprocess.Popen(_command(out), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                           env=_env(hold_start_s=300))
    pid = _wait_until_started("auto-512", out, run, scratch_before)
    cell_env = _environ(pid)  # the Ray task's cell process, while its engine starts
    assert cell_env.get("KVEVAL_ENGINE") == "fake"
    assert cell_env.get("OMP_NUM_THREADS") == os.environ.get("OMP_NUM_THREADS"), "not a local cell's thread set-up"
    run.send_signal(signal.SIGTERM)
    output, _ = run.communicate(timeout=180)
    assert run.returncode == 130, output
    assert "Ray: 1 node(s)" in output and "auto-512 (Ray task): cell process started" in output
    assert "one per node at a time" in output
    stopped = json.loads((out / "cells" / "auto-512.json").read_text())
    assert stopped["failure"]["reason"] == "interrupted" and stopped["process"]["interrupted"] is True
    assert not (out / "cells" / "auto-1024.json").exists()  # queued behind it: never begun, nothing recorded
    assert "interrupted" in (out / "review.md").read_text()

    # 2. The resume on Ray redoes both and reads as the local run did.
    done = subprocess.run(_command(out), capture_output=True, text=True, cwd=ROOT, env=_env())
    assert done.returncode == 3, done.stdout + done.stderr  # INCONCLUSIVE, as the local run
    assert two_auto_cells.verdict.status == "INCONCLUSIVE"
    assert _generated(out, CELLS) == _generated(two_auto_cells.run_dir, CELLS)
    assert all(_generated(out, CELLS).values())
    for cell in CELLS:
        facts = json.loads((out / "cells" / f"{cell}.json").read_text())
        assert facts["process"]["node"] and "fake engine: " in (out / "cells" / f"{cell}.log").read_text()
        assert facts["capacity"] == schema.dump(two_auto_cells.cell("auto", int(cell.split("-")[1])).capacity)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["options"]["executor"] == "ray" and [c["id"] for c in manifest["cells"]] == list(CELLS)
    assert manifest["options"]["kv_cache_memory_bytes"] == two_auto_cells.manifest.options.kv_cache_memory_bytes
    assert _scratch_dirs() <= scratch_before, "a node's scratch copy of the run was left behind"
    assert not _processes_mentioning(str(out)) and not _processes_mentioning("kveval-ray-cell-")
