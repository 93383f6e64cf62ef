"""How cells run one after another on this host get their process: the fork server or the process
started ahead (run/fork_server.py, run/warm_process.py), and the environment every cell gets."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from kveval.run import environment
from kveval.run.devices import devices_per_cell, visible_devices_env
from kveval.run.fork_server import ForkServer, fork_cells_enabled
from kveval.run.options import CompareOptions
from kveval.run.warm_process import WarmProcess, warm_cells_enabled


def cells_env(devices: list[str] | None, base_env: dict[str, str] | None = None) -> dict[str, str | None] | None:
    """What cells one after another on this host change in this process's environment: the devices they
    share, and with `base_env` (the environment when the run began) whatever the parent's own imports have
    set since (sklearn's KMP_INIT_AT_FORK, say) undone, so every cell, and the process started for it ahead,
    gets the same environment."""
    extra: dict[str, str | None] = {}
    if base_env is not None:
        extra.update({name: None for name in os.environ if name not in base_env})
        extra.update({name: value for name, value in base_env.items() if os.environ.get(name) != value})
    if devices:
        extra.update(visible_devices_env(devices, environment.gpu_vendor()))
    return extra or None


def cell_starter(options: CompareOptions, devices: list[str] | None, gpu_host: bool) -> WarmProcess | ForkServer | None:
    """How cells run one after another on this host get their process without importing afresh: forked from
    a fork server (by default without a GPU: run/fork_server.py) or started ahead (with one: run/warm_process.py).
    None for Ray and for cells at once on several devices."""
    if options.executor == "ray" or (devices and len(devices) > devices_per_cell(options.engine_args)):
        return None
    if fork_cells_enabled(gpu_host):
        return ForkServer(Path(tempfile.mkdtemp(prefix="kveval-cells-")), lm_eval="tasks" in options.phases)
    if warm_cells_enabled(gpu_host):
        return WarmProcess(Path(tempfile.mkdtemp(prefix="kveval-cells-")), lm_eval="tasks" in options.phases)
    return None


def end_starter(starter: WarmProcess | ForkServer | None) -> None:
    """End the waiting process or the fork server, and remove its directory of logs."""
    if starter is not None:
        starter.close()
        shutil.rmtree(starter.directory, ignore_errors=True)
