"""Cell processes forked from one server (run/fork_server.py, issue 18), with the fake engine
(KVEVAL_ENGINE=fake): each cell still gets a process of its own that stores what a cold one stores, and dies
the way a cold one dies; a cell whose environment differs, or a server that is gone, means a cold start;
no server outlives its holder or its parent."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from types import SimpleNamespace

import pytest

from kveval.files.rundir import RunDir, write_json_atomic
from kveval.inputs.model_config import ModelSource
from kveval.run import diagnosis
from kveval.files import schema
from kveval.run.cell_process import cell_env, run_cell_process
from kveval.run.fork_server import ForkServer, fork_cells_enabled
from tests.support.cell_processes import (HELD_FAKE_START, ROOT, cell_pid, fake_engine, gone,  # noqa: F401
                                          kill_once_started, mark_lm_eval_imports, run_in_process,
                                          tiny_plan, tiny_run_dir, wait_gone, without_timings)


def test_every_cell_gets_a_process_of_its_own_forked_from_one_server(tmp_path):
    store = tiny_run_dir(tmp_path)
    with ForkServer(tmp_path / "server") as server:
        server.prestart(cell_env())
        server_pid = server.server.process.pid
        facts = [run_in_process(store, tiny_plan(store, f"auto-{n}"), server) for n in "ab"]
        pids = [cell_pid(store, f"auto-{n}") for n in "ab"]
        assert all(f["process"]["forked"] is True and f["process"]["exit_code"] == 0 for f in facts)
        assert len({server_pid, *pids}) == 3 and all(gone(pid) for pid in pids)   # two cell processes, both ended
        assert server.server.process.pid == server_pid and not gone(server_pid)  # one server, still serving
        other = run_in_process(store, tiny_plan(store, "auto-c"), server, env={"KVEVAL_TEST_MARK": "1"})
        assert other["process"]["forked"] is False and other["process"]["warm"] is False   # another environment: cold
        assert wait_gone(server_pid)          # ... and the mismatching server was ended
        restarted = server.server.process.pid   # the next one runs with the cell's environment
    assert wait_gone(restarted)
    assert not list((tmp_path / "server").glob(".server-*.log"))
    for cell in (*facts, other):
        assert cell["complete"] and cell["started"] and len(cell["phases"]["generation"]["records"]) == 3


def test_a_forked_cell_stores_what_a_cold_one_does(tmp_path):
    cold, forked = tiny_run_dir(tmp_path / "cold"), tiny_run_dir(tmp_path / "forked")
    cold_facts = run_in_process(cold, tiny_plan(cold), None)
    with ForkServer(tmp_path / "server", lm_eval=False) as server:
        server.prestart(cell_env())
        forked_facts = run_in_process(forked, tiny_plan(forked), server)
    assert cold_facts["process"]["forked"] is False and forked_facts["process"]["forked"] is True
    stored = [json.loads(s.cell_path("auto-512").read_text()) for s in (cold, forked)]
    text = [json.dumps(without_timings(f), sort_keys=True).replace(str(s.path.parent), "ROOT")
            for f, s in zip(stored, (cold, forked))]
    assert text[0] == text[1]
    # The engine's words, and what the server printed importing, are in the cell's log, as a cold cell's are.
    assert "fake engine: KV cache dtype auto" in forked.cell_log_path("auto-512").read_text()


@pytest.mark.parametrize("fault", ["timeout", "sigkill"])
def test_a_forked_cell_that_dies_is_recorded_as_a_cold_one_is_and_the_server_lives_on(tmp_path, monkeypatch, fault):
    # The fake engine's start is held (a real one takes seconds): the cell is stopped by its timeout, or
    # killed, while its engine starts. Its process dies; the server that forked it does not.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HELD_FAKE_START),
                                                      *filter(None, [os.environ.get("PYTHONPATH")])]))
    monkeypatch.setenv("KVEVAL_TEST_HOLD_FAKE_START_S", "60")
    stored = {}
    for mode in ("cold", "forked"):
        store = tiny_run_dir(tmp_path / mode)
        with ForkServer(tmp_path / mode / "server", lm_eval=False) as server:
            if mode == "forked":
                server.prestart(cell_env())
                assert server.wait_ready(120)   # the cell's clock then covers only what a forked cell does
            if fault == "sigkill":
                threading.Thread(target=kill_once_started, args=(store, "auto-512"), daemon=True).start()
            facts = run_cell_process(store, tiny_plan(store), timeout_s=4 if fault == "timeout" else 120,
                                     on_event=lambda event: None, warm=server if mode == "forked" else None)
            facts = schema.dump(facts)   # the record as stored: the checks below read its keys
            assert gone(cell_pid(store, "auto-512"))
            assert facts["process"]["forked"] is (mode == "forked")
            assert mode == "cold" or server.take(cell_env()) is not None   # still serving
            stored[mode] = facts
    assert {k: v for k, v in stored["forked"]["process"].items() if k not in ("seconds", "warm", "forked")} == \
        {k: v for k, v in stored["cold"]["process"].items() if k not in ("seconds", "warm", "forked")}
    assert stored["forked"]["process"]["cause"] == {"timeout": "timeout", "sigkill": "oom_killed"}[fault]
    texts = [json.dumps(without_timings(stored[mode]), sort_keys=True).replace(str(tmp_path / mode), "ROOT")
             for mode in ("cold", "forked")]
    assert texts[0] == texts[1]


def test_a_server_that_died_between_cells_means_a_cold_start_and_a_new_server(tmp_path):
    store = tiny_run_dir(tmp_path)
    with ForkServer(tmp_path / "server", lm_eval=False) as server:
        server.prestart(cell_env())
        first = run_in_process(store, tiny_plan(store, "auto-a"), server)
        dead = server.server.process.pid
        os.killpg(dead, signal.SIGKILL)
        assert wait_gone(dead)
        second = run_in_process(store, tiny_plan(store, "auto-b"), server)
        assert first["process"]["forked"] is True and second["process"]["forked"] is False
        assert second["complete"] and second["process"]["exit_code"] == 0
        assert server.server is not None and server.server.process.pid != dead   # started again for the next cell


def test_a_server_ends_on_close_and_when_its_parent_dies(tmp_path):
    server = ForkServer(tmp_path / "server")
    server.prestart(cell_env())
    pid = server.server.process.pid
    time.sleep(0.5)
    assert not gone(pid)
    began = time.monotonic()
    server.close()
    assert gone(pid) and time.monotonic() - began < 10
    # A parent that starts a server and dies without closing it: the server reads EOF and exits.
    parent = textwrap.dedent(f"""
        import os
        from pathlib import Path
        from kveval.run.fork_server import ForkServer
        server = ForkServer(Path({str(tmp_path / 'orphan')!r}))
        server.prestart(dict(os.environ))
        print(server.server.process.pid, flush=True)
        os._exit(0)
    """)
    done = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert wait_gone(int(done.stdout.strip()), 60), "the server outlived its parent"


def test_on_by_default_without_a_gpu_only_and_the_switch_decides_otherwise(monkeypatch):
    monkeypatch.delenv("KVEVAL_FORK_CELLS", raising=False)
    assert fork_cells_enabled(gpu_host=False) and not fork_cells_enabled(gpu_host=True)
    monkeypatch.setenv("KVEVAL_FORK_CELLS", "0")
    assert not fork_cells_enabled(gpu_host=False)
    monkeypatch.setenv("KVEVAL_FORK_CELLS", "1")
    assert fork_cells_enabled(gpu_host=True)


def test_where_a_fork_could_not_use_cuda_the_server_ends_and_every_cell_starts_cold(tmp_path, monkeypatch):
    # tests/support/bad_fork: the server's probe fork finds torch's "bad fork" mark, as after a CUDA init.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "tests" / "support" / "bad_fork"),
                                                      *filter(None, [os.environ.get("PYTHONPATH")])]))
    store = tiny_run_dir(tmp_path)
    with ForkServer(tmp_path / "server", lm_eval=False) as server:
        server.prestart(cell_env())
        pid = server.server.process.pid
        assert not server.wait_ready(60) and wait_gone(pid)
        monkeypatch.delenv("PYTHONPATH")   # the cells themselves run as usual
        facts = [run_in_process(store, tiny_plan(store, f"auto-{n}"), server) for n in "ab"]
        assert [f["process"]["forked"] for f in facts] == [False, False]
        assert server.unsafe and server.server is None   # not started again for the second cell
    assert all(f["complete"] and f["process"]["exit_code"] == 0 for f in facts)


def test_a_cell_forked_by_a_server_that_dies_ends_with_it_and_is_recorded_as_dead(tmp_path, monkeypatch):
    # The parent ends the server at Ctrl-C or after a failed hand-over; a cell it forked must not run on unseen.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HELD_FAKE_START),
                                                      *filter(None, [os.environ.get("PYTHONPATH")])]))
    monkeypatch.setenv("KVEVAL_TEST_HOLD_FAKE_START_S", "60")
    store = tiny_run_dir(tmp_path)
    with ForkServer(tmp_path / "server", lm_eval=False) as server:
        server.prestart(cell_env())
        assert server.wait_ready(120)
        server_pid = server.server.process.pid

        def kill_server_once_started() -> None:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not store.cell_events_path("auto-512").is_file():
                time.sleep(0.1)
            time.sleep(0.5)
            os.kill(server_pid, signal.SIGKILL)

        threading.Thread(target=kill_server_once_started, daemon=True).start()
        began = time.monotonic()
        facts = run_cell_process(store, tiny_plan(store), timeout_s=120, on_event=lambda event: None, warm=server)
        facts = schema.dump(facts)   # the record as stored: the checks below read its keys
    assert time.monotonic() - began < 30                       # not the 60 s hold, nor the timeout
    assert gone(cell_pid(store, "auto-512")) and gone(server_pid)
    assert facts["process"]["forked"] is True and facts["process"]["exit_code"] != 0
    assert facts["started"] is False and facts["complete"] is True


@pytest.mark.parametrize("tasks", [False, True])
def test_a_server_imports_lm_eval_ahead_only_for_a_run_with_a_tasks_phase(tmp_path, monkeypatch, tasks):
    mark = tmp_path / "lm_eval-imported"
    mark_lm_eval_imports(monkeypatch, mark)
    store = tiny_run_dir(tmp_path)
    with ForkServer(tmp_path / "server", lm_eval=tasks) as server:
        server.prestart(cell_env())
        assert server.wait_ready(120)
        facts = run_in_process(store, tiny_plan(store), server)   # generation only
    assert facts["process"]["forked"] is True and facts["complete"] and facts["process"]["exit_code"] == 0
    assert mark.exists() is tasks


def test_a_job_forked_from_the_server_fails_in_its_own_words_and_the_server_serves_on(tmp_path):
    # The K/V range pass (run/diagnosis.py) on a model that is not there: it ends at its own input check.
    # That a forked pass measures what one in a process of its own does: tests/integration/test_kv_ranges_model.py.
    run = RunDir(tmp_path / "run")
    run.path.mkdir(parents=True)
    write_json_atomic(run.scoring_path, [{"id": "doc", "token_ids": list(range(100, 260))}])
    with ForkServer(tmp_path / "server", lm_eval=False) as server:
        server.prestart(cell_env())
        diagnosis.run_diagnosis(run, ModelSource(path=str(tmp_path / "no-model")), None,
                                SimpleNamespace(note=lambda message: None), fork=(server, cell_env()))
        (pid,) = server.server.started
        assert server.server.exits == {pid: 2} and gone(pid)
        facts = run_in_process(tiny_run_dir(tmp_path / "cell"), tiny_plan(run), server)
        assert facts["process"]["forked"] is True and facts["complete"]   # still serving
    error = json.loads(run.kv_ranges_path.read_text())["error"]
    assert error.startswith("the K/V range pass failed: kveval.worker.kv_ranges: error:") and "no-model" in error
    assert not list((tmp_path / "server").glob(".kv-ranges-*")) and not list((tmp_path / "server").glob(".job-*"))
