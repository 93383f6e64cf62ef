"""Which cells get another round of task samples, and how many (pure: verdict + evidence in, a plan out).

A tested cell gets another round while it is INCONCLUSIVE *only* because its task accuracy is not yet
shown non-inferior (or, where its recovery is low, a drop not yet significant); and, when another count
keeps it undecided too (degeneration, divergence), while its recovery is under `task_recovery_min`: more
samples cannot make it PASS then, but they can show the drop, a FAIL. The round is sized for
what would decide it at the alpha the next look may spend (analysis/sequential.next_look_size): at least
double the paired samples so far, never past the budget's samples per cell, and cut to the round time
left. The cells of one length share a round: the same new samples for them and their baseline.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from kveval.analysis.sequential import increasing_looks, next_look_size
from kveval.gate import INCONCLUSIVE, Thresholds, Verdict
from kveval.inputs.budget import Budget

MAX_ROUNDS = 8   # doubling from 12 paired samples reaches the default 600 in six


@dataclass(frozen=True)
class LengthShape:
    """What one more step of --task-samples gives at a length: kveval tasks with data there, and docs per
    step (all tasks together)."""

    tasks: int
    docs_per_step: int


@dataclass(frozen=True)
class Costs:
    """The run's pace, to fit a round into the time left: engine start-up and task time per doc."""

    startup_seconds: float
    seconds_per_doc: float


@dataclass
class LengthRound:
    """One round at one length: the baseline and the undecided cells, on `docs` new docs each."""

    max_model_len: int
    reference: str
    cells: list[str]
    target: int                  # paired samples per cell aimed for after the round
    docs: int                    # new docs per cell
    samples_per_point: int
    limit: int | None            # per task, when fewer docs than whole steps are wanted

    @property
    def all_cells(self) -> list[str]:
        return [self.reference, *self.cells]


@dataclass
class RoundPlan:
    rounds: list[LengthRound] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)   # why a cell gets no round (budget, no baseline, ...)


def _open_task_reasons(verdict: Verdict, cell: str) -> int:
    """How many INCONCLUSIVE reasons the cell has when its task comparison is open; 0 otherwise."""
    if verdict.cells.get(cell) != INCONCLUSIVE:
        return 0
    if not any(c.cell == cell and c.name == "task_noninferiority" and c.passed is None for c in verdict.checks):
        return 0
    return sum(1 for r in verdict.reasons if r.cell == cell and r.level == INCONCLUSIVE)


def undecided_by_tasks(verdict: Verdict, cell: str) -> bool:
    """INCONCLUSIVE with one reason only, and that reason the task comparison still open."""
    return _open_task_reasons(verdict, cell) == 1


def task_open_among_others(verdict: Verdict, cell: str) -> bool:
    """INCONCLUSIVE with the task comparison open and at least one other open reason."""
    return _open_task_reasons(verdict, cell) > 1


def task_decided(verdict: Verdict, cell: str) -> bool:
    """The cell's task comparison settled either way (shown non-inferior, or a significant drop)."""
    return any(c.cell == cell and c.name in ("task_noninferiority", "task_recovery") and c.passed is not None
               for c in verdict.checks)


def _yield(evidence: dict, cell: str, n: int) -> float:
    """Paired samples per doc the cell was asked so far (rejections and errors cost docs)."""
    rows = [r for r in (evidence.get("tasks") or {}).get("accuracy") or []
            if r.get("cell") == cell and r.get("level") == "cell"]
    asked = rows[0].get("samples") if rows else None
    return min(1.0, max(0.2, n / asked)) if asked else 1.0


def _docs_to_steps(docs: int, shape: LengthShape) -> tuple[int, int | None]:
    """samples_per_point and a per-task limit that give about `docs` new docs at this length."""
    steps = max(1, math.ceil(docs / shape.docs_per_step))
    per_task = max(1, docs // max(1, shape.tasks))   # rounded down: a round never takes more than the budget left
    whole = steps * shape.docs_per_step // max(1, shape.tasks)
    return steps, (per_task if per_task < whole else None)


def plan_round(verdict: Verdict, evidence: dict, budget: Budget, thresholds: Thresholds,
               shapes: dict[int, LengthShape], costs: Costs | None, seconds_used: float) -> RoundPlan:
    """The next round per length (shortest first), or none, with a note for every cell left out."""
    plan = RoundPlan()
    comparisons = (evidence.get("tasks") or {}).get("cells") or {}
    by_length: dict[int, list[tuple[str, dict, int, int]]] = {}
    for cell, entry in comparisons.items():
        if not undecided_by_tasks(verdict, cell):
            if not task_open_among_others(verdict, cell):
                continue
            recovery = entry.get("recovery")
            if recovery is None or recovery >= thresholds.task_recovery_min:
                plan.notes.append(f"{cell}: no task round: another count keeps it undecided, which task samples "
                                  f"cannot settle, and its recovery is not under {100 * thresholds.task_recovery_min:.1f} %")
                continue
            # Not PASS whatever the tasks show, but a significant drop would be a FAIL: sample for that.
        n, length = int(entry.get("n") or 0), int(entry["max_model_len"])
        if length not in shapes:
            plan.notes.append(f"{cell}: no new task samples can be made at {length} (only kveval's own tasks "
                              "have generated data)")
            continue
        if n >= budget.samples:
            plan.notes.append(f"{cell}: the budget of {budget.samples} paired samples per cell is spent")
            continue
        target = next_look_size(n, int(entry.get("b") or 0), int(entry.get("c") or 0),
                                float(entry.get("baseline_accuracy") or 0), thresholds.task_noninferiority_margin,
                                thresholds.alpha, increasing_looks(entry.get("looks") or [n]), budget.samples)
        if target - n < max(1, n // 4):
            # What the budget leaves would hardly move the bound: not worth another engine start.
            plan.notes.append(f"{cell}: the budget of {budget.samples} paired samples per cell is spent "
                              f"(only {budget.samples - n} left)")
            continue
        docs = math.ceil((target - n) / _yield(evidence, cell, n))
        by_length.setdefault(length, []).append((cell, entry, target, docs))
    left = None if budget.seconds is None else budget.seconds - seconds_used
    for length in sorted(by_length):
        group = by_length[length]
        reference = group[0][1]["reference"]
        docs = max(d for *_, d in group)
        if left is not None and costs is not None:
            per_cell = left / (len(group) + 1) - costs.startup_seconds
            fit = int(per_cell / costs.seconds_per_doc) if costs.seconds_per_doc > 0 else docs
            if fit < min(docs, shapes[length].tasks):
                plan.notes.append(f"{', '.join(c for c, *_ in group)}: the budget's round time is spent "
                                  f"({seconds_used / 60:.0f} of {budget.seconds / 60:.0f} min)")
                continue
            docs = min(docs, fit)
            left -= (len(group) + 1) * (costs.startup_seconds + docs * costs.seconds_per_doc)
        steps, limit = _docs_to_steps(docs, shapes[length])
        plan.rounds.append(LengthRound(length, reference, [c for c, *_ in group], max(t for _, _, t, _ in group),
                                       docs, steps, limit))
    return plan
