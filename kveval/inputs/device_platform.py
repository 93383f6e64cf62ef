"""What vLLM's platform layer says about the device: which platform (cuda, rocm, cpu, xpu, ...), the
device's name, its compute capability and how many devices it sees (issue 38).

`describe_platform` reads a `vllm.platforms.current_platform` handed to it; it imports no vLLM itself,
so the cell (worker/engine.py) and the host's probe (run/host_platform.py, in a child process) read the
object the same way, and tests hand it a stand-in. Internals differ between vLLM releases (0.26 on the
GPU hosts, 0.32 here), so every attribute is asked defensively: what cannot be read is None.
"""
from __future__ import annotations

from typing import Any, Optional

# vLLM's PlatformEnum names, lower-cased, and the is_* methods that say the same on a release whose
# platform lacks `_enum`. ROCm's device_type is "cuda" (torch's name for its devices), so device_type is
# the last resort only.
_KIND_CHECKS = (("rocm", "is_rocm"), ("cuda", "is_cuda"), ("xpu", "is_xpu"), ("tpu", "is_tpu"), ("cpu", "is_cpu"),
                ("oot", "is_out_of_tree"))


def platform_kind(platform: Any) -> str:
    """cuda, rocm, cpu, xpu, tpu, oot (an out-of-tree plugin) or unspecified (also: nothing to tell by)."""
    enum = getattr(platform, "_enum", None)
    name = getattr(enum, "name", None)
    if isinstance(name, str) and name:
        return name.lower()
    for kind, check in _KIND_CHECKS:
        try:
            if callable(getattr(platform, check, None)) and getattr(platform, check)():
                return kind
        except Exception:  # noqa: BLE001 - a release whose check needs a device
            continue
    return str(getattr(platform, "device_type", "") or "unspecified")


def _capability(platform: Any) -> Optional[str]:
    """"9.0" from get_device_capability() (a DeviceCapability or a (major, minor) pair); None on a CPU."""
    try:
        value = platform.get_device_capability()
    except Exception:  # noqa: BLE001 - NotImplementedError on some platforms, NVML errors on others
        return None
    if value is None:
        return None
    if callable(getattr(value, "as_version_str", None)):
        return str(value.as_version_str())
    major, minor = getattr(value, "major", None), getattr(value, "minor", None)
    if major is None and isinstance(value, (tuple, list)) and len(value) == 2:
        major, minor = value
    return f"{major}.{minor}" if major is not None and minor is not None else None


def _device_name(platform: Any, kind: str) -> Optional[str]:
    """The device's name (NVIDIA H100 80GB HBM3, AMD Instinct MI300X); on a CPU the CPU's model, since
    vLLM's CPU platform answers just "cpu"."""
    if kind == "cpu":
        return cpu_model()
    try:
        name = platform.get_device_name()
    except Exception:  # noqa: BLE001 - NotImplementedError, NVML/amdsmi errors
        return None
    text = str(name or "").strip()
    return text or None


def _device_count(platform: Any, kind: str) -> Optional[int]:
    """Devices vLLM sees (in the visible namespace); 0 on a CPU; None where the platform cannot say."""
    if kind == "cpu":
        return 0
    try:
        count = platform.device_count()
    except Exception:  # noqa: BLE001 - not every platform has it
        return None
    return int(count) if isinstance(count, int) and not isinstance(count, bool) else None


def describe_platform(platform: Any) -> dict[str, Any]:
    """{platform, device_name, device_capability, device_count} of vLLM's current platform object."""
    kind = platform_kind(platform)
    return {"platform": kind, "device_name": _device_name(platform, kind),
            "device_capability": None if kind == "cpu" else _capability(platform),
            "device_count": _device_count(platform, kind)}


def cpu_model() -> Optional[str]:
    """The CPU's model name from /proc/cpuinfo, or None where it cannot be read."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip() or None
    except OSError:
        pass
    return None
