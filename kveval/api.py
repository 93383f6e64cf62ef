"""The Python API. The CLI is a thin shell over `compare`, `report`, `gate` and `load_run`.

    import kveval
    result = kveval.compare(kv=["fp8", "auto"], max_model_len=[2048, 8192], kv_cache_memory="150MiB")
    print(result.verdict.status, result.review_path)
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from kveval import defaults
from kveval.run import environment
from kveval.gate import GateConfigError, Thresholds, Verdict, load_thresholds
from kveval.inputs.models import ModelError, resolve_model
from kveval.worker.phases import PHASES
from kveval.run.cell_process import CellPlan, run_cell_process
from kveval.inputs.checkpoint_scales import read_kv_scales
from kveval.files.rundir import SCHEMA_VERSION, RunDir, StoreError, cell_id, read_json, write_json_atomic, write_text_atomic
from kveval.inputs.suites import get_suite, scale_max_tokens, speed_workloads
from kveval.inputs.task_selection import TaskSelectionError, check_lm_eval_names, task_shape, write_run_task_data
from kveval.inputs.task_data import TASKS as TASKS_BY_NAME, TASKS_DIR, write_task_data
from kveval.inputs.kvspec import KVSpec, KVSpecError, parse_kv
from kveval.run.remedy import REMEDY_MODES, plan_remedy
from kveval.inputs.units import parse_size
from kveval.inputs.workloads import CTX_1K_TOKENS, PromptFileError, build_workloads, document_tokens, load_user_prompts


class KvevalError(Exception):
    """A user-facing error: the CLI prints the message, never a traceback."""


class RunInterrupted(KvevalError):
    """Ctrl-C or SIGTERM during a run: finished cells are kept and a partial review is written."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        super().__init__(f"interrupted; finished cells are kept in {run_dir} (partial review: {run_dir / 'review.md'}). "
                         "Run the same command again to resume.")


@dataclass
class RunResult:
    run_dir: Path
    manifest: dict
    cells: dict[str, dict]
    review_path: Path | None = None
    verdict: Verdict | None = None
    evidence: dict | None = None
    results_path: Path | None = None

    def cell(self, kv_cache_dtype: str, max_model_len: int) -> dict | None:
        return self.cells.get(cell_id(kv_cache_dtype, max_model_len))


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
    suite: str = defaults.SUITE
    counts: dict[str, int] | None = None
    speed_runs: int | None = None
    speed_warmup: int | None = None
    speed_max_tokens: int | None = None
    phases: Sequence[str] = defaults.PHASES
    cell_timeout: float | None = defaults.CELL_TIMEOUT_S
    command: str | None = None
    gate_config: str | Path | None = None
    gate_overrides: dict[str, Any] = field(default_factory=dict)
    tasks: Sequence[str] | None = None          # None: kveval's six; ["none"]: skip; else names
    task_limit: int | None = None               # samples per task at most (spread over sizes, depths)
    task_lengths: Sequence[float] | None = None  # prompt sizes as shares of max_model_len (suite's)
    task_depths: Sequence[float] | None = None   # needle depths (suite's)
    task_samples: int | None = None             # samples per (task, size, depth) point (suite's)
    diagnose: bool = defaults.DIAGNOSE          # per-layer K/V range pass through transformers (FP8 runs)
    remedy: str = defaults.REMEDY               # auto: on an FP8 FAIL; always: after every FP8 cell; off


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


def _validate(options: CompareOptions) -> None:
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
    if options.remedy not in REMEDY_MODES:
        raise KvevalError(f"--remedy {options.remedy!r}: choose one of {', '.join(REMEDY_MODES)}")
    if not options.max_model_len:
        raise KvevalError("--max-model-len needs at least one value (e.g. --max-model-len 2048 8192)")
    for length in options.max_model_len:
        if int(length) < 64:
            raise KvevalError(f"--max-model-len {length} is too small (at least 64)")
    unknown = [p for p in options.phases if p not in PHASES]
    if unknown:
        raise KvevalError(f"unknown phase(s) {', '.join(unknown)}; known: {', '.join(PHASES)}")
    if options.gpu_memory_utilization is not None and not 0 < options.gpu_memory_utilization <= 1:
        raise KvevalError("--gpu-memory-utilization must be in (0, 1]")
    for name in ("speed_runs", "speed_max_tokens"):
        value = getattr(options, name)
        if value is not None and value < 1:
            raise KvevalError(f"--{name.replace('_', '-')} must be at least 1")
    if options.speed_warmup is not None and options.speed_warmup < 0:
        raise KvevalError("--speed-warmup must be 0 or more")


