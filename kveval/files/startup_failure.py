"""Why a vLLM engine failed to start, from its log text, and the "did not start" record of a cell.

Both the cell process and the parent write that record (the parent when the child died before it
could), so it lives with the run files rather than in worker/ or run/.

Pure text processing (no vLLM import): a cell process captures vLLM's
stdout+stderr, including the engine-core child's log and tracebacks, and the
parent only sees ``RuntimeError: Engine core initialization failed. See root
cause above.``.  The real reason lives in the log, so we read it there.

Wordings were checked against vLLM's own source (vllm 0.32.0 as installed in
this repo's venv, and upstream ``vllm/v1/core/kv_cache_utils.py``,
``vllm/config/model.py``, ``vllm/platforms/{cuda,cpu}.py``,
``vllm/v1/engine/utils.py``) and the texts recorded in
``shared/reference/FACTS.md``.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

REASONS = ("kv_capacity", "model_limit", "unsupported_dtype", "oom", "shared_device", "interrupted", "executor_lost",
           "other")
# Causes that are not properties of the cell's configuration: a resumed run tries such a cell again.
TRANSIENT_REASONS = ("oom", "shared_device", "interrupted", "executor_lost")

# Long enough for vLLM's KV ValueError (≈450 chars) to keep its key numbers.
MAX_MESSAGE_CHARS = 600


@dataclass(frozen=True)
class StartupFailure:
    """Why one engine (KV spec × max_model_len cell) did not start."""

    reason: str  # one of REASONS
    message: str  # vLLM's own words, trimmed to ~MAX_MESSAGE_CHARS
    estimated_max_model_len: int | None  # when vLLM says what length would fit
    backend: str | None  # attention backend named in the log, e.g. FLASH_ATTN

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for JSON reports."""
        return asdict(self)


# --------------------------------------------------------------------------
# Line normalisation
# --------------------------------------------------------------------------

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# vLLM >= 0.11 prefixes every log line (and every line of a logged traceback,
# via NewLineFormatter) with "(EngineCore_DP0 pid=123) ".
_PROC_PREFIX = re.compile(r"^\((?:[^()]*\s)?pid=\d+\)\s*")
# "ERROR 11-29 10:00:00 [core.py:1510] " (vLLM's _FORMAT / _DATE_FORMAT); the
# fractional seconds and year variants cover older formats.
_LEVEL_PREFIX = re.compile(
    r"^(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+"
    r"(?:\d{4}-)?\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?\s+"
    r"(?:\[[^\]]*\]\s?)?"
)
# torch.distributed style "[rank0]: " prefixes.
_RANK_PREFIX = re.compile(r"^\[rank\d+\]:\s?")
# Lines logged at these levels are chatter (advice, debug listings of rejected
# backends, optional-import warnings), never the root cause of a failure.
_QUIET_LEVELS = {"DEBUG", "INFO", "WARNING", "WARN"}


def _normalise(text: str) -> list[tuple[str | None, str]]:
    """(log level or None, line) with ANSI colours and vLLM/torch prefixes removed.

    Indentation after the prefix is kept (traceback structure needs it).
    """
    out: list[tuple[str | None, str]] = []
    for raw in _ANSI.sub("", text or "").splitlines():
        line = raw.rstrip("\r\n")
        level: str | None = None
        for _ in range(3):  # prefixes can stack: "[rank0]: (Worker pid=1) INFO ..."
            before = line
            line = _RANK_PREFIX.sub("", line)
            line = _PROC_PREFIX.sub("", line)
            m = _LEVEL_PREFIX.match(line)
            if m:
                level = m.group("level")
                line = line[m.end():]
            if line == before:
                break
        out.append((level, line.rstrip()))
    return out


def _normalise_lines(text: str) -> list[str]:
    return [line for _, line in _normalise(text)]


# "ValueError: text", "torch.OutOfMemoryError: text",
# "pydantic_core._pydantic_core.ValidationError: 1 validation error ...",
# or a bare "AssertionError".
_EXC_LINE = re.compile(
    r"^(?:[A-Za-z_]\w*\.)*(?P<name>[A-Za-z_]\w*(?:Error|Exception))"
    r"(?::(?P<msg>.*))?$"
)


