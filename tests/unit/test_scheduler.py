"""The multi-GPU scheduler (run/devices.py, run/parallel.py) with a stand-in for the cell process:
which device each cell gets, what runs at once, the scoring reference first, failures and stops."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import pytest

from kveval.errors import KvevalError
from kveval.run.devices import DevicePool, devices_per_cell, resolve_gpus
from kveval.run.parallel import run_in_parallel


@dataclass
class Plan:
    id: str


class Recorder:
    """run_one stand-in: sleeps per cell, records (cell, devices, start, end)."""

    def __init__(self, seconds: dict[str, float], fail: str | None = None):
        self.seconds, self.fail, self.spans, self.lock = seconds, fail, [], threading.Lock()

    def __call__(self, plan, env, stop):
        began = time.monotonic()
        if plan.id == self.fail:
            raise KvevalError(f"{plan.id}: vLLM rejected --engine-arg")
        while time.monotonic() - began < self.seconds.get(plan.id, 0.05) and not stop.is_set():
            time.sleep(0.01)
        with self.lock:
            self.spans.append((plan.id, env["CUDA_VISIBLE_DEVICES"], began, time.monotonic()))

    def overlapping(self, a: str, b: str) -> bool:
        (_, _, a0, a1), (_, _, b0, b1) = (next(s for s in self.spans if s[0] == x) for x in (a, b))
        return a0 < b1 and b0 < a1


def test_gpus_are_resolved_and_checked():
    assert resolve_gpus(None, 2) is None
    assert resolve_gpus(["all"], 3) == ["0", "1", "2"]
    assert resolve_gpus(["1", "0", "1"], 2) == ["1", "0"]
    with pytest.raises(KvevalError, match="has 2 GPU"):
        resolve_gpus(["2"], 2)
    with pytest.raises(KvevalError, match="no GPU"):
        resolve_gpus(["0"], 0)
    with pytest.raises(KvevalError, match="device indices"):
        resolve_gpus(["gpu0"], 2)
    assert devices_per_cell({}) == 1 and devices_per_cell({"tensor_parallel_size": 2}) == 2
    assert devices_per_cell({"tensor-parallel-size": 2, "pipeline_parallel_size": 2}) == 4


def test_the_reference_runs_alone_then_cells_share_the_devices_one_each():
    plans = [Plan("auto-1024"), Plan("fp8-1024"), Plan("auto-2048"), Plan("fp8-2048")]
    run = Recorder({"auto-1024": 0.2, "fp8-1024": 0.3, "auto-2048": 0.3, "fp8-2048": 0.1})
    run_in_parallel(plans, ["0", "1"], 1, run, first="auto-1024")
    assert sorted(s[0] for s in run.spans) == sorted(p.id for p in plans)        # each once
    assert not any(run.overlapping("auto-1024", other) for other in ("fp8-1024", "auto-2048", "fp8-2048"))
    assert run.overlapping("fp8-1024", "auto-2048")
    devices = {cell: dev for cell, dev, _, _ in run.spans}
    assert devices["fp8-1024"] != devices["auto-2048"]
    for a, b in (("fp8-1024", "auto-2048"), ("fp8-1024", "fp8-2048"), ("auto-2048", "fp8-2048")):
        if run.overlapping(a, b):
            assert devices[a] != devices[b]


def test_a_tensor_parallel_cell_takes_both_devices():
    run = Recorder({})
    run_in_parallel([Plan("a"), Plan("b")], ["0", "1"], 2, run)
    assert {dev for _, dev, _, _ in run.spans} == {"0,1"} and not run.overlapping("a", "b")


def test_a_cell_that_ends_early_frees_its_device_for_the_next():
    # "quick" fails to start at once on one device while "slow" goes on on the other.
    run = Recorder({"slow": 0.5, "quick": 0.01, "next": 0.01})
    run_in_parallel([Plan("slow"), Plan("quick"), Plan("next")], ["0", "1"], 1, run)
    devices = {cell: dev for cell, dev, _, _ in run.spans}
    assert run.overlapping("slow", "next") and devices["next"] == devices["quick"] != devices["slow"]


def test_a_usage_error_in_one_cell_stops_the_others_and_is_raised():
    run = Recorder({"long": 5.0}, fail="bad")
    began = time.monotonic()
    with pytest.raises(KvevalError, match="bad: vLLM rejected"):
        run_in_parallel([Plan("long"), Plan("bad"), Plan("never")], ["0", "1"], 1, run)
    assert time.monotonic() - began < 3 and "never" not in {s[0] for s in run.spans}


def test_the_pool_hands_out_the_lowest_free_devices_and_can_be_stopped():
    pool = DevicePool(["0", "1", "2"])
    assert pool.take(2) == ["0", "1"]
    stop = threading.Event()
    stop.set()
    assert pool.take(2, stop) is None          # only "2" is free
    pool.give(["0"])
    assert pool.take(2) == ["0", "2"]


def test_a_device_freed_after_the_stop_goes_to_no_waiting_cell():
    # A failing cell sets `stop`, then frees its device: the cell waiting for one must not start.
    pool, stop, got = DevicePool(["0"]), threading.Event(), []
    assert pool.take(1) == ["0"]
    waiting = threading.Thread(target=lambda: got.append(pool.take(1, stop)))
    waiting.start()
    time.sleep(0.1)   # it waits in take
    stop.set()
    pool.give(["0"])
    waiting.join(5)
    assert got == [None]
    assert pool.take(1, stop) is None            # a free device, but stopped
