"""A compare run's state in the parent: the typed manifest and its cells, behind the one writer of
manifest.json (RunState), and the manifest as set-up first builds it (new_manifest).

Every change goes through `RunState.change`: checked against the schema (files/schema/manifest.py), written
atomically (files/rundir.py write_json_atomic), once per change, and kept typed in memory, so that no later
step reads back from disk what this process wrote. The file keeps the key order and presence rules it
always had: a key is written only when given, a new one goes last (a resume compares manifests).
"""
from __future__ import annotations

import datetime as _dt
import json
from dataclasses import dataclass
from typing import Any

from kveval import defaults
from kveval.files import schema
from kveval.files.cell_spec import PhaseOptions
from kveval.files.rundir import SCHEMA_VERSION, RunDir, write_json_atomic
from kveval.inputs.budget import parse_budget
from kveval.inputs.model_config import ModelFacts, prompt_format
from kveval.inputs.model_identity import ModelIdentity
from kveval.inputs.models import ModelInfo
from kveval.inputs.slo import parse_slo
from kveval.inputs.suites import Suite
from kveval.inputs.task_selection import TaskShape
from kveval.inputs.units import parse_size
from kveval.inputs.workloads import PromptSpec
from kveval.run import baseline_import
from kveval.run.calibration import CalibratedCheckpoint
from kveval.run.cell_process import CellPlan
from kveval.run.options import CompareOptions
from kveval.run.plan import planned_cell


@dataclass(frozen=True)
class SetUpFacts:
    """What set-up learns beside the options and the model's config, recorded in the manifest."""
    kv_layout: Any                          # inputs/model_config.ModelFacts.kv_layout
    identity: ModelIdentity                 # which weights were judged
    checkpoints: dict[str, CalibratedCheckpoint]   # scaled word -> calibrated checkpoint
    devices: list[str] | None               # --gpus, resolved
    budget_note: str | None                 # why kveval chose the KV budget on a CPU, when it did


def new_manifest(options: CompareOptions, suite: Suite, shape: TaskShape, model: ModelInfo, tokenizer,
                 facts: ModelFacts, prompts: list[PromptSpec], documents: list[dict], phase_options: PhaseOptions,
                 kv_scales: dict, baseline_dtype: str | None, plans: list[CellPlan], environment_facts: dict,
                 set_up: SetUpFacts | None = None) -> dict:
    """The manifest before its task data (written into the run after the resume check): what a resume
    compares. `set_up`: the facts set-up adds, in the order a resume's fingerprint has always seen them."""
    manifest = _manifest(options, suite, shape, model, tokenizer, facts, prompts, documents, phase_options, kv_scales,
                         baseline_dtype, plans, environment_facts)
    if set_up is None:
        return manifest
    manifest["model"]["kv_layout"] = set_up.kv_layout
    if facts.weights_quantization is not None:   # served as they are: the review names them
        manifest["model"]["weights_quantization"] = facts.weights_quantization.label
    if facts.encoder is not None:   # multimodal: the text model runs, the encoder is fixed memory (review says so)
        manifest["model"]["encoder"] = facts.encoder.model_dump(mode="json")
    if set_up.checkpoints:
        manifest["calibration"] = {word: checkpoint.model_dump(mode="json")
                                   for word, checkpoint in set_up.checkpoints.items()}
    # Which weights were judged: the revision asked for, a local model's weights hash (kveval diff, resume).
    manifest["model"].update(set_up.identity.model_dump(mode="json"))
    manifest["options"].update(gpus=set_up.devices, executor=options.executor, kv_budget_note=set_up.budget_note)
    return manifest


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
            **({"reference": options.reference} if options.reference != "auto" else {}),
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


class RunState:
    """The run as the parent holds it: `manifest` (typed, what looks and later steps read) and its cells,
    with `change` the only way the manifest changes."""

    def __init__(self, run: RunDir, manifest: schema.Manifest):
        self.run = run
        self.manifest = manifest

    @classmethod
    def write_new(cls, run: RunDir, data: dict[str, Any]) -> RunState:
        """The manifest set-up built (new_manifest, then its task data), checked and written: its first write."""
        return cls(run, _written(run, data))

    def change(self, **entries: Any) -> None:
        """Top-level manifest entries set (each a typed model or its JSON value), checked and written in one
        atomic write. A key not yet in the manifest goes last."""
        data = schema.dump(self.manifest)
        for key, value in entries.items():
            data[key] = schema.dump(value) if isinstance(value, schema.FileModel) else value
        self.manifest = _written(self.run, data)

    def with_planned(self, plans: list[CellPlan]) -> list[dict[str, Any]]:
        """The manifest's planned cells, then each of `plans` not among them yet (for `change(cells=...)`)."""
        known = {cell.id for cell in self.manifest.cells}
        return [*(schema.dump(cell) for cell in self.manifest.cells),
                *(planned_cell(plan) for plan in plans if plan.id not in known)]

    def cells(self) -> dict[str, schema.CellResult]:
        """The typed cells in the planned order, rounds merged (RunDir.cell_results over the manifest held
        here; a cell file already read is not parsed again)."""
        return self.run.cell_results(self.manifest)


def _written(run: RunDir, data: dict[str, Any]) -> schema.Manifest:
    """`data` checked against the schema first (kveval never writes a file it would refuse), then written
    atomically as manifest.json; the typed manifest it is."""
    path = run.manifest_path
    typed = schema.parse(schema.Manifest, json.loads(json.dumps(data, default=str)), str(path))
    write_json_atomic(path, data)
    return typed
