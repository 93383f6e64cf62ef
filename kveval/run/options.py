"""The checks of one `kveval compare` run's settings (CompareOptions, declared in run/option_model.py), and
the run in kveval's own spelling (normalized)."""
from __future__ import annotations

import dataclasses

from kveval import defaults
from kveval.errors import KvevalError
from kveval.inputs.budget import parse_budget
from kveval.inputs.kvspec import KVSpec, KVSpecError, parse_kv
from kveval.inputs.slo import SloError, parse_slo
from kveval.run.option_model import EXECUTORS, CompareOptions
from kveval.run.reference import REFERENCE_MODES
from kveval.run.remedy import REMEDY_MODES


# Engine settings kveval sets per cell (or for every cell, for the measurement to mean what it says).
# Through --engine-arg they would make a cell something other than its id says.


CONTROLLED_ENGINE_ARGS = {
    "model": "--model",
    "kv_cache_dtype": "--kv (e.g. --kv fp8 auto)",
    "kv_cache_dtype_skip_layers": "--kv fp8:keep=0,1 (layers kept in the model dtype)",
    "max_model_len": "--max-model-len",
    "seed": "--seed",
    "kv_cache_memory_bytes": "--kv-cache-memory",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "enforce_eager": "--enforce-eager",
    "disable_log_stats": "nothing: kveval needs per-request stats for TTFT and decode speed",
    "enable_prefix_caching": "nothing: repeated speed runs must not be served from the prefix cache",
}


SEARCH_WORD = "search"   # --kv search: the same as --search
SEARCH_START = "fp8"     # run/search.SEARCH_DTYPE: the ladder's first candidate


def normalized(options: CompareOptions) -> CompareOptions:
    """The same run in kveval's own spelling: KV specs as parse_kv writes them (FP8 -> fp8), each once;
    the `auto` baseline added when --kv names none (every verdict is against it)."""
    def spelled(kv):
        try:
            return parse_kv(kv).text
        except KVSpecError:
            return kv  # validate_options says what is wrong with it
    kv = tuple(dict.fromkeys(spelled(kv) for kv in options.kv))
    search = options.search or SEARCH_WORD in kv
    if search:   # the ladder starts at plain fp8; `--kv search` alone means `--search --kv fp8 auto`
        kv = tuple(k for k in kv if k != SEARCH_WORD) or (SEARCH_START,)
        kv = kv if SEARCH_START in kv else (SEARCH_START, *kv)
    kv, merged = _one_per_cache(kv)
    try:  # an unreadable spec is validate_options' to report; no baseline is added for it
        add = bool(kv) and not any(parse_kv(text).dtype == "auto" for text in kv)
    except KVSpecError:
        add = False
    return dataclasses.replace(options, kv=kv + (("auto",) if add else ()), baseline_added=add, search=search,
                               chat_template_kwargs=options.chat_template_kwargs or None,   # {} is none given
                               merged_kv=options.merged_kv + merged)