def resolve_thresholds(thresholds: Thresholds | None = None, gate_config: str | Path | None = None,
                       gate_overrides: dict | None = None) -> Thresholds:
    """Thresholds given as such, else defaults < YAML file `gate_config` < `gate_overrides`."""
    if thresholds is not None:
        if gate_config is not None or gate_overrides:
            raise KvevalError("give either thresholds or gate_config/gate_overrides, not both")
        return thresholds
    try:
        return load_thresholds(gate_config, gate_overrides or {})
    except GateConfigError as error:
        raise KvevalError(str(error)) from None


def _default_out(model_name: str) -> Path:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", model_name).strip("-").lower() or "model"
    return Path(defaults.RUNS_DIR) / f"{slug}-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}"


def _load_tokenizer(model_path: str):
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(model_path)
    except Exception as error:  # noqa: BLE001 - hub/network/format errors all mean "cannot read it"
        raise KvevalError(f"cannot load the tokenizer of {model_path!r}: {type(error).__name__}: {error}") from None


def prompt_format(tokenizer) -> dict:
    """How prompts were made: a base model without a chat template (or a tokenizer that drops BOS)
    explains odd outputs, so the manifest and the review say so."""
    probe = tokenizer("x", add_special_tokens=True)["input_ids"]
    bos = getattr(tokenizer, "bos_token_id", None)
    return {"chat_template": bool(getattr(tokenizer, "chat_template", None)),
            "bos_token": getattr(tokenizer, "bos_token", None),
            "adds_bos": bool(bos is not None and probe and probe[0] == bos)}


def _suite_counts(suite, lengths: Sequence[int], model_limit: int | None) -> dict | None:
    """A suite's counts, minus the ~1K-token workload when no cell could hold it (small max_model_len)."""
    if suite.counts is None:
        return None
    counts = dict(suite.counts)
    if min(max(lengths), model_limit or max(lengths)) <= CTX_1K_TOKENS:
        counts.pop("ctx_1k", None)
    return counts


def _text_config_number(model_path: str, name: str) -> int | None:
    """A positive whole number from the model's (text) config, or None when it does not say."""
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(model_path)
    except Exception:  # noqa: BLE001 - an unreadable config only means "unknown"
        return None
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    value = getattr(text_config, name, None)
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


def model_length_limit(model_path: str) -> int | None:
    """The model's own maximum context (max_position_embeddings), if its config says."""
    return _text_config_number(model_path, "max_position_embeddings")


def model_layer_count(model_path: str) -> int | None:
    """num_hidden_layers of the model's (text) config, if its config says."""
    return _text_config_number(model_path, "num_hidden_layers")


def _check_keep_layers(kv: Sequence[str], layers: int | None, model_name: str) -> None:
    """fp8:keep=N with N past the model's last layer would silently keep nothing."""
    if layers is None:
        return
    for text in kv:
        beyond = [k for k in parse_kv(text).keep if k.isdigit() and int(k) >= layers]
        if beyond:
            raise KvevalError(f"--kv {text}: {model_name} has layers 0-{layers - 1}; no layer {', '.join(beyond)}")


def model_dtype(model_path: str) -> str:
    """The checkpoint's own dtype as a vLLM kv_cache_dtype name (bfloat16 when the config says none)."""
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(model_path)
    except Exception:  # noqa: BLE001 - unreadable config: the common case
        return "bfloat16"
    dtype = str(getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or "bfloat16")
    dtype = dtype.replace("torch.", "")
    return dtype if dtype in ("bfloat16", "float16") else "bfloat16"