def _exception_match(line: str) -> re.Match[str] | None:
    return _EXC_LINE.match(line.strip())


# Wrapper errors that only say "look above" — never the informative message.
_WRAPPER = re.compile(
    r"Engine core initialization failed|Engine process failed to start"
    r"|Frontend process failed during engine core initialization"
    r"|WorkerProc initialization failed|See root cause above"
    r"|See stack trace for (?:the )?root cause",
    re.IGNORECASE,
)


# --------------------------------------------------------------------------
# Numbers vLLM states
# --------------------------------------------------------------------------

_ESTIMATED = re.compile(r"estimated maximum model length is\s+([\d,]+)", re.IGNORECASE)
# Old (V0) wording: "... stored in KV cache (Y)" — Y tokens is the longest
# sequence that fits, i.e. the same quantity as the newer estimate.
_OLD_KV_TOKENS = re.compile(
    r"maximum number of tokens that can be stored in KV cache\s*\(([\d,]+)\)",
    re.IGNORECASE,
)


def _to_int(number: str) -> int:
    return int(float(number.replace(",", "")))


def estimated_max_model_len(text: str) -> int | None:
    """The max model length vLLM says would fit in the KV cache, if it says one.

    Reads "the estimated maximum model length is 6,656" (vLLM V1) and the old
    "maximum number of tokens that can be stored in KV cache (6656)" (V0).
    """
    text = text or ""
    m = _ESTIMATED.search(text) or _OLD_KV_TOKENS.search(text)
    return _to_int(m.group(1)) if m else None


# --------------------------------------------------------------------------
# Backend detection
# --------------------------------------------------------------------------

# Chosen-backend lines vLLM prints, in all versions we know of:
#   "Using FLASH_ATTN attention backend out of potential backends: [...]"  (cuda, >=0.11)
#   "Using AttentionBackendEnum.FLASH_ATTN backend."  (explicitly selected)
#   "Using FLASH_ATTN backend." / "Using CPU_MLA backend." / "Using _Backend.X backend"
#   "Using Torch SDPA backend." (old CPU), "Using Flash Attention backend." (XPU)
# The second word may not be a lowercase "attention", so "X attention backend"
# yields X while "Flash Attention backend" stays two words.
_USING_BACKEND = re.compile(
    r"\bUsing (?:AttentionBackendEnum\.|_Backend\.)?"
    r"(?P<name>[A-Za-z][A-Za-z0-9_]*(?: (?-i:(?!attention\b))[A-Za-z0-9]+)?)"
    r" (?:attention )?backend\b",
    re.IGNORECASE,
)
# "Selected backend AttentionBackendEnum.TREE_ATTN is not valid for this configuration."
_SELECTED_BACKEND = re.compile(
    r"Selected backend (?:AttentionBackendEnum\.|_Backend\.)?(?P<name>[A-Za-z0-9_]+)"
)
_BACKEND_ALIASES = {
    "FLASH ATTENTION": "FLASH_ATTN",
    "FLASHATTENTION": "FLASH_ATTN",
    "TORCH SDPA": "TORCH_SDPA",
    "CPU ATTENTION": "CPU_ATTN",
    "CPU": "CPU_ATTN",
    "TRITON": "TRITON_ATTN",
    "TURBOQUANT": "TURBOQUANT",
}
# Words that mean the line is about some other kind of backend.
_NOT_ATTENTION = {
    "MOE", "GEMM", "SAMPLER", "SSM", "GDN", "KERNEL", "PREFILL",  # other layer kinds
    "NCCL", "GLOO", "RAY", "MP", "UNI",  # distributed / executor backends
}
_CPU_PLATFORM = re.compile(
    r"Automatically detected platform cpu|\bCPU KV cache size\b", re.IGNORECASE
)


def _normalise_backend(name: str) -> str | None:
    key = name.strip().upper()
    if any(word in _NOT_ATTENTION for word in key.split()):
        return None
    if key in _BACKEND_ALIASES:
        return _BACKEND_ALIASES[key]
    return key.replace(" ", "_")


