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
CELL_KEYS = ["cell", "kv_spec", "max_model_len"]


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

def _flag(series: pd.Series) -> pd.Series:
    """True only where the stored value is true (None/NaN/missing -> False)."""
    return series.map(lambda v: bool(v) if v is not None and not (isinstance(v, float) and math.isnan(v)) else False
                      ).astype(bool)


def _present(series: pd.Series) -> pd.Series:
    """Where a text field (error, rejection) holds something."""
    return series.map(lambda v: v is not None and not (isinstance(v, float) and math.isnan(v)) and v != "").astype(bool)


def tasks_phase(facts: CellResult | None) -> TasksPhase | None:
    """A cell's tasks phase, or None when it ran none."""
    return facts.phases.tasks if facts else None


def task_samples(cells: dict[str, CellResult]) -> pd.DataFrame:
    """One row per stored sample of every cell: the cell, its KV dtype and max_model_len, then every
    record field (fields a record adds beyond the known ones are kept, after them). Rejected and
    errored samples are kept. Derived: `status` ("scored"; "error": the engine or lm-eval failed on
    it; "rejected": not accepted, e.g. too long for the cell; "unscored": accepted without a score),
    `scored` (status "scored": accepted and a score) and `scored_correct` (scored and correct;
    `correct` as stored, else score >= 1)."""
    rows, extra = [], []
    for name, facts in cells.items():
        phase = facts.phases.tasks
        for stored in (phase.samples or []) if phase else []:
            sample = schema.dump(stored)   # the keys the sample holds, in its order (absent ones stay absent)
            rows.append({"cell": name, "kv_spec": facts.kv_spec,
                         "max_model_len": facts.max_model_len, **sample})
            extra.extend(k for k in sample if k not in RECORD_FIELDS and k not in extra and k not in CELL_KEYS)
    columns = [c for c in SAMPLE_COLUMNS if c not in ("scored", "scored_correct")] + extra
    frame = pd.DataFrame(rows, columns=columns)
    for column in ("length_fraction", "depth", "score", "partial"):
        frame[column] = pd.to_numeric(frame[column], errors="coerce").astype(float)
    for column in ("target_tokens", "prompt_tokens"):
        frame[column] = pd.to_numeric(frame[column], errors="coerce").round().astype("Int64")
    frame["accepted"] = _flag(frame["accepted"])
    score = frame["score"]
    frame["scored"] = frame["accepted"] & score.notna()
    stored = frame["correct"]
    correct = [bool(c) if c is not None and not (isinstance(c, float) and math.isnan(c)) else bool(s >= 1)
               for c, s in zip(stored, score.fillna(0.0))]
    frame["scored_correct"] = frame["scored"] & pd.Series(correct, index=frame.index, dtype=bool)
    errored = _present(frame["error"])
    status = ["scored" if ok else "error" if bad else "rejected" if not taken else "unscored"
              for ok, bad, taken in zip(frame["scored"], errored, frame["accepted"])]
    frame["status"] = pd.Series(status, index=frame.index, dtype=object)
    return frame[["cell", "kv_spec", "max_model_len", *RECORD_FIELDS, "status", "scored", "scored_correct",
                  *extra]]


def _counts(group: pd.DataFrame) -> dict:
    n = int(group["scored"].sum())
    correct = int(group["scored_correct"].sum())
    low, high = wilson_interval(correct, n)
    prompt = group["prompt_tokens"].dropna()
    return {"samples": int(len(group)), "n": n, "correct": correct,
            "rejected": int((group["status"] == "rejected").sum()),
            "errors": int((group["status"] == "error").sum()),
            "accuracy": correct / n if n else math.nan, "wilson_low": low, "wilson_high": high,
            "prompt_tokens_mean": float(prompt.mean()) if len(prompt) else math.nan}


def _single(series: pd.Series):
    """The group's one value of a column (target_tokens of a point), NaN when absent or mixed."""
    values = series.dropna().unique()
    return values[0] if len(values) == 1 else math.nan


def _cell_order(frame: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(frame["cell"]))


def task_accuracy(samples: pd.DataFrame) -> pd.DataFrame:
    """Accuracy with Wilson 95 % interval per cell at three levels (see the module doc): per
    (task, length_fraction, depth), per task, and pooled over tasks (task "ALL").
    n: scored samples; rejected: samples the cell did not accept (too long for it, or refused);
    errors: samples the engine or lm-eval failed on. Both are outside n (never scored as wrong)."""
    rows = []
    if samples.empty:
        return pd.DataFrame(columns=ACCURACY_COLUMNS)
    for cell in _cell_order(samples):
        mine = samples[samples["cell"] == cell]
        head = {"cell": cell, "kv_spec": mine["kv_spec"].iloc[0], "max_model_len": mine["max_model_len"].iloc[0]}
        for task in dict.fromkeys(mine["task"]):
            per_task = mine[mine["task"] == task]
            points = per_task.groupby(["length_fraction", "depth"], dropna=False, sort=True)
            for (fraction, depth), group in points:
                rows.append({**head, "level": "point", "task": task, "length_fraction": fraction, "depth": depth,
                             "target_tokens": _single(group["target_tokens"]), **_counts(group)})
            rows.append({**head, "level": "task", "task": task, "length_fraction": math.nan, "depth": math.nan,
                         "target_tokens": math.nan, **_counts(per_task)})
        rows.append({**head, "level": "cell", "task": ALL_TASKS, "length_fraction": math.nan, "depth": math.nan,
                     "target_tokens": math.nan, **_counts(mine)})
    frame = pd.DataFrame(rows, columns=ACCURACY_COLUMNS)
    frame["target_tokens"] = pd.to_numeric(frame["target_tokens"]).round().astype("Int64")
    return frame


