"""CompareOptions: every setting of a `kveval compare` run, declared once (issue 42).

Each field says, beside its type and default (kveval.defaults):
- `Cli`: how the command line spells it (flags, metavar, help, choices). kveval/cli builds the click options
  of `compare` and `baseline` from `command_line_options()`, and scripts/options_table.py writes the README's
  option table from the same list (tests/unit/test_option_model.py keeps the README equal to it).
- `Recorded`: the key of manifest.json's `options` that records it (files/schema/manifest.Options, written by
  run/state.py), or where else the run keeps it; a test checks that both sides name each other.
A field without `Cli` is the API's or kveval's own (set while the run is planned), never a flag.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BeforeValidator, Field, ValidationError
from pydantic.dataclasses import dataclass as pydantic_dataclass

from kveval import defaults
from kveval.errors import KvevalError
from kveval.gate import Thresholds
from kveval.inputs.kvspec import KVSpec, parse_kv
from kveval.inputs.suites import SUITES
from kveval.run.reference import REFERENCE_MODES
from kveval.run.remedy import REMEDY_MODES

EXECUTORS = ("local", "ray")

# A README row may name several options: an option whose `readme` is SAME_ROW is listed in the row before it.
SAME_ROW = ""


@dataclass(frozen=True)
class Shortcut:
    """A flag that feeds another field's value (`--full` is `--suite full`; `--dtype X` is `--engine-arg
    dtype=X`): a command-line option without a field of its own."""

    name: str                      # the click parameter's name
    flags: tuple[str, ...]
    kind: type                     # int, str, or bool (a flag)
    help: str
    readme: str = SAME_ROW
    readme_metavar: str | None = None


@dataclass(frozen=True)
class Cli:
    """How a field is given on the command line and described in the README's option table."""

    flags: tuple[str, ...]
    help: str
    readme: str = SAME_ROW
    metavar: str | None = None
    readme_metavar: str | None = None     # the README's placeholder where it differs from --help's (INTEGER: N)
    show_default: bool | str = False      # True: the field's default; a text: that text
    choices: tuple[str, ...] = ()
    off_flag: str | None = None           # a boolean's flag that sets it False (--no-diagnose)
    path: Literal["file", "dir"] | None = None
    many: bool = False                    # one or more values after the flag, for a field that is no Sequence
    split_commas: bool = True             # many values: also split at commas (not for KEY=VALUE items)
    repeat: bool = False                  # one value per flag, the flag repeated (--threshold a=1 --threshold b=2)
    baseline: bool = True                 # also an option of `kveval baseline` (it sets the others itself)
    shortcuts: tuple[Shortcut, ...] = ()  # listed right after this option


@dataclass(frozen=True)
class Recorded:
    """Where a run keeps a field: `key` in manifest.json's options, or (key None) `elsewhere`, in words."""

    key: str | None
    elsewhere: str = ""


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


def _checked_template_kwargs(value: Any) -> Any:
    # Checked before pydantic's own dict check, so that a bad value gets kveval's line naming the flag.
    if isinstance(value, Mapping):   # another mapping is a dict like a parsed one
        value = dict(value)
    check_chat_template_kwargs(value)
    return value


def _spaced(values: Sequence[Any]) -> str:
    return " ".join(str(v) for v in values)


# A number given whole stays an int (kveval.compare(cell_timeout=600) records 600, not 600.0, as before).
Real = Union[float, int]

_VLLM_SHORTCUTS = (
    Shortcut("tensor_parallel_size", ("--tensor-parallel-size",), int, "GPUs per engine (tensor parallel).",
             readme="vLLM's own options for every engine (as `--engine-arg` would pass them; giving one both ways is "
                    "refused). `--tokenizer`, `--revision` and `--trust-remote-code` also hold for kveval's own loaders "
                    "(prompt sizing, config, K/V diagnosis), so they read what vLLM loads"),
    Shortcut("dtype", ("--dtype",), str, "The model's compute dtype (e.g. bfloat16, float16; default: the checkpoint's)."),
    Shortcut("tokenizer", ("--tokenizer",), str, "Another tokenizer (id or directory) for vLLM and kveval's prompts."),
    Shortcut("revision", ("--revision",), str,
             "The model revision (branch, tag or commit of a hub id) for vLLM and kveval."),
    Shortcut("trust_remote_code", ("--trust-remote-code",), bool, "Run the model's own code (vLLM and kveval's loaders)."),
    Shortcut("max_num_seqs", ("--max-num-seqs",), int, "Requests an engine batches at most."),
    Shortcut("attention_backend", ("--attention-backend",), str,
             "vLLM's attention backend (e.g. FLASH_ATTN, TRITON_ATTN).", readme_metavar="NAME"),
)
# vLLM's own engine options, first class on the command line: passed to every engine through engine_args, and
# read by kveval's loaders (tokenizer, config, K/V diagnosis) where they say which files vLLM loads.
VLLM_SHORTCUTS = {shortcut.name: shortcut for shortcut in _VLLM_SHORTCUTS}


# A pydantic dataclass: each value is checked against its type when the options are made, and again by
# dataclasses.replace, which set-up uses to settle them.
@pydantic_dataclass
class CompareOptions:
    """The settings of one compare run; kveval.api.compare's keyword arguments are these fields."""

    model: Annotated[str | None, Recorded(None, "manifest.json's model"), Cli(
        ("--model",), metavar="ID|DIR|FILE.gguf",
        help="Hugging Face model id, local directory or GGUF file (dequantised once into $KVEVAL_HOME). "
             "Default: the embedded SmolLM2-135M-Instruct.",
        readme="Hugging Face id, local directory or GGUF file; default: the embedded SmolLM2-135M-Instruct")] = None
    kv: Annotated[Sequence[str], Recorded("kv"), Cli(
        ("--kv", "--kv-cache-dtype"), show_default=True, baseline=False,
        help="KV-cache configurations to compare (vLLM's --kv-cache-dtype values), e.g. --kv fp8 auto (also "
             "--kv fp8 --kv auto, --kv fp8,auto); fp8:keep=0,1 keeps layers 0 and 1 in the model dtype "
             "(vLLM's --kv-cache-dtype-skip-layers 0 1); fp8:scaled / fp8:scaled=head use per-tensor / per-head "
             "K/V scales calibrated once with llm-compressor (combinable: fp8:scaled,keep=0).",
        readme="KV configurations (default `fp8 auto`; `auto` is the baseline, added with a note when left out); also "
               "`--kv fp8 --kv auto`, `--kv fp8,auto`. `fp8:keep=0,1` keeps layers 0 and 1 in the model dtype "
               "(vLLM's `--kv-cache-dtype-skip-layers 0 1`); `fp8:scaled` / `fp8:scaled=head` load a copy of the "
               "model with per-tensor / per-attention-head K/V scales calibrated once with llm-compressor "
               "([Calibrated scales](#calibrated-scales-and-the-search)); options combine: `fp8:scaled,keep=0`")
    ] = defaults.KV
    max_model_len: Annotated[Sequence[int], Recorded("max_model_len"), Cli(
        ("--max-model-len",), show_default=_spaced(defaults.MAX_MODEL_LEN) + ", without those over the model's limit",
        help="max_model_len values, e.g. --max-model-len 2048 8192 32768.",
        readme="default `2048 8192 32768`, less those over the model's limit; `8k` = 8192")] = defaults.MAX_MODEL_LEN
    out: Annotated[str | Path | None, Recorded(None, "the run directory itself"), Cli(
        ("--out",), metavar="DIR", help="Run directory. Default: runs/<model>-<time>.",
        readme="run directory (default `runs/<model>-<time>`); the same command into the same `--out` resumes")] = None
    kv_cache_memory: Annotated[str | int | None, Recorded("kv_cache_memory_bytes"), Cli(
        ("--kv-cache-memory", "--kv-cache-memory-bytes"), metavar="SIZE",
        help="KV-cache budget per engine (vLLM's --kv-cache-memory-bytes), e.g. 150MiB or 157286400, to "
             "emulate a smaller GPU.",
        readme="KV budget per engine (`150MiB` or bytes) to emulate a smaller accelerator. Unset on a CPU, kveval "
               "sizes it to the run (at most a quarter of memory); on a GPU vLLM's default share applies")] = None
    gpu_memory_utilization: Annotated[Real | None, Recorded("gpu_memory_utilization"), Cli(
        ("--gpu-memory-utilization",), help="Passed to vLLM.", readme_metavar="F",
        readme="passed to vLLM (seed default 0)")] = None
    enforce_eager: Annotated[bool, Recorded("enforce_eager"), Cli(
        ("--enforce-eager",), off_flag="--no-enforce-eager", show_default=True, help="Passed to vLLM.")] = False
    seed: Annotated[int, Recorded("seed"), Cli(
        ("--seed",), show_default=True,
        help="Seed of every random choice kveval makes (scoring documents, task samples, probe order); "
             "generation is greedy, so the same seed gives the same inputs in every cell.")] = defaults.SEED
    engine_args: Annotated[dict[str, Any], Recorded("engine_args"), Cli(
        ("--engine-arg",), metavar="KEY=VALUE", many=True, split_commas=False, shortcuts=_VLLM_SHORTCUTS,
        help="Any other vllm.LLM argument, e.g. --engine-arg dtype=float32 (repeatable; JSON values).",
        readme="any other `vllm.LLM` argument (repeatable, JSON values); may not set what kveval controls "
               "(`kv_cache_dtype`, `max_model_len`, ...)")] = Field(default_factory=dict)
    prompts: Annotated[str | Path | None, Recorded("prompts_file"), Cli(
        ("--prompts",), metavar="FILE.jsonl", path="file",
        help='Your own prompts, one JSON object per line: {"prompt": ...} or {"messages": [...]}.',
        readme='your own prompts: `{"prompt": ...}` or `{"messages": [...]}` per line (at most 10,000)')] = None
    chat_template_kwargs: Annotated[dict[str, Any] | None, BeforeValidator(_checked_template_kwargs),
                                    Recorded("chat_template_kwargs"), Cli(
        ("--chat-template-kwargs",), metavar="JSON",
        help="Arguments of every chat-template rendering (vLLM's chat_template_kwargs), as a JSON object, "
             "e.g. '{\"enable_thinking\": false}' so a thinking template answers the tasks outside <think>.",
        readme="arguments of every chat-template rendering (vLLM's `chat_template_kwargs`), e.g. "
               "`'{\"enable_thinking\": false}'` so a thinking template (Qwen3) answers the tasks outside `<think>`; "
               "recorded in the manifest and named in the review")] = None
    suite: Annotated[str, Recorded("suite"), Cli(
        ("--suite",), choices=tuple(SUITES), show_default=True,
        shortcuts=(Shortcut("full", ("--full",), bool, "Same as --suite full."),),
        help="standard: field-study shape; quick: one prompt per workload, short answers, few task samples "
             "(CPU demo); full: standard with 5 samples per task point (GPU runs).",
        readme="workload size: `standard` (default); `quick` one prompt per workload, short answers (CPU); `full` = "
               "standard with 5 samples per task point")] = defaults.SUITE
    tasks: Annotated[Sequence[str] | None, Recorded("tasks"), Cli(
        ("--tasks", "--task"), metavar="NAME...",
        help="Long-context tasks per cell: kveval's passkey niah_single niah_multikey niah_multivalue vt cwe "
             "(default: all six), 'none' to skip, or any lm-eval task name whose data is local.",
        readme="`passkey niah_single niah_multikey niah_multivalue vt cwe` (default: all six), `none`, or a local "
               "lm-eval task ([docs/tasks.md](docs/tasks.md))")] = None
    task_limit: Annotated[int | None, Recorded("limit"), Cli(
        ("--limit",), help="At most this many samples per task (kveval's tasks keep them spread over sizes and depths).",
        readme="at most N samples per task")] = None
    task_lengths: Annotated[Sequence[float] | None, Recorded("lengths"), Cli(
        ("--task-lengths",), metavar="SHARE...",
        help="Task prompt sizes as shares of max_model_len; above 1 probes rejection "
             f"(default: suite's, e.g. {_spaced(defaults.TASK_LENGTHS)}).",
        readme="task prompt sizes (shares of max_model_len), needle depths, samples per point")] = None
    task_depths: Annotated[Sequence[float] | None, Recorded("depths"), Cli(
        ("--task-depths",), metavar="SHARE...",
        help=f"Needle depths in the haystack (default: suite's, e.g. {_spaced(defaults.TASK_DEPTHS)}).")] = None
    task_samples: Annotated[int | None, Recorded("samples_per_point"), Cli(
        ("--task-samples",), help="Samples per task x size x depth point (default: suite's, e.g. 1).")] = None
    speed_runs: Annotated[int | None, Recorded("phase_options"), Cli(
        ("--speed-runs",), baseline=False, help="Measured speed runs per workload (default: suite's).",
        readme="measured and warm-up runs per workload; then each speed workload and throughput level (at least 3 "
               "runs) repeats until the 95 % interval of its median is within SHARE of it (default 0.05), within S "
               "seconds per cell and phase (default 60 for speed, 180 for throughput; `quick` 30 and 60; 0: no "
               "repeats) ([statistics](docs/statistics.md#speed-figures-from-repeats))")] = None
    speed_warmup: Annotated[int | None, Recorded("phase_options"), Cli(
        ("--speed-warmup",), baseline=False, help="Warm-up runs before them (default: suite's).")] = None
    repeat_target: Annotated[Real | None, Recorded("phase_options"), Cli(
        ("--repeat-target",), metavar="SHARE", baseline=False,
        help="Repeat each throughput level and speed workload until the 95 % interval of its median is within "
             "this share of it (default 0.05: ±5 %), within --repeat-budget.")] = None
    repeat_budget: Annotated[Real | None, Recorded("phase_options"), Cli(
        ("--repeat-budget",), metavar="SECONDS", readme_metavar="S", baseline=False,
        help="Seconds per cell and speed phase (speed, throughput) for those repeats (default: suite's, 60 and "
             "180; quick 30 and 60); 0: the first run of each level only.")] = None
    concurrency: Annotated[Sequence[int] | None, Recorded("phase_options"), Cli(
        ("--concurrency",), metavar="N...", baseline=False,
        help="Throughput sweep: requests submitted at once per level (default: suite's, e.g. 1 4 16 64; "
             "each cell also runs its own maximum concurrency).",
        readme="throughput sweep levels (default: `quick` 1 4 with prompts of 12.5 % of the length, others 1 4 16 64 "
               "at 50 %); each cell also runs its own maximum, none above vLLM's `max_num_seqs`")] = None
    prefer: Annotated[str, Recorded("prefer"), Cli(
        ("--prefer",), choices=defaults.PREFERENCES, show_default=True, baseline=False,
        help="Which passing configuration to deploy: the one holding the most KV (capacity), the best output "
             "tok/s against auto (throughput) or the least TTFT against auto (latency).",
        readme="which passing configuration the deploy line names: the most KV (default), the best output tok/s × "
               "`auto`, or the least TTFT × `auto`; with objectives in vLLM bench's terms (`--slo ttft_p99=2s "
               "tpot_p99=100ms`; p50, p90, p99; a bare number is ms) the one with the most goodput")] = defaults.PREFER
    slo: Annotated[Sequence[str] | None, Recorded("slo"), Cli(
        ("--slo",), metavar="METRIC_pNN=VALUE...", baseline=False,
        help="Service-level objectives in vLLM bench's terms, e.g. --slo ttft_p99=2s tpot_p99=100ms: the deploy "
             "answer is the passing configuration with the most goodput (requests/s at the highest concurrency "
             "level meeting every objective).")] = None
    phases: Annotated[Sequence[str], Recorded("phases"), Cli(
        ("--phases",), show_default=True, baseline=False, help="Phases to run in each cell, in order.",
        readme="phases per cell, default `generation scoring tasks speed throughput`")] = defaults.PHASES
    cell_timeout: Annotated[Real | None, Recorded("cell_timeout_s"), Cli(
        ("--cell-timeout",), show_default=True, readme_metavar="S", help="Seconds before a cell is stopped.",
        readme="stop a cell after S seconds (default 3600); stop a started cell that finishes no step for S seconds "
               "(default 600): reported as an engine defect")] = defaults.CELL_TIMEOUT_S
    # No progress for this long: the cell is stalled.
    stall_timeout: Annotated[Real | None, Recorded("stall_timeout_s"), Cli(
        ("--stall-timeout",), show_default=True, readme_metavar="S",
        help="Seconds a started cell may go without finishing a step before it is stopped as stalled (an engine "
             "that hangs is reported as a defect of that configuration, not as FP8 damage).")] = defaults.STALL_TIMEOUT_S
    # run/search.py's ladder until one passes (also --kv search).
    search: Annotated[bool, Recorded(None, "manifest.json's search"), Cli(
        ("--search",), baseline=False,
        help="Find the KV configuration with the most capacity that passes: try fp8, then fp8:scaled (per-tensor "
             "scales calibrated with llm-compressor), fp8:scaled=head, the diagnosed layers kept in the model "
             "dtype (fewest first) and combinations, each judged by the same gate, until one PASSes at each "
             "--max-model-len (also --kv search).",
        readme="find the KV configuration with the most capacity that passes (or `--kv search`): `fp8` → "
               "`fp8:scaled` → `fp8:scaled=head` → the diagnosed layers kept (fewest first) → combinations, each "
               "judged by the same gate, stopping at the first PASS at each length "
               "([below](#calibrated-scales-and-the-search))")] = False
    # auto: on an FP8 FAIL; always: after every FP8 cell; off.
    remedy: Annotated[str, Recorded(None, "manifest.json's remedy"), Cli(
        ("--remedy",), choices=REMEDY_MODES, show_default=True, baseline=False,
        help="auto: when an FP8 cell FAILs, run it again with the layers whose K/V leave the FP8 range kept in "
             "the model dtype; always: try that after every started FP8 cell; off: never.",
        readme="`auto` (default): when plain FP8 FAILs, or is INCONCLUSIVE with a diagnosed cause, run it again with "
               "the diagnosed layers kept; `always`: after every started FP8 cell; `off`")] = defaults.REMEDY
    # Task rounds until decided: samples per cell and/or time (inputs/budget.py).
    budget: Annotated[str | int | None, Recorded("budget"), Cli(
        ("--budget",), metavar="N|TIME|N,TIME", baseline=False,
        help="Evidence until decided: while a tested cell is INCONCLUSIVE because its task accuracy, its "
             "degeneration or its divergence is not yet decided, run rounds of new task samples, new probes "
             "and/or new scored documents (up to 48 per cell) for it and its auto baseline, up to N paired "
             "samples per cell (also the sequential design's N_max) and/or TIME of round time (90s, 10m, "
             "1h), whichever comes first; 0 or off: no rounds. Default: 600,20m on a CPU, 1200,20m on a GPU "
             "(a time alone keeps that cap).",
        readme="more task, probe and scoring-document rounds until decided: up to N paired samples per cell (48 "
               "documents) and/or TIME (`90s`, `20m`); default `600,20m`; `0` / `off`: one look")] = None
    # The per-layer K/V range pass through transformers (FP8 runs).
    diagnose: Annotated[bool, Recorded(None, "manifest.json's kv_scales and the run's kv_ranges.json"), Cli(
        ("--diagnose",), off_flag="--no-diagnose", show_default=True, baseline=False,
        help="Measure each layer's K/V range with transformers (once per run) against the FP8 range.",
        readme="the per-layer K/V range pass with transformers (default on)")] = defaults.DIAGNOSE
    # Resume: redo every cell that did not start, not only transient ones.
    retry_failed: Annotated[bool, Recorded(None, "not recorded: how this invocation resumes"), Cli(
        ("--retry-failed",),
        help="Resuming into the same --out: also redo cells that did not start for a reason of their "
             "configuration (by default only unfinished, crashed and transiently failed cells are redone).",
        readme="on resume, also redo cells that did not start for a reason of their configuration; `--out` holds "
               "other settings or a damaged run: move it to `OUT.replaced-<time>`, start anew")] = False
    # --out holds another run: move it aside and start over.
    fresh: Annotated[bool, Recorded(None, "not recorded: what this invocation did to --out"), Cli(
        ("--fresh",),
        help="--out holds a run with other settings (or a damaged one): move it aside to OUT.replaced-<time> "
             "and start anew.")] = False
    # Issue 39: the `auto` cells of an earlier run (another GPU, a CPU) as the baseline; only FP8 cells start.
    baseline_from: Annotated[str | Path | None, Recorded("baseline_from"), Cli(
        ("--baseline-from",), metavar="RUN_DIR", path="dir", baseline=False,
        help="Take the auto cells of an earlier run (`kveval baseline`, made where auto fits: a larger GPU, a "
             "CPU) as the baseline and start only the other cells; refused, before any engine, unless both "
             "runs have the same weights, tokenizer, chat template, prompts, documents, task samples, seed and "
             "sampling settings, and an auto cell at each --max-model-len.",
        readme="judge against the `auto` cells of an earlier run made where `auto` fits (`kveval baseline --model M "
               "--max-model-len N` on a larger GPU or a CPU) and start only the other cells; refused in one line "
               "unless weights, tokenizer, chat template, prompts, documents, task samples, seed and sampling match. "
               "Where `auto` cannot start on the card itself: `--reference offload` judges against a quality-only "
               "`auto` cell with weights moved to host memory (`cpu_offload_gb`, slow) "
               "([docs/baseline.md](docs/baseline.md))")] = None
    # run/reference.py: auto (emulated budgets), offload, off.
    reference: Annotated[str, Recorded("reference"), Cli(
        ("--reference",), choices=REFERENCE_MODES, show_default=True, baseline=False,
        help="Where auto cannot hold a length FP8 holds: auto starts a quality-only auto cell there on an "
             "emulated budget (--kv-cache-memory, a CPU); offload starts it on this card's own memory share "
             "with weights moved to host memory (vLLM's cpu_offload_gb: slow); off starts none.")] = "auto"
    # Device indices (or ["all"]): cells at once, one per device.
    gpus: Annotated[Sequence[str] | None, Recorded("gpus"), Cli(
        ("--gpus",), metavar="IDS|all",
        help="Run independent cells at once, one per GPU (e.g. --gpus 0,1 or --gpus all); a cell with "
             "--engine-arg tensor_parallel_size=N takes N. Default: one cell at a time.",
        readme="cells at once, one per GPU (`--gpus 0,1`); default one at a time ([docs/gpu.md](docs/gpu.md))")] = None
    # local: cell processes on this machine; ray: Ray tasks.
    executor: Annotated[str, Recorded("executor"), Cli(
        ("--executor",), choices=EXECUTORS, show_default=True,
        help="local: each cell's process on this machine; ray: each cell a Ray task on a Ray cluster, with "
             "its GPUs (needs pip install 'kveval[ray]'; results land in --out here).",
        readme="run each cell as a Ray task (`pip install 'kveval[ray]'`); address `auto`, `HOST:PORT`, "
               "`ray://HOST:PORT`, else `$RAY_ADDRESS` or a local Ray")] = "local"
    # --executor ray: the cluster (None: $RAY_ADDRESS, else local).
    ray_address: Annotated[str | None, Recorded(None, "not recorded: where this invocation's cells ran"), Cli(
        ("--ray-address",), metavar="ADDRESS",
        help="--executor ray: the cluster to join (e.g. ray://head:10001 or auto). Default: $RAY_ADDRESS, "
             "else a Ray started on this machine for the run.")] = None
    # The gate's thresholds; shared with `kveval report` and `gate`, stored as the run's thresholds.json.
    gate_config: Annotated[str | Path | None, Recorded(None, "the run's thresholds.json"), Cli(
        ("--gate-config",), metavar="FILE.yaml", baseline=False,
        help="Gate thresholds from a YAML mapping (threshold: value); --threshold wins over it.",
        readme="gate thresholds from YAML / one override (repeatable; wins over the file)")] = None
    gate_overrides: Annotated[dict[str, Any], Recorded(None, "the run's thresholds.json"), Cli(
        ("--threshold",), metavar="KEY=VALUE", repeat=True, baseline=False,
        help="Override one gate threshold, e.g. --threshold kl_mean_max=0.01 (repeatable). Keys: "
             + ", ".join(f.name for f in dataclasses.fields(Thresholds)) + ".")] = Field(default_factory=dict)

    # Not options of the command line: the API's own, and what kveval sets while it plans the run.
    counts: Annotated[dict[str, int] | None, Recorded("counts")] = None   # prompts per workload (suite's)
    speed_max_tokens: Annotated[int | None, Recorded("phase_options")] = None
    command: Annotated[str | None, Recorded(None, "manifest.json's command")] = None   # the command line, as given
    # False: the default lengths, trimmed to the model's limit.
    lengths_given: Annotated[bool, Recorded(None, "manifest.json's max_model_len, trimmed")] = True
    # --kv named no `auto`: normalized() added it (the run says so).
    baseline_added: Annotated[bool, Recorded(None, "manifest.json's kv, with auto")] = False
    # (dropped, kept): two --kv spellings of one vLLM cache, run once.
    merged_kv: Annotated[tuple[tuple[str, str], ...], Recorded(None, "manifest.json's kv, once each")] = ()

    @property
    def kv_specs(self) -> tuple[KVSpec, ...]:
        """The --kv values as configurations: the one place the user's KV specs are read (after
        validate_options, which refuses any that do not parse)."""
        return tuple(parse_kv(text) for text in self.kv)


