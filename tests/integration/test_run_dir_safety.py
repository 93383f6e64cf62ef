"""The run directory stays the truth (issue 21), through the real CLI and orchestration with the fake
engine (worker/fake_engine.py: no vLLM, any CPU): a second run into a live run's --out is refused at
once and the first finishes as if alone; a disk that fills mid-run stops the run with one line, keeps
every finished cell, and the same command resumes it to the cells an uninterrupted run has."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from kveval import api
from kveval.analysis.cell_records import generation_records
from tests.support.evidence import typed_cell
from kveval.cli.commands import cli
from kveval.files.run_lock import LOCK_NAME
from tests.support import tiny_compare

ROOT = Path(__file__).resolve().parents[2]
CELLS = ("auto-512", "fp8-512", "auto-1024", "fp8-1024")
ARGS = ["--kv", "fp8", "auto", "--max-model-len", "512", "1024", "--kv-cache-memory", "40MiB", "--phases",
        "generation", "scoring", "--suite", "quick", "--no-diagnose", "--remedy", "off", "--tasks", "none"]


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"id": "count", "prompt": "Count from one to one hundred in words.",
                                "max_tokens": 64}) + "\n")
    return path


def _command(prompts: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "tests.support.tiny_compare", "compare", *ARGS, "--prompts", str(prompts),
            "--out", str(out)]


# No figures: the cells are what is compared here (render/outputs.py NO_PLOTS_ENV; CPU time).
FAKE_ENV = {"KVEVAL_ENGINE": "fake", "KVEVAL_NO_PLOTS": "1"}


def _env() -> dict:
    return {**os.environ, **FAKE_ENV}


def _run(command: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=_env(), timeout=600)


def _measured(out: Path, cell: str) -> dict:
    """What a cell measured: its outputs and its teacher-forced figures (not its timings or pids)."""
    facts = json.loads((out / "cells" / f"{cell}.json").read_text())
    records = {pid: (r.text, r.token_ids, r.accepted) for pid, r in generation_records(typed_cell(facts)).items()}
    timing = ("seconds", "engine_seconds", "efficiency", "warmup_seconds")   # how long it took, not what it measured
    scoring = {key: value for key, value in (facts["phases"].get("scoring") or {}).items() if key not in timing}
    return {"complete": facts["complete"], "started": facts.get("started"),
            "pool": (facts.get("capacity") or {}).get("kv_pool_tokens"), "records": records, "scoring": scoring}


@pytest.fixture(scope="module")
def alone(tmp_path_factory, default_model_dir):
    """The same command run alone: what every other run here must end with. (default_model_dir: on a
    fresh machine the model is converted once, under the fixture's lock, not by each run here.)
    It runs in this process, through the same CLI and tiny_compare's counts: a child would spend
    seconds of CPU importing kveval and transformers again, and no other run is near this one."""
    root = tmp_path_factory.mktemp("alone")
    prompt_file = root / "prompts.jsonl"
    prompt_file.write_text(json.dumps({"id": "count", "prompt": "Count from one to one hundred in words.",
                                       "max_tokens": 64}) + "\n")
    with pytest.MonkeyPatch.context() as patch:
        for name, value in FAKE_ENV.items():
            patch.setenv(name, value)
        patch.setattr(api, "compare", tiny_compare._tiny_compare)   # what `python -m tests.support.tiny_compare` does
        done = CliRunner().invoke(cli, _command(prompt_file, root / "run")[3:])   # the argv after the module's name
    assert done.exit_code in (0, 1, 3, 4), done.output
    return {cell: _measured(root / "run", cell) for cell in CELLS}


def test_a_second_run_into_a_live_runs_out_is_refused_at_once(tmp_path, prompts, alone):
    out = tmp_path / "run"
    first = subprocess.Popen(_command(prompts, out), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             cwd=ROOT, env=_env())
    deadline = time.monotonic() + 120
    while f'"pid": {first.pid}' not in ((out / LOCK_NAME).read_text() if (out / LOCK_NAME).is_file() else ""):
        assert first.poll() is None and time.monotonic() < deadline, first.stdout.read()
        time.sleep(0.05)
    began = time.monotonic()
    second = _run(_command(prompts, out))
    refused_in = time.monotonic() - began
    assert first.poll() is None, "the first run ended before the second was refused: nothing was tested"
    assert second.returncode == 2, second.stdout + second.stderr
    message = second.stderr.strip().splitlines()
    assert len(message) == 1 and "Traceback" not in second.stderr   # refused before any progress line
    assert f"is being written by another kveval run (pid {first.pid}: " in message[0]
    assert "engine" not in second.stdout.lower()   # refused before any cell or engine
    first_output, _ = first.communicate(timeout=600)
    assert first.returncode in (0, 1, 3, 4), first_output
    assert {cell: _measured(out, cell) for cell in CELLS} == alone
    print(f"second run refused in {refused_in:.1f} s")


def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True).returncode == 0


def test_a_full_disk_stops_the_run_with_one_line_and_the_same_command_resumes_it(tmp_path, prompts, alone):
    disk = tmp_path / "small-disk"
    # 6 MiB: the run's inputs and the two 512 cells fit (about 4.4 MB), auto-1024's outputs (about 9 MB) do
    # not. The quick suite scores 8 documents per length (c3d267f; one before), so the cell files are about
    # 7x what they were when 1 MiB sufficed; a smaller disk stops the run in auto-512 with 0 cells finished.
    if not _mount_tmpfs(disk, "6m"):
        pytest.skip("cannot mount a tmpfs here (needs root): the full-disk path is unit-tested with an injected ENOSPC")
    try:
        out = disk / "run"
        full = _run(_command(prompts, out))
        assert full.returncode == 2, full.stdout + full.stderr
        # Progress lines go to stderr too; the error is one line, the last.
        errors = [line for line in full.stderr.splitlines() if line.startswith("Error")]
        assert errors == [full.stderr.strip().splitlines()[-1]] and "Traceback" not in full.stderr
        assert errors[0].startswith(f"Error: no space left on {disk} while writing {out}/cells/")
        assert errors[0].endswith("2 finished cells are safe; free space and run the same command to resume")
        kept = {cell: _measured(out, cell) for cell in ("auto-512", "fp8-512")}
        assert kept == {cell: alone[cell] for cell in kept}
        # The whole run, with its degeneration probe rounds, writes about 21 MB.
        assert subprocess.run(["mount", "-o", "remount,size=64m", str(disk)]).returncode == 0
        resumed = _run(_command(prompts, out))
        assert resumed.returncode in (0, 1, 3, 4), resumed.stdout + resumed.stderr
        assert "auto-512: reused from the run directory" in resumed.stderr
        assert {cell: _measured(out, cell) for cell in CELLS} == alone
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)