# --- paired comparison ---------------------------------------------------------------------------

def _keyed(frame: pd.DataFrame) -> pd.DataFrame:
    """Samples keyed by (task, sample id); doc_id stands in where a record has no sample_id."""
    key = [str(s) if s is not None and not (isinstance(s, float) and math.isnan(s)) else f"doc:{d}"
           for s, d in zip(frame["sample_id"], frame["doc_id"])]
    # round: which round of task samples (files/task_rounds.py) the sample came in; 0 for the first.
    rounds = (pd.to_numeric(frame["round"], errors="coerce").fillna(0).astype(int) if "round" in frame
              else pd.Series(0, index=frame.index, dtype=int))
    keyed = frame.assign(key=key, rejected=frame["status"] == "rejected", errored=frame["status"] == "error",
                         round=rounds)
    return keyed.drop_duplicates(["task", "key"], keep="first")[
        ["task", "key", "round", "accepted", "rejected", "errored", "scored", "scored_correct"]]


def _paired_row(merged: pd.DataFrame) -> dict:
    both_scored = merged[merged["scored_cell"] & merged["scored_base"]]
    base, mine = both_scored["scored_correct_base"], both_scored["scored_correct_cell"]
    n = int(len(both_scored))
    both, b, c = int((base & mine).sum()), int((base & ~mine).sum()), int((~base & mine).sum())
    base_acc = int(base.sum()) / n if n else None
    cell_acc = int(mine.sum()) / n if n else None
    return {"n_paired": n, "baseline_correct": int(base.sum()), "cell_correct": int(mine.sum()), "both": both,
            "baseline_only": b, "cell_only": c, "neither": n - both - b - c,
            "baseline_accuracy": base_acc, "cell_accuracy": cell_acc, "recovery": recovery(cell_acc, base_acc),
            "mcnemar_p": mcnemar_p(both, b, c, n - both - b - c) if n else None,
            "cell_rejected": int((merged["rejected_cell"] & merged["accepted_base"]).sum()),
            "baseline_rejected": int((merged["accepted_cell"] & merged["rejected_base"]).sum()),
            "cell_errors": int((merged["errored_cell"] & merged["scored_base"]).sum()),
            "baseline_errors": int((merged["errored_base"] & merged["scored_cell"]).sum())}


def baseline_cells(samples: pd.DataFrame, baseline_kv: str = BASELINE_KV) -> dict[str, str]:
    """Non-baseline cell -> the baseline cell with samples at its max_model_len (cells without one left out)."""
    meta = samples.groupby("cell", sort=False)[["kv_spec", "max_model_len"]].first()
    bases = meta[meta["kv_spec"] == baseline_kv]
    out = {}
    for cell, row in meta.iterrows():
        if row["kv_spec"] == baseline_kv:
            continue
        same = bases[bases["max_model_len"] == row["max_model_len"]]
        if len(same):
            out[cell] = same.index[0]
    return out


def look_rounds(samples: pd.DataFrame, cell: str) -> list[int]:
    """The rounds `cell` took part in (0: the first look), one per look of paired_looks."""
    return sorted(int(k) for k in set(_keyed(samples[samples["cell"] == cell])["round"]))


def paired_looks(samples: pd.DataFrame, cell: str, reference: str) -> list[int]:
    """Paired samples (both cells scored) after each round `cell` took part in, cumulative: the looks
    of the sequential design (analysis/sequential.py). One look when there were no rounds."""
    merged = _keyed(samples[samples["cell"] == cell]).merge(_keyed(samples[samples["cell"] == reference]),
                                                            on=["task", "key"], suffixes=("_cell", "_base"))
    paired = merged[merged["scored_cell"] & merged["scored_base"]]
    taken = sorted(set(_keyed(samples[samples["cell"] == cell])["round"]))
    return [int((paired["round_cell"] <= k).sum()) for k in taken]


