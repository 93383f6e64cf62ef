"""results.json, tables/*.csv and the figures: the machine-readable outputs, written from evidence and verdict."""
from __future__ import annotations

import dataclasses
import json
import os
import warnings
from pathlib import Path

import pandas as pd

from kveval import __version__
from kveval.analysis.cell_records import BASELINE_KV
from kveval.analysis.degeneration import FINDING_COLUMNS
from kveval.analysis.diff import EXAMPLE_COLUMNS, PAIR_COLUMNS, SUMMARY_COLUMNS
from kveval.analysis.json_values import json_safe
from kveval.analysis.task_accuracy import ACCURACY_COLUMNS, COMPARISON_COLUMNS, GRID_COLUMNS, SAMPLE_COLUMNS
from kveval.files import schema
from kveval.files.rundir import RunDir, write_json_atomic, write_text_atomic
from kveval.render.capacity_plots import capacity_plot, throughput_plot
from kveval.render.divergence_plot import kl_position_plot
from kveval.render.headline import decision_of, deployment_of
from kveval.render.kv_range_plot import kv_range_plot
from kveval.render.plots import task_heatmap

SUMMARY_FIGURES = ["n", "kl_mean", "kl_median", "kl_p90", "kl_p99", "kl_max", "top1_n", "top1_agreement",
                   "top1_agreement_se", "dp_mean", "abs_dp_mean", "abs_dp_p99", "abs_dp_max", "dp_rms"]
DIVERGENCE_COLUMNS = ["kind", "cell", "reference", "same_length", "bucket", "start", "end", *SUMMARY_FIGURES]
# A table's column -> the header tables/*.csv give it, where the two differ. The KV spec column (`kv_spec`,
# the user's --kv text) keeps the header the published tables have had since the first run, so that no
# reader of them breaks (issue 17 renamed the evidence's key, not the tables').
CSV_HEADERS = {"kv_spec": "kv_cache_dtype"}


# --- tables --------------------------------------------------------------------------------------

def divergence_rows(divergence: schema.Divergence) -> list[dict]:
    """One row per comparison over all positions (bucket "all"), then one per position bucket."""
    rows = []
    for comp in divergence.comparisons:
        head = {"kind": comp.kind, "cell": comp.cell, "reference": comp.reference, "same_length": comp.same_length}
        rows.append({**head, "bucket": "all", "start": None, "end": None, **_summary_figures(comp.summary)})
        for bucket in comp.buckets:
            rows.append({**head, "bucket": bucket.bucket, "start": bucket.start, "end": bucket.end,
                         **_summary_figures(bucket)})
    return rows


def _summary_figures(summary: schema.DivergenceSummary) -> dict:
    """The SUMMARY_FIGURES columns of one summary (each a field of schema.DivergenceSummary)."""
    return {name: getattr(summary, name) for name in SUMMARY_FIGURES}


EXCERPT_FIELDS = ["excerpt_char_offset", "excerpt_before", "excerpt_candidate", "excerpt_reference"]


def _flat_excerpts(rows: list[schema.DiffPair] | list[schema.DiffExample], columns: list[str]) -> pd.DataFrame:
    """Diff rows with their `excerpt` spread into excerpt_* columns (CSV has no nesting)."""
    flat = []
    for row in rows:
        excerpt = row.excerpt
        flat.append({**{k: v for k, v in schema.dump(row).items() if k != "excerpt"},
                     "excerpt_char_offset": excerpt.char_offset if excerpt else None,
                     "excerpt_before": excerpt.before if excerpt else None,
                     "excerpt_candidate": excerpt.candidate if excerpt else None,
                     "excerpt_reference": excerpt.reference if excerpt else None})
    return pd.DataFrame(flat, columns=[c for c in columns if c != "excerpt"] + EXCERPT_FIELDS, dtype=object)


def _frame(rows: list[dict], columns: list[str] | None = None) -> pd.DataFrame:
    """Columns keep each value's own type (dtype object): a count stays 1792 in the CSV where a column
    with a missing value would make pandas write 1792.0."""
    if columns is None and rows:
        columns = list(dict.fromkeys(key for row in rows for key in row))
    return pd.DataFrame(rows, columns=columns, dtype=object)


def _rows(models) -> list[dict]:
    """Typed evidence rows as results.json stores them (the CSV has the same columns)."""
    return [schema.dump(model) for model in models or []]


def _task_sample_frame(rows: list[dict]) -> pd.DataFrame:
    """Per-sample task rows; lists and mappings (expected values, needle depths) as JSON text (CSV has no nesting)."""
    frame = _frame(rows, None if rows else SAMPLE_COLUMNS)
    for column in frame.columns:
        frame[column] = frame[column].map(
            lambda v: json.dumps(v, ensure_ascii=False) if isinstance(v, (list, dict)) else v)
    return frame