@functools.cache
def _annotations() -> dict[str, Any]:
    """Each field's annotation with its metadata (Cli, Recorded), read once."""
    return typing.get_type_hints(CompareOptions, include_extras=True)


def field_metadata(name: str, kind: type) -> Any:
    """The field's `kind` annotation (Cli or Recorded), or None."""
    found = [item for item in getattr(_annotations()[name], "__metadata__", ()) if isinstance(item, kind)]
    return found[0] if found else None


@dataclass(frozen=True)
class CommandLineOption:
    """One option of `kveval compare` as the command line and the README show it: a field's `Cli` or a
    `Shortcut`, with what the field's type says (`value`: one of int, float, str, bool; `many`: several)."""

    name: str                 # the click parameter's name: the field's, or the shortcut's
    field: str                # the CompareOptions field it sets
    flags: tuple[str, ...]
    value: type
    many: bool
    default: Any
    help: str
    readme: str
    cli: Cli | None           # None: a Shortcut (a flag or one value, no more settings)
    readme_metavar: str | None
    baseline: bool            # also an option of `kveval baseline` (a shortcut: as its field)


def _value_type(annotation: Any) -> tuple[type, bool]:
    """(value type, several values) of a field's annotation: `Sequence[int] | None` -> (int, True)."""
    arguments = [a for a in typing.get_args(annotation) if a is not type(None)]
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is Union:
        if float in arguments:
            return float, False
        return _value_type(arguments[0])
    if typing.get_origin(annotation) is Sequence:
        return _value_type(arguments[0])[0], True
    if annotation in (int, float, bool):
        return annotation, False
    return str, False   # text on the command line: a path, a size, JSON, KEY=VALUE items


