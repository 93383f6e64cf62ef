"""Long-context task accuracy: per-sample lm-eval results turned into rates, intervals and paired tests.

Pure functions over `cells` (cell id -> stored facts); the records are the `tasks` phase's
`samples` (see the record format in the tasks phase). A sample is *scored* when the cell accepted
it and lm-eval gave it a score; a *rejected* sample (prompt + answer budget longer than the cell's
max_model_len, or refused by vLLM; never truncated) is counted apart and never scored as wrong.

Statistics come from statsmodels: Wilson score intervals (`proportion_confint(method="wilson")`)
for accuracies, McNemar's exact test (`mcnemar(table, exact=True)`, a two-sided binomial test on
the discordant pairs) for a cell against its baseline on the samples both scored.

Levels of `task_accuracy` (column `level`):
  "point"  one (task, length_fraction, depth) of one cell;
  "task"   one task of one cell, pooled over lengths and depths (length_fraction, depth NaN);
  "cell"   one cell pooled over every task (task "ALL", length_fraction, depth NaN).
`task_comparisons` uses task "ALL" for its pooled-over-tasks rows too.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Callable, Hashable, Iterable, TypeVar, cast

import pandas as pd

from kveval.analysis.cell_records import BASELINE_KV
from kveval.analysis.json_values import json_safe, records
from kveval.analysis.sequential import look_caps
from kveval.files import schema
from kveval.files.schema import CellResult, TasksPhase

ALL_TASKS = "ALL"
CONFIDENCE = 0.95

RECORD_FIELDS = ["task", "doc_id", "sample_id", "length_fraction", "depth", "target_tokens", "prompt_tokens",
                 "max_gen_toks", "accepted", "rejection", "error", "response", "expected", "score", "correct",
                 "partial", "finish_reason", "output_tokens", "seconds"]
SAMPLE_COLUMNS = ["cell", "kv_spec", "max_model_len", *RECORD_FIELDS, "status", "scored", "scored_correct"]
COUNT_COLUMNS = ["samples", "n", "correct", "rejected", "errors", "accuracy", "wilson_low", "wilson_high",
                 "prompt_tokens_mean"]
ACCURACY_COLUMNS = ["cell", "kv_spec", "max_model_len", "level", "task", "length_fraction", "depth",
                    "target_tokens", *COUNT_COLUMNS]
COMPARISON_COLUMNS = ["cell", "reference", "kv_spec", "max_model_len", "task", "n_paired", "baseline_correct",
                      "cell_correct", "both", "baseline_only", "cell_only", "neither", "baseline_accuracy",
                      "cell_accuracy", "recovery", "mcnemar_p", "cell_rejected", "baseline_rejected", "cell_errors",
                      "baseline_errors"]
GRID_COLUMNS = ["cell", "kv_spec", "max_model_len", "depth", "target_tokens", "length_fraction", "samples", "n",
                "correct", "rejected", "errors", "accuracy", "wilson_low", "wilson_high", "prompt_tokens_mean"]
_Key = TypeVar("_Key", bound=Hashable)


# --- statistics ----------------------------------------------------------------------------------

def wilson_interval(correct: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Wilson score interval of correct/n; (nan, nan) when n is 0."""
    from statsmodels.stats.proportion import proportion_confint  # statsmodels takes ~1 s to import

    if not n:
        return math.nan, math.nan
    low, high = proportion_confint(int(correct), int(n), alpha=1 - confidence, method="wilson")
    # The bound at an extreme is exactly 0 or 1 (floating point gives 0.9999999999999999 for k = n).
    return (0.0 if correct == 0 else float(low)), (1.0 if correct == n else float(high))


def mcnemar_p(both: int, baseline_only: int, cell_only: int, neither: int) -> float:
    """Exact McNemar p-value of a paired 2×2 table (rows: baseline right/wrong; columns: cell
    right/wrong). 1.0 when there is no discordant pair: nothing differs."""
    from statsmodels.stats.contingency_tables import mcnemar

    if baseline_only + cell_only == 0:
        return 1.0
    table = [[int(both), int(baseline_only)], [int(cell_only), int(neither)]]
    return float(mcnemar(table, exact=True).pvalue)


def recovery(cell_accuracy: float | None, baseline_accuracy: float | None) -> float | None:
    """cell accuracy / baseline accuracy; None when either is unknown or the baseline got nothing right."""
    if cell_accuracy is None or baseline_accuracy is None or pd.isna(cell_accuracy) or pd.isna(baseline_accuracy):
        return None
    if baseline_accuracy == 0:
        return None
    return float(cell_accuracy) / float(baseline_accuracy)


