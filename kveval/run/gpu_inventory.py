"""This host's GPUs, whichever vendor: nvidia-smi, else rocm-smi, amd-smi or torch on ROCm (in a child), as
lines shaped like nvidia-smi's ("NAME, MEMORY MiB, DRIVER") and the vendor. Never raises: a missing tool, an
error, a time-out or unreadable output is "no GPU found that way"."""
from __future__ import annotations

import csv
import functools
import json
import os
import shutil
import subprocess
import sys
from typing import Callable, Literal

GpuVendor = Literal["nvidia", "amd"]
_SMI_TIMEOUT_S = 20
_TORCH_TIMEOUT_S = 60   # a cold `import torch` takes seconds, more on a busy host
_KFD = "/dev/kfd"       # the ROCm kernel driver's device


def gpu_names() -> list[str]:
    """This host's GPUs, one "NAME, MEMORY MiB, DRIVER" line each, whichever vendor ([] without one)."""
    return gpu_inventory()[0]


def gpu_inventory() -> tuple[list[str], GpuVendor | None]:
    """The GPU lines and their vendor: nvidia-smi, else rocm-smi, else amd-smi, else torch on ROCm.

    The first way that lists a GPU wins, so torch is never imported where an smi tool answered. No way
    raises: a missing tool, an error, a time-out or output it cannot read is "no GPU found that way"."""
    for vendor, probe in _PROBES:
        try:
            lines = probe()
        except Exception:  # noqa: BLE001 - a probe that breaks must not stop a run on a CPU host
            lines = []
        if lines:
            return lines, vendor
    return [], None


@functools.lru_cache(maxsize=1)
def gpu_vendor() -> GpuVendor | None:
    """The vendor of this host's GPUs, probed once per process: cells' device variables ask it often.
    Where no smi tool lists them, vLLM's platform layer names it (run/host_platform.py)."""
    from kveval.run.host_platform import VENDORS, host_platform

    vendor = gpu_inventory()[1]
    if vendor is None:
        vendor = VENDORS.get((host_platform() or {}).get("platform"))
    return vendor  # type: ignore[return-value]


def _command_output(command: list[str], timeout: float = _SMI_TIMEOUT_S) -> str | None:
    """The command's stdout, or None when it is not installed, fails or hangs."""
    if not shutil.which(command[0]):
        return None
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=True).stdout
    except (subprocess.SubprocessError, OSError, ValueError):
        return None