def scoring_documents(tokenizer, lengths: Sequence[int], fraction: float, model_limit: int | None,
                      seed: int) -> list[dict]:
    """Plain documents for teacher-forced scoring, one per max_model_len (capped at the model's limit)."""
    documents, seen = [], set()
    for length in sorted(set(int(x) for x in lengths)):
        size = int(fraction * min(length, model_limit or length))
        if size < 16 or size in seen:
            continue
        seen.add(size)
        documents.append({"id": f"doc:{size}", "kind": "document", "token_ids": document_tokens(tokenizer, size, seed=seed)})
    return documents


def plan_cells(options: CompareOptions, model_path: str, phase_options: dict,
               baseline_dtype: str | None = None) -> list[CellPlan]:
    """Cells in run order: shortest max_model_len first, the `auto` baseline first within a length."""
    specs = [parse_kv(kv).text for kv in options.kv]
    kv_order = sorted(dict.fromkeys(specs), key=lambda kv: (kv != "auto", specs.index(kv)))
    plans = []
    for length in sorted(dict.fromkeys(int(x) for x in options.max_model_len)):
        for kv in kv_order:
            plans.append(cell_plan(options, model_path, phase_options, kv, length, baseline_dtype))
    return plans


def cell_plan(options: CompareOptions, model_path: str, phase_options: dict, kv: str, length: int,
              baseline_dtype: str | None = None) -> CellPlan:
    """One cell: a KV spec (e.g. fp8, fp8:keep=0) at one max_model_len. `baseline_dtype`: what the
    `auto` baseline really runs when vLLM would resolve `auto` to FP8 for this checkpoint."""
    spec = parse_kv(kv)
    if spec.dtype == "auto" and baseline_dtype:
        spec = KVSpec(baseline_dtype)
    kv_bytes = parse_size(options.kv_cache_memory) if options.kv_cache_memory is not None else None
    return CellPlan(
        id=cell_id(kv, length), kv_cache_dtype=parse_kv(kv).text, max_model_len=length,
        engine={"model": model_path, "kv_cache_dtype": spec.dtype, "kv_cache_dtype_skip_layers": list(spec.keep),
                "max_model_len": length, "seed": options.seed,
                "kv_cache_memory_bytes": kv_bytes, "gpu_memory_utilization": options.gpu_memory_utilization,
                "enforce_eager": options.enforce_eager, "extra": dict(options.engine_args)},
        phases=list(options.phases), phase_options=phase_options,
    )


def _settings_fingerprint(manifest: dict) -> dict:
    # What must match for a re-run into the same directory to reuse finished cells.
    return {key: manifest.get(key) for key in ("model", "options", "prompt_ids", "scoring_ids")}


