"""GPUs of any vendor (issue 38): run/environment lists them from nvidia-smi, else rocm-smi, else amd-smi,
else torch on ROCm (in a child); `--gpus` and the cells' device variables work on AMD; the platform
profile treats an AMD host as a GPU and says the GPU budgets were calibrated on NVIDIA FA3 only.
No tool is run here: shutil.which and subprocess.run are faked."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from kveval.errors import KvevalError
from kveval.evidence import platform_profile
from kveval.files import schema
from kveval.run import environment, gpu_inventory, host_platform
from kveval.run.devices import resolve_gpus, visible_devices_env
from tests.support.constructed import complete_cells, planned_manifest
from tests.support.evidence import typed_cells, typed_manifest

NVIDIA_SMI = "NVIDIA H100 80GB HBM3, 81559 MiB, 580.159.04\nNVIDIA H100 80GB HBM3, 81559 MiB, 580.159.04\n"

# rocm-smi --showproductname --showmeminfo vram --csv on two MI300X (ROCm 6.2), a warning line first.
ROCM_SMI_CSV = """\
WARNING: AMD GPU device(s) is/are in a low-power state. Check power control/runtime_status

device,VRAM Total Memory (B),VRAM Total Used Memory (B),Card Series,Card Model,Card Vendor,Card SKU,Subsystem ID,Device Rev,Node ID,GUID,GFX Version
card0,206141652992,295915520,AMD Instinct MI300X,0x74a1,"Advanced Micro Devices, Inc. [AMD/ATI]",M3000100,0x74a1,0x00,2,28851,gfx942
card1,206141652992,295915520,AMD Instinct MI300X,0x74a1,"Advanced Micro Devices, Inc. [AMD/ATI]",M3000100,0x74a1,0x00,3,51499,gfx942
"""

# Older rocm-smi (ROCm 5): lower-case headers, product in "Card series", the vendor's comma unquoted.
ROCM_SMI_CSV_OLD = """\
device,Card series,Card model,Card vendor,Card SKU,VRAM Total Memory (B),VRAM Total Used Memory (B)
card0,Arcturus GL-XL [Instinct MI100],0x0c34,Advanced Micro Devices, Inc. [AMD/ATI],D3430401,34342961152,6754304
"""

AMD_SMI_JSON = json.dumps([{"gpu": 0, "asic": {"market_name": "AMD Instinct MI250X", "vendor_id": "0x1002"},
                            "vram": {"type": "HBM", "size": {"value": 65520, "unit": "MB"}},
                            "driver": {"name": "amdgpu", "version": "6.8.5"}}])


GPU_TOOLS = ("nvidia-smi", "rocm-smi", "amd-smi", "torch")


class FakeHost:
    """The tools this host has: command name -> its stdout, or an exception its run raises. Records what
    was run, so a test can tell that a later way (torch) was never tried."""

    def __init__(self, monkeypatch, tools: dict[str, str | BaseException], kfd: bool = False):
        self.tools, self.ran = tools, []
        self.real_which, self.real_run = shutil.which, subprocess.run
        monkeypatch.setattr(shutil, "which", self.which)
        monkeypatch.setattr(subprocess, "run", self.run)
        monkeypatch.setattr(gpu_inventory, "_KFD", "/" if kfd else "/nonexistent/kfd")

    def which(self, name, *args, **kwargs):
        if name not in GPU_TOOLS:   # platform.* asks for uname: the real one
            return self.real_which(name, *args, **kwargs)
        return f"/usr/bin/{name}" if name in self.tools else None

    def run(self, command, *args, **kwargs):
        torch = command[0] == sys.executable and command[1:2] == ["-c"] and "import torch" in command[2]
        name = "torch" if torch else command[0]
        if name not in GPU_TOOLS:
            return self.real_run(command, *args, **kwargs)
        self.ran.append(name)
        answer = self.tools[name]
        if isinstance(answer, BaseException):
            raise answer
        return subprocess.CompletedProcess(command, 0, stdout=answer, stderr="")


@pytest.fixture(autouse=True)
def rocm_install(tmp_path, monkeypatch):
    """A ROCm install whose version file says 6.2.0 (build suffix dropped); gpu_vendor's cache emptied."""
    (tmp_path / ".info").mkdir()
    (tmp_path / ".info" / "version").write_text("6.2.0-66\n")
    monkeypatch.setenv("ROCM_PATH", str(tmp_path))
    cached = environment.gpu_vendor   # a test may stand in for it: clear the real one's cache
    cached.cache_clear()
    # The smi tools are what these tests are about: vLLM's platform layer has no answer here
    # (test_host_platform.py tests that way).
    monkeypatch.setattr(host_platform, "host_platform", lambda: None)
    monkeypatch.setattr(environment, "host_platform", lambda: None)
    yield
    cached.cache_clear()


