"""Fault injection on the real CPU engine: a cell killed mid-generation, a finished cell file
corrupted, the run interrupted, then resumed — every cell that had finished reads the same as its
uninterrupted run, with no cell lost or duplicated and no process left behind. Tiny workloads: one short prompt,
generation only, two cells of `auto` (FP8 may not start on this CPU, and is not what is tested)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine

ARGS = ["--kv", "auto", "--kv-cache-memory", "40MiB", "--phases", "generation",
        "--suite", "quick", "--enforce-eager", "--no-diagnose", "--remedy", "off", "--tasks", "none"]
CELLS = ("auto-512", "auto-1024")


def _command(prompts: Path, out: Path, lengths: tuple[str, ...] = ("512", "1024")) -> list[str]:
    return [sys.executable, "-m", "tests.support.tiny_compare", "compare", *ARGS, "--max-model-len", *lengths,
            "--prompts", str(prompts), "--out", str(out)]


ROOT = Path(__file__).resolve().parents[2]


def _start(command: list[str]) -> subprocess.Popen:
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)


def _run(command: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, cwd=ROOT)


def _events(out: Path, cell: str) -> list[dict]:
    path = out / "cells" / f"{cell}.events.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip().endswith("}")]


def _wait_for(out: Path, cell: str, phase: str, process: subprocess.Popen, timeout: float = 300,
              not_pid: int | None = None) -> int:
    """The cell process's pid, once it has begun `phase` (not_pid: an earlier run's process, whose
    events are still on disk until the new run restarts the cell)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events = _events(out, cell)
        pid = next((e["pid"] for e in events if e.get("pid")), None)
        if pid and pid != not_pid and any(e.get("phase") == phase for e in events):
            return pid
        assert process.poll() is None, process.stdout.read()
        time.sleep(0.2)
    raise AssertionError(f"{cell} never reached {phase}")


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(int(entry.name))
    return found


def _generated(out: Path, cells=CELLS) -> dict[str, list]:
    """What each cell measured that must not depend on faults: its greedy token ids per prompt."""
    result = {}
    for cell in cells:
        facts = json.loads((out / "cells" / f"{cell}.json").read_text())
        assert facts["complete"] and facts["started"] and not facts.get("crash"), facts.get("crash")
        result[cell] = {r["prompt_id"]: r.get("token_ids") for r in facts["phases"]["generation"]["records"]}
    return result


@pytest.fixture()
def prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    # Long enough (64 tokens, seconds on a CPU) that a kill seen at the start of generation lands inside it.
    path.write_text(json.dumps({"id": "count", "prompt": "Count from one to one hundred in words, separated by "
                                "commas.", "max_tokens": 64}) + "\n")
    return path


def test_kill_corrupt_interrupt_then_resume_keeps_every_finished_measurement(tmp_path, prompts, default_model_dir):
    faulty = tmp_path / "faulty"

    # 1. The first cell's process is SIGKILLed mid-generation: recorded as a crash in plain words; the run goes on.
    run = _start(_command(prompts, faulty))
    os.kill(_wait_for(faulty, "auto-512", "generation", run), signal.SIGKILL)
    output, _ = run.communicate(timeout=600)
    assert run.returncode == 3, output
    earlier_1024 = next(e["pid"] for e in _events(faulty, "auto-1024") if e.get("pid"))
    killed = json.loads((faulty / "cells" / "auto-512.json").read_text())
    assert killed["crash"]["cause"] == "oom_killed" and "SIGKILL" in killed["crash"]["message"]
    assert "--kv-cache-memory" in killed["crash"]["advice"]
    review = (faulty / "review.md").read_text()
    assert "[auto-512](cells/auto-512.log)" in review and "SIGKILL" in review
    assert not _processes_mentioning(str(faulty)), "a cell process outlived its run"

    # auto-1024 finished without a fault: after every later fault and resume, it must read the same.
    expected = _generated(faulty, ("auto-1024",))

    # 2. A finished cell's file is damaged: the resume must redo it, never read it as data.
    (faulty / "cells" / "auto-1024.json").write_text('{"cell": "auto-1024", "complete": tru')

    # 3. The resume is stopped (SIGTERM; Ctrl-C's SIGINT takes the same path, but a job started in the
    # background by a shell inherits SIGINT ignored) while auto-1024's engine starts again.
    run = _start(_command(prompts, faulty))
    _wait_for(faulty, "auto-1024", "engine_start", run, not_pid=earlier_1024)
    run.send_signal(signal.SIGTERM)
    output, _ = run.communicate(timeout=120)
    assert run.returncode == 130, output
    assert "Run the same command again to resume" in output
    assert "running it again: its earlier run crashed" in output        # auto-512 was redone
    assert "its stored result is unusable" in output                     # the damaged auto-1024
    interrupted = json.loads((faulty / "cells" / "auto-1024.json").read_text())
    assert interrupted["process"]["interrupted"] is True and interrupted["failure"]["reason"] == "interrupted"
    assert "interrupted" in (faulty / "review.md").read_text()
    assert not _processes_mentioning(str(faulty))
    finished = (faulty / "cells" / "auto-512.json").read_bytes()

    # 4. The last resume keeps auto-512 byte for byte and redoes the interrupted cell.
    done = _run(_command(prompts, faulty))
    assert done.returncode in (0, 1, 3, 4), done.stdout + done.stderr
    assert (faulty / "cells" / "auto-512.json").read_bytes() == finished
    final = _generated(faulty)   # both complete, started, not crashed
    assert final["auto-1024"] == expected["auto-1024"]
    assert final["auto-512"]["count"] and final["auto-512"].keys() == final["auto-1024"].keys()
    assert sorted(p.name for p in (faulty / "cells").glob("*.json") if not p.name.endswith(".spec.json")) == \
        sorted(f"{cell}.json" for cell in CELLS)
    manifest = json.loads((faulty / "manifest.json").read_text())
    assert [c["id"] for c in manifest["cells"]] == list(CELLS)
