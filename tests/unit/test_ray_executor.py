"""--executor ray, its pure parts: which files go to a node and which come back, the record of a
cell whose Ray task died, the options it refuses, and the no-limit scheduling Ray's queue relies on.
The real Ray run (a local cluster, real CPU cells) is tests/integration/test_ray_engine.py."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import pytest
from click.testing import CliRunner

from kveval.cli.commands import cli
from kveval.files.rundir import RunDir, write_json_atomic
from kveval.inputs.kvspec import KVSpec
from kveval.run.cell_process import CellPlan
from kveval.run.parallel import run_in_parallel
from kveval.run.ray_executor import cell_files, lost_task_record, run_input_files, unpack_files
from kveval.files.startup_failure import TRANSIENT_REASONS


def _run_dir(tmp_path) -> RunDir:
    run = RunDir(tmp_path / "run")
    write_json_atomic(run.manifest_path, {"cells": [{"id": "auto-512"}, {"id": "fp8-512"}]})
    write_json_atomic(run.workloads_path, [{"id": "p"}])
    write_json_atomic(run.scoring_path, [{"id": "d"}])
    (run.path / RunDir.TASK_DATA_DIR / "niah").mkdir(parents=True)
    (run.path / RunDir.TASK_DATA_DIR / "niah" / "test.jsonl").write_text('{"x": 1}\n')
    write_json_atomic(run.cell_path("auto-512"), {"cell": "auto-512", "complete": True})
    run.cell_log_path("auto-512").write_text("vLLM log\n")
    run.cell_events_path("auto-512").write_text('{"event": "phase"}\n')
    write_json_atomic(run.cell_spec_path("auto-512"), {"run_dir": "/elsewhere"})
    return run


def test_a_node_gets_what_cells_read_and_not_other_cells_logs(tmp_path):
    files = run_input_files(_run_dir(tmp_path))
    assert set(files) == {"manifest.json", RunDir(tmp_path).workloads_path.name, RunDir(tmp_path).scoring_path.name,
                          "taskdata/niah/test.jsonl", "cells/auto-512.json"}


def test_a_cells_files_come_back_byte_for_byte_and_only_inside_the_run(tmp_path):
    run = _run_dir(tmp_path)
    back = cell_files(run, "auto-512")
    assert set(back) == {"cells/auto-512.json", "cells/auto-512.log", "cells/auto-512.events.jsonl"}
    driver = tmp_path / "driver"
    unpack_files(back, driver)
    for relative, data in back.items():
        assert (driver / relative).read_bytes() == data
    with pytest.raises(ValueError, match="not inside"):
        unpack_files({"../escaped.json": b"{}"}, driver)
    assert not (tmp_path / "escaped.json").exists()


PLAN = CellPlan("fp8-512", KVSpec("fp8"), 512, {"model": "/m"}, ["generation"])


def test_a_lost_task_is_a_failure_a_resume_redoes_and_keeps_what_was_measured():
    never_started = lost_task_record(None, PLAN, "the Ray task running this cell failed: node died", 3.0)
    assert never_started["failure"]["reason"] == "executor_lost" and "executor_lost" in TRANSIENT_REASONS
    assert never_started["complete"] and not never_started["started"]
    started = {"cell": "fp8-512", "started": True, "phases": {"generation": {"records": [1]}}}
    crashed = lost_task_record(started, PLAN, "the Ray task running this cell failed: node died", 9.0)
    assert crashed["phases"] == started["phases"] and crashed["crash"]["cause"] == "executor_lost"
    interrupted = {"cell": "fp8-512", "complete": True, "process": {"interrupted": True}}
    assert lost_task_record(interrupted, PLAN, "gone", 1.0) is interrupted


@pytest.mark.parametrize("args, fragment", [
    (["--executor", "ray", "--gpus", "0"], "leave --gpus out"),
    (["--ray-address", "auto"], "--ray-address is for --executor ray"),
    (["--executor", "slurm"], "'slurm' is not one of"),
])
def test_ray_options_that_contradict_are_refused(args, fragment, tmp_path):
    result = CliRunner().invoke(cli, ["compare", "--out", str(tmp_path / "o"), *args])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert fragment in result.output, result.output


@dataclass
class Plan:
    id: str


def test_without_a_device_limit_every_cell_runs_at_once_after_the_reference():
    spans, lock = {}, threading.Lock()

    def run(plan, env, stop):
        assert env is None  # Ray sets the task's devices itself
        began = time.monotonic()
        time.sleep(0.2)
        with lock:
            spans[plan.id] = (began, time.monotonic())

    run_in_parallel([Plan("auto-512"), Plan("fp8-512"), Plan("fp8-1024")], None, 1, run, first="auto-512")
    assert spans["auto-512"][1] <= min(spans["fp8-512"][0], spans["fp8-1024"][0])
    assert spans["fp8-512"][0] < spans["fp8-1024"][1] and spans["fp8-1024"][0] < spans["fp8-512"][1]


def test_a_ray_address_nothing_answers_at_is_refused_at_once_not_retried_for_ever():
    import socket

    from kveval.errors import KvevalError
    from kveval.run.ray_executor import check_reachable

    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]  # closed again below: nothing listens there
    began = time.monotonic()
    for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
        with pytest.raises(KvevalError, match=f"nothing answers at 127.0.0.1:{port}"):
            check_reachable(address)
    assert time.monotonic() - began < 10
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        check_reachable(f"127.0.0.1:{listening.getsockname()[1]}")
    for resolved_by_ray in (None, "auto", "local"):
        check_reachable(resolved_by_ray)


def test_slots_that_are_not_devices_run_cells_in_plan_order_without_an_env():
    order = []

    def run(plan, env, stop):
        assert env is None
        order.append(plan.id)
        time.sleep(0.05)

    plans = [Plan("auto-512"), Plan("auto-1024"), Plan("auto-2048")]
    run_in_parallel(plans, ["ray-cpu-node-0"], 1, run, visible=False)
    assert order == ["auto-512", "auto-1024", "auto-2048"]
