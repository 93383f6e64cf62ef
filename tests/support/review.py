"""The review of in-memory cells, through the same pipeline `kveval report` runs (evidence -> verdict -> render)."""
from kveval.evidence import build_evidence
from kveval.files import schema
from kveval.gate import evaluate
from kveval.render.review import render_review
from tests.support.evidence import typed_cells, typed_manifest


def review_of(manifest: dict | schema.Manifest, workloads: list[dict], cells: dict[str, dict] | dict[str, schema.CellResult]) -> str:
    """`manifest`: a test's (partial) manifest dict, completed by `typed_manifest`, or a typed one."""
    manifest = typed_manifest(manifest)
    evidence = build_evidence(manifest, workloads, typed_cells(cells))
    return render_review(manifest, evidence, evaluate(evidence))