def compare(model: str | None = None, kv: Sequence[str] = defaults.KV,
            max_model_len: Sequence[int] = defaults.MAX_MODEL_LEN, *, progress: Any = None, **kwargs) -> RunResult:
    """Run the (kv dtype x max_model_len) matrix, store every fact, write review.md."""
    options = CompareOptions(model=model, kv=tuple(kv), max_model_len=tuple(int(x) for x in max_model_len), **kwargs)
    _validate(options)
    # Before any engine starts: a bad thresholds file must not cost a run.
    thresholds = resolve_thresholds(None, options.gate_config, options.gate_overrides)
    try:
        suite = get_suite(options.suite)
        kv_cache_bytes = parse_size(options.kv_cache_memory) if options.kv_cache_memory is not None else None
    except ValueError as error:
        raise KvevalError(str(error)) from None
    try:
        shape = task_shape(suite, options.tasks, options.task_lengths, options.task_depths, options.task_samples,
                           options.task_limit)
        task_names, task_fractions, task_depths, task_samples = shape.names, shape.fractions, shape.depths, shape.samples
        if "tasks" in options.phases and task_names:
            check_lm_eval_names(task_names, TASKS_DIR)
    except TaskSelectionError as error:
        raise KvevalError(str(error)) from None
    phases = [p for p in options.phases if p != "tasks" or task_names]
    options = dataclasses.replace(options, phases=tuple(phases))
    from kveval.run.progress import ConsoleProgress

    show = progress if progress is not None else ConsoleProgress()
    try:
        model_info = resolve_model(options.model, progress=show.note)
        user_prompts = load_user_prompts(options.prompts) if options.prompts else []
    except (ModelError, PromptFileError) as error:
        raise KvevalError(str(error)) from None
    tokenizer = _load_tokenizer(model_info.path)
    model_limit = model_length_limit(model_info.path)
    _check_keep_layers(options.kv, model_layer_count(model_info.path), model_info.name)
    try:
        prompts = build_workloads(tokenizer, options.max_model_len, seed=options.seed,
                                  counts=options.counts if options.counts is not None
                                  else _suite_counts(suite, options.max_model_len, model_limit),
                                  user_prompts=user_prompts, context_basis=model_limit)
    except (ValueError, PromptFileError) as error:
        raise KvevalError(f"cannot build the workloads: {error}") from None
    prompts = scale_max_tokens(prompts, suite.max_tokens_scale)

    documents = scoring_documents(tokenizer, options.max_model_len, suite.scoring_doc_fraction, model_limit,
                                  options.seed)
    phase_options = {"scoring": {"top_k": suite.scoring_top_k, "noise": True}, "speed": {
        "runs": options.speed_runs or suite.speed_runs,
        "warmup": options.speed_warmup if options.speed_warmup is not None else suite.speed_warmup,
        "workloads": speed_workloads(prompts, suite.speed_workloads),
        "max_tokens": options.speed_max_tokens or suite.speed_max_tokens,
    }}
    run_dir = RunDir(options.out or _default_out(model_info.name))
    task_settings = {"tasks": task_names if "tasks" in options.phases else [], "lengths": list(task_fractions),
                     "depths": list(task_depths), "samples_per_point": task_samples, "limit": options.task_limit}
    phase_options["tasks"] = {"tasks": task_settings["tasks"], "limit": options.task_limit}
    kv_scales = read_kv_scales(model_info.path)
    # For ModelOpt FP8-KV checkpoints vLLM resolves `auto` to FP8 (vllm#34752): `auto` would be no
    # baseline, so the baseline cells run the model dtype instead, and the review says so.
    baseline_dtype = model_dtype(model_info.path) if kv_scales.get("auto_is_fp8") else None
    plans = plan_cells(options, model_info.path, phase_options, baseline_dtype)
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "tool": "kveval",
        "command": options.command or f"kveval.compare(model={options.model!r}, kv={list(options.kv)!r}, "
                                      f"max_model_len={list(options.max_model_len)!r}, ...)",
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "model": {**model_info.to_dict(), "max_position_embeddings": model_limit, "dtype": model_dtype(model_info.path)},
        "options": {
            "kv": list(options.kv), "max_model_len": list(options.max_model_len), "seed": options.seed,
            "kv_cache_memory_bytes": kv_cache_bytes, "gpu_memory_utilization": options.gpu_memory_utilization,
            "enforce_eager": options.enforce_eager, "engine_args": options.engine_args, "suite": suite.name,
            "counts": options.counts, "phases": list(options.phases), "phase_options": phase_options,
            "prompts_file": str(options.prompts) if options.prompts else None, "cell_timeout_s": options.cell_timeout,
            **task_settings,
        },
        "prompt_ids": [p.id for p in prompts],
        "prompt_format": prompt_format(tokenizer),
        "kv_scales": kv_scales,
        "baseline_engine_dtype": baseline_dtype,
        "scoring_ids": [d["id"] for d in documents],
        "cells": [plan.to_dict() for plan in plans],
        **environment.describe(),
    }
    reuse = _prepare_run_dir(run_dir, manifest)
    # Task data is part of what every cell reads: written before the first cell, into the run.
    task_plan = write_run_task_data(run_dir, tokenizer, options.max_model_len, task_settings["tasks"],
                                    model_limit=model_limit, fractions=task_fractions, depths=task_depths,
                                    samples=task_samples, seed=options.seed)
    manifest["task_data"] = task_plan  # cells read their length's data directory from here
    write_json_atomic(run_dir.manifest_path, manifest)
    write_json_atomic(run_dir.workloads_path, [p.to_dict() for p in prompts], compact=True)
    write_json_atomic(run_dir.scoring_path, documents, compact=True)
    show.note(f"Run directory: {run_dir.path}  ({len(plans)} cells, {len(prompts)} prompts per cell)")
    if options.diagnose and any(parse_kv(kv).dtype.startswith("fp8") for kv in options.kv):
        run_diagnosis(run_dir, model_info.path, manifest.get("kv_scales"), show)

    try:
        _run_cells(run_dir, plans, reuse, options, show)
        result = report(run_dir.path, thresholds=thresholds)
        remedy = plan_remedy(result.verdict, result.evidence, options.remedy)
        extra = [cell_plan(options, model_info.path, phase_options, kv, length, baseline_dtype)
                 for kv, length in remedy["cells"]]
        if remedy["notes"]:
            manifest["remedy"] = {"mode": options.remedy, "notes": remedy["notes"],
                                  "cells": [plan.id for plan in extra] or (manifest.get("remedy") or {}).get("cells", [])}
            known = {c["id"] for c in manifest["cells"]}
            manifest["cells"] += [plan.to_dict() for plan in extra if plan.id not in known]
            write_json_atomic(run_dir.manifest_path, manifest)
            for note in remedy["notes"]:
                show.note(note)
        _run_cells(run_dir, extra, True, options, show)
    except KeyboardInterrupt:
        # Finished cells are on disk already; render what exists so the user has a review now.
        report(run_dir.path, thresholds=thresholds)
        raise RunInterrupted(run_dir.path) from None
    return report(run_dir.path, progress=show, thresholds=thresholds)


