"""The manifest of a compare run, as first written (new_manifest)."""
from __future__ import annotations

import datetime as _dt

from kveval import defaults
from kveval.files.cell_spec import PhaseOptions
from kveval.files.rundir import SCHEMA_VERSION
from kveval.inputs.budget import parse_budget
from kveval.inputs.model_config import ModelFacts, prompt_format
from kveval.inputs.models import ModelInfo
from kveval.inputs.slo import parse_slo
from kveval.inputs.suites import Suite
from kveval.inputs.task_selection import TaskShape
from kveval.inputs.units import parse_size
from kveval.inputs.workloads import PromptSpec
from kveval.run import baseline_import
from kveval.run.cell_process import CellPlan
from kveval.run.options import CompareOptions
from kveval.run.plan import planned_cell


def new_manifest(options: CompareOptions, suite: Suite, shape: TaskShape, model: ModelInfo, tokenizer,
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
