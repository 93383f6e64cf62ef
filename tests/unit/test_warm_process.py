"""Cell processes started ahead (run/warm_process.py, issue 18), with the fake engine (KVEVAL_ENGINE=fake: no
vLLM, so a waiting process is ready in about a second): a cell takes the waiting process only when it was
started with the cell's exact environment, writes what a cold cell writes, and no waiting process outlives
its holder or its parent."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from kveval.files import schema
from kveval.run.cell_process import _child_env, run_cell_process
from kveval.run.warm_process import WarmProcess, warm_cells_enabled
from tests.support.cell_processes import (HELD_FAKE_START, ROOT, cell_pid, fake_engine, gone,  # noqa: F401
                                          kill_once_started, mark_lm_eval_imports, run_in_process,
                                          tiny_plan, tiny_run_dir, wait_gone, without_timings)


def test_a_cell_takes_the_waiting_process_only_when_its_environment_matches(tmp_path):
    store = tiny_run_dir(tmp_path)
    with WarmProcess(store.cells_dir) as warm:
        first = run_in_process(store, tiny_plan(store, "auto-a"), warm)
        assert first["process"]["warm"] is False             # nothing waited yet: started cold
        waiting = warm.child.process.pid
        second = run_in_process(store, tiny_plan(store, "auto-b"), warm)
        assert second["process"]["warm"] is True and second["process"]["exit_code"] == 0
        assert cell_pid(store, "auto-b") == waiting              # the very process that waited ran the cell
        mismatched = warm.child.process.pid
        third = run_in_process(store, tiny_plan(store, "auto-c"), warm, env={"KVEVAL_TEST_MARK": "1"})
        assert third["process"]["warm"] is False             # another environment: started cold
        assert cell_pid(store, "auto-c") != mismatched and gone(mismatched)
        last = warm.child.process.pid
    assert gone(last)                                       # the last one, for which no cell came
    assert not list(store.cells_dir.glob(".warm-*.log"))
    for facts in (first, second, third):
        assert facts["complete"] and facts["started"] and len(facts["phases"]["generation"]["records"]) == 3


def test_a_warm_cell_stores_what_a_cold_one_does(tmp_path):
    cold, warm_store = tiny_run_dir(tmp_path / "cold"), tiny_run_dir(tmp_path / "warm")
    plan = tiny_plan(cold)
    cold_facts = run_in_process(cold, plan, None)
    with WarmProcess(warm_store.cells_dir, lm_eval=False) as warm:
        warm.prestart({k: v for k, v in _child_env().items() if v is not None})
        warm_facts = run_in_process(warm_store, tiny_plan(warm_store), warm)
    assert cold_facts["process"]["warm"] is False and warm_facts["process"]["warm"] is True
    stored = [json.loads(s.cell_path(plan.id).read_text()) for s in (cold, warm_store)]
    # The model path differs by directory only; everything else but the timings is the same.
    text = [json.dumps(without_timings(f), sort_keys=True).replace(str(s.path.parent), "ROOT")
            for f, s in zip(stored, (cold, warm_store))]
    assert text[0] == text[1]
    # The engine's words are in the cell's log, as a cold cell's are.
    assert "fake engine: KV cache dtype auto" in warm_store.cell_log_path(plan.id).read_text()


def test_a_waiting_process_that_gets_no_cell_is_ended_by_close(tmp_path):
    warm = WarmProcess(tmp_path / "cells")
    warm.prestart({k: v for k, v in _child_env().items() if v is not None})
    pid = warm.child.process.pid
    time.sleep(0.5)
    assert not gone(pid)
    began = time.monotonic()
    warm.close()
    assert gone(pid) and time.monotonic() - began < 10
    assert not list((tmp_path / "cells").glob(".warm-*.log"))


def test_a_waiting_process_ends_when_its_parent_dies(tmp_path):
    # A parent that starts a waiting process and dies without closing it: the child reads EOF and exits.
    parent = textwrap.dedent(f"""
        import os, sys
        from pathlib import Path
        from kveval.run.warm_process import WarmProcess
        warm = WarmProcess(Path({str(tmp_path / 'cells')!r}))
        warm.prestart(dict(os.environ))
        print(warm.child.process.pid, flush=True)
        os._exit(0)
    """)
    done = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True, cwd=ROOT, timeout=60)
    pid = int(done.stdout.strip())
    assert wait_gone(pid), "the waiting process outlived its parent"
    (log,) = (tmp_path / "cells").glob(".warm-*.log")     # left by the dead parent, harmless
    assert "Traceback" not in log.read_text()


def test_a_warm_child_that_dies_importing_leaves_its_words_in_the_cells_log(tmp_path, monkeypatch):
    # Handed its cell while still importing, it dies there: the cell's log says why, as a cold child's would.
    store = tiny_run_dir(tmp_path)
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\nsleep 1\necho 'ImportError: libfoo.so: cannot open shared object file' >&2\nexit 1\n")
    python.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(python))
    with WarmProcess(store.cells_dir) as warm:
        warm.prestart({k: v for k, v in _child_env().items() if v is not None})
        facts = run_in_process(store, tiny_plan(store), warm)
    assert facts["process"] == {**facts["process"], "warm": True, "exit_code": 1}
    assert facts["started"] is False and "libfoo.so" in facts["failure"]["message"]
    assert "libfoo.so" in store.cell_log_path("auto-512").read_text()
    assert not list(store.cells_dir.glob(".warm-*.log"))


@pytest.mark.parametrize("fault", ["timeout", "sigkill"])
def test_a_warm_cell_that_dies_is_recorded_as_a_cold_one_is(tmp_path, monkeypatch, fault):
    # The fake engine's start is held (as a real one takes seconds): the cell is stopped by its timeout, or
    # killed, while its engine starts.
    paths = [str(HELD_FAKE_START), *filter(None, [os.environ.get("PYTHONPATH")])]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))
    monkeypatch.setenv("KVEVAL_TEST_HOLD_FAKE_START_S", "60")
    stored = {}
    for mode in ("cold", "warm"):
        store = tiny_run_dir(tmp_path / mode)
        with WarmProcess(store.cells_dir, lm_eval=False) as warm:
            if mode == "warm":
                warm.prestart({k: v for k, v in _child_env().items() if v is not None})
            if fault == "sigkill":
                threading.Thread(target=kill_once_started, args=(store, "auto-512"), daemon=True).start()
            facts = run_cell_process(store, tiny_plan(store), timeout_s=4 if fault == "timeout" else 120,
                                     on_event=lambda event: None, warm=warm if mode == "warm" else None)
            facts = schema.dump(facts)   # the record as stored: the checks below read its keys
        assert gone(cell_pid(store, "auto-512"))
        assert facts["process"]["warm"] is (mode == "warm")
        stored[mode] = facts
    assert {k: v for k, v in stored["warm"]["process"].items() if k not in ("seconds", "warm")} == \
        {k: v for k, v in stored["cold"]["process"].items() if k not in ("seconds", "warm")}
    assert stored["warm"]["process"]["cause"] == {"timeout": "timeout", "sigkill": "oom_killed"}[fault]
    texts = [json.dumps(without_timings(stored[mode]), sort_keys=True).replace(str(tmp_path / mode), "ROOT")
             for mode in ("cold", "warm")]
    assert texts[0] == texts[1]


def _reading_stdin(pid: int) -> bool:
    """The process sits in read(0, ...) (Linux x86-64: syscall 0 on fd 0): its imports are done."""
    try:
        return Path(f"/proc/{pid}/syscall").read_text().split()[:2] == ["0", "0x0"]
    except OSError:
        return False


@pytest.mark.parametrize("tasks", [False, True])
def test_a_waiting_process_imports_lm_eval_ahead_only_for_a_run_with_a_tasks_phase(tmp_path, monkeypatch, tasks):
    mark = tmp_path / "lm_eval-imported"
    mark_lm_eval_imports(monkeypatch, mark)
    store = tiny_run_dir(tmp_path)
    with WarmProcess(store.cells_dir, lm_eval=tasks) as warm:
        warm.prestart({k: v for k, v in _child_env().items() if v is not None})
        pid, deadline = warm.child.process.pid, time.monotonic() + 120
        while not _reading_stdin(pid):   # handed its cell only once it waits for one, whatever it imported
            assert time.monotonic() < deadline and not gone(pid)
            time.sleep(0.1)
        facts = run_in_process(store, tiny_plan(store), warm)   # generation only
    assert facts["process"]["warm"] is True and facts["complete"] and facts["process"]["exit_code"] == 0
    assert mark.exists() is tasks


def test_on_by_default_on_a_gpu_host_only_and_the_switch_decides_otherwise(monkeypatch):
    monkeypatch.delenv("KVEVAL_WARM_CELLS", raising=False)
    assert warm_cells_enabled(gpu_host=True) and not warm_cells_enabled(gpu_host=False)
    monkeypatch.setenv("KVEVAL_WARM_CELLS", "0")
    assert not warm_cells_enabled(gpu_host=True)
    monkeypatch.setenv("KVEVAL_WARM_CELLS", "1")
    assert warm_cells_enabled(gpu_host=False)
