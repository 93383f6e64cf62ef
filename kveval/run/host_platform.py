"""This host's platform as vLLM's platform layer sees it (issue 38), asked before any engine starts: which
platform vLLM would run on (cuda, rocm, cpu, xpu, ...), the first device's name and compute capability,
and how many devices vLLM sees. The GPU-or-CPU decisions of a run (the budget, --gpus, the cell
starter) follow it; run/gpu_inventory.py's nvidia-smi / rocm-smi / amd-smi lines still describe the GPUs.

The parent never imports vLLM: a short child (`python -c`, importing vllm.platforms only, ~5 s on the
2-core CPU) prints the answer, read by inputs/device_platform.py as the cell reads it. Asked once per
process. No answer (vLLM not installed, the import fails or hangs past the time-out, the fake engine of
the tests) is None, and the smi tools decide as before.
"""
from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

# vLLM's platform -> the GPU vendor the manifest names, where no smi tool listed the GPUs.
VENDORS = {"cuda": "nvidia", "rocm": "amd"}
PROBE_TIMEOUT_S = 90   # a cold vllm.platforms import takes ~5 s here; a busy or slow disk more

# The child: vLLM's platform object, read by kveval's own reader. Its last line is the JSON answer.
_SCRIPT = """
import json
from vllm.platforms import current_platform
from kveval.inputs.device_platform import describe_platform
print(json.dumps(describe_platform(current_platform)))
"""


def _child_env() -> dict[str, str]:
    """This environment, with the directory holding this kveval first on PYTHONPATH: the child reads the
    platform with this checkout's reader, whether kveval is installed or run from a worktree."""
    root = str(Path(__file__).resolve().parents[2])
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else "")}


def probe_platform(timeout: float = PROBE_TIMEOUT_S) -> Optional[dict[str, Any]]:
    """{platform, device_name, device_capability, device_count} from a child asking vLLM, or None."""
    if os.environ.get("KVEVAL_ENGINE") == "fake":   # the tests' engine: vLLM runs no cell
        return None
    if importlib.util.find_spec("vllm") is None:    # finds the package without importing it
        return None
    try:
        done = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=timeout,
                              env=_child_env())
        lines = done.stdout.strip().splitlines()
        answer = json.loads(lines[-1]) if done.returncode == 0 and lines else None
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    # "unspecified": vLLM found no platform it can run on, which says nothing the smi tools cannot.
    if not isinstance(answer, dict) or not isinstance(answer.get("platform"), str) or answer["platform"] == "unspecified":
        return None
    return {"platform": answer["platform"], "device_name": _text(answer.get("device_name")),
            "device_capability": _text(answer.get("device_capability")),
            "device_count": answer.get("device_count") if isinstance(answer.get("device_count"), int) else None}


def _text(value: Any) -> Optional[str]:
    return str(value) if value not in (None, "") else None


@functools.lru_cache(maxsize=1)
def host_platform() -> Optional[dict[str, Any]]:
    """probe_platform(), asked once per process: the run's set-up and its options both read it."""
    return probe_platform()


def gpu_platform(platform: Optional[dict[str, Any]]) -> Optional[bool]:
    """Whether vLLM runs on a GPU here by that answer (anything but its CPU platform); None: no answer."""
    if not platform:
        return None
    return platform.get("platform") != "cpu"