# --- samples -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Sample:
    """One stored task sample of a cell (`record`, as the cell holds it) and what the tables derive from it.

    status: "scored" (accepted and a score); "error" (the engine or lm-eval failed on it); "rejected" (not
    accepted, e.g. too long for the cell); "unscored" (accepted without a score). correct: scored and
    correct (`correct` as stored, else score >= 1)."""

    cell: str
    kv_spec: str
    max_model_len: int
    record: schema.TaskSample
    status: str
    correct: bool

    @property
    def scored(self) -> bool:
        return self.status == "scored"

    @property
    def key(self) -> tuple[str, str]:
        """(task, sample id) pairing it with the baseline's sample; doc_id stands in without a sample_id."""
        sample_id = self.record.sample_id
        return self.record.task, (str(sample_id) if sample_id is not None else f"doc:{self.record.doc_id}")

    @property
    def round(self) -> int:
        """Which round of task samples (files/task_rounds.py) it came in; 0 for the first."""
        return self.record.round or 0

    @property
    def length_fraction(self) -> float:
        return _number(self.record.length_fraction)

    @property
    def depth(self) -> float:
        return _number(self.record.depth)


def _number(value: float | None) -> float:
    return math.nan if value is None else float(value)


def _sample(name: str, facts: CellResult, record: schema.TaskSample) -> Sample:
    score = _number(record.score)
    scored = record.accepted and not math.isnan(score)
    status = ("scored" if scored else "error" if record.error else "rejected" if not record.accepted
              else "unscored")
    correct = scored and (record.correct if record.correct is not None else score >= 1)
    return Sample(name, facts.kv_spec, facts.max_model_len, record, status, correct)


def cell_samples(cells: dict[str, CellResult]) -> list[Sample]:
    """Every stored sample of every cell, in cell and record order; rejected and errored ones kept."""
    out: list[Sample] = []
    for name, facts in cells.items():
        phase = facts.phases.tasks
        out.extend(_sample(name, facts, record) for record in (phase.samples or [] if phase else []))
    return out


def task_samples(cells: dict[str, CellResult]) -> pd.DataFrame:
    """One row per stored sample of every cell (tables/task_samples.csv): the cell, its KV dtype and
    max_model_len, then every record field (fields a record adds beyond the known ones are kept, after
    them), then `Sample`'s status, scored and correct (`scored_correct`)."""
    rows: list[dict[str, Any]] = []
    extra: list[str] = []
    for sample in cell_samples(cells):
        stored = schema.dump(sample.record)   # the keys the sample holds, in its order (absent ones stay absent)
        rows.append({"cell": sample.cell, "kv_spec": sample.kv_spec, "max_model_len": sample.max_model_len,
                     **stored, "status": sample.status, "scored": sample.scored, "scored_correct": sample.correct})
        extra.extend(k for k in stored if k not in SAMPLE_COLUMNS and k not in extra)
    frame = pd.DataFrame(rows, columns=SAMPLE_COLUMNS + extra)
    # One dtype per column as the CSV and the evidence have always shown them: fractions as floats, token
    # counts as integers even where some sample has none.
    for column in ("length_fraction", "depth", "score", "partial"):
        frame[column] = pd.to_numeric(frame[column], errors="coerce").astype(float)
    for column in ("target_tokens", "prompt_tokens"):
        frame[column] = pd.to_numeric(frame[column], errors="coerce").round().astype("Int64")
    for column in ("accepted", "scored", "scored_correct"):
        frame[column] = frame[column].astype(bool)
    return frame


def _counts(group: list[Sample]) -> dict[str, Any]:
    n = sum(1 for sample in group if sample.scored)
    correct = sum(1 for sample in group if sample.correct)
    low, high = wilson_interval(correct, n)
    prompt = [sample.record.prompt_tokens for sample in group if sample.record.prompt_tokens is not None]
    counts = schema.TaskCounts(
        samples=len(group), n=n, correct=correct,
        rejected=sum(1 for sample in group if sample.status == "rejected"),
        errors=sum(1 for sample in group if sample.status == "error"),
        accuracy=correct / n if n else math.nan, wilson_low=low, wilson_high=high,
        prompt_tokens_mean=sum(prompt) / len(prompt) if prompt else math.nan)
    return schema.dump(counts)


