"""Which divergence budget was calibrated on a cell's device and attention backend (issue 38). Pure.

The budgets (gate/thresholds.py PROFILES) come from healthy runs on two families only:

- "gpu": NVIDIA compute capability 9.x (H100, H200) on vLLM's FLASH_ATTN backend, which is FA3 there.
  TRITON_ATTN on the same GPUs belongs to it too: a cell that keeps layers in the model dtype runs on it
  by design (worker/engine.py KEPT_LAYERS_GPU_BACKEND), and the published H100/H200 runs that set the
  GPU budget include such cells (Qwen2.5-Coder-1.5B with layers 0, 1 kept: KL mean 0.0077 on TRITON_ATTN,
  reports/h100-qwen2.5-coder-1.5b-8192; SmolLM2 keep=3,17 0.010-0.012, reports/h200-planted-*).
- "cpu": vLLM's CPU platform, whatever its backend is called (CPU_ATTN, TORCH_SDPA); the CPU flags pick
  cpu or cpu-amx (evidence.cpu_profile).

Anything else — FLASHINFER, another backend, FLASH_ATTN on Ada (8.9, FA2) or Blackwell (10.x), any AMD
(ROCm) or Intel (XPU) device, a CUDA device whose capability could not be read — is "uncalibrated": the
GPU budgets were never checked against its kernels, and the gate widens them by the run's own noise floor.
Cells stored before issue 38 name no device: their family is unknown and they are judged as before.
"""
from __future__ import annotations

from typing import Literal, Optional

Family = Literal["gpu", "cpu", "uncalibrated"]

CALIBRATED_GPU_BACKENDS = ("FLASH_ATTN", "TRITON_ATTN")   # on NVIDIA compute capability 9.x only
CALIBRATED_GPU_CAPABILITY_MAJOR = "9"


def backend_family(platform: Optional[str], capability: Optional[str], backend: Optional[str]) -> Family:
    """The family whose budget was calibrated on this platform, device capability and backend."""
    if platform == "cpu":
        return "cpu"
    if (platform == "cuda" and capability and capability.split(".")[0] == CALIBRATED_GPU_CAPABILITY_MAJOR
            and (backend or "").upper() in CALIBRATED_GPU_BACKENDS):
        return "gpu"
    return "uncalibrated"


def where(platform: Optional[str], device: Optional[str], capability: Optional[str], backend: Optional[str]) -> str:
    """"FLASHINFER on NVIDIA L40S (cuda, compute capability 8.9)": a cell's backend and device in a few words."""
    details = [platform or "unknown platform"]
    if capability:
        details.append(f"compute capability {capability}")
    return f"{backend or 'unknown attention backend'} on {device or 'an unnamed device'} ({', '.join(details)})"


# Backends of a hybrid's state layers (Gated DeltaNet, Mamba, short convolutions): they hold no K/V cache, so
# the FP8 cell is judged on its attention layers' backend (a tiny Qwen3-Next on an H100 listed GDN_ATTN first).
STATE_BACKEND_MARKS = ("GDN", "MAMBA", "LINEAR", "SHORT_CONV")


def kv_cache_backend(names: list[str]) -> str | None:
    """The backend of the layers that cache K and V among an engine's attention groups (the first such)."""
    attention = [name for name in names if not any(mark in name.upper() for mark in STATE_BACKEND_MARKS)]
    chosen = attention or names
    return chosen[0] if chosen else None
