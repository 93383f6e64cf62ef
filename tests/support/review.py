"""The review of in-memory cells, through the same pipeline `kveval report` runs (evidence -> verdict -> render)."""
from kveval.evidence import build_evidence
from kveval.gate import evaluate
from kveval.render.review import render_review


def review_of(manifest: dict, workloads: list[dict], cells: dict[str, dict]) -> str:
    evidence = build_evidence(manifest, workloads, cells)
    return render_review(manifest, evidence, evaluate(evidence))