def _single(values: Iterable[float | int | None]) -> float | int:
    """The group's one value (target_tokens of a point), NaN when absent or mixed."""
    present = {value for value in values if value is not None and not math.isnan(value)}
    return present.pop() if len(present) == 1 else math.nan


def _nan_last(value: float) -> tuple[bool, float]:
    """Sort key of a number that may be NaN, NaN last (as pandas groups them)."""
    return (True, 0.0) if math.isnan(value) else (False, value)


def _by(samples: Iterable[Sample], key: Callable[[Sample], _Key]) -> dict[_Key, list[Sample]]:
    """The samples grouped by `key`, groups in order of first appearance."""
    groups: dict[_Key, list[Sample]] = {}
    for sample in samples:
        groups.setdefault(key(sample), []).append(sample)
    return groups


def task_accuracy(samples: list[Sample]) -> pd.DataFrame:
    """Accuracy with Wilson 95 % interval per cell at three levels (see the module doc): per
    (task, length_fraction, depth), per task, and pooled over tasks (task "ALL").
    n: scored samples; rejected: samples the cell did not accept (too long for it, or refused);
    errors: samples the engine or lm-eval failed on. Both are outside n (never scored as wrong)."""
    rows = []
    for mine in _by(samples, lambda sample: sample.cell).values():
        first = mine[0]
        head = {"cell": first.cell, "kv_spec": first.kv_spec, "max_model_len": first.max_model_len}
        for task, per_task in _by(mine, lambda sample: sample.record.task).items():
            points = _by(per_task, lambda sample: (sample.length_fraction, sample.depth))
            for (fraction, depth) in sorted(points, key=lambda point: (_nan_last(point[0]), _nan_last(point[1]))):
                group = points[(fraction, depth)]
                rows.append({**head, "level": "point", "task": task, "length_fraction": fraction, "depth": depth,
                             "target_tokens": _single(sample.record.target_tokens for sample in group),
                             **_counts(group)})
            rows.append({**head, "level": "task", "task": task, "length_fraction": math.nan, "depth": math.nan,
                         "target_tokens": math.nan, **_counts(per_task)})
        rows.append({**head, "level": "cell", "task": ALL_TASKS, "length_fraction": math.nan, "depth": math.nan,
                     "target_tokens": math.nan, **_counts(mine)})
    frame = pd.DataFrame(rows, columns=ACCURACY_COLUMNS)
    return frame.astype({"target_tokens": "Int64"}) if rows else frame


# --- paired comparison ---------------------------------------------------------------------------

def _keyed(samples: Iterable[Sample]) -> dict[tuple[str, str], Sample]:
    """Samples by (task, sample id), the first where a key repeats."""
    keyed: dict[tuple[str, str], Sample] = {}
    for sample in samples:
        keyed.setdefault(sample.key, sample)
    return keyed


def _pairs(samples: list[Sample], cell: str, reference: str) -> list[tuple[Sample, Sample]]:
    """(the cell's sample, the reference's) for every key both have, in the cell's order."""
    base = _keyed(sample for sample in samples if sample.cell == reference)
    return [(mine, base[key]) for key, mine in _keyed(sample for sample in samples if sample.cell == cell).items()
            if key in base]


@dataclass(frozen=True)
class Paired:
    """A cell's samples against its reference's, paired (the counting columns of COMPARISON_COLUMNS)."""

    n_paired: int
    baseline_correct: int
    cell_correct: int
    both: int
    baseline_only: int
    cell_only: int
    neither: int
    baseline_accuracy: float | None
    cell_accuracy: float | None
    recovery: float | None
    mcnemar_p: float | None
    cell_rejected: int
    baseline_rejected: int
    cell_errors: int
    baseline_errors: int


def _paired(pairs: list[tuple[Sample, Sample]]) -> Paired:
    both_scored = [(mine.correct, base.correct) for mine, base in pairs if mine.scored and base.scored]
    n = len(both_scored)
    both = sum(1 for mine, base in both_scored if base and mine)
    b = sum(1 for mine, base in both_scored if base and not mine)
    c = sum(1 for mine, base in both_scored if mine and not base)
    base_correct, cell_correct = both + b, both + c
    base_acc = base_correct / n if n else None
    cell_acc = cell_correct / n if n else None
    return Paired(
        n_paired=n, baseline_correct=base_correct, cell_correct=cell_correct, both=both, baseline_only=b,
        cell_only=c, neither=n - both - b - c, baseline_accuracy=base_acc, cell_accuracy=cell_acc,
        recovery=recovery(cell_acc, base_acc), mcnemar_p=mcnemar_p(both, b, c, n - both - b - c) if n else None,
        cell_rejected=sum(1 for mine, base in pairs if mine.status == "rejected" and base.record.accepted),
        baseline_rejected=sum(1 for mine, base in pairs if mine.record.accepted and base.status == "rejected"),
        cell_errors=sum(1 for mine, base in pairs if mine.status == "error" and base.scored),
        baseline_errors=sum(1 for mine, base in pairs if base.status == "error" and mine.scored))