def detect_backend(text: str) -> str | None:
    """The attention backend the log says vLLM chose (first one named).

    vLLM's CPU platform (0.32) returns CPU_ATTN for non-MLA models without
    logging it, so a log that shows the CPU platform and no explicit backend
    line is reported as CPU_ATTN.
    """
    lines = _normalise_lines(text)
    for line in lines:
        if "MMEncoderAttention" in line or "Cannot use" in line:
            continue  # vision-encoder choice / a backend being rejected
        m = _USING_BACKEND.search(line)
        if m:
            backend = _normalise_backend(m.group("name"))
            if backend:
                return backend
    for line in lines:
        m = _SELECTED_BACKEND.search(line)
        if m:
            return m.group("name").upper()
    if any(_CPU_PLATFORM.search(line) for line in lines):
        return "CPU_ATTN"
    return None


# --------------------------------------------------------------------------
# Root-cause rules
# --------------------------------------------------------------------------

_I = re.IGNORECASE
_KV_CAPACITY = [
    # V1 (0.26 / 0.32 and in between; some versions spell it "models's").
    re.compile(r"KV\s+cache is needed, which is larger than the available KV\s+cache memory", _I),
    re.compile(r"To serve at least one request with the model'?s'? max seq len", _I),
    re.compile(r"estimated maximum model length is", _I),
    # V0.
    re.compile(r"is larger than the maximum number of tokens that can be stored in KV cache", _I),
    re.compile(r"No available memory for the cache blocks", _I),
    re.compile(r"Cannot auto-fit max_model_len", _I),
]
_MODEL_LIMIT = [
    re.compile(r"User-specified max_model_len \(?[\d,]+\)? is greater than the derived max_model_len", _I),
    re.compile(r"is greater than the derived max_model_len", _I),
]
_UNSUPPORTED_DTYPE = [
    re.compile(r"kv_cache_dtype not supported", _I),  # backend validate_configuration reason
    re.compile(r"does not support fp8 kv[ _-]?cache", _I),  # "FlashAttention does not support fp8 kv-cache on this device."
    re.compile(r"does not support fp8 kv_cache_dtype", _I),
    # "kv_cache_dtype fp8_e5m2 is not supported" (not the backend-listing
    # "kv_cache_dtype: fp8, ... Reasons: {X: [head_size not supported]}").
    re.compile(r"\bkv[_ ]cache[_ ]dtype\b[ =:]*'?[\w.]+'? is not supported", _I),
    re.compile(r"\bUnknown kv[_ ]cache[_ ]dtype", _I),
    re.compile(r"\bInvalid kv[_ ]cache[_ ]dtype", _I),  # selector assert / torch_utils
    re.compile(r"\bFP8 KV cache\b[^\n]{0,60}\b(?:requires|is not (?:yet )?supported|not compatible)", _I),
    re.compile(r"not compatible with FP8 KV cache", _I),
    # pydantic literal error for CacheConfig.cache_dtype: "Input should be 'auto', 'float16', ..., 'fp8', ..."
    re.compile(r"Input should be 'auto',[^\n]*'fp8", _I),
]
_OOM = [
    re.compile(r"\bOutOfMemoryError\b"),
    re.compile(r"\b(?:CUDA|HIP|XPU|NPU|GPU|CPU|device)\s+out of memory\b", _I),
    re.compile(r"\bCUDA error: out of memory\b", _I),
    re.compile(r"\bCannot allocate memory\b", _I),
    re.compile(r"Failed to load model - not enough GPU memory", _I),
    re.compile(r"is less than desired (?:GPU|CPU) memory utilization", _I),
    re.compile(r"std::bad_alloc"),
]
# Another process changed the device's memory while vLLM profiled it (two runs on one GPU):
# "AssertionError: Error in memory profiling. Initial free memory 113.5 GiB, current free memory
# 133.61 GiB. This happens when other processes sharing the same container release GPU memory ..."
_SHARED_DEVICE = [
    re.compile(r"Error in memory profiling", _I),
    re.compile(r"other processes sharing the same (?:container|GPU|device)", _I),
]
_RULES: list[tuple[str, list[re.Pattern[str]]]] = [
    ("shared_device", _SHARED_DEVICE),
    ("kv_capacity", _KV_CAPACITY),
    ("model_limit", _MODEL_LIMIT),
    ("unsupported_dtype", _UNSUPPORTED_DTYPE),
    ("oom", _OOM),
]