def _nvidia_gpus() -> list[str]:
    out = _command_output(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"])
    return [line.strip() for line in (out or "").splitlines() if line.strip()]


def _gpu_line(name: str, memory_mib: int | None, version: str | None) -> str:
    """One line shaped like nvidia-smi's ("NAME, MEMORY MiB, DRIVER"), leaving out what is unknown."""
    parts = [name] + ([f"{memory_mib} MiB"] if memory_mib else []) + ([version] if version else [])
    return ", ".join(parts)


def _rocm_version() -> str | None:
    """The ROCm install's version ("ROCm 6.2.0"), standing where nvidia-smi's line has the driver's."""
    for root in (os.environ.get("ROCM_PATH"), "/opt/rocm"):
        try:
            with open(os.path.join(root, ".info", "version"), encoding="utf-8") as handle:
                text = handle.read().strip().split("-")[0]
        except (OSError, TypeError):
            continue
        if text:
            return f"ROCm {text}"
    return None


def _known(value: object) -> str | None:
    """A name field's text, or None for rocm-smi's and amd-smi's placeholders and bare PCI ids (0x74a1)."""
    text = str(value or "").strip()
    if not text or text.upper() in ("N/A", "NA", "UNKNOWN") or text.lower().startswith("0x"):
        return None
    return text


def _csv_rows(text: str) -> list[dict[str, str]]:
    """rocm-smi --csv tables as rows keyed by lower-cased header; a header row starts with "device"
    and rows of one device in several tables are merged. Warnings around the table are skipped."""
    rows: dict[str, dict[str, str]] = {}
    header: list[str] | None = None
    for fields in csv.reader(line for line in text.splitlines() if line.strip()):
        first = fields[0].strip().lower() if fields else ""
        if first == "device":
            header = [f.strip().lower() for f in fields]
        elif header and first.startswith("card"):
            rows.setdefault(first, {}).update(zip(header, _fit(fields, header)))
    return list(rows.values())


def _fit(fields: list[str], header: list[str]) -> list[str]:
    """Fields lined up with the header when an unquoted vendor name ("Advanced Micro Devices, Inc.")
    split into more fields than the header has: the surplus is joined back into the vendor column."""
    surplus = len(fields) - len(header)
    if surplus <= 0 or "card vendor" not in header:
        return [f.strip() for f in fields]
    at = header.index("card vendor")
    return [f.strip() for f in fields[:at] + [",".join(fields[at:at + surplus + 1])] + fields[at + surplus + 1:]]


def _rocm_smi_gpus() -> list[str]:
    out = _command_output(["rocm-smi", "--showproductname", "--showmeminfo", "vram", "--csv"])
    if not out:
        return []
    version = _rocm_version()
    lines = []
    for row in _csv_rows(out):
        # Newer rocm-smi: "Device Name"/"Card Series" hold the product, "Card Model" a PCI id; older: "Card series".
        names = (_known(row.get(k)) for k in ("device name", "card series", "card model", "marketing name"))
        name = next((n for n in names if n), None)
        total = (row.get("vram total memory (b)") or "").strip()
        lines.append(_gpu_line(name or "AMD GPU", int(total) // 2**20 if total.isdigit() else None, version))
    return lines


def _mib(size: object) -> int | None:
    """amd-smi's VRAM size, in MiB: {"value": 196592, "unit": "MB"}, "196592 MB" or a bare number (MB)."""
    if isinstance(size, dict):
        value, unit = size.get("value"), str(size.get("unit") or "MB")
    else:
        value, _, unit = str(size or "").strip().partition(" ")
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    # amd-smi's "MB" are MiB (an MI300X reports 196592); GB likewise GiB.
    return int(number * 1024) if unit.strip().upper().startswith("G") else int(number)


def _amd_smi_gpus() -> list[str]:
    out = _command_output(["amd-smi", "static", "--json"])
    if not out:
        return []
    data = json.loads(out)
    # A list of GPUs, or (newer amd-smi) a dict holding that list.
    gpus = data if isinstance(data, list) else next((v for v in data.values() if isinstance(v, list)), [])
    version = _rocm_version()
    lines = []
    for gpu in gpus:
        if not isinstance(gpu, dict):
            continue
        asic, board = gpu.get("asic") or {}, gpu.get("board") or {}
        name = _known(asic.get("market_name")) or _known(board.get("product_name")) or "AMD GPU"
        driver = _known((gpu.get("driver") or {}).get("version"))
        lines.append(_gpu_line(name, _mib((gpu.get("vram") or {}).get("size")),
                               version or (f"driver {driver}" if driver else None)))
    return lines


# Run in a child so the parent never holds a HIP context (GPU memory) or pays for importing torch.
_TORCH_HIP_SCRIPT = """
import torch
if torch.version.hip and torch.cuda.is_available():
    for i in range(torch.cuda.device_count()):
        memory = torch.cuda.get_device_properties(i).total_memory // 2**20
        print(f"{torch.cuda.get_device_name(i)}\t{memory}\tROCm {torch.version.hip}")
"""


def _torch_hip_gpus() -> list[str]:
    # /dev/kfd is the ROCm kernel driver's device: without it no AMD GPU is reachable, and a CPU host
    # pays no torch import for nothing.
    if not os.path.exists(_KFD):
        return []
    try:
        out = subprocess.run([sys.executable, "-c", _TORCH_HIP_SCRIPT], capture_output=True, text=True,
                             timeout=_TORCH_TIMEOUT_S, check=True).stdout
    except (subprocess.SubprocessError, OSError, ValueError):
        return []
    lines = []
    for row in out.splitlines():
        name, _, rest = row.partition("\t")
        memory, _, version = rest.partition("\t")
        if name.strip():
            lines.append(_gpu_line(name.strip(), int(memory) if memory.isdigit() else None,
                                   _rocm_version() or version.strip() or None))
    return lines


_PROBES: tuple[tuple[GpuVendor, Callable[[], list[str]]], ...] = (
    ("nvidia", _nvidia_gpus), ("amd", _rocm_smi_gpus), ("amd", _amd_smi_gpus), ("amd", _torch_hip_gpus))