def baseline_cells(samples: list[Sample], baseline_kv: str = BASELINE_KV) -> dict[str, str]:
    """Non-baseline cell -> the baseline cell with samples at its max_model_len (cells without one left out)."""
    firsts = [group[0] for group in _by(samples, lambda sample: sample.cell).values()]
    bases = [first for first in firsts if first.kv_spec == baseline_kv]
    out = {}
    for first in firsts:
        if first.kv_spec == baseline_kv:
            continue
        same = [base.cell for base in bases if base.max_model_len == first.max_model_len]
        if same:
            out[first.cell] = same[0]
    return out


def look_rounds(samples: list[Sample], cell: str) -> list[int]:
    """The rounds `cell` took part in (0: the first look), one per look of paired_looks."""
    return sorted({sample.round for sample in _keyed(sample for sample in samples if sample.cell == cell).values()})


def paired_looks(samples: list[Sample], cell: str, reference: str) -> list[int]:
    """Paired samples (both cells scored) after each round `cell` took part in, cumulative: the looks
    of the sequential design (analysis/sequential.py). One look when there were no rounds."""
    paired = [mine.round for mine, base in _pairs(samples, cell, reference) if mine.scored and base.scored]
    return [sum(1 for taken in paired if taken <= k) for k in look_rounds(samples, cell)]


def task_comparisons(samples: list[Sample], baseline_kv: str = BASELINE_KV) -> pd.DataFrame:
    """Every non-baseline cell against the baseline cell at the same max_model_len, paired on
    (task, sample_id) where both cells scored the sample: per task and pooled over tasks ("ALL").
    baseline_only (b) / cell_only (c): discordant pairs; recovery = cell / baseline accuracy (None
    when the baseline got none right); mcnemar_p: exact McNemar (1.0 when b + c = 0). cell_rejected:
    samples the cell rejected that the baseline accepted (baseline_rejected the reverse); *_errors:
    engine errors on samples the other cell scored. None of these enter the accuracies."""
    rows = []
    for cell, reference in baseline_cells(samples, baseline_kv).items():
        mine = [sample for sample in samples if sample.cell == cell]
        pairs = _pairs(samples, cell, reference)
        head = {"cell": cell, "reference": reference, "kv_spec": mine[0].kv_spec,
                "max_model_len": mine[0].max_model_len}
        for task in dict.fromkeys(sample.record.task for sample in mine):
            per_task = [(mine, base) for mine, base in pairs if mine.record.task == task]
            rows.append({**head, "task": task, **asdict(_paired(per_task))})
        rows.append({**head, "task": ALL_TASKS, **asdict(_paired(pairs))})
    return pd.DataFrame(rows, columns=COMPARISON_COLUMNS)


# --- depth × length ------------------------------------------------------------------------------

def depth_length_grid(samples: list[Sample]) -> pd.DataFrame:
    """Accuracy per (cell, needle depth, prompt length) pooled over the tasks that have a depth;
    length = target_tokens, the prompt size in tokens the sample was built for."""
    placed = [sample for sample in samples if not math.isnan(sample.depth) and sample.record.target_tokens is not None]
    rows = []
    for mine in _by(placed, lambda sample: sample.cell).values():
        first = mine[0]
        head = {"cell": first.cell, "kv_spec": first.kv_spec, "max_model_len": first.max_model_len}
        points = _by(mine, lambda sample: (sample.depth, int(sample.record.target_tokens or 0)))
        for depth, target in sorted(points):
            group = points[(depth, target)]
            rows.append({**head, "depth": depth, "target_tokens": target,
                         "length_fraction": _single(sample.length_fraction for sample in group), **_counts(group)})
    return pd.DataFrame(rows, columns=GRID_COLUMNS)


# --- evidence ------------------------------------------------------------------------------------

