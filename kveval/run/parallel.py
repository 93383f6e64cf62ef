"""Cells at once, one per free device: the parent starts each cell's process in its own thread.

Cells are started in plan order as devices free up, so which cell gets which device is the same
from run to run when cells take the same time. A cell that fails (to start, or crashes) only frees its
device. Ctrl-C stops every running cell as interrupted — each is recorded like a sequential run's —
and then stops the run.
"""
from __future__ import annotations

import threading
from typing import Callable, Sequence

from kveval.run.devices import DevicePool, visible_devices_env
from kveval.run.gpu_inventory import gpu_vendor


def run_in_parallel(plans: Sequence, devices: Sequence[str] | None, per_cell: int,
                    run_one: Callable[..., None], first: str | None = None, *, visible: bool = True) -> None:
    """run_one(plan, env, stop) for every plan; `first` (a plan id) runs alone before the others.
    devices=None: no limit here (an executor that places cells itself, Ray, queues them), env None.
    visible=False: `devices` are only slots, handed out in plan order; env None."""
    pool, stop = (DevicePool(devices) if devices is not None else _NoLimit()), threading.Event()
    errors: list[BaseException] = []
    threads: list[threading.Thread] = []

    def work(plan, taken: list[str]) -> None:
        try:
            run_one(plan, visible_devices_env(taken, gpu_vendor()) if devices is not None and visible else None, stop)
        except BaseException as error:  # noqa: BLE001 - handed to the main thread, which re-raises it
            errors.append(error)
            stop.set()
        finally:
            pool.give(taken)

    def start(plan) -> threading.Thread | None:
        taken = pool.take(per_cell, stop)
        if taken is None:
            return None
        thread = threading.Thread(target=work, args=(plan, taken), name=f"cell {plan.id}", daemon=True)
        thread.start()
        threads.append(thread)
        return thread

    try:
        ordered = sorted(plans, key=lambda p: p.id != first) if first else list(plans)
        for index, plan in enumerate(ordered):
            if stop.is_set():
                break
            thread = start(plan)
            if first and index == 0 and thread is not None:
                _join(thread)  # every other cell scores the reference's outputs
        for thread in threads:
            _join(thread)
    except KeyboardInterrupt:
        stop.set()
        for thread in threads:
            thread.join()
        raise
    if errors:
        raise errors[0]


def _join(thread: threading.Thread) -> None:
    # In slices, so Ctrl-C reaches the main thread while it waits.
    while thread.is_alive():
        thread.join(timeout=0.2)


class _NoLimit:
    """A pool that never makes a cell wait (the executor behind run_one does the placing)."""

    def take(self, count: int, stop: threading.Event | None = None) -> list[str] | None:
        return None if stop is not None and stop.is_set() else []

    def give(self, devices: Sequence[str]) -> None:
        pass
