"""What a compare run's options resolve to before any file is written: the suite, the task shape, the
prompts, and every phase's settings (the phases have no defaults of their own)."""
from __future__ import annotations

import dataclasses

from kveval.errors import KvevalError
from kveval.files.cell_spec import PhaseOptions, ScoringOptions, SpeedOptions, TasksOptions, ThroughputOptions
from kveval.inputs.resources import LM_EVAL_TASKS_DIR
from kveval.inputs.suites import Suite, get_suite, scale_max_tokens, sized_task_samples, speed_workloads
from kveval.inputs.task_selection import TaskSelectionError, TaskShape, check_lm_eval_names, task_shape
from kveval.inputs.units import parse_size
from kveval.inputs.workloads import PromptFileError, PromptSpec, build_workloads, load_user_prompts
from kveval.run import environment
from kveval.run.host_platform import gpu_platform, host_platform
from kveval.run.options import CompareOptions
from kveval.run.plan import suite_counts


def suite_and_tasks(options: CompareOptions) -> tuple[Suite, TaskShape, CompareOptions, str | None]:
    """The suite, the task shape, the options without the tasks phase when no task is asked for, and the
    line saying the GPU's first-look task samples were sized down for a long length (None: they were not)."""
    try:
        suite = get_suite(options.suite)
        if options.kv_cache_memory is not None:
            parse_size(options.kv_cache_memory)
    except ValueError as error:
        raise KvevalError(str(error)) from None
    try:
        samples, sized = options.task_samples, None
        if samples is None and suite.task_samples_gpu and _local_gpus(options):
            samples = suite.task_samples_gpu
            if options.max_model_len:   # None: the default lengths, whose longest sizing leaves as they are
                unsized = task_shape(suite, options.tasks, options.task_lengths, options.task_depths, samples,
                                     options.task_limit)
                points = len(unsized.names) * len(unsized.fractions) * len(unsized.depths)
                samples, sized = sized_task_samples(samples, points, unsized.fractions, max(options.max_model_len))
        shape = task_shape(suite, options.tasks, options.task_lengths, options.task_depths, samples,
                           options.task_limit)
        if "tasks" in options.phases and shape.names:
            check_lm_eval_names(shape.names, LM_EVAL_TASKS_DIR)
    except TaskSelectionError as error:
        raise KvevalError(str(error)) from None
    phases = tuple(p for p in options.phases if p != "tasks" or shape.names)
    return suite, shape, dataclasses.replace(options, phases=phases), sized


def _local_gpus(options: CompareOptions) -> bool:
    """Cells run on this host's GPUs (not on a Ray cluster, whose nodes kveval does not see yet)."""
    if options.executor == "ray":
        return False
    by_vllm = gpu_platform(host_platform())
    return by_vllm if by_vllm is not None else bool(environment.gpu_names())


def read_user_prompts(options: CompareOptions) -> list[dict]:
    """The --prompts file, read and checked first: a bad or huge file costs no model load."""
    try:
        return load_user_prompts(options.prompts) if options.prompts else []
    except PromptFileError as error:
        raise KvevalError(str(error)) from None


def build_prompts(options: CompareOptions, suite: Suite, tokenizer, model_limit: int | None,
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


def build_phase_options(options: CompareOptions, suite: Suite, prompts: list[PromptSpec],
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


def _repeat_target(options: CompareOptions, suite: Suite) -> float:
    return options.repeat_target if options.repeat_target is not None else suite.repeat_target


def _repeat_budget(options: CompareOptions, suite_seconds: float) -> float:
    """--repeat-budget (seconds per cell and phase; 0: no repeats beyond the minimum's first run), else the suite's."""
    return float(options.repeat_budget) if options.repeat_budget is not None else suite_seconds


def _levels(options: CompareOptions, suite: Suite) -> list[int]:
    return sorted({int(c) for c in (options.concurrency or suite.throughput_levels)})


def cpu_concurrency(options: CompareOptions, suite: Suite) -> int:
    """Requests a cell serves at once: the throughput sweep's largest level, else one at a time."""
    return max(_levels(options, suite)) if "throughput" in options.phases else 1