def evidence_tables(evidence: schema.Evidence, verdict=None) -> dict[str, pd.DataFrame]:
    """name -> table, one CSV each under tables/."""
    tasks = evidence.tasks if isinstance(evidence.tasks, schema.TaskEvidence) else None   # {}: no cell ran tasks
    degeneration = evidence.degeneration
    summary_rows = [{"cell": cell, **{k: v for k, v in schema.dump(entry).items() if k != "detectors"}, **entry.detectors}
                    for cell, entry in degeneration.cells.items()]
    findings = degeneration.findings
    tables = {
        "diff_pairs": _flat_excerpts(evidence.diff.pairs, PAIR_COLUMNS),
        "diff_summary": _frame(_rows(evidence.diff.summary), SUMMARY_COLUMNS),
        "diff_examples": _flat_excerpts(evidence.diff.examples, EXAMPLE_COLUMNS),
        # Evidence from before the baseline's excerpt was kept writes the table it always wrote.
        "degeneration_findings": _frame(_rows(findings), [
            c for c in FINDING_COLUMNS if c not in ("baseline_excerpt", "late")
            or any(c in row.model_fields_set for row in findings)]),
        "degeneration_summary": _frame(summary_rows),
        "divergence": _frame(divergence_rows(evidence.divergence), DIVERGENCE_COLUMNS),
        "startup": _frame(_rows(evidence.startup)),
        "speed": _frame(_rows(evidence.speed)),
        "throughput": _frame(_rows(evidence.throughput)),
        "capacity_model": _frame(_rows(evidence.capacity_model)),
        "task_samples": _task_sample_frame(_rows(tasks.sample_rows if tasks else [])),
        "task_accuracy": _frame(_rows(tasks.accuracy if tasks else []), ACCURACY_COLUMNS),
        "task_comparisons": _frame(_rows(tasks.comparisons if tasks else []), COMPARISON_COLUMNS),
        "task_grid": _frame(_rows(tasks.grid if tasks else []), GRID_COLUMNS),
    }
    if verdict is not None:
        tables["checks"] = _frame([dataclasses.asdict(check) for check in verdict.checks],
                                  ["name", "cell", "value", "limit", "passed", "detail"])
    return tables


# --- writing -------------------------------------------------------------------------------------

def results_document(evidence: schema.Evidence, verdict, manifest: schema.Manifest | None = None) -> dict:
    deployment = deployment_of(verdict, evidence, manifest) if verdict is not None else None
    decision = decision_of(verdict, evidence, manifest, deployment) if verdict is not None else None
    return json_safe({
        "schema_version": schema.RESULTS_VERSION,
        "kveval_version": __version__,
        "model": manifest.model.name if manifest is not None else None,
        "command": manifest.command if manifest is not None else None,
        # verdict.exit_code: the run's (the decision's), the code `compare` and `report` exited with
        "verdict": verdict.to_dict(decision.exit_code) if verdict is not None else None,
        "evidence": schema.dump(evidence),
        **({"deployment": schema.dump(deployment), "decision": schema.dump(decision)} if verdict is not None else {}),
    })



# Tests only: KVEVAL_NO_PLOTS=1 draws no figure and leaves any PNG there as it is. Drawing is most of a
# report's CPU time, review.md names the figures either way (so it reads the same), and the tests that
# look at a figure leave the variable unset.
NO_PLOTS_ENV = "KVEVAL_NO_PLOTS"


def write_results(run_dir: RunDir | str | Path, evidence: schema.Evidence, verdict,
                  manifest: schema.Manifest | None = None) -> Path:
    """RUN_DIR/results.json (every figure, the verdict and its checks), RUN_DIR/tables/*.csv and
    the figures (write_figures)."""
    run_dir = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    for name, frame in evidence_tables(evidence, verdict).items():
        write_text_atomic(run_dir.table_path(name), frame.rename(columns=CSV_HEADERS).to_csv(index=False))
    if os.environ.get(NO_PLOTS_ENV) != "1":
        write_figures(run_dir, evidence)
    path = run_dir.results_path
    document = results_document(evidence, verdict, manifest)
    try:
        schema.parse("results", document, str(path))
    except schema.FileError as error:
        # A kveval bug, not the user's: the measured evidence is still written, and the bug is shown.
        warnings.warn(f"results.json does not match its own schema (please report): {error}", stacklevel=2)
    write_json_atomic(path, document)
    return path


def write_figures(run_dir: RunDir, evidence: schema.Evidence) -> None:
    """The PNGs review.md links, each only when its evidence has rows (a stale one is removed):
    RUN_DIR/tasks_heatmap.png only when tasks have a depth × length grid."""
    heatmap = run_dir.task_heatmap_path
    grid = evidence.tasks.grid if isinstance(evidence.tasks, schema.TaskEvidence) else []
    if not (grid and task_heatmap(grid, heatmap, evidence.baseline_kv or BASELINE_KV)):
        heatmap.unlink(missing_ok=True)
    plot = run_dir.kv_range_plot_path
    diagnoses = [d for d in evidence.diagnosis.values() if not d.error]
    if not (diagnoses and kv_range_plot(diagnoses[0], plot)):
        plot.unlink(missing_ok=True)
    for name, draw, rows in ((RunDir.CAPACITY_PLOT, capacity_plot, evidence.capacity_model),
                             (RunDir.THROUGHPUT_PLOT, throughput_plot, evidence.throughput),
                             (RunDir.KL_POSITION_PLOT, kl_position_plot, evidence.divergence)):
        figure = run_dir.path / name
        if not (rows and draw(rows, figure)):
            figure.unlink(missing_ok=True)