def task_comparisons(samples: pd.DataFrame, baseline_kv: str = BASELINE_KV) -> pd.DataFrame:
    """Every non-baseline cell against the baseline cell at the same max_model_len, paired on
    (task, sample_id) where both cells scored the sample: per task and pooled over tasks ("ALL").
    baseline_only (b) / cell_only (c): discordant pairs; recovery = cell / baseline accuracy (None
    when the baseline got none right); mcnemar_p: exact McNemar (1.0 when b + c = 0). cell_rejected:
    samples the cell rejected that the baseline accepted (baseline_rejected the reverse); *_errors:
    engine errors on samples the other cell scored. None of these enter the accuracies."""
    if samples.empty:
        return pd.DataFrame(columns=COMPARISON_COLUMNS)
    rows = []
    for cell, reference in baseline_cells(samples, baseline_kv).items():
        mine = samples[samples["cell"] == cell]
        merged = _keyed(mine).merge(_keyed(samples[samples["cell"] == reference]), on=["task", "key"],
                                    suffixes=("_cell", "_base"))
        head = {"cell": cell, "reference": reference, "kv_spec": mine["kv_spec"].iloc[0],
                "max_model_len": mine["max_model_len"].iloc[0]}
        for task in dict.fromkeys(mine["task"]):
            rows.append({**head, "task": task, **_paired_row(merged[merged["task"] == task])})
        rows.append({**head, "task": ALL_TASKS, **_paired_row(merged)})
    return pd.DataFrame(rows, columns=COMPARISON_COLUMNS)


# --- depth × length ------------------------------------------------------------------------------

def depth_length_grid(samples: pd.DataFrame) -> pd.DataFrame:
    """Accuracy per (cell, needle depth, prompt length) pooled over the tasks that have a depth;
    length = target_tokens, the prompt size in tokens the sample was built for."""
    if samples.empty:
        return pd.DataFrame(columns=GRID_COLUMNS)
    placed = samples[samples["depth"].notna() & samples["target_tokens"].notna()]
    rows = []
    for cell in _cell_order(placed):
        mine = placed[placed["cell"] == cell]
        head = {"cell": cell, "kv_spec": mine["kv_spec"].iloc[0], "max_model_len": mine["max_model_len"].iloc[0]}
        for (depth, target), group in mine.groupby(["depth", "target_tokens"], sort=True):
            rows.append({**head, "depth": depth, "target_tokens": int(target),
                         "length_fraction": _single(group["length_fraction"]), **_counts(group)})
    return pd.DataFrame(rows, columns=GRID_COLUMNS)


# --- evidence ------------------------------------------------------------------------------------

def task_evidence(cells: dict[str, CellResult], baseline_kv: str = BASELINE_KV) -> dict:
    """JSON-safe task evidence; {} when no cell has a tasks phase with samples or an error.

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
    samples = task_samples(cells)
    if samples.empty and not errors and not task_errors:
        return {}
    comparisons = task_comparisons(samples, baseline_kv)
    pooled = comparisons[comparisons["task"] == ALL_TASKS]
    per_cell = {row["cell"]: {"reference": row["reference"], "max_model_len": row["max_model_len"],
                              "recovery": row["recovery"], "mcnemar_p": row["mcnemar_p"], "n": row["n_paired"],
                              "baseline_accuracy": row["baseline_accuracy"], "cell_accuracy": row["cell_accuracy"],
                              "b": row["baseline_only"], "c": row["cell_only"], "rejected": row["cell_rejected"],
                              # looks only where rounds were run: a single look is n itself, as before rounds.
                              **({"looks": paired_looks(samples, row["cell"], row["reference"])}
                                 if "round" in samples else {}),
                              **_design(phases.get(row["cell"]),
                                        look_rounds(samples, row["cell"]) if "round" in samples else [0])}
                for row in pooled.to_dict("records")}
    matched = set(baseline_cells(samples, baseline_kv)) if not samples.empty else set()
    unmatched = [{"cell": cell, "reason": f"no {baseline_kv} cell with task results at max_model_len "
                                          f"{samples.loc[samples['cell'] == cell, 'max_model_len'].iloc[0]}"}
                 for cell in _cell_order(samples)
                 if cell not in matched and samples.loc[samples["cell"] == cell, "kv_spec"].iloc[0] != baseline_kv]
    runs = {name: {"tasks": phase.tasks, "lm_eval_version": phase.lm_eval_version, "limit": phase.limit,
                   "data_dir": phase.data_dir, "lm_eval_results": phase.lm_eval_results}
            for name, phase in phases.items() if phase and not phase.error}
    order = list(dict.fromkeys(samples["task"]))
    designs = [phase.design for phase in phases.values() if phase and phase.design]
    return json_safe({
        "baseline_kv": baseline_kv, "tasks": order, "samples": int(len(samples)),
        "sample_rows": records(samples), "accuracy": records(task_accuracy(samples)),
        "comparisons": records(comparisons), "grid": records(depth_length_grid(samples)),
        "cells": per_cell, "unmatched": unmatched, "errors": errors, "task_errors": task_errors, "runs": runs,
        **({"design": {"n_max": designs[0].n_max, "stopped": designs[0].stopped,
                       "spending": "Pocock-type alpha spending (Lan & DeMets 1983)"}} if designs else {}),
    })


def _design(phase: TasksPhase | None, rounds: list[int]) -> dict:
    """The sequential design a cell's tasks phase carries (files/task_rounds.py): n_max and final, and
    where a larger --budget extended it, the N_max in force at each look (`rounds`: each look's round)."""
    design = phase.design if phase else None
    if not (design and design.n_max):
        return {}
    caps = look_caps(rounds, design.n_max, design.n_max_rounds)
    return {"n_max": design.n_max, "final": design.final, **({"n_max_looks": caps} if caps else {})}
