"""Shared by the tests of cells started ahead (test_warm_process.py) and forked (test_fork_server.py): a
tiny run directory for the fake engine, a cell plan, and ways to find, kill and wait for a cell's process."""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from kveval.files.rundir import RunDir, write_json_atomic
from kveval.inputs.kvspec import KVSpec
from kveval.inputs.workloads import PromptSpec
from kveval.files import schema
from kveval.run.cell_process import CellPlan, run_cell_process

ROOT = Path(__file__).resolve().parents[2]
HELD_FAKE_START = ROOT / "tests" / "support" / "held_fake_start"


@pytest.fixture(autouse=True)
def fake_engine(monkeypatch):
    """Import it into a test module: every test there runs cells on the fake engine, undamaged."""
    monkeypatch.setenv("KVEVAL_ENGINE", "fake")
    monkeypatch.delenv("KVEVAL_FAKE_DAMAGE", raising=False)


def tiny_run_dir(path: Path) -> RunDir:
    model = path / "model"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({"num_hidden_layers": 4, "num_key_value_heads": 2,
                                                   "num_attention_heads": 4, "hidden_size": 64,
                                                   "max_position_embeddings": 2048, "torch_dtype": "bfloat16"}))
    store = RunDir(path / "run")
    store.cells_dir.mkdir(parents=True)
    prompts = [PromptSpec(id=f"short-{i}", workload="short", kind="short", text="x", token_ids=tuple(range(5 + i)),
                          max_tokens=8, target_tokens=None) for i in range(3)]
    write_json_atomic(store.workloads_path, [p.to_dict() for p in prompts])
    return store


def tiny_plan(store: RunDir, cell: str = "auto-512") -> CellPlan:
    model = str(store.path.parent / "model")
    return CellPlan(id=cell, kv=KVSpec("auto"), max_model_len=512, phases=["generation"],
                    engine={"model": model, "kv_cache_dtype": "auto", "max_model_len": 512,
                            "kv_cache_memory_bytes": 8 << 20})


def run_in_process(store: RunDir, plan: CellPlan, warm, env: dict | None = None) -> dict:
    """The cell's record as stored (the tests compare cold and warm records key by key)."""
    return schema.dump(run_cell_process(store, plan, timeout_s=120, on_event=lambda event: None, env=env, warm=warm))


def cell_pid(store: RunDir, cell: str) -> int:
    events = [json.loads(line) for line in store.cell_events_path(cell).read_text().splitlines()]
    return next(e["pid"] for e in events if e.get("pid"))


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state == "Z"   # a zombie not yet reaped by init: it runs nothing and holds no memory


def wait_gone(pid: int, seconds: float = 30) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if gone(pid):
            return True
        time.sleep(0.1)
    return False


def without_timings(value):
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items()
                if k != "process" and "seconds" not in k and k not in ("wall", "t")}
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    return value


def kill_once_started(store: RunDir, cell: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if store.cell_events_path(cell).is_file() and store.cell_events_path(cell).read_text().strip():
            os.kill(cell_pid(store, cell), signal.SIGKILL)
            return
        time.sleep(0.1)


MARK_LM_EVAL = ROOT / "tests" / "support" / "mark_lm_eval"


def mark_lm_eval_imports(monkeypatch, mark: Path) -> None:
    """Processes started from here on create `mark` when they import lm-eval (tests/support/mark_lm_eval)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(MARK_LM_EVAL), *filter(None, [os.environ.get("PYTHONPATH")])]))
    monkeypatch.setenv("KVEVAL_TEST_LM_EVAL_MARK", str(mark))
