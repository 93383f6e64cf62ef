"""The settings of one `kveval compare` run, with their defaults (kveval.defaults) and their checks."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from kveval import defaults
from kveval.errors import KvevalError
from kveval.inputs.budget import parse_budget
from kveval.inputs.kvspec import KVSpec, KVSpecError, parse_kv
from kveval.inputs.slo import SloError, parse_slo
from kveval.run.reference import REFERENCE_MODES
from kveval.run.remedy import REMEDY_MODES


@dataclass
class CompareOptions:
    model: str | None = None
    kv: Sequence[str] = defaults.KV
    max_model_len: Sequence[int] = defaults.MAX_MODEL_LEN
    out: str | Path | None = None
    kv_cache_memory: str | int | None = None
    gpu_memory_utilization: float | None = None
    enforce_eager: bool = False
    engine_args: dict[str, Any] = field(default_factory=dict)
    seed: int = defaults.SEED
    prompts: str | Path | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # arguments of every chat rendering (vLLM's name)
    suite: str = defaults.SUITE
    counts: dict[str, int] | None = None
    speed_runs: int | None = None
    speed_warmup: int | None = None
    speed_max_tokens: int | None = None
    phases: Sequence[str] = defaults.PHASES
    cell_timeout: float | None = defaults.CELL_TIMEOUT_S
    stall_timeout: float | None = defaults.STALL_TIMEOUT_S  # no progress for this long: the cell is stalled
    command: str | None = None
    gate_config: str | Path | None = None
    gate_overrides: dict[str, Any] = field(default_factory=dict)
    tasks: Sequence[str] | None = None          # None: kveval's six; ["none"]: skip; else names
    task_limit: int | None = None               # samples per task at most (spread over sizes, depths)
    task_lengths: Sequence[float] | None = None  # prompt sizes as shares of max_model_len (suite's)
    task_depths: Sequence[float] | None = None   # needle depths (suite's)
    task_samples: int | None = None             # samples per (task, size, depth) point (suite's)
    diagnose: bool = defaults.DIAGNOSE          # per-layer K/V range pass through transformers (FP8 runs)
    concurrency: Sequence[int] | None = None    # throughput sweep levels (suite's when None)
    remedy: str = defaults.REMEDY               # auto: on an FP8 FAIL; always: after every FP8 cell; off
    lengths_given: bool = True                  # False: the default lengths, trimmed to the model's limit
    retry_failed: bool = False                  # resume: redo every cell that did not start, not only transient ones
    gpus: Sequence[str] | None = None           # device indices (or ["all"]): cells at once, one per device
    fresh: bool = False                         # --out holds another run: move it aside and start over
    executor: str = "local"                     # local: cell processes on this machine; ray: Ray tasks
    ray_address: str | None = None              # --executor ray: the cluster (None: $RAY_ADDRESS, else local)
    budget: str | int | None = None             # task rounds until decided: samples per cell and/or time (inputs/budget.py)
    baseline_added: bool = False                # --kv named no `auto`: normalized() added it (the run says so)
    merged_kv: tuple[tuple[str, str], ...] = ()  # (dropped, kept): two --kv spellings of one vLLM cache, run once
    search: bool = False                        # --search (or --kv search): run/search.py's ladder until one passes
    # Issue 41: speed repeats, and how the deploy answer weighs capacity against its cost.
    repeat_target: float | None = None          # relative half-width of a median's 95 % interval (suite's when None)
    repeat_budget: float | None = None          # seconds of repeats per cell and speed phase (suite's when None)
    prefer: str = defaults.PREFER               # capacity | throughput | latency (analysis/deploy_choice.py)
    slo: Sequence[str] | None = None            # e.g. ("ttft_p99=2s",): inputs/slo.py
    # Issue 39: the `auto` cells of an earlier run (another GPU, a CPU) as the baseline; only FP8 cells start.
    baseline_from: str | Path | None = None
    reference: str = "auto"                     # run/reference.py: auto (emulated budgets), offload, off

    @property
    def kv_specs(self) -> tuple[KVSpec, ...]:
        """The --kv values as configurations: the one place the user's KV specs are read (after
        validate_options, which refuses any that do not parse)."""
        return tuple(parse_kv(text) for text in self.kv)


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


EXECUTORS = ("local", "ray")


# apply_chat_template's own arguments, which kveval sets itself (workloads.chat._apply_template): a chat-template
# argument is a variable the template reads, such as enable_thinking.
RENDERING_ARGS = ("conversation", "tokenize", "add_generation_prompt", "continue_final_message", "chat_template")


def check_chat_template_kwargs(kwargs: Any) -> None:
    """--chat-template-kwargs: a mapping of names (strings) to JSON values, none of them one kveval sets itself."""
    if kwargs is None:
        return
    if not isinstance(kwargs, dict):
        raise KvevalError(f"--chat-template-kwargs must be a JSON object (e.g. {{\"enable_thinking\": false}}), "
                          f"not {type(kwargs).__name__}")
    for key in kwargs:
        if not isinstance(key, str) or not key:
            raise KvevalError(f"--chat-template-kwargs: key {key!r} is not a name; keys are the template's "
                              "variable names, as strings (e.g. enable_thinking)")
        if key in RENDERING_ARGS:
            raise KvevalError(f"--chat-template-kwargs: {key} is set by kveval itself when it renders a prompt; "
                              "give only the template's own variables (e.g. enable_thinking)")
    try:
        json.dumps(kwargs, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise KvevalError(f"--chat-template-kwargs: the values must be JSON ({error})") from None


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
    template_kwargs = options.chat_template_kwargs
    if isinstance(template_kwargs, Mapping):   # {} is none given; another mapping is a dict like a parsed one
        template_kwargs = dict(template_kwargs) or None
    return dataclasses.replace(options, kv=kv + (("auto",) if add else ()), baseline_added=add, search=search,
                               chat_template_kwargs=template_kwargs, merged_kv=options.merged_kv + merged)


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
    check_chat_template_kwargs(options.chat_template_kwargs)
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