def test_nvidia_smi_lines_are_kept_and_nothing_else_is_asked(monkeypatch):
    host = FakeHost(monkeypatch, {"nvidia-smi": NVIDIA_SMI, "rocm-smi": ROCM_SMI_CSV}, kfd=True)
    assert environment.gpu_inventory() == (["NVIDIA H100 80GB HBM3, 81559 MiB, 580.159.04"] * 2, "nvidia")
    assert host.ran == ["nvidia-smi"]


def test_rocm_smi_alone_lists_amd_gpus_like_nvidia_smi_lines(monkeypatch):
    host = FakeHost(monkeypatch, {"rocm-smi": ROCM_SMI_CSV, "amd-smi": AMD_SMI_JSON, "torch": ""}, kfd=True)
    assert environment.gpu_inventory() == (["AMD Instinct MI300X, 196592 MiB, ROCm 6.2.0"] * 2, "amd")
    assert host.ran == ["rocm-smi"]   # torch is never imported once rocm-smi answered
    hardware = environment.describe()["hardware"]
    assert hardware["gpu_vendor"] == "amd" and len(hardware["gpus"]) == 2
    assert schema.Hardware.model_validate(hardware).gpu_vendor == "amd"


def test_older_rocm_smi_csv_with_an_unquoted_vendor_comma(monkeypatch):
    FakeHost(monkeypatch, {"rocm-smi": ROCM_SMI_CSV_OLD})
    assert environment.gpu_names() == ["Arcturus GL-XL [Instinct MI100], 32752 MiB, ROCm 6.2.0"]


def test_amd_smi_when_rocm_smi_is_missing(monkeypatch):
    FakeHost(monkeypatch, {"amd-smi": AMD_SMI_JSON})
    assert environment.gpu_inventory() == (["AMD Instinct MI250X, 65520 MiB, ROCm 6.2.0"], "amd")


def test_torch_on_rocm_last_in_a_child_process(monkeypatch):
    host = FakeHost(monkeypatch, {"torch": "AMD Instinct MI210\t65520\tROCm 6.1.40091\n"}, kfd=True)
    assert environment.gpu_inventory() == (["AMD Instinct MI210, 65520 MiB, ROCm 6.2.0"], "amd")
    assert host.ran == ["torch"]   # run with sys.executable: this process never imports torch


def test_no_gpu_tool_and_no_rocm_driver_is_no_gpu(monkeypatch):
    host = FakeHost(monkeypatch, {})
    assert environment.gpu_inventory() == ([], None)
    assert environment.gpu_vendor() is None
    assert host.ran == []   # without /dev/kfd a CPU host does not pay for importing torch


def test_tools_that_fail_hang_or_print_garbage_mean_no_gpu(monkeypatch):
    host = FakeHost(monkeypatch, {
        "nvidia-smi": subprocess.TimeoutExpired(["nvidia-smi"], 20),
        "rocm-smi": subprocess.CalledProcessError(2, ["rocm-smi"]),
        "amd-smi": "not json {",
        "torch": OSError("no such interpreter")}, kfd=True)
    assert environment.gpu_inventory() == ([], None)
    assert host.ran == ["nvidia-smi", "rocm-smi", "amd-smi", "torch"]   # each way tried, none raised