def _one_per_cache(kv: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """--kv fp8 fp8_e4m3 names one vLLM cache twice: keep the first spelling, and say which went."""
    kept: dict[KVSpec, str] = {}
    merged = []
    for text in kv:
        try:
            cache = parse_kv(text).cache
        except KVSpecError:
            kept[text] = text   # validate_options says what is wrong with it
            continue
        if cache in kept:
            merged.append((text, kept[cache]))
        else:
            kept[cache] = text
    return tuple(kept.values()), tuple(merged)


def validate_options(options: CompareOptions) -> None:
    if not options.kv:
        raise KvevalError("--kv needs at least one KV-cache dtype (e.g. --kv fp8 auto)")
    for kv in options.kv:
        try:
            parse_kv(kv)
        except KVSpecError as error:
            raise KvevalError(str(error)) from None
    for key in options.engine_args:
        normal = str(key).replace("-", "_").lstrip("_")
        if normal in CONTROLLED_ENGINE_ARGS:
            raise KvevalError(f"--engine-arg {key}=...: kveval sets {normal} itself, per cell, so that a cell is what "
                              f"its id says; use {CONTROLLED_ENGINE_ARGS[normal]}")
    if options.search:
        other = [kv for kv in options.kv if kv not in (SEARCH_START, "auto")]
        if other:
            raise KvevalError(f"--search tries its own ladder of KV configurations (fp8, fp8:scaled, fp8:scaled=head, "
                              f"kept layers, combinations); --kv {' '.join(other)} is not how it starts: leave --kv "
                              "out or give --kv fp8 auto")
    if options.remedy not in REMEDY_MODES:
        raise KvevalError(f"--remedy {options.remedy!r}: choose one of {', '.join(REMEDY_MODES)}")
    if not options.max_model_len:
        raise KvevalError("--max-model-len needs at least one value (e.g. --max-model-len 2048 8192)")
    for length in options.max_model_len:
        if int(length) < 64:
            raise KvevalError(f"--max-model-len {length} is too small (at least 64)")
    unknown = [p for p in options.phases if p not in defaults.PHASES]
    if unknown:
        raise KvevalError(f"unknown phase(s) {', '.join(unknown)}; known: {', '.join(defaults.PHASES)}")
    if options.gpu_memory_utilization is not None and not 0 < options.gpu_memory_utilization <= 1:
        raise KvevalError("--gpu-memory-utilization must be in (0, 1]")
    for name in ("speed_runs", "speed_max_tokens"):
        value = getattr(options, name)
        if value is not None and value < 1:
            raise KvevalError(f"--{name.replace('_', '-')} must be at least 1")
    if options.concurrency is not None and (not options.concurrency or any(int(c) < 1 for c in options.concurrency)):
        raise KvevalError("--concurrency needs whole numbers of at least 1 (e.g. --concurrency 1 4 16 64)")
    if options.cell_timeout is not None and not options.cell_timeout > 0:
        raise KvevalError(f"--cell-timeout {options.cell_timeout:g}: give the seconds a cell may take, more than 0 "
                          f"(default {defaults.CELL_TIMEOUT_S:g})")
    if options.stall_timeout is not None and not options.stall_timeout > 0:
        raise KvevalError(f"--stall-timeout {options.stall_timeout:g}: give the seconds a started cell may go without "
                          f"progress, more than 0 (default {defaults.STALL_TIMEOUT_S:g})")
    if options.executor not in EXECUTORS:
        raise KvevalError(f"--executor {options.executor!r}: choose one of {', '.join(EXECUTORS)}")
    if options.executor == "ray" and options.gpus:
        raise KvevalError("--gpus and --executor ray: Ray places each cell on the devices it has free; "
                          "leave --gpus out (a cell's GPUs: --engine-arg tensor_parallel_size=N)")
    if options.ray_address and options.executor != "ray":
        raise KvevalError("--ray-address is for --executor ray")
    if options.speed_warmup is not None and options.speed_warmup < 0:
        raise KvevalError("--speed-warmup must be 0 or more")
    _check_speed_choice(options)
    try:
        budget = parse_budget(options.budget)
    except ValueError as error:
        raise KvevalError(str(error)) from None
    if options.reference not in REFERENCE_MODES:
        raise KvevalError(f"--reference {options.reference}: one of {', '.join(REFERENCE_MODES)}")
    if options.reference == "offload" and options.baseline_from is not None:
        raise KvevalError("--reference offload and --baseline-from both give the auto baseline; give one")
    if options.baseline_from is not None and options.budget is not None and budget.samples:
        raise KvevalError(f"--budget {options.budget} and --baseline-from: rounds of new samples need the baseline's "
                          "engine, which this run does not start; leave --budget out (or give --budget 0)")
    if not any(spec.dtype == "auto" for spec in options.kv_specs):
        # Every verdict is against `auto` at the same length: without it every phase would run and then
        # nothing could be judged.
        raise KvevalError(f"--kv {' '.join(options.kv)}: no `auto` baseline to judge against; add it "
                          f"(--kv {' '.join(options.kv)} auto)")


def _check_speed_choice(options: CompareOptions) -> None:
    """Issue 41's options: repeats of the speed phases and the deploy preference, checked before any engine."""
    if options.repeat_target is not None and not 0 < options.repeat_target < 1:
        raise KvevalError(f"--repeat-target {options.repeat_target:g}: give the relative half-width of a median's 95 % "
                          "interval at which repeats stop, between 0 and 1 (e.g. 0.05 for ±5 %)")
    if options.repeat_budget is not None and options.repeat_budget < 0:
        raise KvevalError(f"--repeat-budget {options.repeat_budget:g}: give the seconds of repeats per cell and speed "
                          "phase, 0 or more (0: one run per level and the speed runs only)")
    if options.prefer not in defaults.PREFERENCES:
        raise KvevalError(f"--prefer {options.prefer!r}: choose one of {', '.join(defaults.PREFERENCES)}")
    try:
        parse_slo(options.slo)
    except SloError as error:
        raise KvevalError(str(error)) from None
    # A choice by a figure no phase measures would silently fall back to capacity: said now instead.
    needs = {"throughput": "throughput", "latency": "speed"}.get(options.prefer)
    if needs and needs not in options.phases:
        raise KvevalError(f"--prefer {options.prefer} ranks configurations by the {needs} phase's figures, and --phases "
                          f"{' '.join(options.phases)} leaves it out; add {needs} to --phases")
    if options.slo and "throughput" not in options.phases:
        raise KvevalError(f"--slo is checked on the throughput phase's concurrency levels, and --phases "
                          f"{' '.join(options.phases)} leaves it out; add throughput to --phases")