def _run_cells(run_dir: RunDir, plans: list[CellPlan], reuse: bool, options: CompareOptions, show) -> None:
    for plan in plans:
        previous = run_dir.load_cell(plan.id) if reuse else None
        if previous is not None and previous.get("complete") and not previous.get("crash"):
            show.cell_reused(plan.id, previous)
            continue
        show.cell_started(plan.id)
        facts = run_cell_process(run_dir, plan, timeout_s=options.cell_timeout,
                                 on_event=lambda event, cell=plan.id: show.cell_event(cell, event))
        show.cell_finished(plan.id, facts)


DIAGNOSIS_TIMEOUT_S = 1800


def run_diagnosis(run_dir: RunDir, model_path: str, scales: dict | None, show) -> dict:
    """The per-layer K/V range pass (transformers, in its own process so its memory is gone before
    the engines start), stored as RUN_DIR/kv_ranges.json; reused when present. A failure is stored
    as {"error": ...}: the run goes on without a diagnosis."""
    path = run_dir.kv_ranges_path
    if path.is_file():
        return read_json(path)
    show.note("Measuring per-layer K/V ranges with transformers (once per run)")
    command = [sys.executable, "-m", "kveval.worker.kv_ranges", "--model", model_path,
               "--documents", str(run_dir.scoring_path), "--out", str(path)]
    if scales and (scales.get("k_scale") or scales.get("v_scale")):
        write_json_atomic(run_dir.kv_scales_path, scales)
        command += ["--scales", str(run_dir.kv_scales_path)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=DIAGNOSIS_TIMEOUT_S)
        failed = done.returncode != 0 or not path.is_file()
        why = " ".join((done.stderr or done.stdout or f"exit code {done.returncode}").strip().splitlines()[-3:])
    except subprocess.TimeoutExpired:
        failed, why = True, f"timed out after {DIAGNOSIS_TIMEOUT_S} s"
    if failed:
        write_json_atomic(path, {"error": f"the K/V range pass failed: {why[-400:]}"})
        show.note(f"Per-layer diagnosis failed: {why[-200:]}")
    return read_json(path)


