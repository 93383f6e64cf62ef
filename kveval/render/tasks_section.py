"""The review's long-context task section: accuracy per task and cell (Wilson 95 %), fp8 vs auto
on paired samples (recovery, McNemar), the samples auto got right and the cell did not, the depth x
length grid and the heat map link. Pure: evidence["tasks"] in, markdown out.
"""
from __future__ import annotations

import pandas as pd

from kveval.analysis.task_accuracy import ALL_TASKS
from kveval.analysis.cell_records import BASELINE_KV
from kveval.files import schema
from kveval.render.markdown import escape_cell, fmt_int, fmt_share, fmt_sig, long_table
from kveval.files.rundir import RunDir

MAX_TASK_EXAMPLES = 10


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _pct0(value) -> str:
    return f"{100 * value:.0f}"


def _accuracy_text(row: schema.TaskAccuracyRow) -> str:
    """'5/6 = 83 % [44–97]' (Wilson 95 %), then rejected / error counts."""
    n = row.n or 0
    text = (f"{row.correct}/{n} = {_pct0(row.accuracy)} % [{_pct0(row.wilson_low)}–{_pct0(row.wilson_high)}]"
            if n else "no scored sample")
    if row.rejected:
        text += f"; {row.rejected} rejected"
    if row.errors:
        text += f"; {row.errors} errors"
    return text


def _task_cells(rows: list[schema.TaskAccuracyRow] | list[schema.TaskGridRow], length, baseline_kv: str) -> list[str]:
    """Cells at one max_model_len, the baseline first."""
    found = {r.cell: r.kv_spec for r in rows if r.max_model_len == length}
    return sorted(found, key=lambda c: (found[c] != baseline_kv, str(found[c]), c))


def _task_label(task) -> str:
    return "all tasks" if task == ALL_TASKS else task


def _accuracy_table(accuracy: list[schema.TaskAccuracyRow], cells: list[str], tasks_order: list[str]) -> str:
    by = {(r.cell, r.task): r for r in accuracy if r.level in ("task", "cell")}
    rows = []
    for task in [*tasks_order, ALL_TASKS]:
        if not any((cell, task) in by for cell in cells):
            continue
        rows.append({"task": _task_label(task),
                     **{cell: _accuracy_text(by[(cell, task)]) if (cell, task) in by else "—" for cell in cells}})
    return long_table(pd.DataFrame(rows), f"{len(rows)} rows: each task, then all tasks", untrusted=("task",))


def _comparison_table(comparisons: list[schema.TaskComparisonRow], baseline_kv: str) -> str:
    rows = []
    for r in comparisons:
        n = r.n_paired or 0
        rows.append({"cell vs baseline": f"{r.cell} vs {r.reference}", "task": _task_label(r.task),
                     "n paired": fmt_int(n),
                     f"{baseline_kv} accuracy": fmt_share(r.baseline_accuracy),
                     "cell accuracy": fmt_share(r.cell_accuracy),
                     "recovery": fmt_share(r.recovery) if r.recovery is not None else "n/a",
                     "McNemar p": fmt_sig(r.mcnemar_p) if n else "",
                     f"b: only {baseline_kv} right": fmt_int(r.baseline_only),
                     "c: only cell right": fmt_int(r.cell_only),
                     f"rejected by the cell, not by {baseline_kv}": fmt_int(r.cell_rejected)})
    return long_table(pd.DataFrame(rows), f"{len(rows)} rows: each cell and task, paired", untrusted=("task",))


def _grid_text(row: schema.TaskGridRow) -> str:
    n = row.n or 0
    if not n:
        return f"✗ {row.rejected} rejected" if row.rejected else "—"
    text = f"{_pct0(row.accuracy)} % ({row.correct}/{n})"
    return text + (f", {row.rejected} rejected" if row.rejected else "")


def _grid_table(grid: list[schema.TaskGridRow], cell: str) -> str:
    mine = [r for r in grid if r.cell == cell]
    lengths = sorted({int(r.target_tokens) for r in mine})
    depths = sorted({r.depth for r in mine})
    at = {(r.depth, int(r.target_tokens)): r for r in mine}
    rows = [{"depth \\ prompt tokens": f"{d:g}",
             **{f"{t:,}": _grid_text(at[(d, t)]) if (d, t) in at else "" for t in lengths}} for d in depths]
    return long_table(pd.DataFrame(rows), f"{len(rows)} needle depths")


def _discordant_examples(samples: list[schema.TaskSampleRow], comparisons: list[schema.TaskComparisonRow]) -> pd.DataFrame:
    """Samples the baseline got right and the cell got wrong, first few per comparison."""
    by_cell: dict[tuple, schema.TaskSampleRow] = {}
    for s in samples:
        key = s.sample_id or f"doc:{s.doc_id}"
        by_cell[(s.cell, s.task, key)] = s
    rows = []
    for comp in comparisons:
        if comp.task != ALL_TASKS:
            continue
        for (cell, task, key), s in by_cell.items():
            if cell != comp.cell or not s.scored or s.scored_correct:
                continue
            base = by_cell.get((comp.reference, task, key))
            if base and base.scored and base.scored_correct:
                rows.append({"cell": cell, "task": task, "sample": key,
                             "expected": ", ".join(str(v) for v in (s.expected or [])),
                             f"{comp.reference} answer": _shorten(base.response or "", 120),
                             "cell answer": _shorten(s.response or "", 120)})
    return pd.DataFrame(rows)