_TRACEBACK_FILE = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')
# "Failed core proc(s): {'EngineCore_DP0': -9}" — the child was SIGKILLed.
_KILLED_CHILD = re.compile(r"Failed core proc\(s\): \{[^}]*:\s*-9\b")
_PYDANTIC_HEADER = re.compile(r"\d+ validation errors? for (?P<model>\w+)")
_PYDANTIC_TAIL = re.compile(r"\s*\[type=\w+, input_value=.*\]\s*$")
_KILLED_CODES = (-9, 137)


def _trim(message: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    message = " ".join(message.split())
    return message if len(message) <= limit else message[: limit - 1].rstrip() + "…"


def _rule_reason(line: str) -> str | None:
    for reason, patterns in _RULES:
        if reason == "oom" and not _looks_like_error(line):
            continue
        if any(p.search(line) for p in patterns):
            return reason
    # A bare MemoryError (or numpy's _ArrayMemoryError) as the exception.
    m = _exception_match(line)
    if m and m.group("name").endswith("MemoryError"):
        return "oom"
    return None


def _looks_like_error(line: str) -> bool:
    """OOM words also appear in advice text; count them only in error lines."""
    return bool(_exception_match(line)) or "error" in line.lower() or "failed" in line.lower()


def _message_from_line(lines: list[str], idx: int) -> str:
    """vLLM's words from the matched line, minus pydantic's noise."""
    line = lines[idx].strip()
    if line.startswith("Value error, "):  # pydantic wrapping a ValueError
        line = line[len("Value error, "):]
    if "[type=" in line:
        line = _PYDANTIC_TAIL.sub("", line)
    if line.startswith("Input should be"):
        # pydantic: "<N> validation error for CacheConfig" / "cache_dtype" / "  Input should be ..."
        field = lines[idx - 1].strip() if idx >= 1 else ""
        model = ""
        for j in range(idx - 1, max(idx - 4, -1), -1):
            if header := _PYDANTIC_HEADER.search(lines[j]):
                model = header.group("model")
                break
        where = ".".join(x for x in (model, field) if x)
        if where and re.fullmatch(r"[\w.]+", where):
            line = f"{where}: {line}"
    return _trim(line)


def _last_frame(lines: list[str], idx: int) -> str | None:
    """'path:line in func: code' of the traceback frame just above lines[idx]."""
    for j in range(idx - 1, max(idx - 60, -1), -1):
        m = _TRACEBACK_FILE.match(lines[j])
        if m:
            path = m.group("path")
            if "site-packages/" in path:
                path = path.split("site-packages/", 1)[1]
            where = f"{path}:{m.group('line')} in {m.group('func')}"
            if j + 1 < idx:
                code = lines[j + 1].strip()
                if code and not set(code) <= set("^~ ") and not _TRACEBACK_FILE.match(lines[j + 1]):
                    where += f": {code}"
            return where
        if lines[j].strip().startswith("Traceback (most recent call last)"):
            break
    return None


def _is_bare_assertion(line: str) -> bool:
    m = _exception_match(line)
    return m is not None and m.group("name") == "AssertionError" and not (m.group("msg") or "").strip()


def classify_startup_failure(
    log_text: str,
    *,
    exception_text: str = "",
    kv_cache_dtype: str = "auto",
    exit_code: int | None = None,
) -> StartupFailure:
    """Classify an engine start-up failure.

    ``log_text`` is the whole stdout+stderr of the cell process;
    ``exception_text`` is ``f"{type(e).__name__}: {e}"`` of what the cell
    caught.  The earliest root-cause-looking line wins (a child's ValueError
    comes before the parent's "Engine core initialization failed" wrapper).
    """
    kv_dtype = (kv_cache_dtype or "auto").strip().lower()
    # The log first: with multiprocessing the exception is only a wrapper.
    tagged = _normalise(log_text) + _normalise(exception_text)
    lines = [line for _, line in tagged]
    # Only lines that can carry an error: ERROR/CRITICAL log lines and raw
    # (unprefixed) output such as tracebacks and the exception text.
    loud = [level not in _QUIET_LEVELS for level, _ in tagged]
    full_text = "\n".join(lines)
    backend = detect_backend(full_text)
    estimate = estimated_max_model_len("\n".join(text for text, ok in zip(lines, loud) if ok))

    for idx, line in enumerate(lines):
        if not loud[idx]:
            continue
        reason = _rule_reason(line)
        if reason is not None:
            return StartupFailure(reason, _message_from_line(lines, idx), estimate, backend)
        if kv_dtype != "auto" and _is_bare_assertion(line):
            # FACTS: fp8_e5m2 on FA3 dies on a message-less assert; the backend
            # lacks that cache dtype even though vLLM never says so.
            where = _last_frame(lines, idx)
            msg = (
                f"AssertionError (no message) while starting with "
                f"kv_cache_dtype={kv_cache_dtype} on backend {backend or 'unknown'}"
            )
            if where:
                msg += f" at {where}"
            return StartupFailure("unsupported_dtype", _trim(msg), estimate, backend)

    # No specific cause: report the root cause, not the wrapper.
    exc_lines = [
        (i, m) for i, line in enumerate(lines) if loud[i] and (m := _exception_match(line))
    ]
    root = [(i, m) for i, m in exc_lines if not _WRAPPER.search(lines[i])]
    killed = exit_code in _KILLED_CODES or bool(_KILLED_CHILD.search(full_text))

    if root:
        i = root[0][0]
        msg = lines[i].strip()
        if _is_bare_assertion(msg):
            where = _last_frame(lines, i)
            msg = "AssertionError (no message)" + (f" at {where}" if where else "")
        return StartupFailure("other", _trim(msg), estimate, backend)

    if killed:
        what = f"exit code {exit_code}" if exit_code in _KILLED_CODES else "engine core child exit code -9"
        detail = lines[exc_lines[-1][0]].strip() if exc_lines else exception_text.strip()
        msg = f"process killed ({what}, SIGKILL), most likely out of memory"
        if detail:
            msg += f"; {detail}"
        return StartupFailure("oom", _trim(msg), estimate, backend)

    if exc_lines:
        return StartupFailure("other", _trim(lines[exc_lines[-1][0]]), estimate, backend)
    if exception_text.strip():
        return StartupFailure("other", _trim(exception_text), estimate, backend)
    code = f"exit code {exit_code}" if exit_code is not None else "unknown exit status"
    return StartupFailure("other", f"{code} with no error message", estimate, backend)


def not_started_record(cell: str, kv_spec: str, max_model_len: int, failure: StartupFailure, log: str, *,
                       engine_settings: dict[str, Any] | None = None, startup_seconds: float | None = None,
                       info: dict[str, Any] | None = None) -> dict[str, Any]:
    """The result file of a cell whose engine did not start. One shape whoever writes it: the child
    (the engine raised) or the parent (the child died or timed out before the engine was up)."""
    from kveval.files.logfacts import kv_pool_from_log
    from kveval.files.schema import CELL_VERSION

    return {
        "schema_version": CELL_VERSION, "cell": cell, "kv_spec": kv_spec, "max_model_len": max_model_len,
        "engine_settings": engine_settings, "complete": True, "phases": {}, "started": False,
        "startup_seconds": startup_seconds, "failure": failure.to_dict(),
        # vLLM may have sized the pool before failing (e.g. an FP8 backend check comes later).
        "logged_capacity": kv_pool_from_log(log),
        "info": {"vllm_version": None, "platform": None, **(info or {}), "attention_backend": failure.backend},
    }