def _prepare_run_dir(run_dir: RunDir, manifest: dict) -> bool:
    """True when finished cells of an earlier, identical run in this directory can be reused."""
    if run_dir.path.exists() and not run_dir.path.is_dir():
        raise KvevalError(f"--out {run_dir.path} exists and is not a directory")
    if not run_dir.exists():
        if run_dir.path.is_dir() and any(run_dir.path.iterdir()):
            raise KvevalError(f"--out {run_dir.path} is not empty and is not a kveval run; choose another directory")
        return False
    try:
        earlier = run_dir.load_manifest()
    except StoreError as error:
        raise KvevalError(f"--out {run_dir.path}: {error}") from None
    if _settings_fingerprint(earlier) != _settings_fingerprint(manifest):
        raise KvevalError(
            f"--out {run_dir.path} holds a run with different settings; give another --out "
            "(kveval never overwrites measured results)"
        )
    return True


def load_run(run_dir: str | Path) -> RunResult:
    store = RunDir(run_dir)
    try:
        manifest = store.load_manifest()
        cells = store.load_cells(manifest)
    except StoreError as error:
        raise KvevalError(str(error)) from None
    return RunResult(store.path, manifest, cells, store.review_path if store.review_path.exists() else None)


def report(run_dir: str | Path, *, progress: Any = None, thresholds: Thresholds | None = None,
           gate_config: str | Path | None = None, gate_overrides: dict | None = None) -> RunResult:
    """Recompute the evidence and the verdict from the stored files alone (no engine); write
    results.json, tables/*.csv and review.md. Thresholds: `thresholds`, or defaults < the YAML file
    `gate_config` < `gate_overrides`."""
    from kveval.pipeline import judge_stored_run

    limits = resolve_thresholds(thresholds, gate_config, gate_overrides)
    result = load_run(run_dir)
    try:
        review = judge_stored_run(RunDir(run_dir), result.manifest, result.cells, limits)
    except StoreError as error:
        raise KvevalError(str(error)) from None
    result.results_path, result.review_path = review.results_path, review.review_path
    result.evidence, result.verdict = review.evidence, review.verdict
    if progress is not None:
        progress.note(f"Review written: {review.review_path}")
    return result


def gate(run_dir: str | Path, thresholds: Thresholds | None = None, *, gate_config: str | Path | None = None,
         gate_overrides: dict | None = None) -> Verdict:
    """The verdict for a stored run (no engine); results.json and review.md are rewritten with it."""
    return report(run_dir, thresholds=thresholds, gate_config=gate_config, gate_overrides=gate_overrides).verdict


def generate_task_data(out: str | Path, max_model_len: int, *, model: str | None = None,
                       tasks: Sequence[str] | None = None, task_lengths: Sequence[float] | None = None,
                       task_depths: Sequence[float] | None = None, task_samples: int | None = None,
                       suite: str = defaults.SUITE, seed: int = defaults.SEED, progress: Any = None) -> dict:
    """Write kveval's task data for one max_model_len into OUT/<task>.jsonl, for the stock lm_eval
    CLI (`lm_eval --include_path "$(kveval tasks path)" --tasks kveval_longctx --metadata '{"data_dir": "OUT"}'`)."""
    try:
        shape = task_shape(get_suite(suite), tasks, task_lengths, task_depths, task_samples)
    except ValueError as error:  # TaskSelectionError is one
        raise KvevalError(str(error)) from None
    others = [n for n in shape.names if n not in TASKS_BY_NAME]
    if others:
        raise KvevalError(f"only kveval's own tasks have generated data; not: {', '.join(others)}")
    if int(max_model_len) < 64:
        raise KvevalError(f"--max-model-len {max_model_len} is too small (at least 64)")
    try:
        model_info = resolve_model(model, progress=progress)
    except ModelError as error:
        raise KvevalError(str(error)) from None
    tokenizer = _load_tokenizer(model_info.path)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise KvevalError(f"--out {out} exists and is not a directory")
    try:
        return write_task_data(tokenizer, out, int(max_model_len), shape.names, fractions=shape.fractions,
                               depths=shape.depths, samples_per_point=shape.samples, seed=seed)
    except ValueError as error:
        raise KvevalError(f"cannot generate task data for max_model_len {max_model_len}: {error}") from None