def _tasks_scoring_line(tasks: schema.TaskEvidence) -> str:
    versions = sorted({r.lm_eval_version for r in tasks.runs.values() if r.lm_eval_version})
    via = f"lm-eval {', '.join(versions)}" if versions else "lm-eval"
    return (f"RULER-style needle and aggregation tasks run through {via} in every cell. A sample is correct when "
            "every expected value appears in the answer; rejected = the prompt plus the answer budget is longer "
            "than the cell's max_model_len allows (or vLLM refused it): never truncated, never scored as wrong, "
            "counted apart. Accuracy: correct/scored with a Wilson 95 % interval. Recovery: cell accuracy / "
            f"`{tasks.baseline_kv or BASELINE_KV}` accuracy on the samples both cells scored; McNemar's exact "
            "test on the discordant samples (b: only the baseline right, c: only the cell right).")


def _skipped_sizes(manifest: schema.Manifest) -> list[str]:
    """Sizes whose samples were not generated because a task's question and needles do not fit them."""
    lines = []
    for length, by_task in sorted(manifest.task_data.files.items(), key=lambda item: int(item[0])):
        for task, entry in by_task.items():
            for fraction, why in entry.skipped.items():
                if entry.docs:  # a task with no sample at all is reported as failed by its cells
                    lines.append(f"- max_model_len {fmt_int(int(length))} / {escape_cell(task, None)}: no samples at "
                                 f"{100 * float(fraction):.0f} % ({escape_cell(why, 300)})")
    return lines


def tasks_section(manifest: schema.Manifest, evidence: schema.Evidence) -> str:
    tasks = evidence.tasks if isinstance(evidence.tasks, schema.TaskEvidence) else None   # {}: no cell ran tasks
    asked = manifest.options.tasks
    if tasks is None:
        return ("## Long-context tasks\n\n" + ("_Skipped: the run asked for no task (`tasks: none`)._" if not asked else
                                              "_No cell stored task results (none started, or none reached the phase)._"))
    baseline_kv = tasks.baseline_kv or BASELINE_KV
    accuracy, comparisons, grid = tasks.accuracy, tasks.comparisons, tasks.grid
    out = ["## Long-context tasks", "", _tasks_scoring_line(tasks)]
    errors = tasks.errors
    failed = [f"- **{cell}**: the tasks phase failed: {escape_cell(error, 400)}" for cell, error in errors.items()]
    failed += [f"- **{cell}** / {escape_cell(task, None)}: this task failed (the others ran): {escape_cell(error, 400)}"
               for cell, by_task in tasks.task_errors.items() for task, error in by_task.items()]
    failed += _skipped_sizes(manifest)
    if failed:
        out += ["", *failed]
    for entry in tasks.unmatched:
        out += ["", f"- {entry.cell}: not compared ({escape_cell(entry.reason, 200)})"]
    order = tasks.tasks
    for length in sorted({r.max_model_len for r in accuracy}, key=lambda v: (v is None, v or 0)):
        cells = _task_cells(accuracy, length, baseline_kv)
        out += ["", f"### max_model_len {fmt_int(length)}", "", "Accuracy per task:", "",
                _accuracy_table(accuracy, cells, order)]
        here = [c for c in comparisons if c.max_model_len == length]
        if here:
            out += ["", f"Against `{baseline_kv}` (paired on the samples both cells scored):", "",
                    _comparison_table(here, baseline_kv)]
            examples = _discordant_examples(tasks.sample_rows, here)
            if not examples.empty:
                out += ["", f"Samples `{baseline_kv}` answered correctly and the cell did not (first {MAX_TASK_EXAMPLES}; "
                            "all in `tables/task_samples.csv`):", "",
                        long_table(examples.head(MAX_TASK_EXAMPLES), f"{min(len(examples), MAX_TASK_EXAMPLES)} samples",
                                   untrusted=tuple(examples.columns))]
        grid_cells = _task_cells(grid, length, baseline_kv)
        if grid_cells:
            out += ["", "Accuracy by needle depth (share of the haystack) × prompt length (tokens), pooled over the "
                        "tasks that place a needle:"]
            for cell in grid_cells:
                out += ["", f"**{cell}**", "", _grid_table(grid, cell)]
    if grid:
        out += ["", f"![depth × length accuracy]({RunDir.TASK_HEATMAP})"]
    out += ["", "Every sample: `tables/task_samples.csv`; per point: `tables/task_accuracy.csv`; paired: "
                "`tables/task_comparisons.csv`."]
    return "\n".join(out)


