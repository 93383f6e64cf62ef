"""Which cells a run has, in which order, with which engine settings; and the documents every cell scores."""
from __future__ import annotations

import datetime as _dt
import re
from pathlib import Path
from typing import Sequence

from kveval import defaults
from kveval.errors import KvevalError
from kveval.files.cell_spec import PhaseOptions
from kveval.files.rundir import cell_id
from kveval.inputs.kvspec import KVSpec
from kveval.inputs.units import parse_size
from kveval.inputs.workloads import CTX_1K_TOKENS, document_tokens
from kveval.run.cell_process import CellPlan
from kveval.run.options import CompareOptions


def default_out(model_name: str) -> Path:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", model_name).strip("-").lower() or "model"
    return Path(defaults.RUNS_DIR) / f"{slug}-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}"


def suite_counts(suite, lengths: Sequence[int], model_limit: int | None) -> dict | None:
    """A suite's counts, minus the ~1K-token workload when no cell could hold it (small max_model_len)."""
    if suite.counts is None:
        return None
    counts = dict(suite.counts)
    if min(max(lengths), model_limit or max(lengths)) <= CTX_1K_TOKENS:
        counts.pop("ctx_1k", None)
    return counts


# Prompts are built up to max_model_len tokens in the parent: beyond this, that alone needs gigabytes.
LONGEST_BUILDABLE = 4 * 1024 * 1024


def lengths_for_model(lengths: Sequence[int], given: bool, limit: tuple[int, str] | None, model_name: str,
                      allow_long: bool) -> tuple[tuple[int, ...], str | None]:
    """The max_model_len values to run, and a note when defaults were trimmed. Lengths the user gave
    over the model's limit are refused (vLLM would refuse every such cell) unless vLLM is told to
    allow them (VLLM_ALLOW_LONG_MAX_MODEL_LEN=1); default lengths over it are left out, with a note."""
    huge = [n for n in lengths if n > LONGEST_BUILDABLE]
    if huge:
        raise KvevalError(f"--max-model-len {huge[0]:,}: kveval builds prompts up to max_model_len tokens, and above "
                          f"{LONGEST_BUILDABLE:,} that alone would exhaust memory; give a length up to that")
    if limit is None or allow_long:
        return tuple(lengths), None
    ceiling, derivation = limit
    over = [n for n in lengths if n > ceiling]
    if not over:
        return tuple(lengths), None
    if given:
        raise KvevalError(
            f"--max-model-len {', '.join(f'{n:,}' for n in over)}: over {model_name}'s limit of {ceiling:,} tokens "
            f"({derivation}); vLLM refuses longer unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 is set. "
            f"Give lengths up to {ceiling:,}")
    kept = tuple(n for n in lengths if n <= ceiling) or (ceiling,)
    return kept, (f"default max_model_len {', '.join(f'{n:,}' for n in over)} left out: over {model_name}'s limit of "
                  f"{ceiling:,} tokens ({derivation})")


def check_keep_layers(specs: Sequence[KVSpec], layers: int | None, model_name: str) -> None:
    """fp8:keep=N with N past the model's last layer would silently keep nothing."""
    if layers is None:
        return
    for spec in specs:
        beyond = [k for k in spec.keep if k.isdigit() and int(k) >= layers]
        if beyond:
            raise KvevalError(f"--kv {spec.text}: {model_name} has layers 0-{layers - 1}; no layer {', '.join(beyond)}")


ROUND_SEED_STEP = 7919   # a scoring round's documents: the run's seed moved by this per round (other text)


def scoring_documents(tokenizer, lengths: Sequence[int], count: int, fractions: tuple[float, float],
                      model_limit: int | None, seed: int, round_number: int = 0) -> list[dict]:
    """Plain documents for teacher-forced scoring: `count` per max_model_len (capped at the model's limit),
    sized evenly between the two shares of it; each size starts at its own place in the corpus. A
    scoring round (run/rounds.py) draws other text (another seed) under ids of its own (doc:r<k>:<size>)."""
    documents, seen = [], set()
    prefix = f"doc:r{round_number}:" if round_number else "doc:"
    seed = seed + ROUND_SEED_STEP * round_number
    low, high = fractions
    for length in sorted(set(int(x) for x in lengths)):
        usable = min(length, model_limit or length)
        steps = max(1, count - 1)
        for i in range(count):
            size = int(usable * (low + (high - low) * i / steps)) if count > 1 else int(high * usable)
            if size < 16 or size in seen:
                continue
            seen.add(size)
            documents.append({"id": f"{prefix}{size}", "kind": "document",
                              "token_ids": document_tokens(tokenizer, size, seed=seed)})
    return documents


def plan_cells(options: CompareOptions, model_path: str, phase_options: PhaseOptions,
               baseline_dtype: str | None = None, efficiency_sample: int = 0,
               calibrated: dict[str, str] | None = None) -> list[CellPlan]:
    """Cells in run order: shortest max_model_len first, the `auto` baseline first within a length.
    The first cell also replays its phases' requests as one batched call each, up to
    `efficiency_sample` of them (worker/efficiency.py): the engine-efficiency reference, measured once
    per run because it repeats the phase's work."""
    specs = list(dict.fromkeys(options.kv_specs))
    kv_order = sorted(specs, key=lambda spec: (spec.dtype != "auto", specs.index(spec)))
    plans = []
    for length in sorted(dict.fromkeys(int(x) for x in options.max_model_len)):
        for spec in kv_order:
            options_here = phase_options if plans or not efficiency_sample else \
                phase_options.model_copy(update={"efficiency_sample": efficiency_sample})
            plans.append(cell_plan(options, model_path, options_here, spec, length, baseline_dtype, calibrated))
    return plans


def cell_plan(options: CompareOptions, model_path: str, phase_options: PhaseOptions, spec: KVSpec, length: int,
              baseline_dtype: str | None = None, calibrated: dict[str, str] | None = None) -> CellPlan:
    """One cell: a KV spec (e.g. fp8, fp8:keep=0, fp8:scaled) at one max_model_len. `baseline_dtype`: what
    the `auto` baseline really runs when vLLM would resolve `auto` to FP8 for this checkpoint.
    `calibrated`: scaled word -> the calibrated checkpoint copy (run/calibration.py) a scaled spec loads."""
    if spec.scaled:
        if not calibrated or spec.scaled not in calibrated:
            raise KvevalError(f"--kv {spec.text}: no calibrated checkpoint was made for it")
        model_path = calibrated[spec.scaled]
    engine_spec = KVSpec(baseline_dtype) if spec.dtype == "auto" and baseline_dtype else spec
    kv_bytes = parse_size(options.kv_cache_memory) if options.kv_cache_memory is not None else None
    return CellPlan(
        id=cell_id(spec.text, length), kv=spec, max_model_len=length,
        engine={"model": model_path, "kv_cache_dtype": engine_spec.dtype,
                "kv_cache_dtype_skip_layers": list(engine_spec.keep),
                "max_model_len": length, "seed": options.seed,
                "kv_cache_memory_bytes": kv_bytes, "gpu_memory_utilization": options.gpu_memory_utilization,
                "enforce_eager": options.enforce_eager, "extra": dict(options.engine_args)},
        phases=list(options.phases), phase_options=phase_options,
    )


def planned_cell(plan: CellPlan) -> dict:
    """The manifest's entry for a cell: its id, KV spec and length, and the engine settings it is started
    with (schema.PlannedEngine: the plan's `engine` less the model path, which the manifest's model gives)."""
    return {**plan.to_dict(), "engine": {key: value for key, value in plan.engine.items() if key != "model"}}