def test_a_tool_answering_without_a_gpu_row_falls_through(monkeypatch):
    FakeHost(monkeypatch, {"nvidia-smi": "", "rocm-smi": "WARNING: No AMD GPUs specified\n", "amd-smi": AMD_SMI_JSON})
    assert environment.gpu_inventory()[1] == "amd"


def test_gpus_refused_without_a_gpu_in_one_line_naming_every_tool():
    with pytest.raises(KvevalError) as refused:
        resolve_gpus(["0"], 0)
    message = str(refused.value)
    assert "\n" not in message and "rocm-smi" in message and "nvidia-smi" in message
    assert resolve_gpus(["all"], 2) == ["0", "1"]   # two AMD GPUs listed by rocm-smi are two devices


def test_amd_cells_get_hip_visible_devices_too(monkeypatch):
    assert visible_devices_env(["0", "1"], "amd") == {"CUDA_VISIBLE_DEVICES": "0,1", "HIP_VISIBLE_DEVICES": "0,1"}
    assert visible_devices_env(["1"], "nvidia") == {"CUDA_VISIBLE_DEVICES": "1"}
    assert visible_devices_env(["1"], None) == {"CUDA_VISIBLE_DEVICES": "1"}
    from kveval.run import parallel, starter

    monkeypatch.setattr(environment, "gpu_vendor", lambda: "amd")
    monkeypatch.setattr(parallel, "gpu_vendor", lambda: "amd")
    assert starter.cells_env(["2"]) == {"CUDA_VISIBLE_DEVICES": "2", "HIP_VISIBLE_DEVICES": "2"}
    seen = []
    parallel.run_in_parallel([type("Plan", (), {"id": "a"})()], ["3"], 1, lambda plan, env, stop: seen.append(env))
    assert seen == [{"CUDA_VISIBLE_DEVICES": "3", "HIP_VISIBLE_DEVICES": "3"}]


def _profile(hardware: dict, backend: str | None) -> dict:
    cells = complete_cells({"auto-1024": {"kv_spec": "auto", "max_model_len": 1024, "started": True,
                                          "info": {"attention_backend": backend}}})
    manifest = planned_manifest([{"id": "auto-1024", "kv_spec": "auto", "max_model_len": 1024}])
    manifest["versions"].update(vllm="0.11.0+rocm", vllm_distribution="vllm", torch="2.8.0+rocm6.4")
    manifest["hardware"].update(hardware)
    return platform_profile(typed_manifest(manifest), typed_cells(cells))


CAVEAT = "budgets calibrated on NVIDIA FA3 (H100/H200) only"


def test_an_amd_host_gets_the_gpu_profile_with_the_calibration_caveat():
    amd = _profile({"gpus": ["AMD Instinct MI300X, 196592 MiB, ROCm 6.2.0"], "gpu_vendor": "amd"}, "ROCM_AITER_FA")
    assert amd["profile"] == "gpu"
    assert amd["why"].startswith("GPU AMD Instinct MI300X, 196592 MiB, ROCm 6.2.0 (ROCM_AITER_FA)")
    assert amd["why"].endswith(f"; {CAVEAT}, not on this GPU's kernels")


def test_nvidia_fa3_and_older_manifests_keep_their_why():
    nvidia = _profile({"gpus": ["NVIDIA H100 80GB HBM3, 81559 MiB, 580.159.04"], "gpu_vendor": "nvidia"}, "FLASH_ATTN")
    assert nvidia == {"profile": "gpu", "why": "GPU NVIDIA H100 80GB HBM3, 81559 MiB, 580.159.04 (FLASH_ATTN)"}
    older = _profile({"gpus": ["NVIDIA H200, 143771 MiB, 580.159.04"]}, "TRITON_ATTN")   # no gpu_vendor key
    assert older["profile"] == "gpu" and CAVEAT not in older["why"]
    rocm_backend = _profile({"gpus": ["AMD Instinct MI250X"]}, "ROCM_ATTN")   # vendor unknown, ROCm kernels
    assert CAVEAT in rocm_backend["why"]
    cpu = _profile({"gpus": [], "gpu_vendor": None}, "CPU_ATTN")
    assert cpu["profile"].startswith("cpu") and CAVEAT not in cpu["why"]