def command_line_options() -> list[CommandLineOption]:
    """`kveval compare`'s options, in the order of --help and the README's table."""
    hints = typing.get_type_hints(CompareOptions)
    default_options = CompareOptions()
    options = []
    for field in dataclasses.fields(CompareOptions):
        cli = field_metadata(field.name, Cli)
        if cli is None:
            continue
        value, many = _value_type(hints[field.name])
        default = getattr(default_options, field.name)
        options.append(CommandLineOption(field.name, field.name, cli.flags, value, many or cli.many, default,
                                         cli.help, cli.readme, cli, cli.readme_metavar, cli.baseline))
        options.extend(CommandLineOption(s.name, field.name, s.flags, s.kind, False, False if s.kind is bool else None,
                                         s.help, s.readme, None, s.readme_metavar, cli.baseline)
                       for s in cli.shortcuts)
    return options


def checked(**settings: Any) -> CompareOptions:
    """CompareOptions(**settings), a value of the wrong type refused in one line naming its option."""
    try:
        return CompareOptions(**settings)
    except ValidationError as error:
        first = error.errors()[0]
        name = str(first["loc"][0]) if first["loc"] else "?"
        cli = field_metadata(name, Cli) if name in _annotations() else None
        label = cli.flags[0] if cli else name
        raise KvevalError(f"{label} {first['input']!r}: {first['msg']}") from None
