"""The one-way pipeline from a stored run to its review: files -> evidence -> verdict -> outputs.

    stored cells (files) -> analysis (pure) -> evidence -> gate (verdict) -> render (review.md,
    review.html, results.json, tables/*.csv, figures)

Each step reads only what the step before it produced; nothing downstream reads the cells again.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kveval.analysis.capacity_model import with_pool_ratios
from kveval.analysis.cell_records import BASELINE_KV
from kveval.evidence import build_evidence
from kveval.files import schema
from kveval.files.rundir import RunDir, write_text_atomic
from kveval.gate import Thresholds, Verdict, evaluate
from kveval.render.html_review import review_html
from kveval.render.outputs import write_results
from kveval.render.review import render_review


@dataclass
class Review:
    evidence: schema.Evidence
    verdict: Verdict
    results_path: Path
    review_path: Path
    html_path: Path


def judge_stored_run(run: RunDir, manifest: schema.Manifest, cells: dict[str, schema.CellResult] | None,
                     thresholds: Thresholds) -> Review:
    """Evidence from the stored files, the verdict on it, and every output written into the run.
    `cells`: the run's cells as already read; None reads them (`RunDir.cell_results`)."""
    return write_review(run, manifest, *stored_run_verdict(run, manifest, cells, thresholds))


def stored_run_verdict(run: RunDir, manifest: schema.Manifest, cells: dict[str, schema.CellResult] | None,
                       thresholds: Thresholds) -> tuple[schema.Evidence, Verdict]:
    """Evidence from the stored files and the verdict on it; nothing is written. `cells`: the typed
    cells (`RunDir.cell_results`); None reads them."""
    if cells is None:
        cells = run.cell_results(manifest)
    evidence = build_evidence(manifest, run.load_workloads(manifest), cells, kv_ranges=run.load_kv_ranges(),
                              rounds=run.round_results(manifest))
    return evidence, evaluate(evidence, thresholds)


def stored_evidence_verdict(evidence: schema.Evidence, thresholds: Thresholds) -> tuple[schema.Evidence, Verdict]:
    """The verdict on a run directory without cells (a published report), from its stored evidence;
    nothing is written. Capacity rows stored
    before the pool ratios existed get them (derived from the rows alone)."""
    rows = evidence.capacity_model
    if rows and any("measured_ratio" not in row.model_fields_set for row in rows):
        ratios = with_pool_ratios([schema.dump(row) for row in rows], evidence.baseline_kv or BASELINE_KV)
        evidence = schema.parse(schema.Evidence, {**schema.dump(evidence), "capacity_model": ratios},
                                "the stored evidence")
    return evidence, evaluate(evidence, thresholds)


def write_review(run: RunDir, manifest: schema.Manifest, evidence: schema.Evidence, verdict: Verdict) -> Review:
    """results.json, tables/*.csv, figures, review.md and review.html, from evidence and verdict alone.
    The HTML is written after the figures, which it carries inline."""
    results_path = write_results(run.path, evidence, verdict, manifest)
    review = render_review(manifest, evidence, verdict)
    write_text_atomic(run.review_path, review)
    write_text_atomic(run.review_html_path, review_html(review, run.path))
    return Review(evidence, verdict, results_path, run.review_path, run.review_html_path)