def task_evidence(cells: dict[str, CellResult], baseline_kv: str = BASELINE_KV) -> dict[str, Any]:
    """JSON-safe task evidence (`schema.TaskEvidence`); {} when no cell has a tasks phase with samples or an error.

    samples: number of stored samples; sample_rows: every sample (tables/task_samples.csv);
    accuracy / comparisons / grid: the three tables above as rows; cells: per non-baseline cell the
    pooled-over-tasks comparison the gate reads (recovery, mcnemar_p, n, accuracies, rejected =
    samples it rejected that the baseline accepted, b, c, looks = paired samples after each round); unmatched: non-baseline cells with samples
    but no baseline with samples at their max_model_len; errors: cell -> error text of a tasks phase
    that crashed; task_errors: cell -> {task: error text} for single tasks that failed while the
    others ran; runs: per cell what was asked (tasks, lm-eval version, limit, lm-eval's aggregates);
    cells[*].n_max / final and design: the sequential design of a run with task rounds (absent otherwise).
    """

    phases = {name: facts.phases.tasks for name, facts in cells.items()}
    errors = {name: str(phase.error) for name, phase in phases.items() if phase and phase.error}
    task_errors = {name: {str(task): str(text) for task, text in phase.task_errors.items()}
                   for name, phase in phases.items() if phase and phase.task_errors}
    samples = cell_samples(cells)
    if not samples and not errors and not task_errors:
        return {}
    # Looks only where rounds were run: a single look is n itself, as before rounds.
    in_rounds = any("round" in sample.record.model_fields_set for sample in samples)
    references = baseline_cells(samples, baseline_kv)
    per_cell = {cell: schema.dump(_task_cell(samples, cell, reference, phases.get(cell), in_rounds))
                for cell, reference in references.items()}
    firsts = [group[0] for group in _by(samples, lambda sample: sample.cell).values()]
    unmatched = [{"cell": first.cell, "reason": f"no {baseline_kv} cell with task results at max_model_len "
                                                f"{first.max_model_len}"}
                 for first in firsts if first.cell not in references and first.kv_spec != baseline_kv]
    runs = {name: {"tasks": phase.tasks, "lm_eval_version": phase.lm_eval_version, "limit": phase.limit,
                   "data_dir": phase.data_dir, "lm_eval_results": phase.lm_eval_results}
            for name, phase in phases.items() if phase and not phase.error}
    order = list(dict.fromkeys(sample.record.task for sample in samples))
    designs = [phase.design for phase in phases.values() if phase and phase.design]
    return cast(dict[str, Any], json_safe({
        "baseline_kv": baseline_kv, "tasks": order, "samples": len(samples),
        "sample_rows": records(task_samples(cells)), "accuracy": records(task_accuracy(samples)),
        "comparisons": records(task_comparisons(samples, baseline_kv)), "grid": records(depth_length_grid(samples)),
        "cells": per_cell, "unmatched": unmatched, "errors": errors, "task_errors": task_errors, "runs": runs,
        **({"design": {"n_max": designs[0].n_max, "stopped": designs[0].stopped,
                       "spending": "Pocock-type alpha spending (Lan & DeMets 1983)"}} if designs else {}),
    }))


def _task_cell(samples: list[Sample], cell: str, reference: str, phase: TasksPhase | None,
               in_rounds: bool) -> schema.TaskCell:
    """The pooled-over-tasks comparison of `cell` against `reference` that the gate reads."""
    pooled = _paired(_pairs(samples, cell, reference))
    # Keys absent where they do not apply (dump leaves unset fields out): looks without rounds, no design.
    optional: dict[str, Any] = {**({"looks": paired_looks(samples, cell, reference)} if in_rounds else {}),
                                **_design(phase, look_rounds(samples, cell) if in_rounds else [0])}
    return schema.TaskCell(
        reference=reference, max_model_len=next(s.max_model_len for s in samples if s.cell == cell),
        recovery=pooled.recovery, mcnemar_p=pooled.mcnemar_p, n=pooled.n_paired,
        baseline_accuracy=pooled.baseline_accuracy, cell_accuracy=pooled.cell_accuracy,
        b=pooled.baseline_only, c=pooled.cell_only, rejected=pooled.cell_rejected, **optional)


def _design(phase: TasksPhase | None, rounds: list[int]) -> dict[str, Any]:
    """The sequential design a cell's tasks phase carries (files/task_rounds.py): n_max and final, and
    where a larger --budget extended it, the N_max in force at each look (`rounds`: each look's round)."""
    design = phase.design if phase else None
    if not (design and design.n_max):
        return {}
    caps = look_caps(rounds, design.n_max, design.n_max_rounds)
    return {"n_max": design.n_max, "final": design.final, **({"n_max_looks": caps} if caps else {})}
